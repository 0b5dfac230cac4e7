"""Where rows live: the flag bits of a row and the map from (stream, row) to ring slot.

Vocabulary (FORMAT.md has the full picture):

- A *frame row* ``r`` of env stream ``s`` is the r-th frame that stream wrote.
  Each stream counts its own rows: a batched ``reset()``/``step()`` writes one
  row of every stream, ``extend(env=s)`` and ``reset(obs, env=s)`` rows of one.
- A frame is either an episode's first observation (flag ``START``) or the
  ``next_obs`` of a transition; the transition's action, reward and flags are
  stored in the same row. So "transition at row r" (``stream_row`` in the code: a
  row within its stream) means the transition whose next frame is row r; its
  observation is row r-1.
- A chunk's ``chunk_size`` slots are cut into *extents* of ``E`` consecutive
  slots (``extent_rows``). A stream writes its rows into an extent it owns,
  in order; when the extent is full it takes another free extent of the same
  chunk (the next one if free, else the first of the largest free run). The
  chunk rolls when a stream needs an extent and none is free, so at most the
  unfilled tails of the streams' last extents stay empty (*holes*).
- Every stream has a *home section* of ``rows_per_stream = chunk_size / num_envs``
  slots, ``num_envs`` of them side by side (stream-major, so one env's stack is
  contiguous on disk); a stream's first extent in a chunk is the first of its
  home section. When the streams advance together (batched calls only) each fills
  exactly its home section and row r of every stream is in chunk
  ``r // rows_per_stream``: the layout of format version 1.
- A *slot* is the element of the ring arrays holding a row:
  ``slot = (chunk % positions) * rows_alloc + offset`` (the row's offset in its chunk).
- A *segment* is a run of consecutive slots holding consecutive rows of one stream
  (adjacent extents of one stream, or one home section); stack and n-step arithmetic
  is a slot offset inside a segment.
"""

from __future__ import annotations

import numpy as np

from ..options import extent_rows

__all__ = ["Geometry", "extent_rows", "home_extents", "stream_offsets", "START", "TERMINATED", "TRUNCATED",
           "MISSING", "HEAD_LOST", "DISK_FLAGS", "END", "LOST"]

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

_KEY = np.int64(1) << 40  # stream stride of the search keys (more rows than any stream can write)


def home_extents(rows_per_stream: int, s: int) -> list[int]:
    """The extents of stream ``s``'s home section, in order."""
    m = rows_per_stream // extent_rows(rows_per_stream)
    return list(range(s * m, (s + 1) * m))


