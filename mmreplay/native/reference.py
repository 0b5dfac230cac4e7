"""Numpy references of kernels whose numpy version lives nowhere else in the package.

(The sum tree's is ``mmreplay.sampling.numpy_sumtree``; the batch plan's is ``Index.plan``; the stack
gather's is ``np.take`` as ``FrameReader`` runs it, then the padding zeroed as ``batch.assemble`` does.)
"""

from __future__ import annotations

import numpy as np

from .priorities import BAD_PRIORITY, NEVER_ISSUED, OK


def priority_update_numpy(ids: np.ndarray, priorities: np.ndarray, oldest_id: int, next_id: int,
                          id2slot: np.ndarray, valid: np.ndarray
                          ) -> tuple[int, int, np.ndarray, np.ndarray, int, float]:
    """``mmreplay.native.priorities.priority_update`` in numpy calls: same arguments, same results."""
    empty = np.empty(0, np.int64), np.empty(0, np.float64), 0, 0.0
    ok_p = (priorities >= 0) & (priorities < np.inf)
    if not ok_p.all():
        return (BAD_PRIORITY, int(np.flatnonzero(~ok_p)[0]), *empty)
    never = (ids < 0) | (ids >= next_id)
    if never.any():
        return (NEVER_ISSUED, int(np.flatnonzero(never)[0]), *empty)
    size = id2slot.size
    ok = np.zeros(ids.shape, np.bool_)
    inside = ids >= oldest_id
    ok[inside] = valid[id2slot[ids[inside] % size]]
    skipped = int(ids.size - np.count_nonzero(ok))
    slots = id2slot[ids[ok] % size]
    values = priorities[ok] + 0.0
    # the last occurrence of each slot, in the order of those last occurrences
    _, first_from_back = np.unique(slots[::-1], return_index=True)
    keep = np.sort(slots.size - 1 - first_from_back)
    slots, values = slots[keep], values[keep]
    return OK, -1, slots, values, skipped, float(values.max()) if values.size else 0.0
