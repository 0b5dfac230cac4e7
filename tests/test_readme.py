"""The README works as written: every ```python block runs on its own, in a fresh interpreter and its own
empty directory (a block needs nothing an earlier one made), leaves that directory as it found it (it
removes what it makes), and prints what it says; the install and command sections name what exists."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor

import pytest

from mmreplay.cli.main import build_parser
from tests._support.helpers import require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
# A block that imports one of these needs the module (the skip names the extra that installs it).
NEEDS = {"gymnasium": "gymnasium", "mmreplay.gym": "ale_py", "mmreplay.torch": "torch",
         "mmreplay.sb3": "stable_baselines3", "torch": "torch"}
# A block that imports one of these runs only where the module is installed (as in CI); the other
# blocks run without it.
ONLY_WITH = {"mmreplay.ray": "ray"}


def readme() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def python_blocks() -> list[tuple[str, str]]:
    """``(section heading, code)`` of every ```python block, in order."""
    out, heading, code = [], "", None
    for line in readme().splitlines(keepends=True):
        if code is not None:
            if line.rstrip() == "```":
                out.append((heading, "".join(code)))
                code = None
            else:
                code.append(line)
        elif line.startswith("## "):
            heading = line[3:].strip()
        elif line.rstrip() == "```python":
            code = []
    assert code is None, f"an unclosed ```python block under '## {heading}'"
    return out


def test_every_python_block_runs_on_its_own_in_an_empty_directory(tmp_path):
    blocks = python_blocks()
    assert len(blocks) >= 5, [h for h, _ in blocks]
    for _, code in blocks:
        for name, module in NEEDS.items():
            if re.search(rf"^\s*(import|from) {re.escape(name)}\b", code, re.M):
                require(module)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               PYTHONHASHSEED="0")  # this checkout's mmreplay, whatever is installed
    runs = [(tmp_path / f"block{i}", heading, code) for i, (heading, code) in enumerate(blocks)
            if not any(re.search(rf"^\s*(import|from) {re.escape(name)}\b", code, re.M) and not _installed(module)
                       for name, module in ONLY_WITH.items())]

    def run(where: pathlib.Path, code: str) -> subprocess.CompletedProcess[str]:
        where.mkdir()
        return subprocess.run([sys.executable, "-c", code], cwd=where, env=env, capture_output=True, text=True,
                              timeout=600)

    # the blocks are independent (each in its own directory): two at a time, each mostly one core's work
    with ThreadPoolExecutor(max(1, min(2, len(os.sched_getaffinity(0))))) as pool:
        done_all = list(pool.map(lambda r: run(r[0], r[2]), runs))
    outputs = {}
    for (where, heading, code), done in zip(runs, done_all, strict=True):
        assert done.returncode == 0, f"README block under '## {heading}' failed:\n{code}\n{done.stderr[-3000:]}"
        left = sorted(p.name for p in where.iterdir())
        assert not left, f"README block under '## {heading}' leaves {left} behind: remove what it makes"
        outputs[heading] = done.stdout
    # what the blocks say they do, they did
    said = re.fullmatch(r"\(0, 5000\) (\d+)\n", outputs["Quickstart (a Gymnasium loop)"])
    assert said and int(said[1]) > 4900, outputs["Quickstart (a Gymnasium loop)"]
    said = re.fullmatch(r"([\d,]+) sampleable, beta (\S+), max priority (\S+)\n", outputs["Prioritized replay"])
    assert said and int(said[1].replace(",", "")) > 1900 and float(said[2]) > 0.9 and float(said[3]) > 1.0, said
    said = re.fullmatch(r"resumed ([\d,]+) transitions, beta 0\.700\n", outputs["Durability, snapshots and resume"])
    assert said and int(said[1]) > 250, outputs["Durability, snapshots and resume"]
    said = re.fullmatch(r"4 episodes, ([\d,]+) sampleable transitions\n", outputs["Offline-RL datasets"])
    assert said and int(said[1].replace(",", "")) > 1900  # the four time-limited episodes; the fifth is not exported
    assert "torch.Size([32, 4, 84, 84])" in outputs["Gymnasium and PyTorch"]
    assert "torch.Size([256, 4, 84, 84])" in outputs["Batches on the GPU (`device_batches`)"]
    assert outputs["Writing blocks of steps (`extend`)"].split()[:2] == ["(0,", "400)"]
    assert outputs["Datasets on object storage"].split() == ["episodes", "1", "140"]  # the ended episode
    if _installed("ray"):
        assert outputs["Actors on Ray (`mmreplay.ray`)"].split() == ["32", "1"]


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_the_two_commands_and_the_extras():
    text = readme()
    commands = re.search(r"## The two commands\n(.*?)\n## ", text, re.S)
    assert commands, "no '## The two commands' section"
    lines = [x.strip() for x in re.findall(r"```bash\n(.*?)```", commands.group(1), re.S)[0].splitlines()
             if x.strip() and not x.strip().startswith("#")]
    assert lines == ["python -m pip install . && mmreplay demo",
                     'python -m pip install -e ".[ci]" && python -m pytest -q -n 2 --dist loadfile']  # the full suite
    with open(os.path.join(ROOT, ".ci", "run")) as f:  # CI runs the README's test command
        assert "\npython -m pytest -q -n 2 --dist loadfile\n" in f.read()
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    for extra in ("gym", "atari", "torch", "image", "minari", "ci"):
        assert extra in extras and f"`[{extra}]`" in text, extra
    quickstart = text.split("## Quickstart", 1)[1].split("```python", 1)[0]
    assert "`[gym]`" in quickstart
    torch_section = text.split("## Gymnasium and PyTorch", 1)[1].split("```python", 1)[0]
    assert "`[atari]`" in torch_section and "`[torch]`" in torch_section


def test_the_command_list_names_every_command():
    listing = readme().split("## Command line", 1)[1].split("\n## ", 1)[0]
    helptext = build_parser().format_help()
    commands = re.findall(r"^    (\w+)\s", helptext.split("COMMAND\n", 1)[1], re.M)
    assert {"demo", "info", "export", "import", "bench"} <= set(commands), commands
    for name in commands:
        assert re.search(rf"^mmreplay {name}\b", listing, re.M), f"'mmreplay {name}' missing from the README"
    assert "bench [--capacity N]" in listing and "--next-observations" in listing
    assert "Minari" in listing and "DQN replay" in listing  # info describes datasets too


def test_step_documents_both_flags():
    text = readme()
    assert "both\n`terminated=True` and `truncated=True`" in text or "both `terminated=True` and `truncated=True`" in text
    assert "is stored as\nterminated" in text or "is stored as terminated" in text


@pytest.mark.parametrize("heading", ["Quickstart (a Gymnasium loop)", "Gymnasium and PyTorch"])
def test_blocks_that_need_an_extra_say_so(heading):
    text = readme().split(f"## {heading}", 1)[1].split("```python", 1)[0]
    assert "Needs the" in text and "extra" in text