def stream_offsets(rows_per_stream: int, extents: list[int], fill: int) -> np.ndarray:
    """Slot offsets (within the chunk) of a stream's ``fill`` rows stored in ``extents`` (in row order)."""
    e = extent_rows(rows_per_stream)
    if fill > len(extents) * e:
        raise ValueError(f"{fill} rows do not fit {len(extents)} extents of {e} rows")
    base = np.asarray(extents, np.int64)[: -(-fill // e) if fill else 0] * e
    return (base[:, None] + np.arange(e, dtype=np.int64)).ravel()[:fill]


def stream_runs(rows_per_stream: int, extents: list[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """Rows ``lo .. hi - 1`` of a stream stored in ``extents`` (in row order) as runs of consecutive
    slots, in row order: ``[(offset of the run's first slot within the chunk, rows), ...]`` (adjacent
    extents form one run). Costs O(extents the rows touch), whatever ``lo``."""
    e = extent_rows(rows_per_stream)
    if hi > len(extents) * e or not 0 <= lo <= hi:
        raise ValueError(f"rows {lo}..{hi - 1} do not fit {len(extents)} extents of {e} rows")
    runs: list[tuple[int, int]] = []
    r = lo
    while r < hi:
        i, within = divmod(r, e)
        n = min(e - within, hi - r)
        start = int(extents[i]) * e + within
        if runs and runs[-1][0] + runs[-1][1] == start:
            runs[-1] = (runs[-1][0], runs[-1][1] + n)
        else:
            runs.append((start, n))
        r += n
    return runs


class Geometry:
    """The ring's shape and the map from each stream's rows to slots.

    ``positions`` chunks of ``rows_alloc`` slots, each cut into ``n_extents`` extents of ``extent``
    slots. Per ring position it records the chunk held there (``seq_of_pos``), the owner and first row
    of every extent, each stream's first row in the chunk (``first_row``), and, once the chunk is sealed,
    how many rows each stream holds (``limit``; the section's size while open). While every retained
    chunk is laid out as full home sections, rows map to slots by arithmetic (``aligned``); otherwise
    by a binary search over the retained extents.
    """

    def __init__(self, num_envs: int, rows_per_stream: int, rows_alloc: int, positions: int) -> None:
        self.num_envs = num_envs
        self.rows_per_stream = rows_per_stream
        self.rows_alloc = rows_alloc
        self.positions = positions
        self.extent = extent_rows(rows_per_stream)
        self.per_section = rows_per_stream // self.extent
        self.n_extents = num_envs * self.per_section
        p, x = positions, self.n_extents
        self.seq_of_pos = np.full(p, -1, np.int64)
        self.first_row = np.zeros((p, num_envs), np.int64)
        self.limit = np.full((p, num_envs), rows_per_stream, np.int64)
        self.owner = np.full((p, x), -1, np.int64)
        self.erow = np.zeros((p, x), np.int64)
        self.efill = np.zeros((p, x), np.int64)  # rows in each extent (sealed chunks; ``extent`` while open)
        self.seg_lo = np.zeros((p, x), np.int64)  # offset of the first slot of the extent's segment
        self.seg_hi = np.zeros((p, x), np.int64)  # offset past its last usable slot
        self.home = np.ones(p, np.bool_)  # the chunk is laid out as home sections
        self.sealed = np.zeros(p, np.bool_)
        self.current = np.full(num_envs, -1, np.int64)  # each stream's last extent in the open chunk
        self._streams = np.arange(num_envs, dtype=np.int64)
        self._keys = np.empty(0, np.int64)  # s * 2**40 + first row, of every owned extent, sorted
        self._kseq = np.empty(0, np.int64)  # its chunk
        self._kx = np.empty(0, np.int64)  # its extent
        self._refresh()

    @property
    def size(self) -> int:
        """Slots in the ring."""
        return self.positions * self.rows_alloc


    @property
    def aligned(self) -> bool:
        """Every retained chunk holds full home sections: rows map to slots by arithmetic."""
        return self._base is not None

    # -- the chunk table --------------------------------------------------------------------------------
    def place(self, seq: int, first_rows: np.ndarray) -> None:
        """Chunk ``seq`` occupies its ring position, no extent taken yet; ``first_rows``: each stream's next row."""
        pos = seq % self.positions
        self.seq_of_pos[pos] = seq
        self.first_row[pos] = first_rows
        self.limit[pos] = self.rows_per_stream
        self.owner[pos] = -1
        self.efill[pos] = self.extent
        self.home[pos] = True
        self.sealed[pos] = False
        self.current[:] = -1
        self._refresh()

    def free_extents(self, seq: int) -> int:
        return int(np.count_nonzero(self.owner[seq % self.positions] < 0))

    def allocate(self, seq: int, s: int, row: int) -> int:
        """Give stream ``s`` (whose next row is ``row``) an extent of the open chunk ``seq``; return its first slot.

        The next extent after its current one if free, else (first extent of the chunk) its home extent,
        else the first extent of the largest run of free extents. The caller checks one is free.
        """
        pos = seq % self.positions
        own = self.owner[pos]
        cur = int(self.current[s])
        if cur >= 0 and cur + 1 < self.n_extents and own[cur + 1] < 0:
            x = cur + 1
        elif cur < 0 and own[s * self.per_section] < 0:
            x = s * self.per_section
        else:
            x = _largest_free_run(own)
        home = cur + 1 if cur >= 0 else s * self.per_section
        left_home = bool(self.home[pos]) and (x != home or (x % self.per_section == 0 and cur >= 0))
        if left_home:
            self.home[pos] = False  # a stream left its home section
        own[x] = s
        erow = self.erow[pos]
        erow[x] = row
        self.current[s] = x
        key = s * _KEY + row
        keys = self._keys
        if keys.size == 0 or key > keys[-1]:  # the usual case: the newest row of the highest stream so far
            self._keys = np.append(keys, key)
            self._kseq = np.append(self._kseq, seq)
            self._kx = np.append(self._kx, x)
        else:
            at = int(np.searchsorted(keys, key, side="right"))
            self._keys = np.insert(keys, at, key)
            self._kseq = np.insert(self._kseq, at, seq)
            self._kx = np.insert(self._kx, at, x)
        # The new extent's segment (an open chunk: every extent counts as full). It continues the segment
        # of extent x - 1 when that holds the stream's rows just before; no extent after x can continue it
        # (a stream's extents in a chunk hold rising rows, and x's are its newest).
        e = self.extent
        lo_, hi_ = self.seg_lo[pos], self.seg_hi[pos]
        if x > 0 and own[x - 1] == s and erow[x - 1] + e == row:
            lo = int(lo_[x - 1])
            lo_[x] = lo
            hi_[lo // e:x + 1] = (x + 1) * e
        else:
            lo_[x], hi_[x] = x * e, (x + 1) * e
        if left_home:  # the only input of the arithmetic map's test that an allocation can change
            self._refresh()
        return pos * self.rows_alloc + x * e

    def seal(self, seq: int, fills: np.ndarray) -> None:
        """Chunk ``seq`` was sealed holding ``fills`` rows of each stream."""
        pos = seq % self.positions
        self.limit[pos] = fills
        self.sealed[pos] = True
        own = self.owner[pos]
        for s in range(self.num_envs):
            mine = np.flatnonzero(own == s)
            if mine.size:
                mine = mine[np.argsort(self.erow[pos, mine])]
                self.efill[pos, mine] = np.clip(fills[s] - np.arange(mine.size) * self.extent, 0, self.extent)
        self._segments(pos)
        self._refresh()

    def restore(self, seq: int, first_rows: np.ndarray, fills: np.ndarray, extents: list[list[int]] | None,
                sealed: bool) -> None:
        """Place a committed chunk: ``extents[s]`` lists stream s's extents in row order (``None``: home
        sections, as every stream fills them when the streams advance together). Call ``restored()``
        once every chunk is placed."""
        self.place(seq, first_rows)
        pos = seq % self.positions
        e = self.extent
        for s in range(self.num_envs):
            if extents is None:
                xs = home_extents(self.rows_per_stream, s)[: -(-int(fills[s]) // e)]
            else:
                xs = [int(x) for x in extents[s]]
            for i, x in enumerate(xs):
                self.owner[pos, x] = s
                self.erow[pos, x] = first_rows[s] + i * e
            if xs:
                self.current[s] = xs[-1]
        if extents is not None:
            self.home[pos] = all(list(extents[s]) == home_extents(self.rows_per_stream, s)[: len(extents[s])]
                                 for s in range(self.num_envs))
        if sealed:
            self.seal(seq, fills)
        else:
            self._segments(pos)

    def restored(self) -> None:
        """Build the search keys of every placed chunk's extents (once, after ``restore`` of each)."""
        pos, x = np.nonzero(self.owner >= 0)
        keys = self.owner[pos, x] * _KEY + self.erow[pos, x]
        order = np.argsort(keys, kind="stable")
        self._keys, self._kseq, self._kx = keys[order], self.seq_of_pos[pos][order], x[order].astype(np.int64)
        self._refresh()

    def extents_of(self, seq: int) -> list[list[int]] | None:
        """Each stream's extents of chunk ``seq`` in row order; ``None`` when laid out as home sections."""
        pos = seq % self.positions
        if self.home[pos]:
            return None
        own = self.owner[pos]
        out = []
        for s in range(self.num_envs):
            mine = np.flatnonzero(own == s)
            out.append(mine[np.argsort(self.erow[pos, mine])].tolist())
        return out

    def remove(self, seq: int) -> None:
        """Chunk ``seq`` left the ring (retired)."""
        pos = seq % self.positions
        self.seq_of_pos[pos] = -1
        self.owner[pos] = -1
        keep = self._kseq != seq
        self._keys, self._kseq, self._kx = self._keys[keep], self._kseq[keep], self._kx[keep]
        self._refresh()

    def resized(self, positions: int) -> Geometry:
        """The same chunks in a ring of ``positions`` chunks."""
        new = Geometry(self.num_envs, self.rows_per_stream, self.rows_alloc, positions)
        for pos in np.flatnonzero(self.seq_of_pos >= 0):
            q = int(self.seq_of_pos[pos])
            p = q % positions
            for name in ("seq_of_pos", "first_row", "limit", "owner", "erow", "efill", "seg_lo", "seg_hi", "home",
                         "sealed"):
                getattr(new, name)[p] = getattr(self, name)[pos]
        new.current = self.current.copy()
        new._keys, new._kseq, new._kx = self._keys.copy(), self._kseq.copy(), self._kx.copy()
        new._refresh()
        return new

    def _segments(self, pos: int) -> None:
        """Segments of chunk ``pos``: runs of adjacent extents of one stream holding consecutive rows."""
        e, own, erow = self.extent, self.owner[pos], self.erow[pos]
        fill = self.efill[pos] if self.sealed[pos] else np.full(self.n_extents, e, np.int64)
        x = np.arange(self.n_extents, dtype=np.int64)
        joins = np.zeros(self.n_extents, np.bool_)
        joins[1:] = (own[1:] >= 0) & (own[1:] == own[:-1]) & (erow[1:] == erow[:-1] + e) & (fill[:-1] == e)
        start = np.maximum.accumulate(np.where(joins, 0, x))
        last = np.minimum.accumulate(np.where(np.append(joins[1:], False), self.n_extents, x)[::-1])[::-1]
        self.seg_lo[pos] = start * e
        self.seg_hi[pos] = last * e + fill[last]

    def _refresh(self) -> None:
        """Decide whether rows map by arithmetic (after the chunk table changed; O(chunks x streams))."""
        held = np.flatnonzero(self.seq_of_pos >= 0)
        order = held[np.argsort(self.seq_of_pos[held])]
        rs = self.rows_per_stream
        self._base: np.ndarray | None = None
        # lockstep: laid out as format 1 (row r of stream s in chunk r // R at offset s * R + r % R)
        self.lockstep = True
        if order.size == 0:
            self._base = np.zeros(self.num_envs, np.int64)
            return
        seqs = self.seq_of_pos[order]
        base = self.first_row[order[0]] - seqs[0] * rs
        sealed = self.sealed[order]
        if (self.home[order].all() and (self.limit[order[sealed]] == rs).all()
                and (self.first_row[order] == base + seqs[:, None] * rs).all()):
            self._base = base
        self.lockstep = self._base is not None and not self._base.any()

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
        if self._keys.size == 0:
            return np.zeros(np.broadcast(s, r).shape, np.int64)
        j = np.searchsorted(self._keys, s * _KEY + r, side="right") - 1
        j = np.maximum(j, np.searchsorted(self._keys, s * _KEY))  # never an extent of a lower stream
        np.clip(j, 0, self._keys.size - 1, out=j)
        within = np.clip(r - (self._keys[j] - s * _KEY), 0, self.extent - 1)
        return (self._kseq[j] % self.positions) * self.rows_alloc + self._kx[j] * self.extent + within

    def rows_of(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(stream, row) of ring slots of retained chunks."""
        pos, off = np.divmod(slots, self.rows_alloc)
        x, within = np.divmod(off, self.extent)
        return self.owner[pos, x], self.erow[pos, x] + within

    def spans_inside(self, slots: np.ndarray, before: int, after: int) -> np.ndarray | bool:
        """Whether the rows ``before`` before to ``after`` after each slot's row sit in the slot's segment
        (so their slots are the slot plus offsets). A scalar ``True`` when all do."""
        if self._base is not None:
            within = slots % self.rows_alloc % self.rows_per_stream
            ok = (within >= before) & (within + after < self.rows_per_stream)
        else:
            pos, off = np.divmod(slots, self.rows_alloc)
            x = off // self.extent
            ok = (off - self.seg_lo[pos, x] >= before) & (off + after < self.seg_hi[pos, x])
        return True if ok.all() else ok

    def chunk_slots(self, seq: int) -> slice:
        """The slots of chunk ``seq``."""
        base = (seq % self.positions) * self.rows_alloc
        return slice(base, base + self.n_extents * self.extent)

    def stream_slots(self, seq: int, s: int, fill: int) -> np.ndarray:
        """Slots of stream ``s``'s first ``fill`` rows in chunk ``seq``, in row order."""
        pos = seq % self.positions
        mine = np.flatnonzero(self.owner[pos] == s)
        mine = mine[np.argsort(self.erow[pos, mine])]
        return pos * self.rows_alloc + stream_offsets(self.rows_per_stream, mine.tolist(), fill)


def _largest_free_run(owner: np.ndarray) -> int:
    """The first extent of the longest run of free extents (the lowest such run on ties)."""
    free = owner < 0
    starts = np.flatnonzero(free & ~np.concatenate(([False], free[:-1])))
    ends = np.flatnonzero(free & ~np.concatenate((free[1:], [False]))) + 1
    return int(starts[np.argmax(ends - starts)])
