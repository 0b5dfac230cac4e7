"""The in-RAM index: every id <-> slot question and which stored transitions are sampleable.

Per slot the index keeps only ``flags`` (uint8), ``episode_pos`` (int32: rows since the
first stored frame of the episode), ``slot_id`` (int64 transition id) and
``valid`` (bool), plus ``id2slot`` — ~22 bytes per slot. It also owns the id
counters (``oldest_id``, ``next_id``), the row counters of every stream (``rows``,
``oldest_row``: arrays, one entry per stream) and the ``Geometry`` that maps a
stream's rows to slots. The words *row*, *stream* and *slot* are defined in ``layout``.

Parts outside use its methods only: ids to slots, validity of ids, the
sampleable set, a batch's row arithmetic (``plan``), the latest state of each
stream, the episode table. The chunk log tells it about rows written
(``append_row``, ``append_run``), chunks retired (``retire``) and a commit's
counters (``restore_counters``); the writer tells it about the frames it writes;
durability that a commit recorded the validity (``validity_committed``). Its
arrays and counters are private: the counters others read are read-only
properties (arrays among them are read-only views), so each change goes through
the method that keeps the counters consistent with one another.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import EpisodeStateError, NotSampleableError
from ..native import jit_enabled
from ..native import plan as native_plan
from ..native.priorities import priority_update
from ..native.reference import priority_update_numpy
from ..native.rng import Pcg64State, draw_slots
from .episodes import EpisodeTable, episode_table
from .layout import DISK_FLAGS, END, HEAD_LOST, INVALID, LOST, MISSING, START, TERMINATED, TRUNCATED, Geometry
from .plan import Plan, RowMath
from .sequences import SequencePlan, sequence_fits, sequence_plan

__all__ = ["Index", "Geometry", "Plan", "START", "TERMINATED", "TRUNCATED", "MISSING", "HEAD_LOST", "END",
           "LOST", "INVALID", "DISK_FLAGS"]

_EMPTY = np.empty(0, np.int64)
_EMPTY.flags.writeable = False


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (what the counters' properties hand out: changes go through ``Index``)."""
    v = a.view()
    v.flags.writeable = False
    return v


class _Fits:
    """``Index.fitting_starts``' state: per stream the sorted ids that fitted when its rows were ``head``,
    and its first row whose validity was undecided then."""

    def __init__(self, length: int, per_stream: list[np.ndarray], head: np.ndarray, undecided: np.ndarray) -> None:
        self.length = length
        self.per_stream = per_stream
        self.head = head
        self.undecided = undecided


