"""Uniform sampling over the sampleable transition ids.

Sampleable ids fill the retained id range except near its two ends (windows
still open at the write head, stacks cut by retirement), so drawing from the
range and rejecting the few invalid draws is exact and cheap. When invalid ids
are a large share (a tiny or just-started store) we draw from the explicit
list instead. Both paths are deterministic functions of the generator state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.index import Index
from ..core.statefiles import StateDir
from ..errors import NotSampleableError
from .subset import Accept, Pool, propose_and_accept


def require_sampleable(n_valid: int) -> None:
    """Raise the error every sampler gives when nothing can be drawn."""
    if n_valid == 0:
        raise NotSampleableError(
            "no sampleable transitions yet: a transition becomes sampleable once its n-step window has"
            " closed (add more steps or end the episode)")


class UniformSampler:
    """Every sampleable transition equally likely; keeps no state of its own."""

    prioritized = None  # (no priorities: the store's priority calls refuse)

    def __init__(self, index: Index) -> None:
        self.index = index

    def draw(self, rng: np.random.Generator, batch_size: int, replace: bool,
             beta: float | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``batch_size`` ids drawn uniformly; ``replace=False`` returns distinct ids (and their slots when
        known, see ``Sampler.draw``).

        Raises ``NotSampleableError`` when there are no sampleable transitions, or fewer than
        ``batch_size`` without replacement; ``ValueError`` for ``beta``.
        """
        if beta is not None:
            raise ValueError("beta= is for prioritized stores; this store samples uniformly")
        idx = self.index
        n_valid = idx.n_valid
        require_sampleable(n_valid)
        if not replace and batch_size > n_valid:
            raise NotSampleableError(
                f"sample({batch_size}, replace=False) needs {batch_size} distinct transitions, the store has"
                f" {n_valid} sampleable; ask for fewer or use replace=True")
        lo, hi = idx.oldest_id, idx.next_id
        if 2 * n_valid < hi - lo or (not replace and 4 * batch_size > n_valid):
            ids = idx.valid_ids()
            if replace:
                return ids[rng.integers(0, ids.size, size=batch_size)], None, None
            return rng.choice(ids, size=batch_size, replace=False), None, None
        cand, slots, all_ok = idx.draw_uniform(rng, lo, hi, batch_size)
        if replace and all_ok:  # (nearly always)
            return cand, None, slots
        out = np.empty(0, np.int64)
        while True:
            out = np.concatenate([out, cand[idx.valid_at(slots)]])
            if not replace:
                _, first = np.unique(out, return_index=True)
                out = out[np.sort(first)]
            if out.size >= batch_size:
                return out, None, None
            cand, slots, _ = idx.draw_uniform(rng, lo, hi, batch_size - out.size)

    def draw_where(self, rng: np.random.Generator, batch_size: int, accept: Accept, beta: float | None,
                   pool: Pool | None = None) -> tuple[np.ndarray, np.ndarray | None] | None:
        """``batch_size`` ids drawn uniformly (with replacement) among the sampleable transitions whose
        slots pass ``accept``; None if none does. Proposals are uniform draws as in ``draw``; when too few
        pass, uniform draws from ``pool`` (those that are sampleable and pass), else one exact pass."""
        if beta is not None:
            raise ValueError("beta= is for prioritized stores; this store samples uniformly")
        idx = self.index
        require_sampleable(idx.n_valid)
        lo, hi = idx.oldest_id, idx.next_id
        listed = idx.valid_ids() if 2 * idx.n_valid < hi - lo else None

        def propose(n: int) -> np.ndarray:
            if listed is not None:
                return idx.slots_of(listed[rng.integers(0, listed.size, size=n)])
            cand = rng.integers(lo, hi, size=n, dtype=np.int64)
            return idx.slots_of(cand[idx.valid_in_range(cand)])

        slots = propose_and_accept(batch_size, propose, accept)
        if slots is not None:
            return idx.ids_of(slots), None
        ids = pool() if pool is not None else (idx.valid_ids() if listed is None else listed)
        if ids.size:
            def from_pool(n: int) -> np.ndarray:
                cand = ids[rng.integers(0, ids.size, size=n)]
                return idx.slots_of(cand[idx.valid_in_range(cand)])

            slots = propose_and_accept(batch_size, from_pool, accept)
            if slots is not None:
                return idx.ids_of(slots), None
            ids = ids[idx.valid_in_range(ids)]  # the pool is mostly stale: one exact pass over it
        sl = idx.slots_of(ids)
        sl = sl[accept(sl)]
        if sl.size == 0:
            return None
        return idx.ids_of(sl[rng.integers(0, sl.size, size=batch_size)]), None

    def added(self, slots: np.ndarray) -> None:
        pass

    def slots_cleared(self, slots: np.ndarray) -> None:
        pass

    def ring_resized(self, size: int, moves: list[tuple[slice, slice]]) -> None:
        pass

    def save_state(self, files: StateDir, delta: bool) -> dict[str, Any] | None:
        return None

    def saved(self, entry: dict[str, Any] | None) -> None:
        pass

    def restore(self, files: StateDir, entry: dict[str, Any] | None, valid_slots: np.ndarray) -> None:
        pass
