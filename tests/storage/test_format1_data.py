"""Stores written at format version 1 (``tests/data/format1``) still open, read and continue.

The two stores were written by mmreplay 0.1.0 at format version 1 with exactly the calls of
``_single`` and ``_vector`` below (then closed). Each test replays the same calls into a new store
and compares: the same ids, rows, priorities and seeded draws.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import mmreplay as mr
from tests._support.helpers import data_dir

FIELDS = ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index", "weight")


def _single(path: str) -> mr.ReplayStore:
    s = mr.ReplayStore.create(path, capacity=12, obs_shape=(2,), obs_dtype="int32", stack=2, n_step=2, chunk_size=8,
                              seed=3, prioritized=mr.Prioritized())
    t = 0
    for ep in range(4):
        s.reset(np.array([t, 0], np.int32))
        t += 1
        for i in range(5 + ep):
            s.step(i % 3, float(i), np.array([t, 0], np.int32), i == 4 + ep and ep % 2 == 0, False)
            t += 1
    s.update_priorities(np.array([s.sampleable_ids()[0]]), [3.0])
    return s


def _vector(path: str) -> mr.ReplayStore:
    v = mr.ReplayStore.create(path, capacity=12, obs_shape=(2,), obs_dtype="int32", stack=2, n_step=2, chunk_size=8,
                              num_envs=2, seed=4)
    v.reset(np.array([[0, 0], [0, 1]], np.int32))
    for i in range(13):
        v.step(np.array([i % 3, 1]), np.array([1.0, 2.0]), np.array([[i + 1, 0], [i + 1, 1]], np.int32),
               np.array([i % 5 == 4, False]), np.array([False, i == 9]))
    return v


def _copy(tmp_path, name: str) -> str:
    dst = str(tmp_path / name)
    shutil.copytree(os.path.join(data_dir(), "format1", name), dst)
    os.makedirs(os.path.join(dst, "state"), exist_ok=True)
    for root, _, files in os.walk(dst):
        for f in files:
            os.chmod(os.path.join(root, f), 0o644 if not f.endswith(".npy") or "state" in root else 0o444)
    with open(os.path.join(dst, "manifest.json")) as f:
        assert json.load(f)["format_version"] == 1
    return dst


def _same(a: mr.ReplayStore, b: mr.ReplayStore) -> None:
    assert a.id_range == b.id_range and len(a) == len(b)
    ids = a.sampleable_ids()
    np.testing.assert_array_equal(ids, b.sampleable_ids())
    x, y = a.gather(ids), b.gather(ids)
    for name in FIELDS[:-1]:
        np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)
    for _ in range(3):
        x, y = a.sample(8), b.sample(8)
        for name in FIELDS:
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)


@pytest.mark.parametrize("name, build", [("single", _single), ("vector", _vector)])
def test_a_format_1_store_reads_and_continues_like_a_new_one(tmp_path, name, build):
    old_path = _copy(tmp_path, name)
    new = build(str(tmp_path / "new"))
    new.commit()
    with mr.ReplayStore.open(old_path, mode="r") as old:
        assert old.verify() == []
        with mr.ReplayStore.open(str(tmp_path / "new"), mode="r") as fresh:
            _same(old, fresh)
    old = mr.ReplayStore.open(old_path)  # a writer continues it (its streams in lockstep: still format 1)
    np.testing.assert_array_equal(old.episode_open, new.episode_open)
    n = old.num_envs
    for i in range(20):
        frame = np.full((n, 2) if n > 1 else (2,), 100 + i, np.int32)
        if n > 1:
            args = (np.zeros(n, np.int64), np.ones(n), frame, np.zeros(n, np.bool_), np.zeros(n, np.bool_))
        else:
            if not old.episode_open[0]:
                old.reset(frame)
                new.reset(frame)
                continue
            args = (0, 1.0, frame, False, False)
        old.step(*args)
        new.step(*args)
    _same(old, new)
    if n > 1:
        with pytest.raises(ValueError, match="older mmreplay"):
            old.extend(np.zeros(1, np.int64), [1.0], np.zeros((1, 2), np.int32), [False], [False], env=0)
    old.close()
    new.close()
    with open(os.path.join(old_path, "manifest.json")) as f:
        assert json.load(f)["format_version"] == 1  # the oldest version that reads it right
    with mr.ReplayStore.open(old_path, mode="r") as old, mr.ReplayStore.open(str(tmp_path / "new"), mode="r") as fresh:
        assert old.verify() == []
        _same(old, fresh)
