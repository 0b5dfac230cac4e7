"""Drawing among the sampleable transitions that pass a test (the starts of strict sequences).

A sampler proposes independent draws from its own distribution (uniform, or
proportional to priority) and keeps those the test accepts, in proposal order: the
first ``batch_size`` kept are independent draws from the distribution restricted
to the accepted set, exactly. Each proposal costs O(1) plus the test, so while a
fair share of the draws is accepted the cost is O(batch) whatever the store's size.
The number of proposals is bounded: when a draw still lacks rows after
``budget(batch_size)`` proposals (fewer than ~1 in 30 accepted), the sampler falls
back to drawing among a *pool* that holds every transition the test accepts (for
strict sequences the index keeps it up to date incrementally), or without one, to one
pass over the sampleable set; either also proves an empty set empty.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["Accept", "Pool", "budget", "propose_and_accept"]

Accept = Callable[[np.ndarray], np.ndarray]
"""A vectorized test of sampleable transition slots (int64 array) -> bool mask of the same shape."""

Pool = Callable[[], np.ndarray]
"""Transition ids among which are all the sampleable ones that pass the test (a superset, maintained by
the caller so the fallback need not examine the whole sampleable set)."""

PROPOSALS_PER_ROW = 32
MIN_PROPOSALS = 1024


def budget(batch_size: int) -> int:
    """Proposals made before falling back to the exact pass."""
    return PROPOSALS_PER_ROW * batch_size + MIN_PROPOSALS


def propose_and_accept(batch_size: int, propose: Callable[[int], np.ndarray], accept: Accept) -> np.ndarray | None:
    """``batch_size`` slots from rounds of ``propose(n)`` (independent draws; it may return fewer than
    ``n`` when it drops draws that are not sampleable) that pass ``accept``, in proposal order; None
    when ``budget(batch_size)`` proposals were not enough. Each round asks for what the acceptance
    seen so far predicts is missing, with a margin, so the common case takes one round."""
    limit = budget(batch_size)
    kept: list[np.ndarray] = []
    got = proposed = 0
    n = batch_size + batch_size // 4 + 4
    while proposed < limit:
        n = min(n, limit - proposed)
        cand = propose(n)
        proposed += n
        ok = cand[accept(cand)]
        kept.append(ok)
        got += ok.size
        if got >= batch_size:
            return np.concatenate(kept)[:batch_size]
        rate = max(got, 1) / proposed
        n = int((batch_size - got) / rate * 1.25) + 4
    return None
