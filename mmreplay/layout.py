"""Where rows live: the flag bits of a row and the arithmetic from (stream, row) to ring slot.

Vocabulary (FORMAT.md has the full picture):

- A *frame row* ``r`` of env stream ``s`` is the r-th frame that stream wrote.
  All streams write one frame per ``reset()``/``step()``, so they advance in
  lockstep and share one row counter.
- A frame is either an episode's first observation (flag ``START``) or the
  ``next_obs`` of a transition; the transition's action, reward and flags are
  stored in the same row. So "transition rho" means the transition whose next
  frame is row rho; its observation is row rho-1.
- A *slot* is the element of the ring arrays holding a row:
  ``slot = (chunk % positions) * rows_alloc + s * rows_per_stream + r % rows_per_stream``
  with ``chunk = r // rows_per_stream`` (stream-major inside a chunk, so one
  env's stack is contiguous on disk).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Flag bits stored in the ``flags`` column (FORMAT.md).
START = 1  # the frame is an episode's first observation; no transition ends here
TERMINATED = 2  # the transition ending here terminated the episode
TRUNCATED = 4  # the transition ending here was truncated (time limit)
MISSING = 8  # the frame's content was never available (imports); it is stored as zeros
HEAD_LOST = 16  # on a START frame: the episode began earlier, its first frames were not stored
DISK_FLAGS = START | TERMINATED | TRUNCATED | MISSING | HEAD_LOST
# Bits that exist only in RAM.
END = 32  # the frame is the last one of its episode
LOST = 64  # the frame's episode has HEAD_LOST
INVALID = 128  # the transition ending here was invalidated (invalidate() or clear()): never sampleable again


@dataclass(frozen=True)
class Geometry:
    """The ring's shape: ``positions`` chunks of ``rows_alloc`` slots, ``rows_per_stream`` rows per stream."""

    num_envs: int
    rows_per_stream: int
    rows_alloc: int
    positions: int

    @property
    def size(self) -> int:
        """Slots in the ring."""
        return self.positions * self.rows_alloc

    def slots(self, s: np.ndarray | int, r: np.ndarray | int) -> np.ndarray:
        """Ring slot of row(s) ``r`` of stream(s) ``s`` (broadcasting)."""
        rs = self.rows_per_stream
        q, within = np.divmod(np.asarray(r, dtype=np.int64), rs)
        return (q % self.positions) * self.rows_alloc + (np.asarray(s, dtype=np.int64) * rs + within)

    def chunk_slots(self, seq: int) -> slice:
        """The slots of chunk ``seq`` (every stream's rows)."""
        base = (seq % self.positions) * self.rows_alloc
        return slice(base, base + self.num_envs * self.rows_per_stream)

    def rows_of(self, slots: np.ndarray, seq_of_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(stream, row) of ring slots, given the chunk sequence number held at each ring position."""
        pos, off = np.divmod(slots, self.rows_alloc)
        s, within = np.divmod(off, self.rows_per_stream)
        return s, seq_of_pos[pos] * self.rows_per_stream + within
