"""Where rows live: the flag bits of a row and the map from (stream, row) to ring slot.

Vocabulary (FORMAT.md has the full picture):

- A *frame row* ``r`` of env stream ``s`` is the r-th frame that stream wrote.
  Each stream counts its own rows: a batched ``reset()``/``step()`` writes one
  row of every stream, ``extend(env=s)`` and ``reset(obs, env=s)`` rows of one.
- A frame is either an episode's first observation (flag ``START``) or the
  ``next_obs`` of a transition; the transition's action, reward and flags are
  stored in the same row. So "transition rho" means the transition whose next
  frame is row rho; its observation is row rho-1.
- A chunk gives every stream a *section* of ``rows_per_stream`` consecutive
  slots (stream-major, so one env's stack is contiguous on disk). Stream s's
  rows in chunk c are ``first_row[c, s] .. first_row[c, s] + fill - 1`` at
  offsets ``0 .. fill - 1`` of its section. The chunk rolls when a stream needs
  a row and its section is full; the other streams' sections may then be sealed
  part-filled (their unused tail is a *hole*, never read). When streams advance
  together (batched calls only) every section fills and row r of every stream is
  in chunk ``r // rows_per_stream``: the arithmetic of format version 1.
- A *slot* is the element of the ring arrays holding a row:
  ``slot = (chunk % positions) * rows_alloc + s * rows_per_stream + offset``.
"""

from __future__ import annotations

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

_KEY = np.int64(1) << 40  # stream stride of the search keys (more rows than any stream can write)


class Geometry:
    """The ring's shape and the map from each stream's rows to slots.

    ``positions`` chunks of ``rows_alloc`` slots, ``rows_per_stream`` slots per stream and chunk. Per
    ring position it records the chunk held there (``seq_of_pos``), the row of every stream at offset 0
    of its section (``first_row``) and how many rows the section can hold (``limit``: the section's size,
    or its fill when the chunk was sealed with a hole). While no retained section has a hole, rows map
    to slots by arithmetic (``aligned``); otherwise by a binary search over the retained chunks.
    """

    def __init__(self, num_envs: int, rows_per_stream: int, rows_alloc: int, positions: int) -> None:
        self.num_envs = num_envs
        self.rows_per_stream = rows_per_stream
        self.rows_alloc = rows_alloc
        self.positions = positions
        self.seq_of_pos = np.full(positions, -1, np.int64)
        self.first_row = np.zeros((positions, num_envs), np.int64)
        self.limit = np.full((positions, num_envs), rows_per_stream, np.int64)
        self._streams = np.arange(num_envs, dtype=np.int64)
        self._refresh()

    @property
    def size(self) -> int:
        """Slots in the ring."""
        return self.positions * self.rows_alloc

    @property
    def aligned(self) -> bool:
        """No retained section has a hole: rows map to slots by arithmetic."""
        return self._base is not None

    # -- the chunk table --------------------------------------------------------------------------------
    def place(self, seq: int, first_rows: np.ndarray) -> None:
        """Chunk ``seq`` occupies its ring position; ``first_rows``: each stream's row at offset 0."""
        pos = seq % self.positions
        self.seq_of_pos[pos] = seq
        self.first_row[pos] = first_rows
        self.limit[pos] = self.rows_per_stream
        self._refresh()

    def seal(self, seq: int, fills: np.ndarray) -> None:
        """Chunk ``seq`` was sealed holding ``fills`` rows of each stream."""
        self.limit[seq % self.positions] = fills
        self._refresh()

    def remove(self, seq: int) -> None:
        """Chunk ``seq`` left the ring (retired)."""
        pos = seq % self.positions
        self.seq_of_pos[pos] = -1
        self.limit[pos] = self.rows_per_stream
        self._refresh()

    def resized(self, positions: int) -> Geometry:
        """The same chunks in a ring of ``positions`` chunks."""
        new = Geometry(self.num_envs, self.rows_per_stream, self.rows_alloc, positions)
        for pos in np.flatnonzero(self.seq_of_pos >= 0):
            q = int(self.seq_of_pos[pos])
            p = q % positions
            new.seq_of_pos[p] = q
            new.first_row[p] = self.first_row[pos]
            new.limit[p] = self.limit[pos]
        new._refresh()
        return new

    def _refresh(self) -> None:
        """Recompute the row map after the chunk table changed (O(chunks x streams))."""
        held = np.flatnonzero(self.seq_of_pos >= 0)
        order = held[np.argsort(self.seq_of_pos[held])]  # positions of the retained chunks, oldest first
        rs = self.rows_per_stream
        self._order = order
        if order.size == 0:
            self._base: np.ndarray | None = np.zeros(self.num_envs, np.int64)
            return
        seqs = self.seq_of_pos[order]
        base = self.first_row[order[0]] - seqs[0] * rs
        if (self.limit[order] == rs).all() and (self.first_row[order] == base + seqs[:, None] * rs).all():
            self._base = base
            return
        self._base = None
        # keys[s * C + j] = s * 2**40 + first_row of stream s in the j-th oldest chunk: sorted.
        self._keys = (self._streams[:, None] * _KEY + self.first_row[order].T).ravel()

    # -- the map ---------------------------------------------------------------------------------------
    def slots(self, s: np.ndarray | int, r: np.ndarray | int) -> np.ndarray:
        """Ring slot of row(s) ``r`` of stream(s) ``s`` (broadcasting). Rows must be retained (or the
        open chunk's next ones); others map to some slot of a retained chunk, never outside the ring."""
        rs = self.rows_per_stream
        s = np.asarray(s, dtype=np.int64)
        r = np.asarray(r, dtype=np.int64)
        if self._base is not None:
            q, within = np.divmod(r - self._base[s], rs)
            return (q % self.positions) * self.rows_alloc + (s * rs + within)
        c = self._order.size
        j = np.searchsorted(self._keys, s * _KEY + r, side="right") - 1 - s * c
        np.clip(j, 0, c - 1, out=j)
        pos = self._order[j]
        within = np.clip(r - self.first_row[pos, s], 0, rs - 1)
        return pos * self.rows_alloc + (s * rs + within)

    def rows_of(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(stream, row) of ring slots of retained chunks."""
        pos, off = np.divmod(slots, self.rows_alloc)
        s, within = np.divmod(off, self.rows_per_stream)
        return s, self.first_row[pos, s] + within

    def section_ends(self, slots: np.ndarray) -> np.ndarray | int:
        """For slots of retained chunks: the offset where their section's rows end (``limit``; a scalar
        while aligned)."""
        if self._base is not None:
            return self.rows_per_stream
        pos, off = np.divmod(slots, self.rows_alloc)
        return self.limit[pos, off // self.rows_per_stream]

    def chunk_slots(self, seq: int) -> slice:
        """The slots of chunk ``seq`` (every stream's section)."""
        base = (seq % self.positions) * self.rows_alloc
        return slice(base, base + self.num_envs * self.rows_per_stream)

    def section(self, seq: int, s: int) -> tuple[int, int]:
        """(first slot, first row) of stream ``s``'s section of chunk ``seq``."""
        pos = seq % self.positions
        return pos * self.rows_alloc + s * self.rows_per_stream, int(self.first_row[pos, s])
