"""Benchmark-only prototype of the proposed wiring of ``mmreplay.native`` into a ``ReplayStore``.

``wire(store)`` replaces, on one store object, the numpy batch path by the kernels: the plan
(``native.plan.plan_batch`` instead of ``Index.plan``), the stack copy split between the caller and
the store's reader thread (``native.gather.gather_stacks`` instead of ``np.take`` and the masked
padding), the n-step returns (``native.plan.nstep_returns``) and the priority update
(``native.priorities.priority_update``). It reaches into private attributes, on purpose and only
here: it exists to measure what the wiring gives before the store is restructured (the lead wires
the kernels for real; BENCHMARKS.md labels figures measured through this module). The batches it
returns equal the numpy path's (tools/bench_batches.py checks a few before measuring). Its ``stacks``
is ``FrameReader.stacks`` as proposed: the reader's cold-data logic kept, ``np.take`` and the masked
padding replaced by the kernel.
"""

from __future__ import annotations

import resource
from typing import Any

import numpy as np

from mmreplay.batch import Batch
from mmreplay.index import Plan
from mmreplay.native import gather, plan, priorities
from mmreplay.prefetch import Draw


class Wiring:
    def __init__(self, store: Any) -> None:
        self.store = store
        log = store._log
        idx = log.index
        geo = idx.geo
        self.cfg = plan.config(geo.num_envs, geo.rows_per_stream, geo.rows_alloc, geo.positions, idx.k, idx.n,
                               idx.pad_first, idx.has_missing, idx.oldest_row, idx.rows)
        gamma = store.schema.gamma
        self.weights = np.array([[gamma ** i if i < m else 0.0 for i in range(idx.n)] for m in range(idx.n + 1)])

    # -- the plan, made when a batch is drawn (caller's thread) ------------------------------------------
    def plan(self, ids: np.ndarray) -> tuple[np.ndarray, ...]:
        store = self.store
        log = store._log
        idx = log.index
        cfg = self.cfg
        cfg[plan.C_POSITIONS] = idx.geo.positions
        cfg[plan.C_HAS_MISSING] = int(idx.has_missing)
        cfg[plan.C_OLDEST_ROW] = idx.oldest_row
        cfg[plan.C_ROWS] = idx.rows
        slots = idx.id2slot[ids % idx.id2slot.size]
        return (slots, *plan.plan_batch(slots, idx.flags, idx.epos, log.seq_of_pos, cfg, self.weights))

    # -- the copy (caller's thread for sample(), the prefetch thread for batches()) ----------------------
    def assemble(self, planned: tuple[np.ndarray, ...], ids: np.ndarray, weight: np.ndarray | None) -> Batch:
        store = self.store
        slots, stacks, pad, reward_slots, reward_weights, m, ends = planned
        obs, next_obs = self.stacks(stacks, pad, ends[2])
        arrays = store._arrays
        reward, discount = plan.nstep_returns(arrays["reward"], reward_slots, reward_weights, store._discounts, m,
                                              ends[0])
        b = slots.shape[0]
        return Batch(obs=obs, action=arrays["action"][slots], reward=reward, next_obs=next_obs, discount=discount,
                     terminated=ends[0], truncated=ends[1], index=ids,
                     weight=np.ones(b, np.float32) if weight is None else weight.astype(np.float32, copy=False),
                     extras={name: arrays["x_" + name][slots] for name in store._extra_names})

    def stacks(self, stacks: np.ndarray, pad: np.ndarray, next_missing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``FrameReader.stacks`` as proposed: the same cold-data logic (request every frame run first when
        reads fault, probe now and then), the copy by ``gather_stacks`` split between the caller and the
        reader's thread, padding zeroed by the kernel."""
        reader = self.store._reader
        frames = reader.frames
        b, k = stacks.shape[1], stacks.shape[2]
        both = reader._pool.get((2, b, k) + frames.shape[1:], frames.dtype)
        requested = reader.prefetch_io is True or (reader.prefetch_io == "auto" and reader._cold_batches > 0)
        if requested:
            reader.request(stacks.reshape(-1))
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        flat_frames = frames.reshape(frames.shape[0], -1)
        flat_out = both.reshape(2, b, k, -1)
        split = reader.threads > 1 and both.nbytes >= 2 * reader.MIN_SPLIT_BYTES
        half = b // 2 if split else b
        fut = reader._workers().submit(gather.gather_stacks, flat_frames, stacks, pad, next_missing, flat_out, half,
                                       b) if split else None
        gather.gather_stacks(flat_frames, stacks, pad, next_missing, flat_out, 0, half)
        if fut is not None:
            fut.result()
        if reader.prefetch_io == "auto":
            if requested:
                reader._cold_batches -= 1
            elif resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults >= reader.COLD_FAULTS:
                reader._cold_batches = reader.PROBE_EVERY
        return both[0], both[1]

    # -- priority updates ----------------------------------------------------------------------------------
    def update_priorities(self, index: Any, p: Any) -> int:
        store = self.store
        prio = store._prio
        ids = np.asarray(index, np.int64)
        p = np.asarray(p, np.float64)
        store._sync()
        log = store._log
        idx = log.index
        status, pos, slots, values, skipped, top = priorities.priority_update(
            ids, p, log.oldest_id, log.next_id, idx.id2slot, idx.valid)
        if status != priorities.OK:
            return store.__class__.update_priorities(store, index, p)  # the numpy path raises the error
        store._skipped_updates += skipped
        prio.raw[slots] = values
        prio.tree.set_distinct(slots, np.power(values + prio.eps, prio.alpha))
        prio._dirty[slots] = True
        if top > prio.max_priority:
            prio.max_priority = top
        return skipped


def wire(store: Any) -> Wiring:
    """Route ``store``'s sample(), batches() and update_priorities() through the kernels (this object only)."""
    w = Wiring(store)

    def _plan(ids: np.ndarray) -> Any:
        return w.plan(ids)

    def _assemble(slots: np.ndarray, ids: np.ndarray, weight: np.ndarray | None = None) -> Batch:
        return w.assemble(w.plan(ids), ids, weight)

    def _assemble_draw(d: Draw) -> Batch:
        if d.plan is None:
            raise RuntimeError("a prefetched draw has no plan")
        return w.assemble(d.plan, d.ids.copy(), d.weight)  # type: ignore[arg-type]

    store._plan = _plan
    store._assemble = _assemble
    store._assemble_draw = _assemble_draw
    if store._prio is not None:
        store.update_priorities = w.update_priorities
    return w


def numpy_plan(store: Any, ids: np.ndarray) -> Plan:
    """The numpy path's plan of ``ids`` (for checks)."""
    log = store._log
    return log.index.plan(store._slots_of(ids), log.seq_of_pos)
