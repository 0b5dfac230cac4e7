"""The in-RAM index: which stored transitions are sampleable, and the row arithmetic of a batch.

Vocabulary (FORMAT.md has the full picture):

- A *frame row* ``r`` of env stream ``s`` is the r-th frame that stream wrote.
  All streams write one frame per ``reset()``/``step()``, so they advance in
  lockstep and share the row counter ``rows``.
- A frame is either an episode's first observation (flag ``START``) or the
  ``next_obs`` of a transition; the transition's action, reward and flags are
  stored in the same row. So "transition ρ" means the transition whose next
  frame is row ρ; its observation is row ρ-1.
- A *slot* is the element of the ring arrays holding a row:
  ``slot = (chunk % positions) * rows_alloc + s * rows_per_stream + r % rows_per_stream``
  with ``chunk = r // rows_per_stream`` (stream-major inside a chunk, so one
  env's stack is contiguous on disk).

Per slot the index keeps only ``flags`` (uint8), ``epos`` (int32: rows since
the first stored frame of the episode), ``slot_id`` (int64 transition id) and
``valid`` (bool), plus ``id2slot`` — ~14 bytes per slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_EMPTY = np.empty(0, np.int64)
_EMPTY.flags.writeable = False

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


@dataclass(frozen=True)
class Geometry:
    num_envs: int
    rows_per_stream: int  # Rs
    rows_alloc: int  # A
    positions: int  # P

    def slots(self, s: np.ndarray | int, r: np.ndarray | int) -> np.ndarray:
        """Ring slot of row(s) ``r`` of stream(s) ``s`` (broadcasting)."""
        rs = self.rows_per_stream
        q, within = np.divmod(np.asarray(r, dtype=np.int64), rs)
        return (q % self.positions) * self.rows_alloc + (np.asarray(s, dtype=np.int64) * rs + within)

    def chunk_slots(self, seq: int) -> slice:
        base = (seq % self.positions) * self.rows_alloc
        return slice(base, base + self.num_envs * self.rows_per_stream)


@dataclass
class Plan:
    """Row arithmetic of a batch: ring slots to gather and masks to apply (all numpy, shape B first)."""

    slots: np.ndarray  # (B,) the transitions' own slots (action, extras, id)
    obs_slots: np.ndarray  # (B, k)
    obs_pad: np.ndarray  # (B, k) True where the frame is zero padding
    next_slots: np.ndarray  # (B, k)
    next_pad: np.ndarray  # (B, k)
    reward_slots: np.ndarray  # (B, n) clamped to written rows; weights are 0 where unused
    reward_weights: np.ndarray  # (B, n) float64 gamma**i for i < m, else 0
    m: np.ndarray  # (B,) window length
    terminated: np.ndarray  # (B,) bool
    truncated: np.ndarray  # (B,) bool
    next_missing: np.ndarray  # (B,) bool: terminated onto a missing final frame -> next_obs is all zeros


class Index:
    """Per-slot bookkeeping and the sampleable set.

    Validity is decided lazily: ``sync()`` examines rows written since the last
    call and returns the slots that became sampleable, so ``step()`` stays a
    handful of array stores.
    """

    def __init__(self, geometry: Geometry, stack: int, n_step: int, pad: str, gamma: float) -> None:
        self.geo = geometry
        self.k = stack
        self.n = n_step
        self.pad_first = pad == "first"
        self._back = np.arange(stack - 1, -1, -1, dtype=np.int64)  # k-1 .. 0: oldest frame first
        self._ar_n = np.arange(n_step, dtype=np.int64)
        self._ar_k = np.arange(stack, dtype=np.int64)
        self._span = np.arange(-stack, n_step, dtype=np.int64)
        self._last_col = np.arange(n_step) == n_step - 1
        # reward weights of a window of length m: gamma**i for i < m, else 0 (row m of this table)
        self._weights = np.array([[gamma ** i if i < m else 0.0 for i in range(n_step)]
                                  for m in range(n_step + 1)], np.float64)
        self.has_missing = False  # a MISSING frame was ever written or loaded (imports only)
        size = geometry.positions * geometry.rows_alloc
        self.flags = np.zeros(size, np.uint8)
        self.epos = np.zeros(size, np.int32)
        self.slot_id = np.full(size, -1, np.int64)
        self.valid = np.zeros(size, np.bool_)
        self.id2slot = np.full(size, -1, np.int64)
        self.rows = 0  # frame rows written per stream
        self.oldest_row = 0  # first retained row (all streams)
        self.checked = np.zeros(geometry.num_envs, np.int64)  # per stream: first row whose validity is undecided
        self.n_valid = 0
        self._synced_rows = -1

    # -- layout ----------------------------------------------------------------------------------------
    def resize(self, positions: int, retained_seqs: list[int]) -> None:
        """Re-lay the arrays for a ring of ``positions`` chunks, keeping the retained chunks' slots."""
        old = self.geo
        new = Geometry(old.num_envs, old.rows_per_stream, old.rows_alloc, positions)
        size = positions * old.rows_alloc
        arrays = {}
        for name in ("flags", "epos", "slot_id", "valid"):
            src = getattr(self, name)
            dst = np.full(size, -1, src.dtype) if name == "slot_id" else np.zeros(size, src.dtype)
            for seq in retained_seqs:
                dst[new.chunk_slots(seq)] = src[old.chunk_slots(seq)]
            arrays[name] = dst
        for name, arr in arrays.items():
            setattr(self, name, arr)
        self.geo = new
        self.id2slot = np.full(size, -1, np.int64)
        live = np.flatnonzero(self.slot_id >= 0)
        self.id2slot[self.slot_id[live] % size] = live

    def rebuild(self, r0: int, slots: np.ndarray, flags: np.ndarray, first_id: int) -> np.ndarray:
        """Fill the index from the disk flags of retained rows ``r0 ..`` (``slots``/``flags``: (R, streams),
        rows in order) and decide every row at once. Returns the sampleable slots.

        Transition ids are counted in (row, stream) order from ``first_id``. This is ``sync()`` specialised
        for a whole store: the same rules, computed in row space with a few passes over the arrays.
        """
        n_rows = slots.shape[0]
        self.oldest_row = r0
        self.checked[:] = r0
        self._synced_rows = self.rows
        if n_rows == 0:
            return np.empty(0, np.int64)
        k, n = self.k, self.n
        pos = np.arange(n_rows, dtype=np.int64)[:, None]
        start = (flags & START) != 0
        end = (flags & (TERMINATED | TRUNCATED)) != 0
        end[:-1] |= start[1:]  # a START ends the episode before it (truncation by reset)
        last_start = np.maximum.accumulate(np.where(start, pos, -1), axis=0)
        # An episode whose START was retired counts from one row before the oldest: its head is gone.
        epos = np.where(last_start >= 0, pos - last_start, pos + 1)
        cols = np.arange(slots.shape[1], dtype=np.int64)
        if (flags & HEAD_LOST).any():  # imports only: the flag is propagated to the episode's frames
            lost = ((flags & HEAD_LOST) != 0)[np.maximum(last_start, 0), cols] & (last_start >= 0)
        else:
            lost = np.zeros(flags.shape, np.bool_)
        tx = ~start
        count = np.cumsum(tx.ravel())
        ids = np.where(tx, first_id + count.reshape(tx.shape) - 1, -1)
        ram_flags = flags | np.where(end, END, 0).astype(np.uint8) | np.where(lost, LOST, 0).astype(np.uint8)
        self.flags[slots] = ram_flags
        self.epos[slots] = epos
        self.slot_id[slots] = ids
        # ids are consecutive: their id2slot positions are one range modulo the ring (two slices at most)
        live_slots = slots.ravel()[tx.ravel()]
        size = self.id2slot.size
        lo = first_id % size
        cut = min(live_slots.size, size - lo)
        self.id2slot[lo:lo + cut] = live_slots[:cut]
        self.id2slot[:live_slots.size - cut] = live_slots[cut:]
        # Window of the transition at row r: up to the first episode end at or after r, at most n rows.
        next_end = np.minimum.accumulate(np.where(end, pos, n_rows + n)[::-1], axis=0)[::-1]
        dist = next_end - pos
        complete = (dist < n) | (pos + n - 1 < n_rows)
        valid = tx & complete
        if (flags & MISSING).any():  # imports only: rows that would bootstrap from a missing frame
            self.has_missing = True
            last = np.minimum(pos + np.minimum(dist + 1, n) - 1, n_rows - 1)
            last_f = ram_flags[last, cols]
            valid &= ((last_f & MISSING) == 0) | ((last_f & TERMINATED) != 0)
        f0 = pos - epos  # the episode's first stored row (relative; -1 when retired)
        valid &= (~lost & (f0 >= 0)) | (pos - k >= np.maximum(f0, 0))
        incomplete = ~complete
        self.checked[:] = np.where(incomplete.any(axis=0), r0 + incomplete.argmax(axis=0), r0 + n_rows)
        new = slots[valid]
        self.valid[new] = True
        self.n_valid = int(new.size)
        return new

    # -- writing ---------------------------------------------------------------------------------------
    def note_frames(self, slots: np.ndarray, flags: np.ndarray, epos: np.ndarray, ids: np.ndarray) -> None:
        """Record frames written at ``slots`` (one per stream, or a subset). ids < 0 for START frames."""
        self.flags[slots] = flags
        self.epos[slots] = epos
        self.slot_id[slots] = ids
        has = ids >= 0
        if has.all():
            self.id2slot[ids % self.id2slot.size] = slots
        elif has.any():
            self.id2slot[ids[has] % self.id2slot.size] = slots[has]

    def mark_end(self, slots: np.ndarray) -> None:
        """A START followed these frames: they ended their episodes (truncation by reset)."""
        self.flags[slots] |= END

    # -- validity --------------------------------------------------------------------------------------
    BLOCK = 1 << 16  # candidate rows per stream examined per pass (bounds temporary memory)

    def sync(self) -> np.ndarray:
        """Decide every row whose n-step window has closed since the last call; return newly valid slots."""
        if self.rows == self._synced_rows:
            return _EMPTY  # nothing was written: no window can have closed
        self._synced_rows = self.rows
        found = []
        while True:
            starts = np.maximum(self.checked, self.oldest_row)
            stops = np.minimum(starts + self.BLOCK, self.rows)
            if int((stops - starts).sum()) <= 0:
                self.checked[:] = starts
                break
            found.append(self._sync_block(starts, stops))
            if (self.checked == starts).all() or (stops == self.rows).all():
                break
        return np.concatenate(found) if found else np.empty(0, np.int64)

    def _sync_block(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        geo, n, rows = self.geo, self.n, self.rows
        counts = stops - starts
        total = int(counts.sum())
        stream = np.repeat(np.arange(geo.num_envs, dtype=np.int64), counts)
        offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
        rho = np.repeat(starts - offsets, counts) + np.arange(total, dtype=np.int64)
        win = rho[:, None] + np.arange(n, dtype=np.int64)  # (M, n) the window's frame rows
        written = win < rows
        wslots = geo.slots(stream[:, None], np.minimum(win, rows - 1))
        ends = written & ((self.flags[wslots] & END) != 0)
        has_end = ends.any(axis=1)
        complete = has_end | written[:, -1]
        # Completion is monotone in the row, so a stream's first incomplete row is where it stops.
        new_checked = stops.copy()
        np.minimum.at(new_checked, stream[~complete], rho[~complete])
        done = rho < new_checked[stream]
        rho, stream, ends, has_end, wslots = rho[done], stream[done], ends[done], has_end[done], wslots[done]
        slots = geo.slots(stream, rho)
        f = self.flags[slots]
        m = np.where(has_end, ends.argmax(axis=1) + 1, n)
        last_f = self.flags[wslots[np.arange(rho.size), m - 1]]
        boot_ok = ((last_f & MISSING) == 0) | ((last_f & TERMINATED) != 0)
        ok = ((f & START) == 0) & boot_ok & self._stack_ok(rho, slots, f)
        new = slots[ok]
        self.valid[new] = True
        self.n_valid += int(new.size)
        self.checked[:] = new_checked
        return new

    def _stack_ok(self, rho: np.ndarray, slots: np.ndarray, f: np.ndarray) -> np.ndarray:
        """The observation stack of transition rows ``rho`` has every real frame it needs retained."""
        f0 = rho - self.epos[slots]  # first stored row of the episode
        lost = ((f & LOST) != 0) | (f0 < self.oldest_row)
        return ~lost | (rho - self.k >= np.maximum(f0, self.oldest_row))

    def retire(self, seq: int) -> tuple[slice, np.ndarray]:
        """Forget chunk ``seq`` (the oldest). Returns its slot range and the valid slots it invalidated elsewhere."""
        geo = self.geo
        sl = geo.chunk_slots(seq)
        self.n_valid -= int(np.count_nonzero(self.valid[sl]))
        self.valid[sl] = False
        self.slot_id[sl] = -1
        self.flags[sl] = 0
        self.oldest_row = (seq + 1) * geo.rows_per_stream
        # Rows near the new oldest row may have lost stack history.
        rows = np.arange(self.oldest_row, min(self.oldest_row + self.k, self.rows), dtype=np.int64)
        if rows.size == 0:
            return sl, np.empty(0, np.int64)
        stream = np.repeat(np.arange(geo.num_envs, dtype=np.int64), rows.size)
        rho = np.tile(rows, geo.num_envs)
        slots = geo.slots(stream, rho)
        cand = self.valid[slots]
        slots, rho = slots[cand], rho[cand]
        bad = slots[~self._stack_ok(rho, slots, self.flags[slots])]
        self.valid[bad] = False
        self.n_valid -= int(bad.size)
        return sl, bad

    # -- batches ---------------------------------------------------------------------------------------
    def rows_of(self, slots: np.ndarray, seq_of_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(stream, row) of ring slots, given the chunk sequence number held at each ring position."""
        geo = self.geo
        pos, off = np.divmod(slots, geo.rows_alloc)
        s, within = np.divmod(off, geo.rows_per_stream)
        return s, seq_of_pos[pos] * geo.rows_per_stream + within

    def stack_slots(self, s: np.ndarray, last: np.ndarray, epos_last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of the k-frame stacks ending at rows ``last`` (oldest first) and their zero-padding mask.

        Works for any leading shape of ``s``/``last``/``epos_last`` (broadcast together).
        """
        back = self._back
        pad = back > epos_last[..., None]
        rows = last[..., None] - back
        if self.pad_first or pad.any():
            rows = np.where(pad, (last - epos_last)[..., None], rows)  # the episode's first frame
            if self.pad_first:
                pad = np.zeros_like(pad)
        return self.geo.slots(s[..., None], rows), pad

    def plan(self, slots: np.ndarray, seq_of_pos: np.ndarray) -> Plan:
        """Everything needed to build the rows of *valid* transition slots (vectorized, no data access).

        Every frame a row needs lies in the span of rows ``rho-k .. rho+n-1`` of its stream (obs
        stack, n-step window, next stack), so one slot computation over that span serves all.
        Column ``c`` of the span is row ``rho + c - k``. When no row's span leaves its chunk (all but
        a few rows per chunk), the span's slots are the row's slot plus offsets; otherwise they are
        computed row by row with the span clamped to retained, written rows. Either way a valid
        row's window never reaches past its first episode end before that end, and positions
        before its episode's first frame are padding: what such slots hold is never used.
        """
        k, n = self.k, self.n
        geo = self.geo
        within = slots % geo.rows_alloc % geo.rows_per_stream
        if ((within < k) | (within > geo.rows_per_stream - n)).any():
            s, rho = self.rows_of(slots, seq_of_pos)
            span = rho[:, None] + self._span
            np.maximum(span, self.oldest_row, out=span)
            np.minimum(span, self.rows - 1, out=span)
            sl = geo.slots(s[:, None], span)  # (B, k+n)
        else:
            sl = slots[:, None] + self._span
        wslots = sl[:, k:]
        fl = self.flags[wslots]  # the window's frames
        ends = (fl & END) != 0
        m = (ends | self._last_col).argmax(axis=1) + 1  # window length: up to and including the first end
        idx = np.arange(slots.size)
        last_f = fl[idx, m - 1]
        has_end = ends.any(axis=1)
        terminated = (last_f & TERMINATED) != 0
        # A span column c is before the episode's first stored frame iff c < k - epos(rho).
        first_col = k - self.epos[slots]
        obs_pad = self._ar_k < first_col[:, None]
        next_cols = m[:, None] + self._ar_k
        next_pad = next_cols < first_col[:, None]
        obs_slots = sl[:, :k]
        next_slots = sl[idx[:, None], next_cols]
        if self.pad_first:
            first = sl[idx, np.maximum(first_col, 0)][:, None]
            obs_slots = np.where(obs_pad, first, obs_slots)
            next_slots = np.where(next_pad, first, next_slots)
            obs_pad = next_pad = np.zeros_like(obs_pad)
        missing = terminated & ((last_f & MISSING) != 0) if self.has_missing else np.zeros_like(terminated)
        return Plan(slots, obs_slots, obs_pad, next_slots, next_pad, wslots, self._weights[m], m, terminated,
                    has_end & ~terminated, missing)
