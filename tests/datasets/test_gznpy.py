"""GzNpy: gzip'd ``.npy`` files read as a stream, as Python's gzip and numpy read them."""

from __future__ import annotations

import gzip
import io
import re
import struct
import tracemalloc
import zlib

import numpy as np
import pytest

from mmreplay.datasets import DatasetError
from mmreplay.datasets._gznpy import _READ, GzNpy


def _npy(arr: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array(b, arr, allow_pickle=False)
    return b.getvalue()


def _stored(raw: bytes) -> bytes:
    """One gzip member holding ``raw`` uncompressed (its size is known exactly)."""
    c = zlib.compressobj(0, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(raw) + c.flush()


def _read(tmp_path, data: bytes) -> np.ndarray:
    p = tmp_path / "$store$_reward_ckpt.0.gz"
    p.write_bytes(data)
    with GzNpy(str(p), "$store$_reward") as gz:
        return gz.read_all()


def test_members_joined_as_cat_joins_them(tmp_path):
    arr = (np.arange(300_000, dtype=np.int64) * 7919) % 1000003
    npy = _npy(arr)
    data = gzip.compress(npy[:1000]) + gzip.compress(npy[1000:5000]) + gzip.compress(npy[5000:])
    np.testing.assert_array_equal(np.load(io.BytesIO(gzip.decompress(data))), arr)
    np.testing.assert_array_equal(_read(tmp_path, data), arr)


def test_a_member_ending_where_a_read_of_the_file_ends(tmp_path):
    arr = (np.arange(2 * _READ) % 251).astype(np.uint8)
    npy = _npy(arr)
    cut = _READ - (len(_stored(b"")) + (_READ // 65535 + 1) * 5)  # a stored block costs 5 bytes per 64 KiB
    while len(_stored(npy[:cut])) < _READ:
        cut += 1
    assert len(_stored(npy[:cut])) == _READ
    np.testing.assert_array_equal(_read(tmp_path, _stored(npy[:cut]) + _stored(npy[cut:])), arr)


def test_bytes_after_the_last_member_are_refused_unless_zero_padding(tmp_path):
    arr = np.arange(1000, dtype=np.int64)
    one = gzip.compress(_npy(arr))
    for tail in (b"\0" * 10, b"\0" * (_READ + 3)):  # padding, as Python's gzip reads it (also across reads)
        np.testing.assert_array_equal(_read(tmp_path, one + tail), arr)
    npy = _npy(arr)
    two = gzip.compress(npy[:500]) + b"\0" * 7 + gzip.compress(npy[500:])
    np.testing.assert_array_equal(np.load(io.BytesIO(gzip.decompress(two))), arr)
    np.testing.assert_array_equal(_read(tmp_path, two), arr)
    for tail in (b"garbage", b"\0" * 5 + b"x", b"\x1f"):
        with pytest.raises(gzip.BadGzipFile):
            gzip.decompress(one + tail)
        with pytest.raises(DatasetError, match=r"bytes after a gzip member that start no other.*damaged"):
            _read(tmp_path, one + tail)


def test_truncated_and_longer_streams_are_still_refused(tmp_path):
    npy = _npy(np.arange(1000, dtype=np.int64))
    with pytest.raises(DatasetError, match="truncated"):
        _read(tmp_path, gzip.compress(npy)[:-100])
    with pytest.raises(DatasetError, match="more data than its .npy header declares"):
        _read(tmp_path, gzip.compress(npy) + gzip.compress(b"\0" * 8))


def test_a_header_declaring_a_huge_length_is_refused_before_allocating_it(tmp_path):
    declared = 64 << 20
    header = b"{'descr': '|u1', 'fortran_order': False, 'shape': (10,), }"
    p = tmp_path / "$store$_observation_ckpt.0.gz"
    p.write_bytes(gzip.compress(b"\x93NUMPY\x02\x00" + struct.pack("<I", declared) + header))
    tracemalloc.start()
    try:
        with pytest.raises(DatasetError, match=re.escape(p.name) + f".*header declares {declared:,} bytes"):
            GzNpy(str(p), "$store$_observation")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < declared // 4
