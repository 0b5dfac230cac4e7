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
