# numba intrinsics (``copy``, ``load8`` ...) take a typing context first, which mypy sees as an argument:
# mypy: disable-error-code="call-arg,return-value,var-annotated,index"
"""CRC-32C (Castagnoli: what ``google_crc32c.value`` computes) for the frame kernels, without the GIL.

x86-64 computes it with the SSE4.2 instruction; elsewhere slicing-by-8 tables. The frame files checksum
every stored entry with it, checked before every decode, so it must cost a small part of a decode
(BENCHMARKS.md, "Figures behind the code").
"""

from __future__ import annotations

import platform

import numba as nb
import numpy as np

from ._mem import crc32c_u8, crc32c_u64, load1, load8


def _crc_tables() -> np.ndarray:
    """Slicing-by-8 tables of CRC-32C (reflected Castagnoli polynomial 0x82F63B78)."""
    t = np.zeros((8, 256), np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        t[0, i] = c
    for i in range(256):
        for k in range(1, 8):
            t[k, i] = (int(t[k - 1, i]) >> 8) ^ int(t[0, int(t[k - 1, i]) & 0xFF])
    return t


CRC_TABLES = _crc_tables()


def _has_sse42() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        from llvmlite import binding

        return bool(binding.get_host_cpu_features().get("sse4.2", False))
    except Exception:  # an llvmlite that cannot tell: use the tables
        return False


HARDWARE_CRC = _has_sse42()


@nb.njit(nogil=True, cache=True)
def _crc32c_tables(buf: np.ndarray, start: int, length: int) -> int:
    t = CRC_TABLES
    c = np.int64(0xFFFFFFFF)
    i = start
    end = start + length
    while i + 8 <= end:
        a = c ^ (load8(buf, i) & 0xFFFFFFFF)
        c = (np.int64(t[7, a & 0xFF]) ^ np.int64(t[6, (a >> 8) & 0xFF]) ^ np.int64(t[5, (a >> 16) & 0xFF])
             ^ np.int64(t[4, (a >> 24) & 0xFF]) ^ np.int64(t[3, load1(buf, i + 4)])
             ^ np.int64(t[2, load1(buf, i + 5)]) ^ np.int64(t[1, load1(buf, i + 6)])
             ^ np.int64(t[0, load1(buf, i + 7)]))
        i += 8
    while i < end:
        c = np.int64(t[0, (c ^ load1(buf, i)) & 0xFF]) ^ (c >> 8)
        i += 1
    return c ^ 0xFFFFFFFF


@nb.njit(nogil=True, cache=True)
def _crc32c_sse42(buf: np.ndarray, start: int, length: int) -> int:
    c = np.int64(0xFFFFFFFF)
    i = start
    end = start + length
    while i + 8 <= end:
        c = crc32c_u64(c, load8(buf, i))
        i += 8
    while i < end:
        c = crc32c_u8(c, load1(buf, i))
        i += 1
    return (c ^ 0xFFFFFFFF) & 0xFFFFFFFF


crc32c = _crc32c_sse42 if HARDWARE_CRC else _crc32c_tables
"""CRC-32C of ``buf[start:start + length]``."""
