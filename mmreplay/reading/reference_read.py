"""Frames read without the native kernels: compressed ones decoded with numcodecs one by one (the path
where numba is missing, and the reference the kernels are tested against), and the error a frame
kernel's code stands for."""

from __future__ import annotations

import numpy as np

from ..errors import CorruptStoreError
from ..native.codes import E_RECORD, E_UNMAPPED, ERRORS, KIND_LZ4, KIND_RAW
from ..storage import framefile
from ..storage.ring import ChunkRing


def reference_frames(ring: ChunkRing, slots: np.ndarray) -> np.ndarray:
    """Frames at ``slots`` (1-D) decoded one by one with numcodecs, as ``(slots.size, frame_bytes)`` bytes:
    the path without numba (and the reference the kernels are tested against)."""
    fb = ring.frame_bytes
    out = np.empty((slots.size, fb), np.uint8)
    for i, slot in enumerate(slots.tolist()):
        pos, row = divmod(slot, ring.rows_alloc)
        if not 0 <= pos < ring.positions or ring.frame_kind[pos] not in (KIND_RAW, KIND_LZ4):
            raise frame_error(ring, E_UNMAPPED, slot)
        if ring.frame_kind[pos] == KIND_RAW:
            out[i] = ring.raw_frames[slot * fb:(slot + 1) * fb]
            continue
        base = pos * ring.cstride
        rec = np.frombuffer(ring.comp_bytes[base + int(ring.comp_table[pos]) + 16 * row:][:16].tobytes(),
                            framefile.RECORD)[0]
        off, length, crc = int(rec["offset"]), int(rec["length"]), int(rec["crc"])
        data = int(ring.comp_table[pos]) + 16 * ring.schema.chunk_size  # entries start after the records
        if off < data or length < 1 or length > fb or off + length > ring.comp_end[pos]:
            raise frame_error(ring, E_RECORD, slot)
        entry = ring.comp_bytes[base + off:base + off + length].tobytes()
        out[i] = np.frombuffer(framefile.decode_entry(ring.frames_file(slot), entry, crc, fb, row), np.uint8)
    return out


def frame_error(ring: ChunkRing, err: int, slot: int) -> Exception:
    """The exception for a frame kernel's error code ``err`` at ``slot``."""
    if err == E_UNMAPPED:
        return RuntimeError(f"frame slot {slot} is not in a mapped chunk (an mmreplay bug; please report it)")
    row = slot % ring.rows_alloc
    return CorruptStoreError(f"{ring.frames_file(slot)}: frame {row} is damaged ({ERRORS.get(err, err)});"
                             " `mmreplay verify` lists every damaged file")
