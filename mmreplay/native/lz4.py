# numba intrinsics (``copy``, ``load8`` ...) take a typing context first, which mypy sees as an argument:
# mypy: disable-error-code="call-arg,return-value,var-annotated,index"
"""LZ4 block codec for frames: encode a sealed chunk's frames, decode a batch's frames into its output.

Written from the LZ4 block format description (lz4_Block_format.md of the LZ4 project); no code of the
reference implementation or of its bindings is used. A *block* is a run of *sequences*::

    token  [literal length bytes]  literals  offset (2 bytes, little-endian)  [match length bytes]

The token's high nibble is the literal count (15: add following bytes until one is not 255), its low
nibble the match length minus 4 (same extension). The match copies ``length`` bytes starting
``offset`` bytes back in the output (it may overlap its own output: offset 1 repeats one byte). The
last sequence has literals only and ends the block. Encoders keep the last 5 bytes literal and start
no match in the last 12 bytes (decoders of other implementations rely on it; ours does not).

A stored frame *entry* is either the frame's bytes as they are (``length == frame_bytes``: it did not
shrink), or numcodecs' LZ4 framing: the frame size as 4 bytes little-endian, then one LZ4 block (what
``numcodecs.LZ4().decode`` and ``lz4.block.decompress`` read). Each entry carries the CRC-32C of its
stored bytes, checked before it is decoded: a damaged file is an error, never wrong frames. (CRC-32C,
not zlib's CRC-32: x86-64 computes it in hardware, ~8 bytes per cycle, so checking costs ~5% of a
decode; ``google_crc32c.value`` computes the same.)

Every kernel runs without the GIL (``nogil=True``): the chunk sealer encodes beside ``step()``, and a
batch is decoded by several threads at once. (Not ``parallel=True``: numba's workqueue threading layer
aborts when two Python threads enter parallel code at once, and the prefetch and main threads both
read.) Kernels are compiled on first use and cached on disk.
"""

from __future__ import annotations

import platform

import numba as nb
import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

from ._mem import copy, copy16, crc32c_u8, crc32c_u64, fill, load1, load8, prefetch, store1, store8
from .codes import E_CHECKSUM, E_RECORD, E_SIZE, E_STREAM, E_UNMAPPED, KIND_LZ4, KIND_RAW

MIN_MATCH = 4
LAST_LITERALS = 5  # the last 5 bytes of a block are literals
MF_LIMIT = 12  # no match starts in the last 12 bytes
MAX_OFFSET = 65535
HASH_BITS = 12
CHAIN_MASK = 65535  # positions in the match window (offsets are < 65536)


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
"""CRC-32C (Castagnoli; what ``google_crc32c.value`` computes) of ``buf[start:start + length]``."""


