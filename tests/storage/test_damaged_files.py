"""Damaged stores: a clear error naming the file (from open() when the damage makes the store unusable,
from verify() always), and the committed data elsewhere untouched."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.cli import main as cli


@pytest.fixture
def store_path(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=120, obs_shape=(6,), stack=2, n_step=2, chunk_size=16,
                              prioritized=mr.Prioritized())
    s.reset(np.zeros(6, np.uint8))
    for t in range(200):
        s.step(t % 3, 1.0, np.full(6, t % 250, np.uint8), t % 50 == 49, False)
        if t % 50 == 49:
            s.reset(np.zeros(6, np.uint8))
    s.close()
    return str(tmp_path / "s")


def _chunks(path):
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)["chunks"]


def _file(path, chunk, column):
    return os.path.join(path, "chunks", f"{chunk['name']}.{column}.npy")


def _hashes(path):
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            if name == "lock":
                continue
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[p] = hashlib.sha256(f.read()).hexdigest()
    return out


def _verify_names(path, fragment):
    problems = mr.verify_store(path)
    assert problems and any(fragment in p for p in problems), problems
    assert cli.main(["verify", path]) == 1
    return problems


def test_intact_store_verifies(store_path, capsys):
    assert mr.verify_store(store_path) == []
    assert cli.main(["verify", store_path]) == 0
    assert "ok" in capsys.readouterr().out


def test_truncated_chunk_file(store_path):
    target = _file(store_path, _chunks(store_path)[0], "obs")
    with open(target, "r+b") as f:
        f.truncate(os.path.getsize(target) - 10)
    before = _hashes(store_path)
    with pytest.raises(mr.CorruptStoreError, match="obs.npy.*truncated"):
        mr.ReplayStore.open(store_path)
    assert _hashes(store_path) == before  # a refused open changes nothing
    _verify_names(store_path, target)


def test_flipped_bytes_in_a_sealed_chunk(store_path):
    chunks = _chunks(store_path)
    target = _file(store_path, chunks[1], "obs")
    with open(target, "r+b") as f:
        f.seek(4096 + 10)
        b = f.read(1)
        f.seek(4096 + 10)
        f.write(bytes([b[0] ^ 0xFF]))
    problems = _verify_names(store_path, target)
    assert "checksum" in " ".join(problems)
    # frames are not needed to open: the store still opens, and other chunks' rows are intact
    with mr.ReplayStore.open(store_path, mode="r") as s:
        lo, hi = s.id_range
        late = [i for i in s.sampleable_ids() if i >= hi - 30]
        assert s.gather(late).obs.shape[0] == len(late)


def test_flipped_flags_are_caught_at_open(store_path):
    target = _file(store_path, _chunks(store_path)[1], "flags")
    with open(target, "r+b") as f:
        f.seek(4096 + 3)
        f.write(bytes([1]))  # a transition row now claims to be an episode start
    with pytest.raises(mr.CorruptStoreError, match="flags"):
        mr.ReplayStore.open(store_path)
    _verify_names(store_path, target)


def test_missing_chunk(store_path):
    target = _file(store_path, _chunks(store_path)[2], "reward")
    os.unlink(target)
    with pytest.raises(mr.CorruptStoreError, match="reward.npy.*missing"):
        mr.ReplayStore.open(store_path)
    _verify_names(store_path, target)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "edited"])
def test_bad_manifest(store_path, damage):
    path = os.path.join(store_path, "manifest.json")
    raw = open(path, "rb").read()
    data = {"garbage": b"\x00\xffnot json", "truncated": raw[: len(raw) // 2],
            "edited": raw.replace(b'"next_id": ', b'"next_id": 1')}[damage]
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(mr.CorruptStoreError, match="manifest.json"):
        mr.ReplayStore.open(store_path)
    _verify_names(store_path, "manifest.json")


def test_newer_format_and_foreign_directory(store_path, tmp_path):
    path = os.path.join(store_path, "manifest.json")
    doc = json.load(open(path))
    doc["format_version"] = 7
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(mr.FormatVersionError, match="version 7"):
        mr.ReplayStore.open(store_path)
    _verify_names(store_path, "version 7")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(mr.NotAStoreError):
        mr.ReplayStore.open(tmp_path / "photos")
    _verify_names(str(tmp_path / "photos"), "not an mmreplay store")


def test_missing_priorities_file(store_path):
    doc = json.load(open(os.path.join(store_path, "manifest.json")))
    target = os.path.join(store_path, doc["priorities"]["file"])
    os.unlink(target)
    with pytest.raises(mr.CorruptStoreError, match="priorities"):
        mr.ReplayStore.open(store_path)
    _verify_names(store_path, target)

