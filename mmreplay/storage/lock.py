"""The single-writer lock: an exclusive ``flock(2)`` on the file ``lock`` in the store directory.

Taking it is the first write ``open(mode="r+")`` makes, so it is also where a store that cannot be
written at all (a read-only file system, a directory without write permission) is recognised: that
is a ``ReadOnlyStoreError`` saying to open with ``mode="r"``, not a raw ``OSError`` about ``lock``.

A forked child never holds the lock: ``flock(2)`` belongs to the open file, which the child's copy of the
descriptor shares, so the lock would outlive the parent's ``close()`` for as long as the child lives. Every
descriptor ``take_lock`` returns is noted as soon as it is opened, and the child closes each one that still
refers to its lock file (one a store was still opening when another thread forked included: the store is
not yet among those ``store.py``'s at-fork hook knows).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading

from ..errors import CorruptStoreError, ReadOnlyStoreError, StoreLockedError

LOCK = "lock"

_CANNOT_WRITE = {
    errno.EROFS: "its file system is mounted read-only",
    errno.EACCES: "this process may not write there (permissions)",
    errno.EPERM: "this process may not write there (permissions)",
}

# descriptor -> (device, inode) of the lock file it was opened on, for every descriptor take_lock opened and
# release_lock has not closed (a forked child closes a descriptor only while it is still on its lock file)
_TAKEN: dict[int, tuple[int, int]] = {}
_TAKING = threading.RLock()  # held from opening a descriptor to noting it, and across a fork (re-entrant: a
# store dropped unclosed may be released by the garbage collector while this thread holds it)


def take_lock(path: str) -> int:
    """Take the writer lock of the store at ``path``; return the descriptor that holds it (``release_lock`` releases it).

    Raises ``StoreLockedError`` when another writer holds it, ``ReadOnlyStoreError`` when the store
    cannot be written (read-only file system, no write permission), ``CorruptStoreError`` when
    ``lock`` is a symbolic link (it is never followed: the lock file is created inside the store only).
    """
    lock = os.path.join(path, LOCK)
    with _TAKING:
        fd = _open(path, lock)
        st = os.fstat(fd)
        _TAKEN[fd] = (st.st_dev, st.st_ino)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        release_lock(fd)
        raise StoreLockedError(
            f"{path} is already open for writing by another process (or another ReplayStore in this one);"
            " close it first, or open with mode='r' to read") from None
    except BaseException:
        release_lock(fd)
        raise
    return fd


def release_lock(fd: int) -> None:
    """Close a descriptor ``take_lock`` returned (the lock goes with it)."""
    with _TAKING:
        _TAKEN.pop(fd, None)
        os.close(fd)


def _open(path: str, lock: str) -> int:
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno in _CANNOT_WRITE:
            raise ReadOnlyStoreError(
                f"{path}: cannot open the store for writing (mode='r+'): {_CANNOT_WRITE[exc.errno]}"
                f" ({exc.strerror} on {lock}); open it with mode='r' to read and sample, or copy it to a"
                " writable place to continue writing") from None
        if exc.errno == errno.ELOOP:
            raise CorruptStoreError(f"{lock}: is a symbolic link; a store's lock is a plain file inside it."
                                    " Remove the link (the next writer creates the file)") from None
        raise


def _file_of(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _after_fork_in_child() -> None:
    for fd, file in _TAKEN.items():
        if _file_of(fd) == file:
            os.close(fd)
    _TAKEN.clear()
    _TAKING.release()


os.register_at_fork(before=_TAKING.acquire, after_in_parent=_TAKING.release, after_in_child=_after_fork_in_child)
