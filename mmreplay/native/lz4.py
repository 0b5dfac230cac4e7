# numba intrinsics (``copy``, ``load8`` ...) take a typing context first, which mypy sees as an argument:
# mypy: disable-error-code="call-arg,return-value,var-annotated,index"
"""LZ4 block codec for frames, decoding: a batch's frames decoded (or copied) straight into its output.

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
not zlib's CRC-32: x86-64 computes it in hardware, so checking costs a small part of a decode;
``google_crc32c.value`` computes the same.)

Every kernel runs without the GIL (``nogil=True``): the chunk sealer encodes beside ``step()``, and a
batch is decoded by several threads at once. (Not ``parallel=True``: numba's workqueue threading layer
aborts when two Python threads enter parallel code at once, and the prefetch and main threads both
read.) Kernels are compiled on first use and cached on disk. The encoder is in ``lz4_encode``.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ._mem import copy, copy16, copy_streaming, load1, load8, prefetch, store1, store16, store_fence
from .codes import E_CHECKSUM, E_RECORD, E_SIZE, E_STREAM, E_UNMAPPED, KIND_LZ4, KIND_RAW
from .crc32c import crc32c

MIN_MATCH = 4
# A long match whose source is less than this far behind reads, past its first FAR bytes, from a whole
# number of periods >= FAR bytes back: a 16-byte load from just behind the output would straddle two
# stores still in flight, which the CPU cannot forward (a stall at every step): frames with long runs of
# short patterns (Pong's) decode much faster this way (BENCHMARKS.md, "Figures behind the code").
FAR = 64
# Outputs from this size on have their raw frames copied with non-temporal stores (``streams``): larger than
# the last-level cache share a core can count on, where plain stores measured slower (BENCHMARKS.md,
# "Figures behind the code").
STREAM_BYTES = 16 * 2**20


# For a match ``off`` < 16 bytes back (tables: no division in the loop): the factor that repeats a pattern of
# ``off`` < 8 bytes (in the low bytes of a word) over a word, ``8 % off``, and the multiple of ``off`` <= 16.
_REPEAT = np.array([0, 0x0101010101010101, 0x0001000100010001, 0x0001000001000001, 0x0000000100000001,
                    0x0000010000000001, 0x0001000000000001, 0x0100000000000001], np.int64)
_REST8 = np.array([0, 0, 0, 2, 0, 3, 2, 1], np.int64)
_STEP = np.array([0, 16, 16, 15, 16, 15, 12, 14, 16, 9, 10, 11, 12, 13, 14, 15], np.int64)


@nb.njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _repeat(out: np.ndarray, op: int, off: int, n: int) -> int:
    """Write the first ``n`` or more bytes of a match ``off`` < 16 bytes back, up to ``n + 15``: the
    pattern's first 16 bytes are built in two words from the ``off`` bytes behind ``op`` and stored every
    multiple of ``off`` <= 16 bytes. Stores only, no load of what was just stored (a load overlapping a
    store still in flight waits for it). Returns how many bytes from ``op`` are final (>= n)."""
    if off <= 2:  # (byte loads: a wider one overlapping two stores still in flight waits for both)
        v = (load1(out, op - 1) if off == 1 else load1(out, op - 2) | (load1(out, op - 1) << 8)) * _REPEAT[off]
        w = v
    elif off < 8:  # (bytes past the pattern are read and masked off)
        v = (load8(out, op - off) & ((1 << (8 * off)) - 1)) * _REPEAT[off]
        r = _REST8[off]  # the second word starts at byte r of the pattern: v shifted down r bytes, its top from v
        w = v if r == 0 else ((v >> (8 * r)) & ((1 << (64 - 8 * r)) - 1)) | (v << (8 * (off - r)))
    elif off == 8:
        v = w = load8(out, op - 8)
    else:  # w: the pattern's bytes 8 .. off-1, then its first ones again
        v = load8(out, op - off)
        w = (load8(out, op - off + 8) & ((1 << (8 * (off - 8))) - 1)) | (v << (8 * (off - 8)))
    step = _STEP[off]
    j = 0
    while j < n:
        store16(out, op + j, v, w)
        j += step
    return j - step + 16


@nb.njit(nogil=True, cache=True, error_model="numpy", inline="always")
def decode_block(src: np.ndarray, ip: int, iend: int, out: np.ndarray, o0: int, oend: int) -> int:
    """Decode the LZ4 block ``src[ip:iend]`` into exactly ``out[o0:oend]``; returns 0, or ``E_STREAM``.

    Every read and write is checked against these bounds, whatever the input holds. Copies move 16
    bytes at a time and may write up to 15 bytes beyond what they need when there is room before
    ``oend`` (never past it): what follows overwrites them, so a block decodes the same wherever its
    output lies. Inlined into its callers: a call of its own takes and drops a reference to both arrays
    (atomic operations) for every frame.
    """
    op = o0
    # a sequence with under 15 literals starting before these needs no other check for its literals' wide
    # copy and its offset (inside the block), nor for a short match's copies (inside the frame)
    ifast = iend - 16
    ofast = oend - 14 - 34
    while True:
        if ip >= iend:
            return E_STREAM
        token = load1(src, ip)
        ip += 1
        ll = token >> 4
        if ll < 15 and ip <= ifast and op <= ofast:
            copy16(out, op, src, ip)
            ip += ll
            op += ll
            off = load1(src, ip) | (load1(src, ip + 1) << 8)
            ip += 2
            ml = token & 15
            if ml < 15 and 0 < off <= op - o0:  # the common case, a short match (at most 18 bytes)
                if off >= 16:  # one or two 16-byte copies, the second reading bytes the first made final
                    copy16(out, op, out, op - off)
                    if ml + MIN_MATCH > 16:  # (only then: from less than 32 back, this load overlaps the store
                        copy16(out, op + 16, out, op - off + 16)  # just made, which stalls until it is written)
                else:
                    _repeat(out, op, off, ml + MIN_MATCH)
                op += ml + MIN_MATCH
                continue
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
            if iend - ip - ll >= 16 and oend - op - ll >= 16:  # room for 16-byte steps
                j = 0
                while j < ll:
                    copy16(out, op + j, src, ip + j)
                    j += 16
            else:
                copy(out, op, src, ip, ll)
            ip += ll
            op += ll
            if ip == iend:  # the last sequence: literals only
                return 0 if op == oend else E_STREAM
            if iend - ip < 2:
                return E_STREAM
            off = load1(src, ip) | (load1(src, ip + 1) << 8)
            ip += 2
            ml = token & 15
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
        # 16-byte steps while they end before oend, then single bytes
        wild = min(ml, oend - op - 15)
        j = 0
        if wild > 0:
            if off >= 16:  # each step reads bytes already final
                far = off if off >= FAR else off * ((FAR + off - 1) // off)
                lim = min(wild, far)
                while j < lim:
                    copy16(out, op + j, out, op - off + j)
                    j += 16
                while j < wild:  # a long match close behind: read whole periods >= FAR bytes back (see FAR)
                    copy16(out, op + j, out, op + j - far)
                    j += 16
            else:
                j = _repeat(out, op, off, wild)
        while j < ml:
            store1(out, op + j, load1(out, op + j - off))
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
           kind: np.ndarray, table: np.ndarray, data_end: np.ndarray, rows_alloc: int, cstride: int, fb: int,
           streaming: bool = False) -> int:
    """Frame ``slot`` of the ring into ``out[o0:o0 + fb]``: copied from the raw column (with non-temporal
    stores when ``streaming``, see ``streams``) or decoded."""
    pos = slot // rows_alloc
    if slot < 0 or pos >= kind.size:
        return E_UNMAPPED
    k = kind[pos]
    if k == KIND_RAW:
        if streaming:
            copy_streaming(out, o0, raw, slot * fb, fb)
        else:
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
def prefetch_entries(obs_slots: np.ndarray, next_slots: np.ndarray, r: int, comp: np.ndarray, comp64: np.ndarray,
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
def prefetch_raw(slot: int, raw: np.ndarray, kind: np.ndarray, rows_alloc: int, fb: int) -> None:
    """Hint the first line of each page a raw frame spans. A frame read from the page cache crosses 4 KiB
    pages the hardware prefetcher does not cross, each with its own TLB miss: started a row ahead, those
    misses overlap the copy of the row before."""
    pos = slot // rows_alloc
    if slot < 0 or pos >= kind.size or kind[pos] != KIND_RAW:
        return
    a = slot * fb
    e = a + fb
    while a < e:
        prefetch(raw, a)
        a = (a // 4096 + 1) * 4096


@nb.njit(nogil=True, cache=True)
def prefetch_row(obs_slots: np.ndarray, next_slots: np.ndarray, r: int, raw: np.ndarray, comp: np.ndarray,
                 comp64: np.ndarray, kind: np.ndarray, table: np.ndarray, rows_alloc: int, cstride: int,
                 fb: int) -> None:
    """The frames of row ``r``: ``prefetch_entries`` for compressed ones, ``prefetch_raw`` for raw ones."""
    prefetch_entries(obs_slots, next_slots, r, comp, comp64, kind, table, rows_alloc, cstride)
    k = obs_slots.shape[1]
    for j in range(2 * k):
        prefetch_raw(obs_slots[r, j] if j < k else next_slots[r, j - k], raw, kind, rows_alloc, fb)


@nb.njit(nogil=True, cache=True)
def prefetch_records(obs_slots: np.ndarray, next_slots: np.ndarray, r0: int, r1: int, comp: np.ndarray,
                     kind: np.ndarray, table: np.ndarray, rows_alloc: int, cstride: int) -> None:
    """Start loading the entry records of rows ``r0 .. r1-1`` (their cache misses overlap; nothing waits)."""
    k = obs_slots.shape[1]
    for r in range(r0, r1):
        for j in range(2 * k):
            slot = obs_slots[r, j] if j < k else next_slots[r, j - k]
            pos = slot // rows_alloc
            if 0 <= slot and pos < kind.size and kind[pos] == KIND_LZ4:
                prefetch(comp, pos * cstride + table[pos] + 16 * (slot - pos * rows_alloc))


@nb.njit(nogil=True, cache=True, inline="always")
def streams(out: np.ndarray, fb: int) -> bool:
    """Whether raw frames are copied into ``out`` with non-temporal stores: when ``out`` is at least
    ``STREAM_BYTES`` (a batch that large leaves the caches before its consumer reads it back, so reading each
    destination line in before overwriting it is wasted memory traffic) and every frame starts 16-byte
    aligned. Below that, plain stores leave the batch in the caches for its consumer."""
    return out.size >= STREAM_BYTES and fb % 16 == 0 and out.ctypes.data % 16 == 0


@nb.njit(nogil=True, cache=True)
def pair_row(obs_slots: np.ndarray, next_slots: np.ndarray, r: int, out: np.ndarray, raw: np.ndarray,
             comp: np.ndarray, comp64: np.ndarray, kind: np.ndarray, table: np.ndarray, data_end: np.ndarray,
             rows_alloc: int, cstride: int, fb: int, streaming: bool = False) -> tuple[int, int]:
    """Row ``r`` of a batch (see ``gather_pairs``): its obs frames, then its next_obs frames, those that the
    obs stack holds copied from the output (from the ring again when ``streaming`` and raw: the output's
    copy went past the caches, the ring's lines were just read). Returns ``(0, 0)`` or ``(error code, slot)``."""
    b, k = obs_slots.shape
    for j in range(k):
        slot = obs_slots[r, j]
        err = _frame(slot, out, (r * k + j) * fb, raw, comp, comp64, kind, table, data_end, rows_alloc, cstride, fb,
                     streaming)
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
        if same >= 0 and not (streaming and kind[slot // rows_alloc] == KIND_RAW):
            copy(out, o0, out, (r * k + same) * fb, fb)
            continue
        err = _frame(slot, out, o0, raw, comp, comp64, kind, table, data_end, rows_alloc, cstride, fb, streaming)
        if err:
            return err, slot
    return 0, 0


@nb.njit(nogil=True, cache=True)
def gather_pairs(obs_slots: np.ndarray, next_slots: np.ndarray, r0: int, r1: int, out: np.ndarray,
                 raw: np.ndarray, comp: np.ndarray, comp64: np.ndarray, kind: np.ndarray, table: np.ndarray,
                 data_end: np.ndarray, rows_alloc: int, cstride: int, fb: int) -> tuple[int, int]:
    """Rows ``r0 .. r1-1`` of a batch: ``obs_slots``/``next_slots`` (B, k) frames into ``out`` (2, B, k, fb)
    flattened. A ``next_obs`` frame that is also one of the row's ``obs`` frames (``k - m`` of them) is
    copied from there instead of being decoded again. Raw frames of a large batch go with non-temporal
    stores (``streams``). Returns ``(0, 0)`` or ``(error code, slot)``."""
    streaming = streams(out, fb)
    err, slot = 0, 0
    prefetch_records(obs_slots, next_slots, r0, r1, comp, kind, table, rows_alloc, cstride)  # no load waits on another
    if r0 < r1:
        k = obs_slots.shape[1]
        for j in range(2 * k):
            prefetch_raw(obs_slots[r0, j] if j < k else next_slots[r0, j - k], raw, kind, rows_alloc, fb)
    for r in range(r0, r1):
        if r + 1 < r1:  # the next row's frames: their cache and TLB misses overlap this row's work
            prefetch_row(obs_slots, next_slots, r + 1, raw, comp, comp64, kind, table, rows_alloc, cstride, fb)
        err, slot = pair_row(obs_slots, next_slots, r, out, raw, comp, comp64, kind, table, data_end, rows_alloc,
                             cstride, fb, streaming)
        if err:
            break
    if streaming:
        store_fence()
    return err, slot


@nb.njit(nogil=True, cache=True)
def gather(slots: np.ndarray, out: np.ndarray, raw: np.ndarray, comp: np.ndarray, comp64: np.ndarray,
           kind: np.ndarray, table: np.ndarray, data_end: np.ndarray, rows_alloc: int, cstride: int, fb: int) -> tuple[int, int]:
    """Frames ``slots`` (1-D) into ``out`` (len(slots) * fb bytes), those of a large read with non-temporal
    stores (``streams``). Returns ``(0, 0)`` or ``(error, slot)``."""
    streaming = streams(out, fb)
    err, bad = 0, 0
    for i in range(slots.size):
        if i + 1 < slots.size:
            prefetch_raw(slots[i + 1], raw, kind, rows_alloc, fb)
        err = _frame(slots[i], out, i * fb, raw, comp, comp64, kind, table, data_end, rows_alloc, cstride, fb,
                     streaming)
        if err:
            bad = slots[i]
            break
    if streaming:
        store_fence()
    return err, bad
