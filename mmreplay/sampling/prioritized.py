"""Proportional prioritized sampling over ring slots (Schaul et al., 2015).

Each sampleable slot carries mass ``(p + eps) ** alpha`` in a sum tree; every
other slot carries 0, so evicted, pending and padding slots are never drawn.
The raw ``p`` last set is kept per slot, and the largest ``p`` ever given is
what new transitions enter with.

Importance weights, for N sampleable transitions and P(i) = mass_i / total:

    w_i = (N * P(i)) ** -beta / max_j (N * P(j)) ** -beta = (P(i) / P_min) ** -beta

N cancels, and the maximum over the whole store is reached at the smallest
positive mass (the tree's ``min_positive``), so the weights never exceed 1.

Durable state: a full table of (raw priority, mass) per retained id, plus
delta files of the ids changed since (see FORMAT.md, "State files"), so a
commit costs O(changes), not O(capacity).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ..core.index import Index
from ..core.statefiles import StateDir
from ..errors import CorruptStoreError, NotSampleableError
from ..native.priorities import BAD_PRIORITY, NEVER_ISSUED
from ..options import Prioritized
from .subset import Accept, Pool, propose_and_accept
from .sumtree import SumTree
from .uniform import require_sampleable

MAX_DELTA_FILES = 64


def check_beta(value: Any) -> float:
    """A valid importance-weight exponent (finite, >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not (
            math.isfinite(value) and value >= 0):
        raise ValueError(f"beta must be a finite number >= 0, got {value!r}")
    return float(value)


class PrioritizedSampler:
    """Sum tree + raw priorities over the index's ring slots, and their durable state."""

    def __init__(self, index: Index, options: Prioritized) -> None:
        self.index = index
        self.alpha = options.alpha
        self.eps = options.eps
        self.beta = options.beta
        size = index.size
        self.tree = SumTree(size)
        self.raw = np.zeros(size, np.float64)
        self.max_priority = 1.0
        self.skipped_updates = 0  # ids update() skipped: evicted or not sampleable
        # Slots whose raw priority or mass changed since the last commit (for a delta state file),
        # or dirty_all when only a full state file will do (after a relayout).
        self._dirty = np.zeros(size, np.bool_)
        self.dirty_all = False
        self._chain: dict[str, Any] | None = None  # the committed entry the next delta builds on

    @property
    def prioritized(self) -> PrioritizedSampler:
        """The sampler itself: it keeps the priorities (``base.Priorities``)."""
        return self

    def mass(self, p: np.ndarray | float) -> np.ndarray:
        return np.power(np.asarray(p, np.float64) + self.eps, self.alpha)

    # -- sampling --------------------------------------------------------------------------------------
    def draw(self, rng: np.random.Generator, batch_size: int, replace: bool,
             beta: float | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Stratified draw of ``batch_size`` ids, their importance weights (float32) for ``beta`` (default
        ``self.beta``) and their slots."""
        if not replace:
            raise ValueError("sample(replace=False) is for uniform stores: prioritized sampling is stratified"
                             " and with replacement; use iter_batches() for an epoch without repeats")
        use_beta = self.beta if beta is None else check_beta(beta)
        require_sampleable(self.index.n_valid)
        if not float(self.tree.total) > 0:  # (what can_sample() checks: the same error as draw_where's)
            raise NotSampleableError("every sampleable transition has priority mass 0: raise eps or the priorities")
        slots, w = self.tree.stratified_sample_normalised(rng, batch_size)  # w: mass / smallest mass
        return self.index.ids_of(slots), np.power(w, -use_beta, out=w).astype(np.float32), slots

    def _weights(self, slots: np.ndarray, beta: float) -> np.ndarray:
        """Importance weights (float32) of drawn slots, normalised by the largest over the store (as ``draw``
        computes them: ``(mass / smallest mass) ** -beta``)."""
        w = self.tree.drawn_masses(slots)
        w /= self.tree.min_positive
        return np.power(w, -beta, out=w).astype(np.float32)

    def draw_where(self, rng: np.random.Generator, batch_size: int, accept: Accept, beta: float | None,
                   pool: Pool | None = None) -> tuple[np.ndarray, np.ndarray | None] | None:
        """``batch_size`` ids drawn in proportion to their mass among the sampleable transitions whose
        slots pass ``accept`` (None if none does), with the importance weights ``draw`` gives them.

        Draws are independent, not stratified: rejecting points of a stratified draw would bias the
        result towards the strata that happen to hold accepted mass. The weights are ``draw``'s: for the
        distribution restricted to the accepted set they are the right importance weights up to one
        constant factor, so normalising by the store's largest weight keeps them <= 1. When too little
        mass passes, the draw is made exactly over ``pool`` (or the whole sampleable set): O(its size).
        """
        use_beta = self.beta if beta is None else check_beta(beta)
        idx = self.index
        require_sampleable(idx.n_valid)
        tree = self.tree
        total = float(tree.total)
        if not total > 0:
            raise NotSampleableError("every sampleable transition has priority mass 0: raise eps or the priorities")

        def propose(n: int) -> np.ndarray:
            return tree.find(rng.random(n) * total)

        slots = propose_and_accept(batch_size, propose, accept)
        if slots is None:  # little mass passes: an exact draw (slots that are not sampleable have no mass)
            cand = idx.slots_of(idx.valid_ids() if pool is None else pool())
            cand = cand[accept(cand)]
            cum = np.cumsum(tree.get(cand))
            if cand.size == 0 or not cum[-1] > 0:
                return None
            pick = np.searchsorted(cum, rng.random(batch_size) * cum[-1], side="right")
            # a point rounded up to the total goes to the last entry with mass
            slots = cand[np.minimum(pick, int(np.flatnonzero(np.diff(cum, prepend=0.0) > 0)[-1]))]
        return idx.ids_of(slots), self._weights(slots, use_beta)

    # -- per-slot state --------------------------------------------------------------------------------
    def _set(self, slots: np.ndarray, raw: np.ndarray | float, mass: np.ndarray | float) -> None:
        self.raw[slots] = raw
        self.tree.set_distinct(slots, mass)
        self._dirty[slots] = True

    def added(self, slots: np.ndarray) -> None:
        """Slots that just became sampleable enter with the maximum priority seen so far."""
        if slots.size:
            self._set(slots, self.max_priority, float(self.mass(self.max_priority)))

    def slots_cleared(self, slots: np.ndarray) -> None:
        """Slots that stopped being sampleable lose their mass."""
        if slots.size:
            self._set(slots, 0.0, 0.0)

    def ring_resized(self, size: int, moves: list[tuple[slice, slice]]) -> None:
        """Move to a ring of ``size`` slots: ``moves`` are (old slots, new slots) of each retained chunk."""
        raw = np.zeros(size, np.float64)
        leaves = np.zeros(size, np.float64)
        old_leaves = self.tree.leaves()
        for old, new in moves:
            raw[new] = self.raw[old]
            leaves[new] = old_leaves[old]
        self.raw = raw
        self.tree = SumTree.from_leaves(leaves)
        self._dirty = np.zeros(size, np.bool_)
        self.dirty_all = True  # slots moved: a delta by slot would be meaningless

    # -- priorities ------------------------------------------------------------------------------------
    def update(self, ids: np.ndarray, priorities: Any) -> int:
        """Set raw priorities of ``ids`` (int64); returns how many ids were skipped (evicted or not
        sampleable). The last of repeated ids wins. Raises ``ValueError`` for NaN, infinite or negative
        priorities and length mismatches, naming the first bad position, ``NotSampleableError`` for ids
        never issued; nothing changes then. Call after the index's validity is updated."""
        p = np.asarray(priorities)
        if p.shape != ids.shape:
            raise ValueError(f"priorities: expected shape {ids.shape} (one per index), got {p.shape}")
        if p.size and p.dtype.kind not in "biuf":
            raise TypeError(f"priorities: expected real numbers, got dtype {p.dtype}")
        if not ids.size:
            return 0
        p = p.astype(np.float64)
        idx = self.index
        status, pos, slots, values, skipped, top = idx.priority_targets(ids, p)
        if status == BAD_PRIORITY:
            raise ValueError(f"priorities[{pos}] = {float(p[pos])!r}: expected finite and >= 0")
        if status == NEVER_ISSUED:
            raise NotSampleableError(f"index[{pos}] = {ids[pos]} was never issued (next id is {idx.next_id})")
        self.skipped_updates += skipped
        if slots.size:
            self.tree.set_distinct_with(slots, np.power(values + self.eps, self.alpha), self.raw, values, self._dirty)
            if top > self.max_priority:
                self.max_priority = top
        return skipped

    def priorities(self, ids: np.ndarray) -> np.ndarray:
        """Raw priorities (float64) of sampleable ids (checked by the caller)."""
        return self.raw[self.index.slots_of(ids)].copy()

    def masses(self, ids: np.ndarray) -> np.ndarray:
        """Sum-tree masses (float64) of sampleable ids (checked by the caller)."""
        return self.tree.get(self.index.slots_of(ids))

    def total_mass(self) -> float:
        return float(self.tree.total)

    def min_mass(self) -> float:
        """The smallest positive mass (0.0 when no sampleable transition has one)."""
        m = float(self.tree.min_positive) if self.index.n_valid else 0.0
        return m if math.isfinite(m) else 0.0  # (every mass 0: the tree's "none" is inf)

    def positive_slots(self) -> int:
        """Slots carrying mass (equals the number of sampleable transitions when consistent)."""
        return int(self.tree.count_positive)

    # -- durable state ---------------------------------------------------------------------------------
    def save_state(self, files: StateDir, delta: bool) -> dict[str, Any]:
        """Write the priority state; return the manifest entry.

        A full file holds the raw priority and tree mass of every retained id. With ``delta`` (a commit
        in place), when the last commit's files are there to build on and few slots changed since, only
        the changed ids are written, as a delta file listed after the previous ones: a commit then costs
        O(changes), not O(capacity). A full file replaces the chain once the deltas would add up to a
        quarter of the retained ids or number ``MAX_DELTA_FILES`` files.
        """
        idx = self.index
        entry = {"max_priority": self.max_priority, "beta": self.beta, "skipped_updates": self.skipped_updates}
        chain = self._chain
        if delta and chain is not None and not self.dirty_all:
            slots = np.flatnonzero(self._dirty)
            ids = idx.ids_of(slots)
            keep = (ids >= idx.oldest_id) & (ids < idx.next_id)
            slots, ids = slots[keep], ids[keep]
            rows = int(chain.get("delta_rows", 0)) + ids.size
            if rows <= (idx.next_id - idx.oldest_id) // 4 and len(chain.get("deltas", [])) < MAX_DELTA_FILES:
                table = np.empty((3, ids.size))
                table[0] = ids
                self._columns(slots, table[1:])
                rel = files.write("priorities-delta", table)
                return {**entry, "file": chain["file"], "first_id": chain["first_id"],
                        "deltas": [*chain.get("deltas", []), rel], "delta_rows": rows}
        slots = idx.slots_of_range(idx.oldest_id, idx.next_id)
        table = np.empty((2, slots.size))
        self._columns(slots, table)
        rel = files.write("priorities", table)
        return {**entry, "file": rel, "first_id": int(idx.oldest_id), "deltas": [], "delta_rows": 0}

    def saved(self, entry: dict[str, Any] | None) -> None:
        self._chain = entry
        self.dirty_all = False
        self._dirty[:] = False

    def _columns(self, slots: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (2, len(slots)) with the slots' raw priorities and tree masses; NaN where not sampleable."""
        self.raw.take(slots, out=out[0])
        out[1] = self.tree.get(slots)
        np.copyto(out, np.nan, where=~self.index.valid_at(slots))

    def restore(self, files: StateDir, entry: dict[str, Any] | None, valid_slots: np.ndarray) -> None:
        """Load committed raw priorities and tree masses of the sampleable slots (the rest stay 0).

        The masses are loaded as saved, not recomputed, so the restored tree is bit for bit the
        committed one and sampling continues exactly.
        """
        self._chain = entry
        if entry is None:  # a store committed before anything was sampleable
            self.added(valid_slots)
            return
        idx = self.index
        first, deltas = int(entry["first_id"]), entry.get("deltas", [])
        # The full file covers the ids issued at its commit; the deltas, in order, what changed since.
        table = files.read_table(entry["file"], 2)
        issued = idx.next_id - first
        if table.shape[1] > issued or (not deltas and table.shape[1] != issued):
            raise CorruptStoreError(f"{os.path.join(files.root, entry['file'])}: covers {table.shape[1]} ids"
                                    f" from {first}; the commit issued {issued} from there")
        if table.shape[1] < issued:
            table = np.concatenate([table, np.full((2, issued - table.shape[1]), np.nan)], axis=1)
        for rel in deltas:  # later files win
            d = files.read_table(rel, 3)
            pos = d[0].astype(np.int64) - first
            inside = (pos >= 0) & (pos < issued)
            table[:, pos[inside]] = d[1:, inside]
        pos = idx.ids_of(valid_slots) - first
        raw, mass = table[0, pos], table[1, pos]
        if np.isnan(raw).any():
            raise CorruptStoreError(f"{os.path.join(files.root, entry['file'])}: no priority for sampleable"
                                    f" transition {int(idx.ids_of(valid_slots[np.isnan(raw)])[0])}")
        self.raw[:] = 0.0
        self.raw[valid_slots] = raw
        leaves = np.zeros(self.raw.size, np.float64)
        leaves[valid_slots] = mass
        self.tree.load_leaves(leaves)
        self.max_priority = float(entry["max_priority"])
        self.beta = float(entry["beta"])
        self.skipped_updates = int(entry["skipped_updates"])
        self._dirty[:] = False
        self.dirty_all = False
