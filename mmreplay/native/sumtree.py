"""Sum-tree kernels: batched leaf writes, lazy propagation, stratified descent, min and max trees.

The tree is the wide, shallow one of ``mmreplay.sampling.numpy_sumtree`` (its module docstring
explains the layout): leaves grouped in rows of ``FANOUT`` = 32, each row's total a node one level
up, until a level has at most ``TOP_MAX`` = 2048 nodes; every row keeps its running sum
``[0, c0, c0+c1, ...]`` with ``+inf`` from the first entry that reaches the row total on, and the top
level keeps one running sum the same way. These kernels hold the same numbers in the same places
and compute every node from its children with the same float64 additions in the same order
(strictly sequential running sums), so each node, the root and every search result are bit for bit
those of the numpy tree for the same leaves. The tests compare the two on random and adversarial
inputs.

State lives in two flat arrays made by ``new_state(capacity)``, so that a kernel call unboxes two
arguments instead of a dozen:

- ``ist`` (int64): the geometry at fixed positions (``I_*`` below), then the bookkeeping of lazy
  propagation: the number of dirty leaf rows, the count of positive leaves, a stale bit, the list of
  dirty leaf rows and one dirty flag per leaf row.
- ``fst`` (float64): node values of every level (leaves first), every row's running sum, the top
  running sum, the smallest positive leaf below each node of levels 1..depth, the largest leaf below
  each node of levels 1..depth, then ``total``, ``min_positive`` and ``max`` (valid when not stale).

Writes (``tree_set``) store leaves and remember which leaf rows changed; ``tree_flush`` recomputes
those rows and their ancestors (or everything, past a quarter of the rows) and then the top. A
search flushes first. None of the kernels is thread-safe with respect to the same state.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SHIFT = 5
FANOUT = 1 << SHIFT
TOP_MAX = 2048
MAX_DEPTH = 6  # 2048 * 32**6 leaves: far beyond any ring

# Positions in ``ist``.
I_DEPTH = 0
I_CAPACITY = 1
I_TOP_N = 2  # nodes in the top level
I_VAL = 3  # MAX_DEPTH + 1 offsets in fst: node values of level l (leaves: l = 0)
I_PRE = I_VAL + MAX_DEPTH + 1  # MAX_DEPTH + 1 offsets: running sums of the rows of level l; [depth]: top
I_MIN = I_PRE + MAX_DEPTH + 1  # offsets of the min-positive nodes of level l (l >= 1)
I_MAX = I_MIN + MAX_DEPTH + 1  # offsets of the max nodes of level l (l >= 1)
I_ROWS = I_MAX + MAX_DEPTH + 1  # rows of level l (l < depth)
I_SCALARS = I_ROWS + MAX_DEPTH + 1  # offset in fst of total, min_positive, max
I_NDIRTY = I_SCALARS + 1
I_COUNT = I_NDIRTY + 1
I_STALE = I_COUNT + 1
I_LIST = I_STALE + 1  # dirty leaf rows (n_rows0 entries), then one flag per leaf row
HEADER = I_LIST


def new_state(capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ist, fst)`` of an all-zero tree of ``capacity`` >= 1 leaves (see the module docstring)."""
    widths = [capacity]
    while widths[-1] > TOP_MAX:
        widths.append(-(-widths[-1] // FANOUT))
    depth = len(widths) - 1
    if depth > MAX_DEPTH:
        raise ValueError(f"capacity: expected at most {TOP_MAX * FANOUT ** MAX_DEPTH} leaves, got {capacity}")
    padded = [-(-w // FANOUT) * FANOUT for w in widths[:-1]] + [widths[-1]]
    n_rows = [p // FANOUT for p in padded[:-1]]
    n_rows0 = n_rows[0] if depth else 0
    ist = np.zeros(HEADER + 2 * n_rows0, np.int64)
    ist[I_DEPTH], ist[I_CAPACITY], ist[I_TOP_N] = depth, capacity, widths[-1]
    off = 0
    for level in range(depth + 1):
        ist[I_VAL + level] = off
        off += padded[level]
    for level in range(depth):
        ist[I_PRE + level] = off
        ist[I_ROWS + level] = n_rows[level]
        off += n_rows[level] * (FANOUT + 1)
    ist[I_PRE + depth] = off  # the top running sum: [0, s0, s0+s1, ...]
    off += widths[-1] + 1
    for table in (I_MIN, I_MAX):
        for level in range(1, depth + 1):
            ist[table + level] = off
            off += padded[level]
    ist[I_SCALARS] = off
    fst = np.zeros(off + 3, np.float64)
    for level in range(1, depth + 1):
        fst[ist[I_MIN + level]:ist[I_MIN + level] + padded[level]] = np.inf
    fst[off + 1] = np.inf  # min_positive of an empty tree
    return ist, fst


# ---------------------------------------------------------------------------------------------- writes


@njit(cache=True, nogil=True)
def check_set(ist: np.ndarray, idx: np.ndarray, values: np.ndarray) -> int:
    """-1 when every ``idx`` is in ``[0, capacity)`` and every value (one per index, or ``values[0]``
    for all when ``values`` has one entry) is finite and >= 0; else ``2 * i`` for a bad index at
    position ``i``, ``2 * i + 1`` for a bad value (the first bad position; an index before a value)."""
    cap = ist[I_CAPACITY]
    one = values.shape[0] == 1
    for i in range(idx.shape[0]):
        j = idx[i]
        if j < 0 or j >= cap:
            return 2 * i
        v = values[0] if one else values[i]
        if not (v >= 0.0 and v < np.inf):  # False for NaN too
            return 2 * i + 1
    return -1


@njit(cache=True, nogil=True)
def tree_set(ist: np.ndarray, fst: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
    """Write leaf masses in order (a repeated index ends with its last value); no validation here
    (``check_set`` first). ``values`` has one entry per index, or one entry for all."""
    n = idx.shape[0]
    if n == 0:
        return
    depth = ist[I_DEPTH]
    leaves = ist[I_VAL]  # offset 0
    one = values.shape[0] == 1
    count = ist[I_COUNT]
    nd = ist[I_NDIRTY]
    n_rows0 = ist[I_ROWS] if depth else 0
    flags = I_LIST + n_rows0
    for i in range(n):
        j = idx[i]
        v = (values[0] if one else values[i]) + 0.0  # -0.0 is stored as 0.0
        old = fst[leaves + j]
        if v != 0.0:
            count += 1
        if old != 0.0:
            count -= 1
        fst[leaves + j] = v
        if depth:
            r = j >> SHIFT
            if ist[flags + r] == 0:
                ist[flags + r] = 1
                ist[I_LIST + nd] = r
                nd += 1
    ist[I_COUNT] = count
    ist[I_NDIRTY] = nd
    ist[I_STALE] = 1


@njit(cache=True, nogil=True)
def tree_set_with(ist: np.ndarray, fst: np.ndarray, idx: np.ndarray, values: np.ndarray, side: np.ndarray,
                  side_values: np.ndarray, flags: np.ndarray) -> None:
    """``tree_set(ist, fst, idx, values)``, and in the same pass ``side[idx] = side_values`` and
    ``flags[idx] = True`` (``side_values`` one per index): a prioritized sampler's raw priorities and
    changed-slot flags beside its tree."""
    for i in range(idx.shape[0]):
        side[idx[i]] = side_values[i]
        flags[idx[i]] = True
    tree_set(ist, fst, idx, values)


@njit(cache=True, nogil=True)
def tree_load(ist: np.ndarray, fst: np.ndarray, leaves: np.ndarray) -> None:
    """Replace every leaf (``leaves``: capacity finite masses >= 0) and rebuild the whole tree."""
    cap = ist[I_CAPACITY]
    count = 0
    for j in range(cap):
        v = leaves[j] + 0.0
        fst[j] = v
        if v != 0.0:
            count += 1
    ist[I_COUNT] = count
    depth = ist[I_DEPTH]
    if depth:
        n_rows0 = ist[I_ROWS]
        for r in range(n_rows0):
            ist[I_LIST + n_rows0 + r] = 0
        _rebuild_all(ist, fst)
    ist[I_NDIRTY] = 0
    _rebuild_top(ist, fst)
    ist[I_STALE] = 0


# ----------------------------------------------------------------------------------------- propagation


@njit(cache=True, nogil=True, inline="always")
def _running(fst: np.ndarray, src: int, n: int, pre: int) -> float:
    """``fst[pre + 1 + i]`` = sum of ``fst[src .. src + i]`` (strictly sequential), then ``+inf`` from
    the first entry that reaches the total on; returns the total. The running sum of non-negative
    numbers never decreases, so the entries that reach the total are a suffix: found from the end."""
    acc = 0.0
    for i in range(n):
        acc += fst[src + i]
        fst[pre + 1 + i] = acc
    i = n - 1
    while i >= 0 and fst[pre + 1 + i] >= acc:
        fst[pre + 1 + i] = np.inf
        i -= 1
    return acc


@njit(cache=True, nogil=True, inline="always")
def _row(ist: np.ndarray, fst: np.ndarray, level: int, r: int) -> None:
    """Recompute row ``r`` of ``level``: its running sum, its node one level up, that node's min and max."""
    child = ist[I_VAL + level] + r * FANOUT
    fst[ist[I_VAL + level + 1] + r] = _running(fst, child, FANOUT, ist[I_PRE + level] + r * (FANOUT + 1))
    lo = np.inf
    hi = 0.0
    if level == 0:
        for c in range(FANOUT):
            v = fst[child + c]
            if v > 0.0 and v < lo:
                lo = v
            hi = max(hi, v)
    else:
        mins = ist[I_MIN + level] + r * FANOUT
        maxs = ist[I_MAX + level] + r * FANOUT
        for c in range(FANOUT):
            lo = min(lo, fst[mins + c])
            hi = max(hi, fst[maxs + c])
    fst[ist[I_MIN + level + 1] + r] = lo
    fst[ist[I_MAX + level + 1] + r] = hi


@njit(cache=True, nogil=True)
def _rebuild_all(ist: np.ndarray, fst: np.ndarray) -> None:
    for level in range(ist[I_DEPTH]):
        for r in range(ist[I_ROWS + level]):
            _row(ist, fst, level, r)


@njit(cache=True, nogil=True)
def _rebuild_top(ist: np.ndarray, fst: np.ndarray) -> None:
    depth = ist[I_DEPTH]
    n = ist[I_TOP_N]
    val = ist[I_VAL + depth]
    total = _running(fst, val, n, ist[I_PRE + depth])
    lo = np.inf
    hi = 0.0
    if depth:
        mins = ist[I_MIN + depth]
        maxs = ist[I_MAX + depth]
        for i in range(n):
            lo = min(lo, fst[mins + i])
            hi = max(hi, fst[maxs + i])
    else:
        for i in range(n):
            v = fst[val + i]
            if v > 0.0 and v < lo:
                lo = v
            hi = max(hi, v)
    s = ist[I_SCALARS]
    fst[s] = total
    fst[s + 1] = lo
    fst[s + 2] = hi


@njit(cache=True, nogil=True)
def tree_flush(ist: np.ndarray, fst: np.ndarray) -> None:
    """Propagate pending leaf writes to every level; afterwards ``fst[ist[I_SCALARS]:][:3]`` holds
    ``total``, ``min_positive`` and ``max``."""
    if ist[I_STALE] == 0:
        return
    depth = ist[I_DEPTH]
    nd = ist[I_NDIRTY]
    if depth and nd:
        n_rows0 = ist[I_ROWS]
        flags = I_LIST + n_rows0
        if nd * 4 > n_rows0:  # past a quarter of the rows, one pass over everything is cheaper
            for i in range(nd):
                ist[flags + ist[I_LIST + i]] = 0
            _rebuild_all(ist, fst)
        else:
            rows = ist[I_LIST:I_LIST + nd].copy()
            for i in range(nd):
                ist[flags + rows[i]] = 0
            for level in range(depth):
                rows.sort()
                prev = -1
                kept = 0
                for i in range(rows.shape[0]):
                    r = rows[i]
                    if r != prev:
                        _row(ist, fst, level, r)
                        rows[kept] = r >> SHIFT
                        kept += 1
                        prev = r
                rows = rows[:kept]
        ist[I_NDIRTY] = 0
    _rebuild_top(ist, fst)
    ist[I_STALE] = 0


# -------------------------------------------------------------------------------------------- searches


@njit(cache=True, nogil=True, inline="always")
def _descend_one(ist: np.ndarray, fst: np.ndarray, m: float) -> int:
    depth = ist[I_DEPTH]
    top = ist[I_PRE + depth]  # fst[top + i] = mass before top node i; fst[top + 1 + i] inclusive
    # first top node whose inclusive sum exceeds m (the +inf tail guarantees one exists)
    lo = 0
    hi = ist[I_TOP_N]
    while lo < hi:
        mid = (lo + hi) >> 1
        if fst[top + 1 + mid] > m:
            hi = mid
        else:
            lo = mid + 1
    node = lo
    if depth == 0:
        return node
    m -= fst[top + node]
    for level in range(depth - 1, -1, -1):
        row = ist[I_PRE + level] + node * (FANOUT + 1)
        c = 0
        while not fst[row + 1 + c] > m:
            c += 1
        if level:
            m -= fst[row + c]
        node = (node << SHIFT) + c
    return node


@njit(cache=True, nogil=True)
def tree_find(ist: np.ndarray, fst: np.ndarray, points: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` = the leaf holding ``points[i]`` (points in ``[0, total]``, validated by the caller)."""
    tree_flush(ist, fst)
    for i in range(points.shape[0]):
        out[i] = _descend_one(ist, fst, points[i])


@njit(cache=True, nogil=True)
def tree_stratified(ist: np.ndarray, fst: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """Stratified draw: point i is ``(i + u[i]) * (total / n)`` (``u`` uniform in [0, 1)), as the numpy
    tree computes it; ``out[i]`` its leaf. The total must be positive."""
    tree_flush(ist, fst)
    n = u.shape[0]
    scale = fst[ist[I_SCALARS]] / n
    for i in range(n):
        out[i] = _descend_one(ist, fst, (i + u[i]) * scale)


@njit(cache=True, nogil=True)
def tree_stratified_normalised(ist: np.ndarray, fst: np.ndarray, u: np.ndarray, out: np.ndarray,
                               ratio: np.ndarray) -> None:
    """``tree_stratified``, and ``ratio[i]`` the mass of leaf ``out[i]`` divided by the smallest positive
    leaf mass (float64): what importance weights are computed from, without a second pass in numpy."""
    tree_stratified(ist, fst, u, out)
    lo = fst[ist[I_SCALARS] + 1]
    leaves = ist[I_VAL]
    for i in range(u.shape[0]):
        ratio[i] = fst[leaves + out[i]] / lo


@njit(cache=True, nogil=True)
def tree_proportional(ist: np.ndarray, fst: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """Independent draws: point i is ``u[i] * total``; ``out[i]`` its leaf. The total must be positive."""
    tree_flush(ist, fst)
    total = fst[ist[I_SCALARS]]
    for i in range(u.shape[0]):
        out[i] = _descend_one(ist, fst, u[i] * total)
