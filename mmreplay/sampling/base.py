"""The protocol every sampler follows, so the store never asks which kind it has.

A sampler decides which transition ids a batch holds (and their importance
weights). It keeps per-slot state only if it needs it (the prioritized sampler's
sum tree); the chunk log tells it when slots stop being sampleable or move, and
the store tells it when slots become sampleable. It says what its durable state
is (a manifest entry plus state files written through a ``StateDir``) and
restores itself from that. A sampler that keeps per-transition priorities hands
them out through ``prioritized`` (a ``Priorities``); every other sampler's is
None, and the store's priority calls refuse then.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..core.statefiles import StateDir
from .subset import Accept, Pool


class Priorities(Protocol):
    """What a sampler that draws by priority lets the store read and set (``Sampler.prioritized``)."""

    beta: float  # the importance-weight exponent of draws that give none; saved by a commit
    max_priority: float  # the largest raw priority ever given: what new transitions enter with
    skipped_updates: int  # ids ``update`` skipped (evicted or not sampleable) over the store's life

    def update(self, ids: np.ndarray, priorities: Any) -> int:
        """Set the raw priorities of ``ids`` (int64); returns how many were skipped. Raises for bad
        priorities and ids never issued, having changed nothing."""
        ...

    def priorities(self, ids: np.ndarray) -> np.ndarray:
        """Raw priorities (float64) of sampleable ids (checked by the caller)."""
        ...

    def masses(self, ids: np.ndarray) -> np.ndarray:
        """The masses (float64) draws weigh sampleable ids by (checked by the caller)."""
        ...

    def total_mass(self) -> float:
        """The mass of every sampleable transition together."""
        ...

    def min_mass(self) -> float:
        """The smallest positive mass (0.0 when nothing is sampleable)."""
        ...

    def positive_slots(self) -> int:
        """Slots carrying mass (the sampleable transitions, when consistent)."""
        ...


class Sampler(Protocol):
    """Chooses batches of sampleable transition ids."""

    @property
    def prioritized(self) -> Priorities | None:
        """Its priorities, or None for a sampler that keeps none: what the store asks instead of which kind
        of sampler it has."""
        ...

    def draw(self, rng: np.random.Generator, batch_size: int, replace: bool,
             beta: float | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``batch_size`` ids (int64), their importance weights (float32, or None meaning all 1) and their
        ring slots when the draw found them on the way (else None: ``Index.slots_of(ids)`` gives them).

        The only consumer of ``rng``. Raises ``NotSampleableError`` when nothing is sampleable,
        ``ValueError`` for options the sampler does not support (``replace=False``, ``beta``).
        """
        ...

    def draw_where(self, rng: np.random.Generator, batch_size: int, accept: Accept, beta: float | None,
                   pool: Pool | None = None) -> tuple[np.ndarray, np.ndarray | None] | None:
        """``batch_size`` ids drawn among the sampleable transitions whose slots pass ``accept``, with the
        sampler's distribution restricted to them (independent draws, with replacement; see ``subset``),
        and their importance weights as ``draw`` computes them (None meaning all 1). ``pool``, if given,
        returns ids among which are all sampleable transitions that pass (others may be there): the
        fallback draws among those instead of examining the whole sampleable set. Returns None when no
        sampleable transition passes. Raises like ``draw`` when nothing is sampleable at all.
        """
        ...

    def added(self, slots: np.ndarray) -> None:
        """These slots just became sampleable."""
        ...

    def slots_cleared(self, slots: np.ndarray) -> None:
        """These slots stopped being sampleable (retired, or their stack history went)."""
        ...

    def ring_resized(self, size: int, moves: list[tuple[slice, slice]]) -> None:
        """The ring grew to ``size`` slots; ``moves`` are (old slots, new slots) of each retained chunk."""
        ...

    def save_state(self, files: StateDir, delta: bool) -> dict[str, Any] | None:
        """Write the durable state (``delta``: only what changed since the last ``saved()``, if possible);
        return the manifest entry describing it (None: nothing to save)."""
        ...

    def saved(self, entry: dict[str, Any] | None) -> None:
        """The manifest holding ``entry`` (from ``save_state(delta=True)``) is now the commit."""
        ...

    def restore(self, files: StateDir, entry: dict[str, Any] | None, valid_slots: np.ndarray) -> None:
        """Load the state a manifest entry describes; ``valid_slots`` are the slots sampleable at that commit."""
        ...
