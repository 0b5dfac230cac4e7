"""tools/cleanrl_dqn.py changes exactly one line of a CleanRL script: the replay buffer's import."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools", "cleanrl_dqn.py")


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("cleanrl_dqn", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclass looks its module up there)
    spec.loader.exec_module(mod)
    return mod


# the shape of a CleanRL script's head (written for this test, not taken from CleanRL)
HEAD = """import random
import numpy as np
{line}

# the buffer: ReplayBuffer(...) below
def make():
    from stable_baselines3.common.buffers import ReplayBufferSamples
    return ReplayBuffer
"""


@pytest.mark.parametrize("line", ["from stable_baselines3.common.buffers import ReplayBuffer",
                                  "from cleanrl_utils.buffers import ReplayBuffer"])
@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_patch_changes_only_the_import(runner, line, ending):
    text = HEAD.format(line=line).replace("\n", ending)
    new, old = runner.patch(text)
    assert old == line
    a, b = text.splitlines(keepends=True), new.splitlines(keepends=True)
    assert len(a) == len(b)
    diff = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    assert diff == [(line + ending, "from mmreplay.sb3 import ReplayBuffer" + ending)]


@pytest.mark.parametrize("text", [
    "import numpy as np\n",  # no buffer import
    "from cleanrl_utils.buffers import ReplayBuffer\nfrom stable_baselines3.common.buffers import ReplayBuffer\n",
    "from stable_baselines3.common.buffers import ReplayBuffer, RolloutBuffer\n",  # not the one-name line
])
def test_patch_refuses_anything_but_one_import(runner, text):
    with pytest.raises(ValueError, match="exactly one buffer import line"):
        runner.patch(text)


def test_cleanrl_root_is_the_checkout_with_cleanrl_utils(runner, tmp_path):
    (tmp_path / "cleanrl_utils").mkdir()
    (tmp_path / "cleanrl").mkdir()
    script = tmp_path / "cleanrl" / "dqn_atari.py"
    script.write_text("")
    assert runner.cleanrl_root(str(script)) == str(tmp_path)
    lone = tmp_path / "other" / "scripts" / "dqn_atari.py"  # no cleanrl_utils beside it or above it
    lone.parent.mkdir(parents=True)
    lone.write_text("")
    assert runner.cleanrl_root(str(lone)) == str(lone.parent)
