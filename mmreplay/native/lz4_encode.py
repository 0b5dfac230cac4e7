# numba intrinsics (``copy``, ``load8`` ...) take a typing context first, which mypy sees as an argument:
# mypy: disable-error-code="call-arg,return-value,var-annotated,index"
"""LZ4 block codec for frames, encoding: every frame of a sealed chunk, one entry each (see ``lz4``).

Runs in the chunk sealer beside ``step()``, without the GIL.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

from ._mem import copy, load1, load8
from .crc32c import crc32c
from .lz4 import MIN_MATCH, decode_entry

LAST_LITERALS = 5  # the last 5 bytes of a block are literals
MF_LIMIT = 12  # no match starts in the last 12 bytes
MAX_OFFSET = 65535
HASH_BITS = 12
CHAIN_MASK = 65535  # positions in the match window (offsets are < 65536)
FAST_AFTER = 16  # misses in a row after which only the hash candidate is tried
# Shorter matches are left as literals. Each match is a sequence, and decoding time goes with the number of
# sequences: a 4- or 5-byte match saves 1-2 bytes over its literals (token and offset cost 3) but costs a
# whole sequence to decode. On the real Atari frames 6 decodes faster for a few more bytes (BENCHMARKS.md,
# "Figures behind the code").
SHORTEST = 6


@nb.njit(nogil=True, cache=True, inline="always")
def _u32(a: np.ndarray, i: int) -> int:
    return (np.int64(a[i]) | (np.int64(a[i + 1]) << 8) | (np.int64(a[i + 2]) << 16)
            | (np.int64(a[i + 3]) << 24))


@nb.njit(nogil=True, cache=True, inline="always")
def _put_length(dst: np.ndarray, op: int, n: int) -> int:
    """The extension bytes of a length whose nibble is 15 (``n`` = length - 15)."""
    while n >= 255:
        dst[op] = 255
        op += 1
        n -= 255
    dst[op] = n
    return op + 1


@nb.njit(nogil=True, cache=True)
def _emit(dst: np.ndarray, op: int, olimit: int, src: np.ndarray, lit: int, ll: int, off: int, ml: int) -> int:
    """Write one sequence (``off == 0``: the last, literals only); returns the new end, or -1 past ``olimit``."""
    need = 1 + ll + (ll // 255 + 1 if ll >= 15 else 0)
    if off:
        need += 2 + ((ml - MIN_MATCH) // 255 + 1 if ml - MIN_MATCH >= 15 else 0)
    if op + need > olimit:
        return -1
    tok_at = op
    op += 1
    tok = 0
    if ll >= 15:
        tok = 15 << 4
        op = _put_length(dst, op, ll - 15)
    else:
        tok = ll << 4
    copy(dst, op, src, lit, ll)
    op += ll
    if off:
        dst[op] = off & 0xFF
        dst[op + 1] = off >> 8
        op += 2
        m = ml - MIN_MATCH
        if m >= 15:
            tok |= 15
            op = _put_length(dst, op, m - 15)
        else:
            tok |= m
    dst[tok_at] = tok
    return op


@nb.njit(nogil=True, cache=True, inline="always")
def _common(src: np.ndarray, a: int, b: int, most: int) -> int:
    """How many bytes from ``a`` and from ``b`` are equal, up to ``most`` (8 compared at a time)."""
    n = 0
    while n + 8 <= most:
        x = load8(src, a + n) ^ load8(src, b + n)
        if x:
            return n + (trailing_zeros(x) >> 3)
        n += 8
    while n < most and load1(src, a + n) == load1(src, b + n):
        n += 1
    return n


@nb.njit(nogil=True, cache=True)
def encode_block(src: np.ndarray, s: int, n: int, dst: np.ndarray, op: int, olimit: int, table: np.ndarray,
                 row: int, chain: np.ndarray, depth_max: int) -> int:
    """LZ4-encode ``src[s:s + n]`` into ``dst[op:]``; returns the end, or -1 if it would pass ``olimit``.

    Greedy matching, the longest of these candidates wins: up to ``depth_max`` earlier positions with
    the same 4-byte hash (``table`` holds the latest absolute position in ``src`` per hash, ``chain``
    the one before each position; positions before ``s`` are ignored, so neither needs clearing
    between frames), the same place one image row up (``row`` bytes back; 0: none) and the previous
    match's offset. Longer matches mean fewer sequences, and the number of sequences is what decoding
    time goes with: on the real Atari frames, depth 4 plus the row candidate decodes faster and shrinks
    more than one hash candidate, for a little more encoding time (BENCHMARKS.md, "Figures behind the
    code"). After misses the
    search skips ahead faster and looks at one candidate only, as LZ4's fast mode does, and a frame
    not 1/16 smaller half-way through is given up (stored as it is): incompressible frames cost little.
    """
    anchor = 0
    if n > MF_LIMIT:
        ilimit = n - MF_LIMIT  # a match starts before this
        mlimit = n - LAST_LITERALS  # and ends at or before this
        shift = 32 - HASH_BITS
        ip = 0
        misses = 0
        last = 0
        op0 = op
        half = n >> 1
        judged = False
        while ip < ilimit:
            p = s + ip
            most = mlimit - ip
            seq = _u32(src, p)
            h = ((seq * 2654435761) & 0xFFFFFFFF) >> shift
            cand = table[h]
            table[h] = p
            chain[p & CHAIN_MASK] = cand
            best = 0
            off = 0
            depth = 0
            deep = depth_max if misses < FAST_AFTER else 1  # in data that does not match, look less
            while cand >= s and p - cand <= MAX_OFFSET and depth < deep:
                if _u32(src, cand) == seq and (best == 0 or load1(src, cand + best) == load1(src, p + best)):
                    length = MIN_MATCH + _common(src, p + MIN_MATCH, cand + MIN_MATCH, most - MIN_MATCH)
                    if length > best:
                        best = length
                        off = p - cand
                        if best >= most:
                            break
                nxt = chain[cand & CHAIN_MASK]
                if nxt >= cand:
                    break
                cand = nxt
                depth += 1
            for other in (row, last):
                # a candidate can only be longer if it also matches the byte where the best one stops
                if (misses < FAST_AFTER and other and other != off and other <= ip and other <= MAX_OFFSET and best < most
                        and _u32(src, p - other) == seq
                        and (best == 0 or load1(src, p - other + best) == load1(src, p + best))):
                    length = MIN_MATCH + _common(src, p + MIN_MATCH, p - other + MIN_MATCH, most - MIN_MATCH)
                    if length > best:
                        best = length
                        off = other
            if best >= SHORTEST:
                cand = p - off
                while ip > anchor and cand > s and load1(src, s + ip - 1) == load1(src, cand - 1):
                    ip -= 1
                    cand -= 1
                    best += 1
                op = _emit(dst, op, olimit, src, s + anchor, ip - anchor, off, best)
                if op < 0:
                    return -1
                ip += best
                anchor = ip
                last = off
                misses = 0
                if ip - 2 < ilimit:
                    h = ((_u32(src, s + ip - 2) * 2654435761) & 0xFFFFFFFF) >> shift
                    chain[(s + ip - 2) & CHAIN_MASK] = table[h]
                    table[h] = s + ip - 2
            else:
                misses += 1
                ip += 1 + (misses >> 6)
                if ip >= half and not judged:
                    # half-way and not even 1/16 smaller (output so far plus the literals pending):
                    # give up, the frame is stored as it is
                    judged = True
                    if (op - op0) + (ip - anchor) > ip - (ip >> 4):
                        return -1
    return _emit(dst, op, olimit, src, s + anchor, n - anchor, 0, 0)


@nb.njit(nogil=True, cache=True)
def encode_frames(src: np.ndarray, count: int, fb: int, dst: np.ndarray, data_start: int, records: np.ndarray,
                  row: int = 0, depth: int = 4) -> int:
    """Encode ``count`` frames of ``fb`` bytes (``src``, 1-D) into ``dst`` from ``data_start``, one entry each.

    ``records`` (count, 2) int64 receives each entry's offset and ``length | crc32c << 32``. An entry is
    the raw frame when LZ4 does not make it smaller. Returns the end of the data. ``dst`` must hold
    ``data_start + count * fb`` bytes.
    """
    table = np.full(1 << HASH_BITS, -1, np.int64)
    chain = np.full(CHAIN_MASK + 1, -1, np.int64)
    dp = data_start
    for i in range(count):
        s = i * fb
        end = encode_block(src, s, fb, dst, dp + 4, dp + fb - 1, table, row, chain, depth)
        if end < 0:
            copy(dst, dp, src, s, fb)
            length = fb
        else:
            dst[dp] = fb & 0xFF
            dst[dp + 1] = (fb >> 8) & 0xFF
            dst[dp + 2] = (fb >> 16) & 0xFF
            dst[dp + 3] = (fb >> 24) & 0xFF
            length = end - dp
        records[i, 0] = dp
        records[i, 1] = length | (crc32c(dst, dp, length) << 32)
        dp += length
    return dp


@nb.njit(nogil=True, cache=True)
def check_frames(src: np.ndarray, count: int, fb: int, enc: np.ndarray, records: np.ndarray, every: int = 1) -> int:
    """Decode every ``every``-th entry of ``enc`` (and the last) and compare it with the frame it came
    from: -1 if all equal, else the first frame that differs (a guard against an encoder bug reaching
    the disk)."""
    buf = np.empty(fb, np.uint8)
    for i in range(count):
        if i % every and i != count - 1:
            continue
        meta = records[i, 1]
        if decode_entry(enc, records[i, 0], meta & 0xFFFFFFFF, (meta >> 32) & 0xFFFFFFFF, buf, 0, fb):
            return i
        s = i * fb
        j = 0
        while j + 8 <= fb:
            if load8(buf, j) != load8(src, s + j):
                return i
            j += 8
        while j < fb:
            if buf[j] != src[s + j]:
                return i
            j += 1
    return -1
