"""A full disk or a failed sync turns the store read-only with a clear error; reopening gives the last commit."""

from __future__ import annotations

import errno
import json
import os
import threading

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.storage import npyfile, ring


def _store(path):
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(4,), stack=2, n_step=2, chunk_size=8)
    s.reset(np.zeros(4, np.uint8))
    return s


def _steps(s, n, start=0):
    for t in range(start, start + n):
        s.step(t % 2, 1.0, np.full(4, t % 256, np.uint8), False, False)


def _committed_store(path, n):
    """A store with ``n`` steps committed, and its committed id range."""
    s = _store(path)
    _steps(s, n)
    s.commit()
    return s, s.id_range


def _assert_read_only_then_reopens(s, path, committed_range):
    batch = s.sample(4)  # sampling still works
    assert batch.obs.shape == (4, 2, 4)
    # save() too: the state since the last commit may be incomplete (a chunk sealed without its checksum)
    for call in (lambda: _steps(s, 1), s.commit, lambda: s.reset(np.zeros(4, np.uint8)), lambda: s.save(path + "-snap")):
        with pytest.raises(mr.ReadOnlyStoreError, match="free space or fix the disk, then reopen"):
            call()
    assert not os.path.exists(path + "-snap")
    s.close()  # does not try to commit
    with mr.ReplayStore.open(path) as again:
        assert again.id_range == committed_range
        _steps(again, 20)  # once space is back, writing goes on


def test_enospc_when_a_new_chunk_is_allocated(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    s, committed = _committed_store(path, 10)
    real = os.posix_fallocate

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(mr.StoreIOError, match="No space left.*read-only") as info:
        _steps(s, 50, start=10)
    assert info.value.errno == errno.ENOSPC
    assert isinstance(info.value, OSError)
    monkeypatch.setattr(os, "posix_fallocate", real)
    _assert_read_only_then_reopens(s, path, committed)
    with open(os.path.join(path, "manifest.json")) as f:
        listed = {c["name"] for c in json.load(f)["chunks"]}
    assert {n.split(".")[0] for n in os.listdir(os.path.join(path, "chunks"))} == listed  # no half-made chunk


def test_failed_fsync_during_commit(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    s, committed = _committed_store(path, 30)
    _steps(s, 7, start=30)

    def eio(path):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ring, "fsync_file", eio)
    with pytest.raises(mr.StoreIOError, match="committing.*Input/output error"):
        s.commit()
    monkeypatch.undo()
    _assert_read_only_then_reopens(s, path, committed)


def test_failed_background_seal_surfaces_at_the_next_commit(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    s, committed = _committed_store(path, 3)
    real = ring.ChunkRing.finish_seal
    tried = threading.Event()

    def broken(self, seq):
        tried.set()
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ring.ChunkRing, "finish_seal", broken)
    _steps(s, 8, start=3)  # fills a chunk: its seal fails in the background
    # (the sealer thread runs queued work first, a directory sync or a deletion: the real seal is put back
    # only once the broken one ran)
    assert tried.wait(30), "the full chunk's seal never ran"
    monkeypatch.setattr(ring.ChunkRing, "finish_seal", real)
    with pytest.raises(mr.StoreIOError, match="Input/output error"):
        s.commit()
    _assert_read_only_then_reopens(s, path, committed)


def test_a_failed_background_seal_met_first_by_save_is_the_stores_own_error(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    s, committed = _committed_store(path, 3)
    tried = threading.Event()

    def broken(self, seq):
        tried.set()
        raise OSError(errno.EIO, "Input/output error")

    real = ring.ChunkRing.finish_seal
    monkeypatch.setattr(ring.ChunkRing, "finish_seal", broken)
    _steps(s, 8, start=3)
    assert tried.wait(30), "the full chunk's seal never ran"
    monkeypatch.setattr(ring.ChunkRing, "finish_seal", real)
    with pytest.raises(mr.StoreIOError, match="sealing a chunk.*Input/output error"):
        s.save(path + "-snap")
    _assert_read_only_then_reopens(s, path, committed)  # a second save is refused too


def test_preallocation_prevents_sparse_chunk_files(tmp_path):
    s = _store(str(tmp_path / "s"))
    _steps(s, 3)
    st = os.stat(os.path.join(s.path, "chunks", "000000000000.obs.npy"))
    assert st.st_blocks * 512 >= st.st_size - npyfile.HEADER_BYTES  # space reserved, not a hole
    s.close()


def test_reopening_for_writing_on_a_full_disk_names_the_store(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    s, committed = _committed_store(path, 5)
    s.close()
    from mmreplay.core import restore

    obs = os.path.join(path, "chunks", "000000000000.obs.npy")
    os.chmod(obs, 0o444)  # (as a seal leaves a chunk's files: the writer copies it to write on)

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(restore, "copy_exclusive", full)
    with pytest.raises(mr.StoreIOError, match=f"opening {path} for writing: .*No space left.*mode='r'"):
        mr.ReplayStore.open(path)
    with mr.ReplayStore.open(path, mode="r") as r:  # reading needs no copy
        assert r.id_range == committed
    monkeypatch.undo()
    with mr.ReplayStore.open(path) as again:
        assert again.id_range == committed
        _steps(again, 3)
