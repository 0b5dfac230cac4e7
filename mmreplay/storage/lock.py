"""The single-writer lock: an exclusive ``flock(2)`` on the file ``lock`` in the store directory.

Taking it is the first write ``open(mode="r+")`` makes, so it is also where a store that cannot be
written at all (a read-only file system, a directory without write permission) is recognised: that
is a ``ReadOnlyStoreError`` saying to open with ``mode="r"``, not a raw ``OSError`` about ``lock``.
"""

from __future__ import annotations

import errno
import fcntl
import os

from ..errors import CorruptStoreError, ReadOnlyStoreError, StoreLockedError

LOCK = "lock"

_CANNOT_WRITE = {
    errno.EROFS: "its file system is mounted read-only",
    errno.EACCES: "this process may not write there (permissions)",
    errno.EPERM: "this process may not write there (permissions)",
}


def take_lock(path: str) -> int:
    """Take the writer lock of the store at ``path``; return the descriptor that holds it (close it to release).

    Raises ``StoreLockedError`` when another writer holds it, ``ReadOnlyStoreError`` when the store
    cannot be written (read-only file system, no write permission), ``CorruptStoreError`` when
    ``lock`` is a symbolic link (it is never followed: the lock file is created inside the store only).
    """
    lock = os.path.join(path, LOCK)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
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
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(
            f"{path} is already open for writing by another process (or another ReplayStore in this one);"
            " close it first, or open with mode='r' to read") from None
    except BaseException:
        os.close(fd)
        raise
    return fd
