"""Chunk column files: plain ``.npy`` (format 1.0) with a page-sized header.

The header is padded with spaces and ends with a newline, exactly ``HEADER_BYTES``
(4096) in all, so the array data starts on a page boundary: the file can then be
mapped at any page of a larger virtual range (see ``vmem``).
``numpy.load(path, mmap_mode="r")`` reads these files like any other ``.npy``;
``read_header`` accepts no other padding byte, since numpy refuses some that
Python's parser would let through (a damaged header is reported here, naming the
file, not by whoever loads the file later).
"""

from __future__ import annotations

import ast
import functools
import os

import numpy as np

from ..errors import CorruptStoreError

HEADER_BYTES = 4096
_MAGIC = b"\x93NUMPY\x01\x00"


@functools.lru_cache(maxsize=64)
def header_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The 4096-byte ``.npy`` 1.0 header for a C-ordered array."""
    descr = np.lib.format.dtype_to_descr(dtype)
    d = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    body_len = HEADER_BYTES - len(_MAGIC) - 2
    body = d.encode("latin1")
    body = body + b" " * (body_len - len(body) - 1) + b"\n"
    return _MAGIC + body_len.to_bytes(2, "little") + body


def create(path: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """Create a new file (a new inode: an existing file is unlinked first) with its space reserved.

    The data region is allocated with ``posix_fallocate`` so that a full disk is
    an ``OSError`` here and never a SIGBUS when the mapped pages are written.
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    try:
        os.unlink(path)  # a hard-linked snapshot copy must never be written through
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.pwrite(fd, header_bytes(dtype, shape), 0)
        if nbytes:
            os.posix_fallocate(fd, HEADER_BYTES, nbytes)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    os.close(fd)


def read_header(path: str, fd: int | None = None) -> tuple[np.dtype, tuple[int, ...]]:
    """Parse and check a chunk file header (from ``fd`` if given); raise ``CorruptStoreError`` naming the file."""
    try:
        if fd is None:
            with open(path, "rb") as f:
                head = f.read(HEADER_BYTES)
        else:
            head = os.pread(fd, HEADER_BYTES, 0)
    except FileNotFoundError:
        raise CorruptStoreError(f"{path}: chunk file is missing") from None
    if len(head) < HEADER_BYTES or head[:8] != _MAGIC:
        raise CorruptStoreError(f"{path}: not an mmreplay chunk file (bad .npy header)")
    n = int.from_bytes(head[8:10], "little")
    if 10 + n != HEADER_BYTES:
        raise CorruptStoreError(f"{path}: header is {10 + n} bytes, expected {HEADER_BYTES}")
    text = head[10:-1].rstrip(b" ")  # the dictionary: padded with spaces, then the final newline
    if head[-1:] != b"\n" or text[:1] != b"{" or text[-1:] != b"}":
        at = HEADER_BYTES - 1 if head[-1:] != b"\n" else 10 if text[:1] != b"{" else 10 + len(text) - 1
        raise CorruptStoreError(f"{path}: damaged .npy header: byte {at} holds {head[at]:#04x}, expected the"
                                " header's dictionary padded with spaces (0x20) and ending in a newline (0x0a)")
    try:
        d = ast.literal_eval(text.decode("latin1"))
        dtype = np.lib.format.descr_to_dtype(d["descr"])
        shape = tuple(int(v) for v in d["shape"])
        if d["fortran_order"]:
            raise ValueError("fortran order")
    except Exception as exc:  # any parse problem means a damaged header
        raise CorruptStoreError(f"{path}: unreadable .npy header ({exc})") from None
    return dtype, shape


def map_data(path: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The data of a chunk file that ``check`` accepted, mapped read-only at ``HEADER_BYTES`` (the header is
    not parsed again: the manifest's dtype and shape are the file's)."""
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=shape)


def check(path: str, dtype: np.dtype, shape: tuple[int, ...], fd: int | None = None) -> None:
    """Check header and size of an existing chunk file against what the manifest says.

    With ``fd`` (an open descriptor of ``path``) everything is read from that file, so a concurrent
    unlink or replace of the path cannot make the check and a later mapping disagree.
    """
    if fd is None or os.pread(fd, HEADER_BYTES, 0) != header_bytes(dtype, shape):
        got_dtype, got_shape = read_header(path, fd)  # not our exact header bytes: parse to say why
        if (got_dtype, got_shape) != (dtype, shape):
            raise CorruptStoreError(
                f"{path}: holds {got_dtype}{list(got_shape)}, the manifest expects {dtype}{list(shape)}")
    want = HEADER_BYTES + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    try:
        size = os.fstat(fd).st_size if fd is not None else os.stat(path).st_size
    except FileNotFoundError:
        raise CorruptStoreError(f"{path}: chunk file is missing") from None
    if size != want:
        raise CorruptStoreError(f"{path}: file is {size} bytes, expected {want} (truncated or extended)")
