"""The single-writer lock of a store directory: an exclusive ``flock`` on its ``lock`` file."""

from __future__ import annotations

import errno
import fcntl
import os

from ..errors import ReadOnlyStoreError, StoreLockedError

LOCK = "lock"


def take_lock(path: str) -> int:
    """Take the writer lock of the store at ``path``; return the descriptor that holds it (close it to
    release). Raises ``StoreLockedError`` if another writer holds it, ``ReadOnlyStoreError`` if the
    directory cannot be written."""
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise ReadOnlyStoreError(
                f"{path}: cannot open the store for writing ({exc.strerror}: the directory is read-only or not"
                " yours); open it with mode='r' to read it") from None
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(
            f"{path} is already open for writing by another process (or another ReplayStore in this one);"
            " close it first, or open with mode='r' to read") from None
    return fd
