"""Uniform sampling over the sampleable transition ids.

Sampleable ids fill the retained id range except near its two ends (windows
still open at the write head, stacks cut by retirement), so drawing from the
range and rejecting the few invalid draws is exact and cheap. When invalid ids
are a large share (a tiny or just-started store) we draw from the explicit
list instead. Both paths are deterministic functions of the generator state.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import NotSampleableError

IdsMask = Callable[[np.ndarray], np.ndarray]


def draw(rng: np.random.Generator, lo: int, hi: int, n_valid: int, is_valid: IdsMask,
         valid_ids: Callable[[], np.ndarray], batch_size: int, replace: bool) -> np.ndarray:
    """``batch_size`` ids drawn uniformly from the valid ids in ``[lo, hi)``.

    ``replace=False`` returns distinct ids. Raises ``NotSampleableError`` when
    there are no sampleable transitions, or fewer than ``batch_size`` without
    replacement.
    """
    if n_valid == 0:
        raise NotSampleableError(
            "no sampleable transitions yet: a transition becomes sampleable once its n-step window has"
            " closed (add more steps or end the episode)")
    if not replace and batch_size > n_valid:
        raise NotSampleableError(
            f"sample({batch_size}, replace=False) needs {batch_size} distinct transitions, the store has"
            f" {n_valid} sampleable; ask for fewer or use replace=True")
    span = hi - lo
    if 2 * n_valid < span or (not replace and 4 * batch_size > n_valid):
        ids = valid_ids()
        if replace:
            return ids[rng.integers(0, ids.size, size=batch_size)]
        return rng.choice(ids, size=batch_size, replace=False)
    out = np.empty(0, np.int64)
    while out.size < batch_size:
        cand = rng.integers(lo, hi, size=batch_size - out.size, dtype=np.int64)
        cand = cand[is_valid(cand)]
        out = np.concatenate([out, cand])
        if not replace:
            _, first = np.unique(out, return_index=True)
            out = out[np.sort(first)]
    return out
