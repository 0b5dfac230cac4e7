"""verify() at the edges: a writer committing while it runs, a rate-limited store this user cannot write,
and chunk headers damaged where Python's parser is more lenient than numpy's."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

import mmreplay as mr
import mmreplay.verify as verify_module
from mmreplay.cli import main as cli
from mmreplay.storage import npyfile


def _steps(store, n, start=0):
    for t in range(start, start + n):
        store.step(0, 1.0, np.full((4, 4), t % 250, np.uint8), False, False)


def _chunks(path):
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)["chunks"]


# -- a live writer ---------------------------------------------------------------------------------------
def test_a_commit_between_reading_the_manifest_and_checking_the_files_is_checked_again(tmp_path, monkeypatch):
    """The writer's commit retires the oldest chunks and deletes their files, which the manifest verify
    read still lists: verify checks the new commit instead of reporting healthy files as missing."""
    path = str(tmp_path / "s")
    w = mr.ReplayStore.create(path, capacity=100, obs_shape=(4, 4), chunk_size=32, compression=None)
    w.reset(np.zeros((4, 4), np.uint8))
    _steps(w, 200)
    w.commit()
    first = _chunks(path)[0]["name"]
    real = verify_module.check_files
    races = [1]

    def commit_meanwhile(root, doc, *args):
        if races.pop() if races else 0:  # once: the writer moves on after verify read the manifest
            _steps(w, 100, 200)
            w.commit()
            assert not os.path.exists(os.path.join(path, "chunks", f"{first}.obs.npy"))
        return real(root, doc, *args)

    monkeypatch.setattr(verify_module, "check_files", commit_meanwhile)
    try:
        assert mr.verify_store(path) == []
        assert not races
    finally:
        w.close()


def test_damage_under_an_unchanged_commit_is_still_reported(tmp_path):
    path = str(tmp_path / "s")
    w = mr.ReplayStore.create(path, capacity=100, obs_shape=(4, 4), chunk_size=32, compression=None)
    w.reset(np.zeros((4, 4), np.uint8))
    _steps(w, 100)
    w.close()
    gone = os.path.join(path, "chunks", f"{_chunks(path)[0]['name']}.reward.npy")
    os.chmod(gone, 0o644)
    os.unlink(gone)
    assert mr.verify_store(path) == [f"{gone}: chunk file is missing"]


# -- a rate-limited store this user cannot write --------------------------------------------------------
def _counters_not_writable(monkeypatch):
    """``ratelimit.npy`` refuses opening for writing, as a read-only copy of a store does (also as root)."""
    real = os.open

    def fake(path, flags, *args, **kwargs):
        if os.fspath(path).endswith(os.sep + "ratelimit.npy") and flags & os.O_RDWR:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake)


@pytest.mark.parametrize("prioritized", [None, mr.Prioritized()])
def test_a_rate_limited_store_whose_counters_cannot_be_written_verifies(tmp_path, monkeypatch, capsys, prioritized):
    path = str(tmp_path / "s")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(4, 4), chunk_size=32, compression=None,
                              prioritized=prioritized, rate_limit=mr.RateLimit(1.0, min_size=10, error_buffer=100))
    s.reset(np.zeros((4, 4), np.uint8))
    _steps(s, 50)
    s.close()
    _counters_not_writable(monkeypatch)
    with mr.ReplayStore.open(path, mode="r") as r, pytest.raises(mr.ReadOnlyStoreError, match="cannot count"):
        r.sample(4)  # (this user can read the store, not sample from it)
    assert mr.verify_store(path) == []
    assert cli.main(["verify", path]) == 0


# -- chunk headers --------------------------------------------------------------------------------------
@pytest.fixture
def store_path(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(4, 4), chunk_size=32, compression=None)
    s.reset(np.zeros((4, 4), np.uint8))
    _steps(s, 80)
    s.close()
    return str(tmp_path / "s")


def _set_byte(path, offset, value):
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes([value]))


@pytest.mark.parametrize("chunk,column", [(0, "flags"), (-1, "action"), (-1, "flags")])  # sealed; open
@pytest.mark.parametrize("offset,value", [(4000, 0xA0), (npyfile.HEADER_BYTES - 1, 0x8A),
                                          (npyfile.HEADER_BYTES - 1, 0x20)])
def test_a_damaged_header_padding_is_a_problem_naming_the_file(store_path, chunk, column, offset, value):
    """A no-break space (0xA0) is whitespace to Python's parser, not to numpy's; the final newline is part of
    the format: the header is damaged in both cases, reported by verify and refused by open."""
    target = os.path.join(store_path, "chunks", f"{_chunks(store_path)[chunk]['name']}.{column}.npy")
    _set_byte(target, offset, value)
    problems = mr.verify_store(store_path)
    assert len(problems) == 1 and problems[0].startswith(f"{target}: damaged .npy header: byte {offset}"), problems
    assert cli.main(["verify", store_path]) == 1
    with pytest.raises(mr.CorruptStoreError, match="damaged .npy header"):
        mr.ReplayStore.open(store_path, mode="r")


def test_a_header_read_back_is_the_one_written(tmp_path):
    path = str(tmp_path / "c.npy")
    npyfile.create(path, np.dtype("<f4"), (8, 3))
    assert npyfile.read_header(path) == (np.dtype("<f4"), (8, 3))
    assert np.load(path, mmap_mode="r").shape == (8, 3)