# -- decoding ------------------------------------------------------------------------------------------
@nb.njit(nogil=True, cache=True)
def decode_block(src: np.ndarray, ip: int, iend: int, out: np.ndarray, o0: int, oend: int) -> int:
    """Decode the LZ4 block ``src[ip:iend]`` into exactly ``out[o0:oend]``; returns 0, or ``E_STREAM``.

    Every read and write is checked against these bounds, whatever the input holds. Copies move 16 or 8
    bytes at a time and may write up to 15 bytes beyond what they need when there is room before
    ``oend`` (never past it): what follows overwrites them, so a block decodes the same wherever its
    output lies.
    """
    op = o0
    while True:
        if ip >= iend:
            return E_STREAM
        token = load1(src, ip)
        ip += 1
        # literals
        ll = token >> 4
        if ll < 15 and iend - ip >= 16 and oend - op >= 16:
            copy16(out, op, src, ip)
        else:
            if ll == 15:
                while True:
                    if ip >= iend:
                        return E_STREAM
                    b = load1(src, ip)
                    ip += 1
                    ll += b
                    if b != 255:
                        break
            if ll > iend - ip or ll > oend - op:
                return E_STREAM
            copy(out, op, src, ip, ll)
        ip += ll
        op += ll
        if ip == iend:  # the last sequence: literals only
            return 0 if op == oend else E_STREAM
        # match
        if iend - ip < 2:
            return E_STREAM
        off = load1(src, ip) | (load1(src, ip + 1) << 8)
        ip += 2
        ml = token & 15
        if ml < 15 and off >= 16 and off <= op - o0 and oend - op >= 32:
            # the common case (a short match from at least 16 bytes back): two 16-byte copies, the
            # second reading bytes the first made final
            copy16(out, op, out, op - off)
            copy16(out, op + 16, out, op - off + 16)
            op += ml + MIN_MATCH
            continue
        if ml == 15:
            while True:
                if ip >= iend:
                    return E_STREAM
                b = load1(src, ip)
                ip += 1
                ml += b
                if b != 255:
                    break
        ml += MIN_MATCH
        if off == 0 or off > op - o0 or ml > oend - op:
            return E_STREAM
        s = op - off
        if off >= 16 and oend - op - ml >= 16:  # 16-byte steps, each reading bytes already final
            j = 0
            while j < ml:
                copy16(out, op + j, out, s + j)
                j += 16
        elif off >= 8:  # 8-byte steps, each reading bytes already final
            j = 0
            while j < ml:
                if oend - op - j >= 8:
                    store8(out, op + j, load8(out, s + j))
                    j += 8
                else:
                    store1(out, op + j, load1(out, s + j))
                    j += 1
        elif off == 1:  # a run of one byte
            if ml <= 16 and oend - op >= 16:
                v = load1(out, s) * 0x0101010101010101
                store8(out, op, v)
                store8(out, op + 8, v)
            else:
                fill(out, op, load1(out, s), ml)
        else:  # a short pattern: write one period of >= 16 bytes, then copy 16 bytes from that far back
            period = off * ((16 + off - 1) // off)
            first = min(period, ml)
            for j in range(first):
                store1(out, op + j, load1(out, s + j))
            j = first
            while j < ml:
                if oend - op - j >= 16:
                    copy16(out, op + j, out, op + j - period)
                    j += 16
                else:
                    store1(out, op + j, load1(out, op + j - period))
                    j += 1
        op += ml


@nb.njit(nogil=True, cache=True)
def decode_entry(src: np.ndarray, start: int, length: int, crc: int, out: np.ndarray, o0: int, fb: int) -> int:
    """Check one stored entry's CRC-32 and decode it into ``out[o0:o0 + fb]``; 0 or an error code."""
    if crc32c(src, start, length) != crc:
        return E_CHECKSUM
    if length == fb:  # stored as it was
        copy(out, o0, src, start, fb)
        return 0
    if length < 5:
        return E_SIZE
    size = (np.int64(src[start]) | (np.int64(src[start + 1]) << 8) | (np.int64(src[start + 2]) << 16)
            | (np.int64(src[start + 3]) << 24))
    if size != fb:
        return E_SIZE
    return decode_block(src, start + 4, start + length, out, o0, o0 + fb)


@nb.njit(nogil=True, cache=True)
def _frame(slot: int, out: np.ndarray, o0: int, raw: np.ndarray, comp: np.ndarray, comp64: np.ndarray,
           kind: np.ndarray, table: np.ndarray, data_end: np.ndarray, rows_alloc: int, cstride: int, fb: int) -> int:
    """Frame ``slot`` of the ring into ``out[o0:o0 + fb]``: copied from the raw column or decoded."""
    pos = slot // rows_alloc
    if slot < 0 or pos >= kind.size:
        return E_UNMAPPED
    k = kind[pos]
    if k == KIND_RAW:
        copy(out, o0, raw, slot * fb, fb)
        return 0
    if k != KIND_LZ4:
        return E_UNMAPPED
    base = pos * cstride
    rec = (base + table[pos]) // 8 + 2 * (slot - pos * rows_alloc)
    start = comp64[rec]
    meta = comp64[rec + 1]
    length = meta & 0xFFFFFFFF
    crc = (meta >> 32) & 0xFFFFFFFF
    # the entry must lie inside this file's data region (a damaged table must not read elsewhere)
    if start < table[pos] or length < 1 or length > fb or start > data_end[pos] - length:
        return E_RECORD
    return decode_entry(comp, base + start, length, crc, out, o0, fb)


@nb.njit(nogil=True, cache=True)
def _prefetch_row(obs_slots: np.ndarray, next_slots: np.ndarray, r: int, comp: np.ndarray, comp64: np.ndarray,
                  kind: np.ndarray, table: np.ndarray, rows_alloc: int, cstride: int) -> None:
    k = obs_slots.shape[1]
    for j in range(2 * k):
        slot = obs_slots[r, j] if j < k else next_slots[r, j - k]
        pos = slot // rows_alloc
        if slot < 0 or pos >= kind.size or kind[pos] != KIND_LZ4:
            continue
        base = pos * cstride
        rec = base + table[pos] + 16 * (slot - pos * rows_alloc)
        start = comp64[rec // 8]  # a read, not a hint: the record is needed now to know where to hint
        if 0 <= start < cstride:
            prefetch(comp, base + start)
            prefetch(comp, base + start + 64)


@nb.njit(nogil=True, cache=True)
def gather_pairs(obs_slots: np.ndarray, next_slots: np.ndarray, r0: int, r1: int, out: np.ndarray,
                 raw: np.ndarray, comp: np.ndarray, comp64: np.ndarray, kind: np.ndarray, table: np.ndarray,
                 data_end: np.ndarray, rows_alloc: int, cstride: int, fb: int) -> tuple[int, int]:
    """Rows ``r0 .. r1-1`` of a batch: ``obs_slots``/``next_slots`` (B, k) frames into ``out`` (2, B, k, fb)
    flattened. A ``next_obs`` frame that is also one of the row's ``obs`` frames (``k - m`` of them) is
    copied from there instead of being decoded again. Returns ``(0, 0)`` or ``(error code, slot)``."""
    b, k = obs_slots.shape
    for r in range(r0, r1):  # every record first: no load waits on another
        for j in range(2 * k):
            slot = obs_slots[r, j] if j < k else next_slots[r, j - k]
            pos = slot // rows_alloc
            if 0 <= slot and pos < kind.size and kind[pos] == KIND_LZ4:
                prefetch(comp, pos * cstride + table[pos] + 16 * (slot - pos * rows_alloc))
    for r in range(r0, r1):
        if r + 1 < r1:  # the next row's entries: their cache misses overlap this row's work
            _prefetch_row(obs_slots, next_slots, r + 1, comp, comp64, kind, table, rows_alloc, cstride)
        for j in range(k):
            slot = obs_slots[r, j]
            err = _frame(slot, out, (r * k + j) * fb, raw, comp, comp64, kind, table, data_end, rows_alloc,
                         cstride, fb)
            if err:
                return err, slot
        for j in range(k):
            slot = next_slots[r, j]
            o0 = ((b + r) * k + j) * fb
            same = -1
            for i in range(k):
                if obs_slots[r, i] == slot:
                    same = i
                    break
            if same >= 0:
                copy(out, o0, out, (r * k + same) * fb, fb)
                continue
            err = _frame(slot, out, o0, raw, comp, comp64, kind, table, data_end, rows_alloc, cstride, fb)
            if err:
                return err, slot
    return 0, 0


@nb.njit(nogil=True, cache=True)
def gather(slots: np.ndarray, out: np.ndarray, raw: np.ndarray, comp: np.ndarray, comp64: np.ndarray,
           kind: np.ndarray, table: np.ndarray, data_end: np.ndarray, rows_alloc: int, cstride: int, fb: int) -> tuple[int, int]:
    """Frames ``slots`` (1-D) into ``out`` (len(slots) * fb bytes). Returns ``(0, 0)`` or ``(error, slot)``."""
    for i in range(slots.size):
        err = _frame(slots[i], out, i * fb, raw, comp, comp64, kind, table, data_end, rows_alloc, cstride, fb)
        if err:
            return err, slots[i]
    return 0, 0


# -- encoding ------------------------------------------------------------------------------------------
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
    time goes with: on the real Atari frames, depth 4 plus the row candidate decodes ~20-30% faster
    and shrinks ~5-15% more than one hash candidate, for ~10% more encoding time. After misses the
    search skips ahead faster, as LZ4's fast mode does, so incompressible data costs little.
    """
    anchor = 0
    if n > MF_LIMIT:
        ilimit = n - MF_LIMIT  # a match starts before this
        mlimit = n - LAST_LITERALS  # and ends at or before this
        shift = 32 - HASH_BITS
        ip = 0
        misses = 0
        last = 0
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
            while cand >= s and p - cand <= MAX_OFFSET and depth < depth_max:
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
                if (other and other != off and other <= ip and other <= MAX_OFFSET and best < most
                        and _u32(src, p - other) == seq
                        and (best == 0 or load1(src, p - other + best) == load1(src, p + best))):
                    length = MIN_MATCH + _common(src, p + MIN_MATCH, p - other + MIN_MATCH, most - MIN_MATCH)
                    if length > best:
                        best = length
                        off = other
            if best:
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
def check_frames(src: np.ndarray, count: int, fb: int, enc: np.ndarray, records: np.ndarray) -> int:
    """Decode every entry of ``enc`` and compare with the frames it came from: -1 if all equal, else the
    first frame that differs (a guard against an encoder bug ever reaching the disk)."""
    buf = np.empty(fb, np.uint8)
    for i in range(count):
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
