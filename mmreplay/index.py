"""The in-RAM index: every id <-> slot question and which stored transitions are sampleable.

Per slot the index keeps only ``flags`` (uint8), ``epos`` (int32: rows since the
first stored frame of the episode), ``slot_id`` (int64 transition id) and
``valid`` (bool), plus ``id2slot`` — ~22 bytes per slot. It also owns the id
counters (``oldest_id``, ``next_id``) and the row counters (``rows``,
``oldest_row``). The words *row*, *stream* and *slot* are defined in ``layout``.

Parts outside use its methods only: ids to slots, validity of ids, the
sampleable set, a batch's row arithmetic (``plan``), the latest state of each
stream, the episode table. The chunk log tells it about rows written and
chunks retired; the writer tells it about the frames it writes.
"""

from __future__ import annotations

import numpy as np

from .episodes import EpisodeTable, episode_table
from .errors import EpisodeStateError, NotSampleableError
from .layout import DISK_FLAGS, END, HEAD_LOST, INVALID, LOST, MISSING, START, TERMINATED, TRUNCATED, Geometry
from .native import plan as native_plan
from .native.priorities import priority_update
from .plan import Plan, RowMath
from .sequences import SequencePlan, sequence_fits, sequence_plan

__all__ = ["Index", "Geometry", "Plan", "START", "TERMINATED", "TRUNCATED", "MISSING", "HEAD_LOST", "END",
           "LOST", "INVALID", "DISK_FLAGS"]

_EMPTY = np.empty(0, np.int64)
_EMPTY.flags.writeable = False


class _Fits:
    """``Index.fitting_starts``' state: per stream the sorted ids that fitted when rows were ``head``, and
    the first row whose validity was undecided then."""

    def __init__(self, length: int, per_stream: list[np.ndarray], head: int, undecided: int) -> None:
        self.length = length
        self.per_stream = per_stream
        self.head = head
        self.undecided = undecided


