"""The writer lock (storage.lock.take_lock): exclusive, never through a link, and a clear error saying to
open with mode="r" where the store cannot be written (issue 12, item 6)."""

from __future__ import annotations

import errno
import os

import pytest

import mmreplay as mr
from mmreplay.storage import lock as storage_lock
from tests._support.hostile import fill


@pytest.fixture
def store(tmp_path):
    fill(tmp_path / "a").close()
    return str(tmp_path / "a")


def test_a_linked_lock_file_is_not_followed(tmp_path, store):
    (tmp_path / "elsewhere").mkdir()
    os.unlink(os.path.join(store, "lock"))
    os.symlink(tmp_path / "elsewhere" / "created", os.path.join(store, "lock"))
    with pytest.raises(mr.CorruptStoreError, match="symbolic link"):
        storage_lock.take_lock(store)
    assert os.listdir(tmp_path / "elsewhere") == []


def _erofs_for_lock(monkeypatch, err=errno.EROFS):
    real = os.open

    def fake(path, flags, *a, **k):
        if os.fspath(path).endswith(os.sep + "lock"):
            raise OSError(err, os.strerror(err), path)
        return real(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", fake)


@pytest.mark.parametrize("err,words", [(errno.EROFS, "read-only"), (errno.EACCES, "permission")])
def test_lock_on_a_read_only_location_says_to_open_read_only(tmp_path, store, monkeypatch, err, words):
    _erofs_for_lock(monkeypatch, err)
    with pytest.raises(mr.ReadOnlyStoreError) as info:
        storage_lock.take_lock(store)
    assert "mode='r'" in str(info.value) and words in str(info.value)
    assert isinstance(info.value, PermissionError)


def test_lock_in_a_directory_without_write_permission(tmp_path, store):
    """A real permission denial: as root (who may write anywhere) the check runs in a child process that
    drops to an unprivileged user first."""
    os.chmod(store, 0o555)
    try:
        if os.geteuid() != 0:
            with pytest.raises(mr.ReadOnlyStoreError, match="mode='r'"):
                storage_lock.take_lock(store)
            return
        os.chmod(tmp_path, 0o755)
        pid = os.fork()
        if pid == 0:  # the child: become nobody, then try
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                try:
                    storage_lock.take_lock(store)
                except mr.ReadOnlyStoreError as exc:
                    code = 0 if "mode='r'" in str(exc) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "an unprivileged writer did not get ReadOnlyStoreError"
    finally:
        os.chmod(store, 0o755)


def test_lock_is_exclusive(tmp_path, store):
    fd = storage_lock.take_lock(store)
    try:
        with pytest.raises(mr.StoreLockedError, match="mode='r'"):
            storage_lock.take_lock(store)
    finally:
        storage_lock.release_lock(fd)
    storage_lock.release_lock(storage_lock.take_lock(store))


def test_open_for_writing_on_a_read_only_location(tmp_path, store, monkeypatch):
    _erofs_for_lock(monkeypatch)
    with pytest.raises(mr.ReadOnlyStoreError, match="mode='r'"):
        mr.ReplayStore.open(store, mode="r+")
    monkeypatch.undo()
    with mr.ReplayStore.open(store, mode="r") as r:
        assert len(r) > 0




def test_a_released_lock_is_forgotten_so_that_a_fork_never_closes_its_reused_descriptor_number(tmp_path, store):
    """Every descriptor take_lock opens is noted (a forked child closes those still on a lock file); closing a
    writer, or failing to take the lock, forgets it: the notes do not grow with every open, and a number the
    process reuses for another file is not taken for a lock."""
    before = dict(storage_lock._TAKEN)
    for _ in range(3):
        s = mr.ReplayStore.open(store)
        held = dict(storage_lock._TAKEN)
        assert len(held) == len(before) + 1
        with pytest.raises(mr.StoreLockedError):
            mr.ReplayStore.open(store)
        assert storage_lock._TAKEN == held
        s.close()
        assert storage_lock._TAKEN == before
