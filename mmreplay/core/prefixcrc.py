"""Checksums of the open chunk's committed rows, extended at each commit over the rows written since.

A sealed chunk's files are checksummed whole when it seals; the open chunk is still being written.
So every commit records, per column file and per env stream, the CRC-32 (zlib) of that stream's
committed rows of the open chunk in row order (the chunk entry's ``prefix_crc32``, FORMAT.md), and
``verify()`` recomputes it. A row is written once, before the stream's row count passes it, and never
rewritten (``reset()`` of an open episode records the end with the new START row): so the CRC of rows
``0 .. n-1`` extends to ``0 .. m-1`` by feeding it rows ``n .. m-1`` alone, and a commit costs
O(rows written since the last one), never O(chunk).

``open()`` recomputes them over the committed rows (``first_damage``): damage in the open chunk is
an error at open, not rows read back silently. That costs one CRC pass over at most one chunk's files.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import CorruptStoreError
from .layout import home_extents, stream_runs

__all__ = ["PrefixCrc", "crc32_rows", "damage_error", "first_damage", "stream_extents"]


def crc32_rows(column: np.ndarray, base: int, runs: list[tuple[int, int]], crc: int = 0) -> int:
    """``crc`` extended over the rows of ``column`` (rows on the first axis, C-contiguous) at ``runs``
    (``[(offset, rows)]`` as ``layout.stream_runs`` gives them), offsets counted from row ``base``."""
    for start, n in runs:
        crc = zlib.crc32(column[base + start:base + start + n].data, crc)  # no copy: a contiguous view
    return crc


def stream_extents(rows_per_stream: int, num_envs: int, extents: Sequence[Sequence[int]] | None) -> list[list[int]]:
    """Each stream's extents of a chunk in row order (``extents`` as a chunk entry lists them; ``None``:
    home sections)."""
    if extents is None:
        return [home_extents(rows_per_stream, s) for s in range(num_envs)]
    return [[int(x) for x in xs] for xs in extents]


@dataclass
class PrefixCrc:
    """The running CRC-32 of the open chunk ``seq``: per column, per stream, over its first ``rows[s]`` rows."""

    seq: int
    rows: list[int]
    crc: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def empty(cls, seq: int, columns: Sequence[str], num_envs: int) -> PrefixCrc:
        """Nothing covered yet (a new chunk, or a store whose commits recorded no prefix)."""
        return cls(seq, [0] * num_envs, {name: [0] * num_envs for name in columns})

    def extend(self, arrays: dict[str, np.ndarray], base: int, rows_per_stream: int,
               extents: list[list[int]], fill: Sequence[int]) -> None:
        """Cover every stream's first ``fill[s]`` rows of chunk ``seq``, whose row 0 is element ``base`` of
        each column's array in ``arrays``; ``extents[s]``: stream s's extents in row order."""
        for s, (done, want) in enumerate(zip(self.rows, fill, strict=True)):
            if want == done:
                continue
            if want < done:  # rows are never taken back: a caller bug, not damage
                raise RuntimeError(f"chunk {self.seq}: stream {s} holds {want} rows, {done} were checksummed")
            runs = stream_runs(rows_per_stream, extents[s], done, int(want))
            for name, crcs in self.crc.items():
                crcs[s] = crc32_rows(arrays[name], base, runs, crcs[s])
            self.rows[s] = int(want)

    def to_json(self) -> dict[str, list[int]]:
        return {name: list(crcs) for name, crcs in self.crc.items()}


def first_damage(recorded: PrefixCrc, arrays: dict[str, np.ndarray], base: int, rows_per_stream: int,
                 extents: list[list[int]]) -> tuple[str, int, int, int] | None:
    """Recompute the open chunk's checksums over the rows ``recorded`` covers (the last commit's):
    ``(column, stream, got, recorded)`` of the first that differs, else None.

    It returns rather than raises: a traceback must not hold ``arrays``, views of mappings the failed
    open unmaps (printing them would fault)."""
    fresh = PrefixCrc.empty(recorded.seq, list(recorded.crc), len(recorded.rows))
    fresh.extend(arrays, base, rows_per_stream, extents, recorded.rows)
    for name, crcs in recorded.crc.items():
        for s, (want, got) in enumerate(zip(crcs, fresh.crc[name], strict=True)):
            if got != want:
                return name, s, got, want
    return None


def damage_error(path: str, stream: int, rows: int, got: int, want: int) -> CorruptStoreError:
    """The error ``open()`` raises for an open chunk's column file whose committed rows changed."""
    return CorruptStoreError(
        f"{path}: the committed rows of stream {stream} in this open chunk ({rows:,} rows) have checksum"
        f" {got:#010x}, not the {want:#010x} the last commit recorded (the file was modified or damaged);"
        " mmreplay verify lists every damaged file")