class Index:
    """Per-slot bookkeeping and the sampleable set.

    Validity is decided lazily: ``update_validity()`` examines rows written since the last
    call and returns the slots that became sampleable, so ``step()`` stays a
    handful of array stores.
    """

    def __init__(self, geometry: Geometry, stack: int, n_step: int, pad: str, gamma: float) -> None:
        self.geo = geometry
        self.stack = stack
        self.n_step = n_step
        self.math = RowMath(stack, n_step, pad, gamma)
        self._pcg: Pcg64State | None = None  # (draw_uniform: the state of the generator last drawn with)
        self._native = jit_enabled()  # False under NUMBA_DISABLE_JIT=1: the numpy plan and priority checks
        self._plan_config = native_plan.config(geometry.num_envs, geometry.rows_per_stream, geometry.rows_alloc,
                                               geometry.positions, stack, n_step, pad == "first", False, 0, 0)
        self._has_missing = False  # a MISSING frame was ever written or loaded (imports only)
        size = geometry.positions * geometry.rows_alloc
        n_env = geometry.num_envs
        self._flags = np.zeros(size, np.uint8)
        self._episode_pos = np.zeros(size, np.int32)
        self._slot_id = np.full(size, -1, np.int64)
        self._valid = np.zeros(size, np.bool_)
        self._id2slot = np.full(size, -1, np.int64)
        self._rows = np.zeros(n_env, np.int64)  # per stream: frame rows written (updated in place, never replaced)
        self._rows_view = self._rows.view()  # what ``rows`` hands out: read-only, and current as ``_rows`` changes
        self._rows_view.flags.writeable = False
        self._rows0 = 0  # ``_rows[0]`` as a Python int (the one-stream step stores it, cheaper than ``+= 1``)
        self._one_stream = n_env == 1
        self._oldest_row = np.zeros(n_env, np.int64)  # per stream: first retained row
        self._written = 0  # frame rows written by all streams (what ``update_validity`` compares with)
        self._next_id = 0  # the id the next transition gets
        self._oldest_id = 0  # the oldest retained id (ids below it were evicted)
        self._checked = np.zeros(n_env, np.int64)  # per stream: first row whose validity is undecided
        self._n_valid = 0
        self._validity_rows = -1
        # Per stream, the state of its last frame once that frame was retired (ended, episode_pos, lost):
        # a stream idle for a whole capacity must still continue its episode correctly.
        self._tail = np.zeros((n_env, 3), np.int64)
        # invalidate()/clear(): invalidated transitions carry the INVALID bit, so no later decision
        # (update_validity, retire, a rebuild followed by apply_validity) makes them sampleable again. clear() also
        # moves the start of what is listed (episodes, transition tables) to the row it happened at.
        self._clear_id = 0  # ids below were removed by clear()
        self._clear_row = np.zeros(n_env, np.int64)  # per stream: rows at the time of that clear()
        self._validity_changed = False  # invalidated or cleared since the last commit recorded it
        self._fits: _Fits | None = None  # fitting_starts() of the last length asked

    @property
    def seq_of_pos(self) -> np.ndarray:
        """The chunk held at each ring position (-1: free)."""
        return self.geo.seq_of_pos

    # -- counters (read-only; changed by the methods below and by retire, invalidate, clear, update_validity) -------
    @property
    def rows(self) -> np.ndarray:
        """Per stream, the frame rows written (a read-only view that follows them)."""
        return self._rows_view

    @property
    def oldest_row(self) -> np.ndarray:
        """Per stream, its first retained row (read-only)."""
        return _readonly(self._oldest_row)

    @property
    def next_id(self) -> int:
        """The id the next transition gets."""
        return self._next_id

    @property
    def oldest_id(self) -> int:
        """The oldest retained id (ids below it were evicted)."""
        return self._oldest_id

    @property
    def n_valid(self) -> int:
        """How many transitions are sampleable (as of the last ``update_validity``)."""
        return self._n_valid

    @property
    def clear_id(self) -> int:
        """Ids below were removed by ``clear()``."""
        return self._clear_id

    @property
    def clear_row(self) -> np.ndarray:
        """Per stream, the rows it had written at the last ``clear()`` (read-only)."""
        return _readonly(self._clear_row)

    @property
    def validity_changed(self) -> bool:
        """Whether transitions were invalidated or cleared since a commit last recorded the validity."""
        return self._validity_changed

    def append_row(self, n_transitions: int) -> int:
        """Every stream wrote one more row, holding ``n_transitions`` transitions: its row count, ``written``
        and ``next_id`` advance together. Returns stream 0's row count."""
        if self._one_stream:
            self._rows0 += 1
            self._rows[0] = self._rows0
        else:
            self._rows += 1
            self._rows0 += 1
        self._written += self._rows.size
        self._next_id += n_transitions
        return self._rows0

    def append_run(self, s: int, n_rows: int, n_transitions: int) -> int:
        """Stream ``s`` wrote ``n_rows`` more rows, holding ``n_transitions`` transitions: its row count,
        ``written`` and ``next_id`` advance together. Returns stream 0's row count."""
        self._rows[s] += n_rows
        if s == 0:
            self._rows0 += n_rows
        self._written += n_rows
        self._next_id += n_transitions
        return self._rows0

    def restore_counters(self, rows: np.ndarray, next_id: int, oldest_id: int) -> None:
        """A commit's counters (opening a store): rows per stream, the next and the oldest retained id;
        ``written`` is their rows together."""
        self._rows[:] = rows
        self._rows0 = int(rows[0])
        self._written = int(rows.sum())
        self._next_id = next_id
        self._oldest_id = oldest_id

    def validity_committed(self) -> None:
        """A commit recorded the validity as it is now: ``validity_changed`` is False until the next change."""
        self._validity_changed = False

    # -- layout ----------------------------------------------------------------------------------------
    def resize(self, positions: int) -> list[tuple[slice, slice]]:
        """Re-lay the arrays for a ring of ``positions`` chunks, keeping the retained chunks' slots.

        Returns ``(old slots, new slots)`` of every retained chunk, for per-slot structures kept elsewhere.
        """
        old = self.geo
        new = old.resized(positions)
        seqs = [int(q) for q in old.seq_of_pos if q >= 0]
        moves = [(old.chunk_slots(q), new.chunk_slots(q)) for q in seqs]
        size = new.size
        arrays = {}
        for name in ("_flags", "_episode_pos", "_slot_id", "_valid"):
            src = getattr(self, name)
            dst = np.full(size, -1, src.dtype) if name == "_slot_id" else np.zeros(size, src.dtype)
            for a, b in moves:
                dst[b] = src[a]
            arrays[name] = dst
        for name, arr in arrays.items():
            setattr(self, name, arr)
        self.geo = new
        self._id2slot = np.full(size, -1, np.int64)
        live = np.flatnonzero(self._slot_id >= 0)
        self._id2slot[self._slot_id[live] % size] = live
        return moves

    def rebuild(self, streams: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]],
                tails: np.ndarray | None = None, heads: np.ndarray | None = None) -> np.ndarray:
        """Fill the index from the disk flags of every stream's retained rows and decide every row at once.

        ``streams[s] = (r0, slots, flags, ids)``: stream s's first retained row, then the slots, disk
        flags and transition ids (-1 on START rows) of its retained rows in row order. ``tails``: per
        stream (ended, episode_pos, lost) of its last frame, used when that frame is not retained. ``heads``: per
        stream the episode position of its oldest retained row (``head_epos``), so an episode whose start
        was retired keeps the positions the writing store gave it. Returns the
        sampleable slots. This is ``update_validity()`` specialised for a whole store: the same rules, computed in
        row space with a few passes over each stream's arrays.
        """
        if tails is not None:
            self._tail[:] = tails
        self._validity_rows = self._written
        valid = [self._rebuild_stream(s, *parts, head=1 if heads is None else max(1, int(heads[s])))
                 for s, parts in enumerate(streams)]
        live = [(sl[ids >= 0], ids[ids >= 0]) for _, sl, _, ids in streams]
        size = self._id2slot.size
        if len(live) == 1 and live[0][1].size and live[0][1][-1] - live[0][1][0] == live[0][1].size - 1:
            # one stream: its ids are consecutive, so their id2slot positions are one range modulo the
            # ring (two slices at most) -- no scatter over a million elements on open
            live_slots, ids = live[0]
            lo = int(ids[0]) % size
            cut = min(live_slots.size, size - lo)
            self._id2slot[lo:lo + cut] = live_slots[:cut]
            self._id2slot[:live_slots.size - cut] = live_slots[cut:]
        else:
            for live_slots, ids in live:
                self._id2slot[ids % size] = live_slots
        new = np.concatenate(valid) if valid else np.empty(0, np.int64)
        self._n_valid = int(new.size)
        return new

    def _rebuild_stream(self, s: int, r0: int, slots: np.ndarray, flags: np.ndarray, ids: np.ndarray,
                        head: int = 1) -> np.ndarray:
        n_rows = slots.size
        self._oldest_row[s] = r0
        self._checked[s] = r0
        if n_rows == 0:
            return np.empty(0, np.int64)
        k, n = self.stack, self.n_step
        pos = np.arange(n_rows, dtype=np.int64)
        start = (flags & START) != 0
        end = (flags & (TERMINATED | TRUNCATED)) != 0
        end[:-1] |= start[1:]  # a START ends the episode before it (truncation by reset)
        last_start = np.maximum.accumulate(np.where(start, pos, -1))
        # An episode whose START was retired continues from the position its oldest retained row had
        # (``head``; at least one row before the oldest: its head is gone).
        episode_pos = np.where(last_start >= 0, pos - last_start, pos + head)
        if (flags & HEAD_LOST).any():  # imports only: the flag is propagated to the episode's frames
            lost = ((flags & HEAD_LOST) != 0)[np.maximum(last_start, 0)] & (last_start >= 0)
        else:
            lost = np.zeros(flags.shape, np.bool_)
        tx = ~start
        ram_flags = flags | np.where(end, END, 0).astype(np.uint8) | np.where(lost, LOST, 0).astype(np.uint8)
        self._flags[slots] = ram_flags
        self._episode_pos[slots] = episode_pos
        self._slot_id[slots] = ids
        # Window of the transition at row r: up to the first episode end at or after r, at most n rows.
        next_end = np.minimum.accumulate(np.where(end, pos, n_rows + n)[::-1])[::-1]
        dist = next_end - pos
        complete = (dist < n) | (pos + n - 1 < n_rows)
        valid = tx & complete
        if (flags & MISSING).any():  # imports only: rows that would bootstrap from a missing frame
            self._has_missing = True
            last = np.minimum(pos + np.minimum(dist + 1, n) - 1, n_rows - 1)
            last_f = ram_flags[last]
            valid &= ((last_f & MISSING) == 0) | ((last_f & TERMINATED) != 0)
        f0 = pos - episode_pos  # the episode's first stored row (relative; -1 when retired)
        valid &= (~lost & (f0 >= 0)) | (pos - k >= np.maximum(f0, 0))
        incomplete = ~complete
        self._checked[s] = r0 + int(incomplete.argmax()) if incomplete.any() else r0 + n_rows
        new = slots[valid]
        self._valid[new] = True
        return new

    # -- writing ---------------------------------------------------------------------------------------
    def note_frames(self, slots: np.ndarray, flags: np.ndarray, episode_pos: np.ndarray, ids: np.ndarray) -> None:
        """Record frames written at ``slots`` (any streams and rows). ids < 0 for START frames."""
        self._flags[slots] = flags
        self._episode_pos[slots] = episode_pos
        self._slot_id[slots] = ids
        has = ids >= 0
        if has.all():
            self._id2slot[ids % self._id2slot.size] = slots
        elif has.any():
            self._id2slot[ids[has] % self._id2slot.size] = slots[has]
        if not self._has_missing and (flags & MISSING).any():
            self._has_missing = True

    def mark_end(self, slots: np.ndarray) -> None:
        """A START followed these frames: they ended their episodes (truncation by reset)."""
        self._flags[slots] |= END

    def note_frame(self, slot: int, flags: int, episode_pos: int, tid: int) -> None:
        """``note_frames`` for the one transition frame of an unbatched step (scalar stores only)."""
        self._flags[slot] = flags
        self._episode_pos[slot] = episode_pos
        self._slot_id[slot] = tid
        self._id2slot[tid % self._id2slot.size] = slot
        if flags & MISSING:
            self._has_missing = True

    def mark_head_lost(self, slot: int) -> None:
        """The START frame at ``slot`` begins an episode whose first frames were never stored (imports)."""
        self._flags[slot] |= HEAD_LOST | LOST

    def last_slots(self) -> np.ndarray:
        """Per stream: the slot of its last frame, -1 if it wrote none or that frame was retired."""
        out = np.full(self.geo.num_envs, -1, np.int64)
        held = (self._rows > 0) & (self._rows > self._oldest_row)
        if held.any():
            s = np.flatnonzero(held)
            out[s] = self.geo.slots(s, self._rows[s] - 1)
        return out

    def head_episode_pos(self) -> np.ndarray:
        """Per stream, the episode position of its oldest retained row (0 when it retains none): a
        manifest's ``head_epos``, from which ``rebuild`` restores the positions of an episode whose start
        was retired."""
        out = np.zeros(self._rows.shape, np.int64)
        held = np.flatnonzero(self._rows > self._oldest_row)
        if held.size:
            out[held] = self._episode_pos[self.geo.slots(held, self._oldest_row[held])]
        return out

    def stream_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per stream, of its last frame: whether it ended its episode, its episode position, whether its
        episode lost its head (the writer resumes from these; a stream that wrote nothing has ended)."""
        last = self.last_slots()
        held = last >= 0
        ended = self._tail[:, 0] != 0
        episode_pos = self._tail[:, 1].astype(np.int32)
        lost = self._tail[:, 2] != 0
        f = self._flags[last[held]]
        ended[held] = (f & END) != 0
        episode_pos[held] = self._episode_pos[last[held]]
        lost[held] = (f & LOST) != 0
        ended[self._rows == 0] = True
        return ended, episode_pos, lost

    def add_chunk(self, seq: int, first_rows: np.ndarray | None = None) -> None:
        """Chunk ``seq`` now occupies its ring position; ``first_rows``: each stream's row at offset 0
        of its section (default: every stream at ``seq * rows_per_stream``, the layout of batched writes)."""
        if first_rows is None:
            first_rows = np.full(self.geo.num_envs, seq * self.geo.rows_per_stream, np.int64)
        self.geo.place(seq, first_rows)

    def take_extent(self, seq: int, s: int, row: int) -> int:
        """Stream ``s``'s rows from ``row`` on go to a free extent of the open chunk ``seq`` (the caller checked
        one is free); returns the slot of ``row``."""
        return self.geo.allocate(seq, s, row)

    def seal_chunk(self, seq: int, fills: np.ndarray) -> None:
        """Chunk ``seq`` was sealed holding ``fills`` rows of each stream."""
        self.geo.seal(seq, fills)

    def restore_chunk(self, seq: int, first_rows: np.ndarray, fills: np.ndarray, extents: list[list[int]] | None,
                      sealed: bool) -> None:
        """A committed chunk (opening a store); ``restored()`` follows once every chunk is placed."""
        self.geo.restore(seq, first_rows, fills, extents, sealed)

    def restored(self) -> None:
        self.geo.restored()

    # -- ids -------------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Slots in the ring (what per-slot structures such as the sum tree are sized to)."""
        return self.geo.size

    def slots_of(self, ids: np.ndarray) -> np.ndarray:
        """Ring slots of ids known to be retained."""
        return self._id2slot[ids % self._id2slot.size]

    def slots_of_range(self, lo: int, hi: int) -> np.ndarray:
        """``slots_of(np.arange(lo, hi))`` for retained ids, without the arithmetic: at most two slices."""
        table = self._id2slot
        a = lo % table.size
        b = a + (hi - lo)
        return table[a:b] if b <= table.size else np.concatenate([table[a:], table[: b - table.size]])

    def ids_of(self, slots: np.ndarray) -> np.ndarray:
        """Transition ids stored at ``slots`` (-1 for START frames and empty slots)."""
        return self._slot_id[slots]

    def draw_uniform(self, rng: np.random.Generator, lo: int, hi: int, n: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """``n`` ids drawn as ``rng.integers(lo, hi, size=n, dtype=np.int64)`` draws them (the generator left
        in the same state), their slots, and whether every one is sampleable: one native call
        (``native.rng.draw_slots``) where numba runs and the generator's state can be drawn on natively
        (``native.rng.Pcg64State``), else numpy's. ``lo .. hi - 1`` must be retained ids."""
        ids = np.empty(n, np.int64)
        pcg = self._pcg
        if pcg is None or pcg.rng is not rng:
            pcg = self._pcg = Pcg64State.attach(rng) if self._native else None
        if pcg is not None:
            slots = np.empty(n, np.int64)
            bad = draw_slots(pcg.st, pcg.buf, lo, hi, ids, slots, self._id2slot, self._valid)
            return ids, slots, bad == 0
        ids = rng.integers(lo, hi, size=n, dtype=np.int64)
        slots = self.slots_of(ids)
        return ids, slots, bool(np.count_nonzero(self._valid[slots]) == n)

    def valid_at(self, slots: np.ndarray) -> np.ndarray:
        """Sampleable mask of ring slots."""
        return self._valid[slots]

    def valid_in_range(self, ids: np.ndarray) -> np.ndarray:
        """Sampleable mask of ids known to lie in the retained range."""
        return self._valid[self._id2slot[ids % self._id2slot.size]]

    def ids_valid(self, ids: np.ndarray) -> np.ndarray:
        """Sampleable mask of any ids (evicted and never-issued ones are not)."""
        inside = (ids >= self._oldest_id) & (ids < self._next_id)
        ok = np.zeros(ids.shape, np.bool_)
        ok[inside] = self._valid[self.slots_of(ids[inside])]
        return ok

    def valid_ids(self) -> np.ndarray:
        """Every sampleable id (sorted int64)."""
        ids = np.arange(self._oldest_id, self._next_id, dtype=np.int64)
        return ids[self._valid[self.slots_of(ids)]]

    def priority_targets(self, ids: np.ndarray, priorities: np.ndarray
                         ) -> tuple[int, int, np.ndarray, np.ndarray, int, float]:
        """Check a priority update of ``ids`` (int64) to ``priorities`` (float64) and resolve it to slots in
        one native pass (``native.priorities.priority_update``: its status codes, the distinct
        sampleable slots with their last value, how many ids were skipped, the largest value)."""
        update = priority_update if self._native else priority_update_numpy
        return update(ids, priorities, self._oldest_id, self._next_id, self._id2slot, self._valid)

    def check_ids(self, ids: np.ndarray) -> None:
        """Raise ``NotSampleableError`` naming the first id that is evicted, never issued or not sampleable."""
        ok = self.ids_valid(ids)
        if ok.all():
            return
        bad = int(np.flatnonzero(~ok)[0])
        i = int(ids[bad])
        if i < 0:
            why = "is not a transition id (ids are >= 0)"
        elif i < self._oldest_id:
            why = f"was evicted (oldest retained id is {self._oldest_id})"
        elif i >= self._next_id:
            why = f"was never issued (next id is {self._next_id})"
        elif i < self._clear_id:
            why = f"was removed by clear() (ids below {self._clear_id})"
        elif self._flags[self.slots_of(np.array([i]))[0]] & INVALID:
            why = "was invalidated (invalidate())"
        else:
            why = "is not sampleable (its n-step window is still open, or its stack history was evicted)"
        raise NotSampleableError(f"index[{bad}] = {i} {why}")

    # -- reading ---------------------------------------------------------------------------------------
    def plan(self, slots: np.ndarray) -> Plan:
        """The row arithmetic of the batch of valid transition slots ``slots``: one native pass
        (``native.plan.plan_batch``, equal array for array to ``plan.RowMath.plan``, its oracle) while the
        streams are in lockstep and laid out as format 1 lays them out (rows in chunk ``row // R``); the
        numpy plan otherwise (streams written apart: rows mapped through the geometry)."""
        cfg = self._native_config()
        if cfg is None:
            return self.plan_numpy(slots)
        stacks, pad, reward_slots, reward_weights, m, ends, zeros = native_plan.plan_batch(
            slots, self._flags, self._episode_pos, self.seq_of_pos, cfg, self.math.gammas)
        return Plan(slots, stacks[0], pad[0], stacks[1], pad[1], reward_slots, reward_weights, m, ends[0], ends[1],
                    ends[2], stacks, pad, zeros)

    def plan_inputs(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                       np.ndarray] | None:
        """The arguments of the native plan (``native.plan.plan_batch``'s: ``slots`` and the index's arrays
        and numbers) for the batch of valid transition slots ``slots``, where ``plan`` would take the native
        pass; None where it would not (then ``plan``). ``FrameReader.planned_stacks`` plans and reads with them."""
        cfg = self._native_config()
        if cfg is None:
            return None
        return slots, self._flags, self._episode_pos, self.seq_of_pos, cfg, self.math.gammas

    def _native_config(self) -> np.ndarray | None:
        """The native plan's ``config``, brought up to date; None while the numpy plan must be used (no numba,
        or streams written apart)."""
        geo = self.geo
        rows, oldest = self._rows, self._oldest_row
        if not self._native or not geo.lockstep or (
                geo.num_envs > 1 and (rows.min() != rows.max() or oldest.min() != oldest.max())):
            return None
        cfg = self._plan_config
        cfg[native_plan.C_POSITIONS] = geo.positions
        cfg[native_plan.C_HAS_MISSING] = self._has_missing
        cfg[native_plan.C_OLDEST_ROW] = oldest.item(0)
        cfg[native_plan.C_ROWS] = rows.item(0)
        return cfg

    def plan_numpy(self, slots: np.ndarray) -> Plan:
        """``plan`` through numpy (``plan.RowMath.plan``): any layout, and the reference of the native pass."""
        return self.math.plan(self._flags, self._episode_pos, self.geo, slots, self._oldest_row, self._rows, self._has_missing)

    def sequence_plan(self, slots: np.ndarray, length: int, head: np.ndarray | None = None) -> SequencePlan:
        """The row arithmetic of sequences of ``length`` steps from valid transition slots ``slots``, as they
        were when each stream had written ``head`` rows (default: now; see ``sequences.sequence_plan``)."""
        head = self._rows.copy() if head is None else np.broadcast_to(np.asarray(head, np.int64), self._rows.shape)
        if head.shape != self._rows.shape or (head > self._rows).any() or (head < self._oldest_row).any():
            raise ValueError(f"head: expected a row count per stream in [{self._oldest_row.tolist()},"
                             f" {self._rows.tolist()}], got {head.tolist()}")
        if slots.size:
            s, stream_row = self.geo.rows_of(slots)
            if (stream_row >= head[s]).any():
                raise ValueError(f"head: {head.tolist()} rows cannot hold these starts (a start must be written"
                                 " before it)")
        return sequence_plan(self.math, self._flags, self._episode_pos, self._slot_id, self.geo, slots, length, head)

    def sequence_fits(self, slots: np.ndarray, length: int) -> np.ndarray:
        """Which valid transition slots start ``length`` steps of their episode, written now (bool mask)."""
        return sequence_fits(self._episode_pos, self.geo, slots, length, self._rows)

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
            per = [ids[self.geo.rows_of(self.slots_of(ids))[0] == s] for s in streams]
        else:
            per = c.per_stream
            cuts = np.maximum(np.minimum(c.head - length + 1, c.undecided), self._oldest_row)
            for s in streams.tolist():
                cut, rows = int(cuts[s]), int(self._rows[s])
                if rows <= cut:
                    continue
                rid = self._slot_id[self.geo.slots(s, np.arange(cut, rows, dtype=np.int64))]  # ids grow with the row
                new = rid[rid >= 0]
                if not new.size:
                    continue
                old = per[s]
                old = old[(old >= self._oldest_id) & (old < new[0])]  # entries of rows before the cut
                sl = self.slots_of(new)
                per[s] = np.concatenate([old, new[self._valid[sl] & self.sequence_fits(sl, length)]])
            per = [a[a >= self._oldest_id] for a in per]
        self._fits = _Fits(length, per, self._rows.copy(), np.maximum(self._checked, self._oldest_row))
        return np.concatenate(per)

    def latest_stacks(self) -> tuple[np.ndarray, np.ndarray]:
        """Slots ``(num_envs, k)`` of every stream's newest stacked state and its zero-padding mask.

        Raises ``EpisodeStateError`` before a stream's first frame.
        """
        bad = np.flatnonzero((self._rows == 0) | (self._rows - 1 < self._oldest_row))
        if bad.size:
            which = "" if self.geo.num_envs == 1 else f" of env {int(bad[0])}"
            raise EpisodeStateError(f"current_obs() before the first reset(obs){which}")
        s = np.arange(self.geo.num_envs, dtype=np.int64)
        last = self._rows - 1
        episode_pos = self._episode_pos[self.geo.slots(s, last)].astype(np.int64)
        return self.math.stack_slots(self.geo, s, last, episode_pos)

    def row_slots(self, stream: int, rows: np.ndarray) -> np.ndarray:
        """Slots of retained rows of one stream; raises ``NotSampleableError`` if any is not retained."""
        lo, hi = int(self._oldest_row[stream]), int(self._rows[stream])
        if rows.size and (rows[0] < lo or rows[-1] >= hi):
            raise NotSampleableError(f"rows {rows[0]}..{rows[-1]} of env {stream} are not retained (the store holds"
                                     f" its rows {lo}..{hi - 1}); take a fresh episodes() table")
        return self.geo.slots(stream, rows)

    def episodes(self, rewards: np.ndarray) -> EpisodeTable:
        """The table of episodes with a retained frame (``rewards``: the ring's reward column).

        After ``clear()`` a stream's episode that ran across it is listed from its last frame before the
        clear (its head was lost, so it is not complete; the transitions after the clear are its own).
        """
        return episode_table(self._flags, rewards, self._slot_id, self.geo.slots, self.geo.num_envs,
                             self.listed_rows(), self._rows)

    def listed_rows(self) -> np.ndarray:
        """Per stream, the first row whose frames are listed (episodes, tables): the oldest retained row, or
        after ``clear()`` the last frame before it where the stream's episode was just reset, or was open at
        the clear and went on (the observation of its first transition after it), else the row the clear
        happened at."""
        lo = self._oldest_row.copy()
        after = np.flatnonzero(self._clear_row > self._oldest_row)
        if after.size:
            at = self._clear_row[after]
            prev = self._flags[self.geo.slots(after, at - 1)]
            # an episode just reset is listed from its first observation; one that ran across the clear once a
            # transition follows it (before that, nothing of it is listed: it was all written before the clear)
            lo[after] = at - (((prev & START) != 0) | (((prev & END) == 0) & (self._rows[after] > at)))
        return lo

    def transition_rows(self) -> dict[str, np.ndarray]:
        """Every transition not removed by ``clear()`` whose two frames are retained (the episodes' listing:
        ``listed_rows``), in id order: ``id``, ``slot``, ``stream``, ``row`` (of its next frame),
        ``episode_pos`` (that frame's episode position), ``flags`` (RAM bits), ``valid``."""
        lo, hi = max(self._oldest_id, self._clear_id), self._next_id
        if hi <= lo:
            slots = np.empty(0, np.int64)
        else:
            slots = np.asarray(self.slots_of_range(lo, hi), np.int64)
        stream, row = self.geo.rows_of(slots)
        ids = np.arange(lo, max(lo, hi), dtype=np.int64)
        keep = row > self.listed_rows()[stream]  # (the oldest retained ones: their observation was retired)
        if not keep.all():
            slots, stream, row, ids = slots[keep], stream[keep], row[keep], ids[keep]
        return {"id": ids, "slot": slots, "stream": stream, "row": row,
                "episode_pos": self._episode_pos[slots].astype(np.int64), "flags": self._flags[slots], "valid": self._valid[slots]}

    # -- invalidation ----------------------------------------------------------------------------------
    def invalidate(self, ids: np.ndarray) -> tuple[int, np.ndarray]:
        """Make transitions ``ids`` never sampleable again (evicted ids are skipped).

        Returns how many retained ids were newly invalidated and the slots that stopped being sampleable
        (for per-slot structures). Raises ``NotSampleableError`` naming the first id never issued; nothing
        changes then.
        """
        never = (ids < 0) | (ids >= self._next_id)
        if never.any():
            i = int(np.flatnonzero(never)[0])
            raise NotSampleableError(f"index[{i}] = {int(ids[i])} was never issued (next id is {self._next_id})")
        slots = np.unique(self.slots_of(ids[ids >= self._oldest_id]))
        fresh = slots[(self._flags[slots] & INVALID) == 0]
        return int(fresh.size), self._mark_invalid(fresh)

    def clear(self) -> np.ndarray:
        """Remove every transition written so far from sampling and listing (ids keep counting up).

        Returns the slots that stopped being sampleable.
        """
        dropped = self._mark_invalid(np.asarray(self.slots_of_range(self._oldest_id, self._next_id), np.int64))
        self._clear_id, self._clear_row = self._next_id, self._rows.copy()
        return dropped

    def _mark_invalid(self, slots: np.ndarray) -> np.ndarray:
        if slots.size == 0:
            return slots
        self._flags[slots] |= INVALID
        was = slots[self._valid[slots]]
        self._valid[was] = False
        self._n_valid -= int(was.size)
        self._validity_changed = True
        return was

    def invalid_ranges(self) -> np.ndarray:
        """The invalidated ids at or after the oldest retained one (and the last clear), as sorted
        disjoint ``[lo, hi)`` ranges: int64 ``(k, 2)``."""
        lo, hi = max(self._oldest_id, self._clear_id), self._next_id
        if hi <= lo:
            return np.empty((0, 2), np.int64)
        bad = (self._flags[self.slots_of_range(lo, hi)] & INVALID) != 0
        edges = np.diff(bad.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
        return np.stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)], axis=1).astype(np.int64) + lo

    def apply_validity(self, ranges: np.ndarray, clear_id: int, clear_row: Any) -> None:
        """Restore a durable validity record after ``rebuild`` (ids of ``ranges`` and below ``clear_id``
        invalid; ``clear_row``: the rows each stream had written at that clear, or one count for all)."""
        self._clear_id = int(clear_id)
        self._clear_row = np.broadcast_to(np.asarray(clear_row, np.int64), self._rows.shape).copy()
        lo, hi = self._oldest_id, self._next_id
        a = np.clip(np.asarray(ranges, np.int64).reshape(-1, 2)[:, 0], lo, hi)
        b = np.clip(np.asarray(ranges, np.int64).reshape(-1, 2)[:, 1], lo, hi)
        a, b = np.append(a, lo), np.append(b, min(max(self._clear_id, lo), hi))
        n = np.maximum(b - a, 0)
        if n.sum():
            starts = np.repeat(a - np.concatenate(([0], np.cumsum(n)[:-1])), n)
            ids = starts + np.arange(int(n.sum()), dtype=np.int64)
            self._mark_invalid(np.unique(self.slots_of(ids)))
        self._validity_changed = False

    # -- validity --------------------------------------------------------------------------------------
    BLOCK = 1 << 16  # candidate rows per stream examined per pass (bounds temporary memory)

    def update_validity(self) -> np.ndarray:
        """Decide every row whose n-step window has closed since the last call; return newly valid slots."""
        if self._written == self._validity_rows:
            return _EMPTY  # nothing was written: no window can have closed
        self._validity_rows = self._written
        # rows per pass scaled so a pass holds about 4M window entries whatever n_step is
        block = min(self.BLOCK, max(64, (1 << 22) // self.n_step))
        found = []
        while True:
            starts = np.maximum(self._checked, self._oldest_row)
            stops = np.maximum(np.minimum(starts + block, self._rows), starts)
            if int((stops - starts).sum()) <= 0:
                self._checked[:] = starts
                break
            found.append(self._validity_block(starts, stops))
            if (self._checked == starts).all() or (stops == self._rows).all():
                break
        return np.concatenate(found) if found else np.empty(0, np.int64)

    def _validity_block(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        geo, n = self.geo, self.n_step
        counts = stops - starts
        total = int(counts.sum())
        stream = np.repeat(np.arange(geo.num_envs, dtype=np.int64), counts)
        offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
        stream_row = np.repeat(starts - offsets, counts) + np.arange(total, dtype=np.int64)
        rows = self._rows[stream][:, None]
        win = stream_row[:, None] + np.arange(n, dtype=np.int64)  # (M, n) the window's frame rows
        written = win < rows
        wslots = geo.slots(stream[:, None], np.minimum(win, rows - 1))
        ends = written & ((self._flags[wslots] & END) != 0)
        has_end = ends.any(axis=1)
        complete = has_end | written[:, -1]
        # Completion is monotone in the row, so a stream's first incomplete row is where it stops.
        new_checked = stops.copy()
        np.minimum.at(new_checked, stream[~complete], stream_row[~complete])
        done = stream_row < new_checked[stream]
        stream_row, stream, ends, has_end, wslots = stream_row[done], stream[done], ends[done], has_end[done], wslots[done]
        slots = wslots[:, 0]  # the window starts at the transition's own row
        f = self._flags[slots]
        m = np.where(has_end, ends.argmax(axis=1) + 1, n)
        last_f = self._flags[wslots[np.arange(stream_row.size), m - 1]]
        boot_ok = ((last_f & MISSING) == 0) | ((last_f & TERMINATED) != 0)
        ok = ((f & (START | INVALID)) == 0) & boot_ok & self._stack_ok(stream, stream_row, slots, f)
        new = slots[ok]
        self._valid[new] = True
        self._n_valid += int(new.size)
        self._checked[:] = new_checked
        return new

    def _stack_ok(self, stream: np.ndarray, stream_row: np.ndarray, slots: np.ndarray, f: np.ndarray) -> np.ndarray:
        """The observation stack of transition rows ``stream_row`` has every real frame it needs retained."""
        oldest = self._oldest_row[stream]
        f0 = stream_row - self._episode_pos[slots]  # first stored row of the episode
        lost = ((f & LOST) != 0) | (f0 < oldest)
        return ~lost | (stream_row - self.stack >= np.maximum(f0, oldest))

    def retire(self, seq: int, oldest_id: int) -> np.ndarray:
        """Forget chunk ``seq`` (the oldest); ``oldest_id`` is the oldest id still retained after it.

        Returns the slots to clear in per-slot structures: all of the chunk's, and the rows after it
        that stopped being sampleable because it held their stack history.
        """
        geo = self.geo
        sl = geo.chunk_slots(seq)
        nxt = (seq + 1) % geo.positions
        new_oldest = geo.first_row[nxt].copy() if geo.seq_of_pos[nxt] == seq + 1 else self._rows.copy()
        # A stream whose last frame goes keeps that frame's state (its episode may continue later).
        gone = np.flatnonzero((self._rows > self._oldest_row) & (self._rows <= new_oldest))
        if gone.size:
            last = geo.slots(gone, self._rows[gone] - 1)
            f = self._flags[last]
            self._tail[gone] = np.stack([(f & END) != 0, self._episode_pos[last], (f & LOST) != 0], axis=1)
        self._oldest_id = oldest_id
        geo.remove(seq)
        cleared = np.arange(sl.start, sl.stop, dtype=np.int64)
        self._n_valid -= int(np.count_nonzero(self._valid[sl]))
        self._valid[sl] = False
        self._slot_id[sl] = -1
        self._flags[sl] = 0
        self._oldest_row = new_oldest
        # Rows near the new oldest row may have lost stack history.
        counts = np.clip(self._rows - new_oldest, 0, self.stack)
        if not counts.any():
            return cleared
        stream = np.repeat(np.arange(geo.num_envs, dtype=np.int64), counts)
        offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
        stream_row = np.repeat(new_oldest - offsets, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        slots = geo.slots(stream, stream_row)
        cand = self._valid[slots]
        stream, slots, stream_row = stream[cand], slots[cand], stream_row[cand]
        bad = slots[~self._stack_ok(stream, stream_row, slots, self._flags[slots])]
        self._valid[bad] = False
        self._n_valid -= int(bad.size)
        return np.concatenate([cleared, bad])
