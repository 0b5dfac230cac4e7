"""Proportional prioritized sampling over ring slots (Schaul et al., 2015).

Each sampleable slot carries mass ``(p + eps) ** alpha`` in a sum tree; every
other slot carries 0, so evicted, pending and padding slots are never drawn.
The raw ``p`` last set is kept per slot, and the largest ``p`` ever given is
what new transitions enter with.

Importance weights, for N sampleable transitions and P(i) = mass_i / total:

    w_i = (N * P(i)) ** -beta / max_j (N * P(j)) ** -beta = (P(i) / P_min) ** -beta

N cancels, and the maximum over the whole store is reached at the smallest
positive mass (the tree's ``min_positive``), so the weights never exceed 1.
"""

from __future__ import annotations

import numpy as np

from ..options import Prioritized
from .sumtree import SumTree


class PrioritySampler:
    """Sum tree + raw priorities over ``size`` ring slots."""

    def __init__(self, options: Prioritized, size: int) -> None:
        self.alpha = options.alpha
        self.eps = options.eps
        self.beta = options.beta
        self.tree = SumTree(size)
        self.raw = np.zeros(size, np.float64)
        self.max_priority = 1.0
        # Slots whose raw priority or mass changed since the last commit (for a delta state file),
        # or dirty_all when only a full state file will do (after a relayout).
        self._dirty = np.zeros(size, np.bool_)
        self.dirty_all = False

    def _touch(self, slots: np.ndarray) -> None:
        self._dirty[slots] = True

    def dirty_slots(self) -> np.ndarray:
        """The slots changed since ``clean()`` (sorted int64); meaningless when ``dirty_all``."""
        return np.flatnonzero(self._dirty)

    def mark_all_dirty(self) -> None:
        self.dirty_all = True

    def clean(self) -> None:
        """The current state is what is on disk (a commit wrote it)."""
        self.dirty_all = False
        self._dirty[:] = False

    def mass(self, p: np.ndarray | float) -> np.ndarray:
        return np.power(np.asarray(p, np.float64) + self.eps, self.alpha)

    def add(self, slots: np.ndarray) -> None:
        """Slots that just became sampleable enter with the maximum priority seen so far."""
        if slots.size:
            self.raw[slots] = self.max_priority
            self.tree.set_distinct(slots, float(self.mass(self.max_priority)))
            self._touch(slots)

    def clear(self, slots: np.ndarray) -> None:
        """Slots that stopped being sampleable (retired, or their stack history went) lose their mass."""
        if slots.size:
            self.raw[slots] = 0.0
            self.tree.set_distinct(slots, 0.0)
            self._touch(slots)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set raw priorities (finite, >= 0) of distinct sampleable slots (validated by the caller)."""
        if slots.size:
            self.raw[slots] = priorities
            self.tree.set_distinct(slots, np.power(priorities + self.eps, self.alpha))
            self._touch(slots)
            top = float(priorities.max())
            if top > self.max_priority:
                self.max_priority = top

    def restore(self, slots: np.ndarray, priorities: np.ndarray, masses: np.ndarray, max_priority: float) -> None:
        """Load committed raw priorities and tree masses of the sampleable slots (the rest stay 0).

        The masses are loaded as saved, not recomputed, so the restored tree is bit for bit the
        committed one and sampling continues exactly.
        """
        self.raw[:] = 0.0
        self.raw[slots] = priorities
        leaves = np.zeros(self.raw.size, np.float64)
        leaves[slots] = masses
        self.tree.load_leaves(leaves)
        self.max_priority = float(max_priority)
        self.clean()

    def sample(self, rng: np.random.Generator, batch_size: int, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """Stratified draw of ``batch_size`` slots and their importance weights (float32)."""
        slots = self.tree.sample_stratified(rng, batch_size)
        mass = self.tree.get(slots)
        weight = np.power(mass / self.tree.min_positive, -beta)
        return slots, weight.astype(np.float32)

    def relayout(self, size: int, moves: list[tuple[slice, slice]]) -> None:
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
        self.mark_all_dirty()  # slots moved: a delta by slot would be meaningless
