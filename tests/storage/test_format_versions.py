"""Stores written before compressed frames existed (format version 1, no ``compression`` in the schema)
keep opening, sampling and growing as raw stores; so do raw stores written now."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.storage import manifest
from tests._support.helpers import data_dir

GOLDEN = os.path.join(data_dir(), "golden")


def write_golden(path: str) -> None:
    """How ``data/golden/raw_v1`` was written (by mmreplay at commit 56869b3, before compression).

    The rows it then read back are in ``raw_v1_rows.npz``: ``gather`` of every sampleable id, their
    priorities, ``current_obs()`` and ``sample(5)`` of a reader opened with the committed RNG.
    """
    s = mr.ReplayStore.create(path, capacity=16, obs_shape=(4, 4), stack=2, n_step=2, gamma=0.9, chunk_size=8,
                              prioritized=mr.Prioritized(), seed=7)
    s.reset(np.zeros((4, 4), np.uint8))
    for t in range(1, 31):
        s.step(t % 3, float(t), np.full((4, 4), t, np.uint8) + np.eye(4, dtype=np.uint8), t % 11 == 0, False)
        if t % 11 == 0:
            s.reset(np.full((4, 4), 100 + t, np.uint8))
        if t == 20:
            b = s.sample(4)
            s.update_priorities(b.index, np.arange(4) + 1.0)
    s.close()


def _manifest(path: str) -> dict:
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)


def test_a_store_written_before_compression_opens_samples_and_grows_raw(tmp_path):
    path = str(tmp_path / "s")
    shutil.copytree(os.path.join(GOLDEN, "raw_v1"), path)
    assert "compression" not in _manifest(path)["schema"] and _manifest(path)["format_version"] == 1
    want = np.load(os.path.join(GOLDEN, "raw_v1_rows.npz"))
    with mr.ReplayStore.open(path, mode="r") as s:
        assert s.compression is None  # uint8 image frames, but written raw: they stay raw
        b = s.gather(want["ids"])
        for name in ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated"):
            assert np.array_equal(getattr(b, name), want[name]), name
        assert np.array_equal(s.priorities(want["ids"]), want["priorities"])
        assert np.array_equal(s.current_obs(), want["current_obs"])
        smp = s.sample(5)
        assert np.array_equal(smp.index, want["sample_index"]) and np.array_equal(smp.weight, want["sample_weight"])
    assert mr.verify_store(path) == []
    with mr.ReplayStore.open(path) as s:
        for t in range(40):
            s.step(t % 3, 1.0, np.full((4, 4), t, np.uint8), False, False)
    doc = _manifest(path)
    assert doc["format_version"] == 1 and doc["schema"]["compression"] is None
    assert not [f for f in os.listdir(os.path.join(path, "chunks")) if not f.endswith(".npy")]
    assert mr.verify_store(path) == []


def test_a_raw_store_written_now_is_format_1(tmp_path):
    path = str(tmp_path / "s")
    with mr.ReplayStore.create(path, capacity=30, obs_shape=(4, 4), stack=2, chunk_size=8, compression=None) as s:
        s.reset(np.zeros((4, 4), np.uint8))
        for t in range(50):
            s.step(0, 1.0, np.full((4, 4), t, np.uint8), False, False)
        rows = s.gather(s.sampleable_ids())
    assert _manifest(path)["format_version"] == 1
    with mr.ReplayStore.open(path, mode="r") as s:
        assert s.compression is None
        b = s.gather(rows.index)
        assert np.array_equal(b.obs, rows.obs) and np.array_equal(b.next_obs, rows.next_obs)


def test_a_newer_format_is_refused_with_a_clear_error(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    mr.ReplayStore.create(path, capacity=30, obs_shape=(4, 4)).close()
    doc = _manifest(path)
    assert doc["format_version"] == 2  # a compressed store: older mmreplay versions refuse it clearly
    body = {k: v for k, v in doc.items() if k not in ("checksum", "format", "format_version")}
    monkeypatch.setattr(manifest, "version_needed", lambda body: manifest.FORMAT_VERSION + 1)
    manifest.write_manifest(path, body)
    with pytest.raises(mr.FormatVersionError, match="upgrade mmreplay"):
        mr.ReplayStore.open(path)
