"""Reopening gives the store as of its last commit: after close(), and after the process was killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np

import mmreplay as mr
from tests._support.helpers import Pair, assert_same, make_pair
from tests._support.model import ModelStore

CFG = dict(capacity=40, stack=3, n_step=2, gamma=0.9, chunk_size=8, num_envs=2, vector=True,
           extras={"lp": ((), "float32")})


def _drive(pair: Pair, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ev = rng.random(2)
        args = (rng.integers(0, 4, 2), rng.integers(-2, 3, 2).astype(np.float64), pair.frame(2), ev < 0.05,
                (ev > 0.05) & (ev < 0.1))
        lp = rng.standard_normal(2).astype(np.float32)
        pair.store.step(*args, lp=lp)
        pair.model.step(*args, lp=lp)


def test_close_then_open_continues(tmp_path):
    pair = make_pair(str(tmp_path / "s"), **CFG)
    pair.store.reset(o := pair.frame(2))
    pair.model.reset(o)
    _drive(pair, 77, 1)
    pair.store.close()
    pair.store = mr.ReplayStore.open(tmp_path / "s")
    assert_same(pair)
    _drive(pair, 90, 2)
    assert_same(pair)
    pair.store.close()
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as r:
        pair.store = r
        assert_same(pair)


def test_uncommitted_writes_are_ignored_on_reopen(tmp_path):
    """Without close(), nothing after the last commit survives; the store continues from the commit."""
    pair = make_pair(str(tmp_path / "s"), **CFG)
    pair.store.reset(o := pair.frame(2))
    pair.model.reset(o)
    _drive(pair, 50, 3)
    pair.store.commit()
    committed_counter = pair.counter
    # A second model replays exactly the committed prefix.
    ref = make_pair(str(tmp_path / "ref"), **CFG)
    ref.store.reset(o := ref.frame(2))
    ref.model.reset(o)
    _drive(ref, 50, 3)
    _drive(pair, 30, 4)  # never committed
    # Simulate the crash: drop the writer without committing what followed the commit.
    pair.store.close(commit=False)
    reopened = mr.ReplayStore.open(tmp_path / "s")
    ref.store.close()
    ref.store = reopened
    assert_same(ref)
    assert committed_counter == ref.counter
    _drive(ref, 60, 5)
    assert_same(ref)
    ref.store.close()


WRITER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import mmreplay as mr
    path, commit_at, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    s = mr.ReplayStore.create(path, capacity=60, obs_shape=(2,), obs_dtype="int32", stack=2, n_step=3,
                              chunk_size=8)
    rng = np.random.default_rng(0)
    s.reset(np.array([0, 0], np.int32))
    for t in range(total):
        end = rng.random() < 0.08
        s.step(t % 3, float(t % 5), np.array([t + 1, 0], np.int32), end, False)
        if end:
            s.reset(np.array([t + 1, 1], np.int32))
        if t + 1 == commit_at:
            s.commit()
            print("committed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_open_after_sigkill_returns_last_commit(tmp_path):
    path = str(tmp_path / "s")
    proc = subprocess.run([sys.executable, "-c", WRITER, path, "137", "300"], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL and "committed" in proc.stdout, proc.stderr
    model = ModelStore(capacity=60, obs_shape=(2,), obs_dtype="int32", stack=2, n_step=3, chunk_size=8)
    rng = np.random.default_rng(0)
    model.reset(np.array([0, 0], np.int32))
    for t in range(137):
        end = rng.random() < 0.08
        model.step(t % 3, float(t % 5), np.array([t + 1, 0], np.int32), end, False)
        if end:
            model.reset(np.array([t + 1, 1], np.int32))
    store = mr.ReplayStore.open(path)
    pair = Pair(store, model, counter=0)
    assert_same(pair)
    np.testing.assert_array_equal(store.current_obs(), model.current_obs())
    # Chunk directories written after the commit are gone; writing goes on from the commit.
    with open(os.path.join(path, "manifest.json")) as f:
        listed = {c["name"] for c in json.load(f)["chunks"]}
    assert {n.split(".")[0] for n in os.listdir(os.path.join(path, "chunks"))} == listed
    for t in range(137, 200):
        for target in (store, model):
            target.step(1, 1.0, np.array([1000 + t, 0], np.int32), t % 40 == 0, False)
            if t % 40 == 0:
                target.reset(np.array([1000 + t, 1], np.int32))
    assert_same(pair)
    store.close()
