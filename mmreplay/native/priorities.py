"""A priority update's checks, id-to-slot lookup and duplicate resolution in one pass.

``store.update_priorities(ids, p)`` must (SEMANTICS.md): refuse NaN, infinite or negative
priorities and ids never issued, naming the first bad position, changing nothing; skip (and count)
ids that were evicted or are not sampleable; let the last occurrence of a repeated id win; and
hand the priority sampler distinct slots with their priorities and the largest of them. In numpy
that is a dozen calls, whose overhead dominates a batch's few ids; ``priority_update`` does it in one
loop over the ids.

Its numpy reference is ``mmreplay.native.reference.priority_update_numpy``; the tests compare them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

OK = 0
BAD_PRIORITY = 1  # position: the first priority that is NaN, infinite or negative
NEVER_ISSUED = 2  # position: the first id < 0 or >= next_id


@njit(cache=True, nogil=True)
def priority_update(ids: np.ndarray, priorities: np.ndarray, oldest_id: int, next_id: int,
                    id2slot: np.ndarray, valid: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray, int, float]:
    """Check and resolve an update of raw priorities (``ids``: int64, ``priorities``: float64, same length).

    ``id2slot`` maps ``id % len(id2slot)`` to a ring slot for retained ids ``[oldest_id, next_id)``;
    ``valid[slot]`` says whether that slot is sampleable (settle the index first: a window that closed
    before the update must count as sampleable).

    Returns ``(status, position, slots, values, skipped, top)``:

    - ``status`` ``OK``, or ``BAD_PRIORITY`` / ``NEVER_ISSUED`` with ``position`` the first bad entry
      (priorities are checked first, over the whole array); then nothing else is computed.
    - ``slots`` (int64) and ``values`` (float64, ``-0.0`` as ``0.0``): one entry per distinct
      sampleable id, its last priority, in the order of those last occurrences.
    - ``skipped``: entries whose id is evicted (< ``oldest_id``) or not sampleable, each counted.
    - ``top``: the largest of ``values`` (0.0 when there is none).
    """
    n = ids.shape[0]
    bad_p = -1
    bad_id = -1
    for i in range(n):
        v = priorities[i]
        if bad_p < 0 and not (v >= 0.0 and v < np.inf):  # False for NaN too
            bad_p = i
        j = ids[i]
        if bad_id < 0 and (j < 0 or j >= next_id):
            bad_id = i
    if bad_p >= 0:
        return BAD_PRIORITY, bad_p, np.empty(0, np.int64), np.empty(0, np.float64), 0, 0.0
    if bad_id >= 0:
        return NEVER_ISSUED, bad_id, np.empty(0, np.int64), np.empty(0, np.float64), 0, 0.0
    size = id2slot.shape[0]
    # Slots already kept, in an open-addressing set (slot + 1; 0 = empty) of at least twice n buckets.
    # Walking from the back keeps each slot's last occurrence.
    buckets = 16
    while buckets < 2 * n:
        buckets <<= 1
    mask = buckets - 1
    table = np.zeros(buckets, np.int64)
    slots = np.empty(n, np.int64)
    values = np.empty(n, np.float64)
    kept = n
    skipped = 0
    top = 0.0
    for i in range(n - 1, -1, -1):
        j = ids[i]
        if j < oldest_id:
            skipped += 1
            continue
        s = id2slot[j % size]
        if not valid[s]:
            skipped += 1
            continue
        h = ((s * 2654435761) >> 12) & mask
        while table[h] != 0 and table[h] != s + 1:
            h = (h + 1) & mask
        if table[h] != 0:
            continue  # a later occurrence of this id was kept
        table[h] = s + 1
        kept -= 1
        slots[kept] = s
        v = priorities[i] + 0.0
        values[kept] = v
        if v > top:
            top = v
    return OK, -1, slots[kept:], values[kept:], skipped, top
