"""The README's quickstart runs as written."""

from __future__ import annotations

import os
import re

from helpers import require

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def quickstart() -> str:
    text = open(README, encoding="utf-8").read()
    section = text.split("## Quickstart", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no python block under '## Quickstart' in README.md"
    return match.group(1)


def test_quickstart_runs(tmp_path, monkeypatch):
    require("gymnasium")
    code = quickstart()
    assert "gym.make" in code and "store.sample" in code
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__quickstart__"}
    exec(compile(code, "README.md quickstart", "exec"), namespace)
    import mmreplay as mr

    with mr.ReplayStore.open(tmp_path / "replay-cartpole", mode="r") as store:
        assert store.id_range == (0, 5000) and len(store) > 4900
    batch = namespace["batch"]
    assert batch.obs.shape == (32, 1, 4)


def block_under(heading: str) -> str:
    text = open(README, encoding="utf-8").read()
    section = text.split("## " + heading, 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block under '## {heading}' in README.md"
    return match.group(1)


def run_block(heading: str, cwd) -> str:
    """A README block in a fresh interpreter with this checkout's mmreplay; returns its stdout."""
    import subprocess
    import sys

    root = os.path.dirname(README)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", block_under(heading)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"README block under '## {heading}' failed:\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_extend_example_runs(tmp_path):
    out = run_block("Writing blocks of steps (`extend`)", tmp_path)
    assert out.split()[:2] == ["(0,", "400)"]


def test_the_ray_example_runs_where_ray_is_installed(tmp_path):
    require("ray")  # the [ray] extra; CI installs it
    out = run_block("Actors on Ray (`mmreplay.ray`)", tmp_path)
    assert out.split() == ["32", "1"]
    import mmreplay as mr

    with mr.ReplayStore.open(tmp_path / "replay-ray", mode="r") as store:
        assert store.id_range == (0, 4000)
