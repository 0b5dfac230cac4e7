"""Durable file writes: the one place that knows how a file or a directory entry is made durable.

``write_atomic`` replaces a file so that a crash leaves the old or the new one (temp file in the same
directory, fsync, ``os.replace``, fsync the directory); ``fsync_file``/``fsync_dir`` make an existing
file's data or a directory's entries durable.
"""

from __future__ import annotations

import io
import os
import zlib

import numpy as np


def fsync_file(path: str) -> None:
    """Make a file's data (and metadata) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make a directory's entries (creations, renames, deletions) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes | memoryview) -> int:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file.

    Returns the CRC-32 of ``data`` (what a manifest records to check the file later)."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)
    return zlib.crc32(data)


def write_npy_atomic(path: str, array: np.ndarray) -> int:
    """``write_atomic`` of an array as a plain ``.npy`` file (never pickled); returns its CRC-32."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return write_atomic(path, buf.getbuffer())