class Index:
    """Per-slot bookkeeping and the sampleable set.

    Validity is decided lazily: ``sync()`` examines rows written since the last
    call and returns the slots that became sampleable, so ``step()`` stays a
    handful of array stores.
    """

    def __init__(self, geometry: Geometry, stack: int, n_step: int, pad: str, gamma: float) -> None:
        self.geo = geometry
        self.stack = stack
        self.n_step = n_step
        self.math = RowMath(stack, n_step, pad, gamma)
        self._plan_config = native_plan.config(geometry.num_envs, geometry.rows_per_stream, geometry.rows_alloc,
                                               geometry.positions, stack, n_step, pad == "first", False, 0, 0)
        self.has_missing = False  # a MISSING frame was ever written or loaded (imports only)
        size = geometry.positions * geometry.rows_alloc
        self.flags = np.zeros(size, np.uint8)
        self.epos = np.zeros(size, np.int32)
        self.slot_id = np.full(size, -1, np.int64)
        self.valid = np.zeros(size, np.bool_)
        self.id2slot = np.full(size, -1, np.int64)
        self.seq_of_pos = np.full(geometry.positions, -1, np.int64)  # chunk held at each ring position
        self.rows = 0  # frame rows written per stream
        self.oldest_row = 0  # first retained row (all streams)
        self.next_id = 0  # the id the next transition gets
        self.oldest_id = 0  # the oldest retained id (ids below it were evicted)
        self.checked = np.zeros(geometry.num_envs, np.int64)  # per stream: first row whose validity is undecided
        self.n_valid = 0
        self._synced_rows = -1
        # invalidate()/clear(): invalidated transitions carry the INVALID bit, so no later decision
        # (sync, retire, a rebuild followed by apply_validity) makes them sampleable again. clear() also
        # moves the start of what is listed (episodes, transition tables) to the row it happened at.
        self.clear_id = 0  # ids below were removed by clear()
        self.clear_row = 0  # rows at the time of that clear()
        self.validity_changed = False  # invalidated or cleared since the last commit recorded it
        self._fits: _Fits | None = None  # fitting_starts() of the last length asked

    # -- layout ----------------------------------------------------------------------------------------
    def resize(self, positions: int) -> list[tuple[slice, slice]]:
        """Re-lay the arrays for a ring of ``positions`` chunks, keeping the retained chunks' slots.

        Returns ``(old slots, new slots)`` of every retained chunk, for per-slot structures kept elsewhere.
        """
        old = self.geo
        new = Geometry(old.num_envs, old.rows_per_stream, old.rows_alloc, positions)
        seqs = [int(q) for q in self.seq_of_pos if q >= 0]
        moves = [(old.chunk_slots(q), new.chunk_slots(q)) for q in seqs]
        size = new.size
        arrays = {}
        for name in ("flags", "epos", "slot_id", "valid"):
            src = getattr(self, name)
            dst = np.full(size, -1, src.dtype) if name == "slot_id" else np.zeros(size, src.dtype)
            for a, b in moves:
                dst[b] = src[a]
            arrays[name] = dst
        for name, arr in arrays.items():
            setattr(self, name, arr)
        self.geo = new
        self.seq_of_pos = np.full(positions, -1, np.int64)
        for q in seqs:
            self.seq_of_pos[q % positions] = q
        self.id2slot = np.full(size, -1, np.int64)
        live = np.flatnonzero(self.slot_id >= 0)
        self.id2slot[self.slot_id[live] % size] = live
        return moves

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
        k, n = self.stack, self.n_step
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

    def note_frame(self, slot: int, flags: int, epos: int, tid: int) -> None:
        """``note_frames`` for the one transition frame of an unbatched step (scalar stores only)."""
        self.flags[slot] = flags
        self.epos[slot] = epos
        self.slot_id[slot] = tid
        self.id2slot[tid % self.id2slot.size] = slot
        if flags & MISSING:
            self.has_missing = True

    def mark_head_lost(self, slot: int) -> None:
        """The START frame at ``slot`` begins an episode whose first frames were never stored (imports)."""
        self.flags[slot] |= HEAD_LOST | LOST

    def frame_state(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Of the frames at ``slots``: whether each ended its episode, its episode position, and whether
        its episode lost its head (the writer resumes its per-stream state from these)."""
        f = self.flags[slots]
        return (f & END) != 0, self.epos[slots].copy(), (f & LOST) != 0

    def add_chunk(self, seq: int) -> None:
        """Chunk ``seq`` now occupies its ring position."""
        self.seq_of_pos[seq % self.geo.positions] = seq

    # -- ids -------------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Slots in the ring (what per-slot structures such as the sum tree are sized to)."""
        return self.geo.size

    def slots_of(self, ids: np.ndarray) -> np.ndarray:
        """Ring slots of ids known to be retained."""
        return self.id2slot[ids % self.id2slot.size]

    def slots_of_range(self, lo: int, hi: int) -> np.ndarray:
        """``slots_of(np.arange(lo, hi))`` for retained ids, without the arithmetic: at most two slices."""
        table = self.id2slot
        a = lo % table.size
        b = a + (hi - lo)
        return table[a:b] if b <= table.size else np.concatenate([table[a:], table[: b - table.size]])

    def ids_of(self, slots: np.ndarray) -> np.ndarray:
        """Transition ids stored at ``slots`` (-1 for START frames and empty slots)."""
        return self.slot_id[slots]

    def valid_at(self, slots: np.ndarray) -> np.ndarray:
        """Sampleable mask of ring slots."""
        return self.valid[slots]

    def valid_in_range(self, ids: np.ndarray) -> np.ndarray:
        """Sampleable mask of ids known to lie in the retained range."""
        return self.valid[self.id2slot[ids % self.id2slot.size]]

    def ids_valid(self, ids: np.ndarray) -> np.ndarray:
        """Sampleable mask of any ids (evicted and never-issued ones are not)."""
        inside = (ids >= self.oldest_id) & (ids < self.next_id)
        ok = np.zeros(ids.shape, np.bool_)
        ok[inside] = self.valid[self.slots_of(ids[inside])]
        return ok

    def valid_ids(self) -> np.ndarray:
        """Every sampleable id (sorted int64)."""
        ids = np.arange(self.oldest_id, self.next_id, dtype=np.int64)
        return ids[self.valid[self.slots_of(ids)]]

    def priority_targets(self, ids: np.ndarray, priorities: np.ndarray
                         ) -> tuple[int, int, np.ndarray, np.ndarray, int, float]:
        """Check a priority update of ``ids`` (int64) to ``priorities`` (float64) and resolve it to slots in
        one native pass (``native.priorities.priority_update``: its status codes, the distinct
        sampleable slots with their last value, how many ids were skipped, the largest value)."""
        return priority_update(ids, priorities, self.oldest_id, self.next_id, self.id2slot, self.valid)

    def check_ids(self, ids: np.ndarray) -> None:
        """Raise ``NotSampleableError`` naming the first id that is evicted, never issued or not sampleable."""
        ok = self.ids_valid(ids)
        if ok.all():
            return
        bad = int(np.flatnonzero(~ok)[0])
        i = int(ids[bad])
        if i < 0:
            why = "is not a transition id (ids are >= 0)"
        elif i < self.oldest_id:
            why = f"was evicted (oldest retained id is {self.oldest_id})"
        elif i >= self.next_id:
            why = f"was never issued (next id is {self.next_id})"
        elif i < self.clear_id:
            why = f"was removed by clear() (ids below {self.clear_id})"
        elif self.flags[self.slots_of(np.array([i]))[0]] & INVALID:
            why = "was invalidated (invalidate())"
        else:
            why = "is not sampleable (its n-step window is still open, or its stack history was evicted)"
        raise NotSampleableError(f"index[{bad}] = {i} {why}")

    # -- reading ---------------------------------------------------------------------------------------
    def plan(self, slots: np.ndarray) -> Plan:
        """The row arithmetic of the batch of valid transition slots ``slots``: one native pass
        (``native.plan.plan_batch``), equal array for array to ``plan.RowMath.plan`` (its oracle)."""
        cfg = self._plan_config
        cfg[native_plan.C_POSITIONS] = self.geo.positions
        cfg[native_plan.C_HAS_MISSING] = int(self.has_missing)
        cfg[native_plan.C_OLDEST_ROW] = self.oldest_row
        cfg[native_plan.C_ROWS] = self.rows
        stacks, pad, reward_slots, reward_weights, m, ends = native_plan.plan_batch(
            slots, self.flags, self.epos, self.seq_of_pos, cfg, self.math.gammas)
        return Plan(slots, stacks[0], pad[0], stacks[1], pad[1], reward_slots, reward_weights, m, ends[0], ends[1],
                    ends[2], stacks, pad)

    def plan_numpy(self, slots: np.ndarray) -> Plan:
        """``plan`` through numpy (``plan.RowMath.plan``): the reference the native pass is checked against."""
        return self.math.plan(self.flags, self.epos, self.geo, slots, self.seq_of_pos, self.oldest_row,
                              self.rows, self.has_missing)

    def sequence_plan(self, slots: np.ndarray, length: int, head: int | None = None) -> SequencePlan:
        """The row arithmetic of sequences of ``length`` steps from valid transition slots ``slots``, as they
        were when ``head`` rows were written (default: now; see ``sequences.sequence_plan``)."""
        head = self.rows if head is None else head
        if not self.oldest_row < head <= self.rows:
            raise ValueError(f"head: expected a row count in ({self.oldest_row}, {self.rows}], got {head}")
        if slots.size and int(self.geo.rows_of(slots, self.seq_of_pos)[1].max()) >= head:
            raise ValueError(f"head: {head} rows cannot hold these starts (a start must be written before it)")
        return sequence_plan(self.math, self.flags, self.epos, self.slot_id, self.geo, self.seq_of_pos, slots,
                             length, head)

    def sequence_fits(self, slots: np.ndarray, length: int) -> np.ndarray:
        """Which valid transition slots start ``length`` steps of their episode, written now (bool mask)."""
        return sequence_fits(self.epos, self.geo, self.seq_of_pos, slots, length, self.rows)

    def fitting_starts(self, length: int) -> np.ndarray:
        """Ids of the sampleable transitions that start ``length`` steps of their episode (strict sequences).

        Kept up to date incrementally for the last ``length`` asked: the first call is one pass over the
        sampleable set; later ones re-examine only the rows whose answer can have changed since (written
        since, or within ``length`` rows of the head then, or undecided then): O(streams x (rows written
        since + length + n_step)). Ids that stopped being sampleable after they entered (their stack history
        went with a retired chunk) may remain: callers check what they draw. Evicted ids never remain.
        """
        c = self._fits
        streams = np.arange(self.geo.num_envs, dtype=np.int64)
        if c is None or c.length != length:
            ids = self.valid_ids()
            ids = ids[self.sequence_fits(self.slots_of(ids), length)]
            per = [ids[self.geo.rows_of(self.slots_of(ids), self.seq_of_pos)[0] == s] for s in streams]
        else:
            per = c.per_stream
            cut = max(min(c.head - length + 1, c.undecided), self.oldest_row)
            if self.rows > cut:
                region = self.geo.slots(streams[:, None], np.arange(cut, self.rows, dtype=np.int64)[None, :])
                rid = self.slot_id[region]  # (streams, rows): ids grow with the row inside a stream
                for s in streams:
                    new = rid[s][rid[s] >= 0]
                    if not new.size:
                        continue
                    old = per[s]
                    old = old[(old >= self.oldest_id) & (old < new[0])]  # entries of rows before the cut
                    sl = self.slots_of(new)
                    per[s] = np.concatenate([old, new[self.valid[sl] & self.sequence_fits(sl, length)]])
            per = [a[a >= self.oldest_id] for a in per]
        self._fits = _Fits(length, per, self.rows, max(int(self.checked.min()), self.oldest_row))
        return np.concatenate(per)

    def latest_stacks(self) -> tuple[np.ndarray, np.ndarray]:
        """Slots ``(num_envs, k)`` of every stream's newest stacked state and its zero-padding mask.

        Raises ``EpisodeStateError`` before the first frame.
        """
        if self.rows == 0 or self.rows - 1 < self.oldest_row:
            raise EpisodeStateError("current_obs() before the first reset(obs)")
        s = np.arange(self.geo.num_envs, dtype=np.int64)
        last = np.full(s.size, self.rows - 1, np.int64)
        epos = self.epos[self.geo.slots(s, last)].astype(np.int64)
        return self.math.stack_slots(self.geo, s, last, epos)

    def row_slots(self, stream: int, rows: np.ndarray) -> np.ndarray:
        """Slots of retained rows of one stream; raises ``NotSampleableError`` if any is not retained."""
        if rows.size and (rows[0] < self.oldest_row or rows[-1] >= self.rows):
            raise NotSampleableError(f"rows {rows[0]}..{rows[-1]} are not retained (the store holds rows"
                                     f" {self.oldest_row}..{self.rows - 1}); take a fresh episodes() table")
        return self.geo.slots(stream, rows)

    def episodes(self, rewards: np.ndarray) -> EpisodeTable:
        """The table of episodes with a retained frame (``rewards``: the ring's reward column).

        After ``clear()`` it starts at the row the clear happened at (an episode that ran across it lost
        its head, so it is not complete), or one row earlier for a stream whose episode had just been reset.
        """
        return episode_table(self.flags, rewards, self.slot_id, self.geo.slots, self.geo.num_envs,
                             self.listed_rows(), self.rows)

    def listed_rows(self) -> np.ndarray:
        """Per stream, the first row whose frames are listed (episodes, tables): the oldest retained row,
        or after ``clear()`` the row it happened at (one earlier where that row starts an episode)."""
        n = self.geo.num_envs
        lo = np.full(n, self.oldest_row, np.int64)
        if self.clear_row > self.oldest_row:
            prev = self.flags[self.geo.slots(np.arange(n, dtype=np.int64), self.clear_row - 1)]
            lo[:] = self.clear_row - ((prev & START) != 0)
        return lo

    def transition_rows(self) -> dict[str, np.ndarray]:
        """Every retained transition not removed by ``clear()``, in id order: ``id``, ``slot``, ``stream``,
        ``row`` (of its next frame), ``epos`` (that frame's episode position), ``flags`` (RAM bits),
        ``valid``."""
        lo, hi = max(self.oldest_id, self.clear_id), self.next_id
        if hi <= lo:
            slots = np.empty(0, np.int64)
        else:
            slots = np.asarray(self.slots_of_range(lo, hi), np.int64)
        stream, row = self.geo.rows_of(slots, self.seq_of_pos)
        return {"id": np.arange(lo, max(lo, hi), dtype=np.int64), "slot": slots, "stream": stream, "row": row,
                "epos": self.epos[slots].astype(np.int64), "flags": self.flags[slots], "valid": self.valid[slots]}

    # -- invalidation ----------------------------------------------------------------------------------
    def invalidate(self, ids: np.ndarray) -> tuple[int, np.ndarray]:
        """Make transitions ``ids`` never sampleable again (evicted ids are skipped).

        Returns how many retained ids were newly invalidated and the slots that stopped being sampleable
        (for per-slot structures). Raises ``NotSampleableError`` naming the first id never issued; nothing
        changes then.
        """
        never = (ids < 0) | (ids >= self.next_id)
        if never.any():
            i = int(np.flatnonzero(never)[0])
            raise NotSampleableError(f"index[{i}] = {int(ids[i])} was never issued (next id is {self.next_id})")
        slots = np.unique(self.slots_of(ids[ids >= self.oldest_id]))
        fresh = slots[(self.flags[slots] & INVALID) == 0]
        return int(fresh.size), self._mark_invalid(fresh)

    def clear(self) -> np.ndarray:
        """Remove every transition written so far from sampling and listing (ids keep counting up).

        Returns the slots that stopped being sampleable.
        """
        dropped = self._mark_invalid(np.asarray(self.slots_of_range(self.oldest_id, self.next_id), np.int64))
        self.clear_id, self.clear_row = self.next_id, self.rows
        return dropped

    def _mark_invalid(self, slots: np.ndarray) -> np.ndarray:
        if slots.size == 0:
            return slots
        self.flags[slots] |= INVALID
        was = slots[self.valid[slots]]
        self.valid[was] = False
        self.n_valid -= int(was.size)
        self.validity_changed = True
        return was

    def invalid_ranges(self) -> np.ndarray:
        """The invalidated ids at or after the oldest retained one (and the last clear), as sorted
        disjoint ``[lo, hi)`` ranges: int64 ``(k, 2)``."""
        lo, hi = max(self.oldest_id, self.clear_id), self.next_id
        if hi <= lo:
            return np.empty((0, 2), np.int64)
        bad = (self.flags[self.slots_of_range(lo, hi)] & INVALID) != 0
        edges = np.diff(bad.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
        return np.stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)], axis=1).astype(np.int64) + lo

    def apply_validity(self, ranges: np.ndarray, clear_id: int, clear_row: int) -> None:
        """Restore a durable validity record after ``rebuild`` (ids of ``ranges`` and below ``clear_id``
        invalid; ``clear_row``: the rows written at that clear)."""
        self.clear_id, self.clear_row = int(clear_id), int(clear_row)
        lo, hi = self.oldest_id, self.next_id
        a = np.clip(np.asarray(ranges, np.int64).reshape(-1, 2)[:, 0], lo, hi)
        b = np.clip(np.asarray(ranges, np.int64).reshape(-1, 2)[:, 1], lo, hi)
        a, b = np.append(a, lo), np.append(b, min(max(self.clear_id, lo), hi))
        n = np.maximum(b - a, 0)
        if n.sum():
            starts = np.repeat(a - np.concatenate(([0], np.cumsum(n)[:-1])), n)
            ids = starts + np.arange(int(n.sum()), dtype=np.int64)
            self._mark_invalid(np.unique(self.slots_of(ids)))
        self.validity_changed = False

    # -- validity --------------------------------------------------------------------------------------
    BLOCK = 1 << 16  # candidate rows per stream examined per pass (bounds temporary memory)

    def sync(self) -> np.ndarray:
        """Decide every row whose n-step window has closed since the last call; return newly valid slots."""
        if self.rows == self._synced_rows:
            return _EMPTY  # nothing was written: no window can have closed
        self._synced_rows = self.rows
        # rows per pass scaled so a pass holds about 4M window entries whatever n_step is
        block = min(self.BLOCK, max(64, (1 << 22) // self.n_step))
        found = []
        while True:
            starts = np.maximum(self.checked, self.oldest_row)
            stops = np.minimum(starts + block, self.rows)
            if int((stops - starts).sum()) <= 0:
                self.checked[:] = starts
                break
            found.append(self._sync_block(starts, stops))
            if (self.checked == starts).all() or (stops == self.rows).all():
                break
        return np.concatenate(found) if found else np.empty(0, np.int64)

    def _sync_block(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        geo, n, rows = self.geo, self.n_step, self.rows
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
        ok = ((f & (START | INVALID)) == 0) & boot_ok & self._stack_ok(rho, slots, f)
        new = slots[ok]
        self.valid[new] = True
        self.n_valid += int(new.size)
        self.checked[:] = new_checked
        return new

    def _stack_ok(self, rho: np.ndarray, slots: np.ndarray, f: np.ndarray) -> np.ndarray:
        """The observation stack of transition rows ``rho`` has every real frame it needs retained."""
        f0 = rho - self.epos[slots]  # first stored row of the episode
        lost = ((f & LOST) != 0) | (f0 < self.oldest_row)
        return ~lost | (rho - self.stack >= np.maximum(f0, self.oldest_row))

    def retire(self, seq: int, oldest_id: int) -> np.ndarray:
        """Forget chunk ``seq`` (the oldest); ``oldest_id`` is the oldest id still retained after it.

        Returns the slots to clear in per-slot structures: all of the chunk's, and the rows after it
        that stopped being sampleable because it held their stack history.
        """
        geo = self.geo
        sl = geo.chunk_slots(seq)
        self.oldest_id = oldest_id
        self.seq_of_pos[seq % geo.positions] = -1
        cleared = np.arange(sl.start, sl.stop, dtype=np.int64)
        self.n_valid -= int(np.count_nonzero(self.valid[sl]))
        self.valid[sl] = False
        self.slot_id[sl] = -1
        self.flags[sl] = 0
        self.oldest_row = (seq + 1) * geo.rows_per_stream
        # Rows near the new oldest row may have lost stack history.
        rows = np.arange(self.oldest_row, min(self.oldest_row + self.stack, self.rows), dtype=np.int64)
        if rows.size == 0:
            return cleared
        stream = np.repeat(np.arange(geo.num_envs, dtype=np.int64), rows.size)
        rho = np.tile(rows, geo.num_envs)
        slots = geo.slots(stream, rho)
        cand = self.valid[slots]
        slots, rho = slots[cand], rho[cand]
        bad = slots[~self._stack_ok(rho, slots, self.flags[slots])]
        self.valid[bad] = False
        self.n_valid -= int(bad.size)
        return np.concatenate([cleared, bad])

