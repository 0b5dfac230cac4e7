"""tools/dqn_atari.py's checks of its arguments and of the run it resumes, made before any env is played (no
Atari ROM needed): intervals are positive integers, and a run is resumed only into the game it was recorded
from."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import mmreplay as mr
from tests._support.helpers import require

TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools",
                    "dqn_atari.py")


@pytest.fixture(scope="module")
def dqn():
    require("torch")
    require("gymnasium")
    spec = importlib.util.spec_from_file_location("dqn_atari", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("option", ["--checkpoint-every", "--train-every", "--target-every", "--capacity",
                                    "--batch-size", "--n-step"])
def test_counts_and_intervals_must_be_positive(dqn, tmp_path, capsys, option):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        dqn.main(["--replay-dir", str(run_dir), "--steps", "10", option, "0"])
    assert exit_.value.code == 2
    assert f"argument {option}: expected an integer >= 1, got 0" in capsys.readouterr().err
    assert not run_dir.exists()  # refused before anything was created
    assert getattr(dqn.parse_args(["--replay-dir", str(run_dir), option, "7"]), option[2:].replace("-", "_")) == 7


def _checkpointed_run(dqn, run_dir, env_id):
    """A run of ``env_id`` checkpointed by the tool itself (a few steps of blank frames: no env is played)."""
    args = dqn.parse_args(["--replay-dir", str(run_dir), "--env-id", env_id, "--device", "cpu"])
    os.makedirs(run_dir)
    run = dqn.Run(args, 6)
    store = mr.ReplayStore.create(run.store_dir, capacity=100, obs_shape=(84, 84), stack=4, n_step=3)
    store.reset(np.zeros((84, 84), np.uint8))
    for t in range(10):
        store.step(t % 6, 0.0, np.full((84, 84), t + 1, np.uint8), False, False)
    run.step = 10
    run.checkpoint(store)
    store.close()


def test_a_run_is_resumed_only_into_its_own_game(dqn, tmp_path, capsys):
    run_dir = tmp_path / "run"
    _checkpointed_run(dqn, run_dir, "ALE/Pong-v5")
    other = dqn.parse_args(["--replay-dir", str(run_dir), "--env-id", "ALE/SpaceInvaders-v5", "--device", "cpu"])
    with pytest.raises(SystemExit) as exit_:
        dqn.Run(other, 6).resume()
    message = str(exit_.value.code)
    assert message.startswith("--env-id ALE/SpaceInvaders-v5: ") and "holds a run of ALE/Pong-v5" in message
    assert "--fresh" in message and "--replay-dir" in message
    with mr.ReplayStore.open(run_dir / "snapshot", mode="r") as snap:  # the run is left as it was
        assert snap.metadata["dqn"]["env_id"] == "ALE/Pong-v5" and snap.id_range == (0, 10)
    same = dqn.parse_args(["--replay-dir", str(run_dir), "--env-id", "ALE/Pong-v5", "--device", "cpu"])
    run = dqn.Run(same, 6)
    store = run.resume()
    assert store is not None and run.step == 10 and store.id_range == (0, 10)
    store.close()
    fresh = dqn.parse_args(["--replay-dir", str(run_dir), "--env-id", "ALE/SpaceInvaders-v5", "--fresh"])
    assert dqn.Run(fresh, 6).resume() is None
