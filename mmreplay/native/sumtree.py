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

- ``meta`` (int64): the geometry at fixed positions (``I_*`` below), then the bookkeeping of lazy
  propagation: the number of dirty leaf rows, the count of positive leaves, a stale bit, the list of
  dirty leaf rows and one dirty flag per leaf row.
- ``nodes`` (float64): node values of every level (leaves first), every row's running sum, the top
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

# Positions in ``meta``.
I_DEPTH = 0
I_CAPACITY = 1
I_TOP_N = 2  # nodes in the top level
I_VAL = 3  # MAX_DEPTH + 1 offsets in nodes: node values of level l (leaves: l = 0)
I_PRE = I_VAL + MAX_DEPTH + 1  # MAX_DEPTH + 1 offsets: running sums of the rows of level l; [depth]: top
I_MIN = I_PRE + MAX_DEPTH + 1  # offsets of the min-positive nodes of level l (l >= 1)
I_MAX = I_MIN + MAX_DEPTH + 1  # offsets of the max nodes of level l (l >= 1)
I_ROWS = I_MAX + MAX_DEPTH + 1  # rows of level l (l < depth)
I_SCALARS = I_ROWS + MAX_DEPTH + 1  # offset in nodes of total, min_positive, max
I_NDIRTY = I_SCALARS + 1
I_COUNT = I_NDIRTY + 1
I_STALE = I_COUNT + 1
I_LIST = I_STALE + 1  # dirty leaf rows (n_rows0 entries), then one flag per leaf row
HEADER = I_LIST


def new_state(capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """``(meta, nodes)`` of an all-zero tree of ``capacity`` >= 1 leaves (see the module docstring)."""
    widths = [capacity]
    while widths[-1] > TOP_MAX:
        widths.append(-(-widths[-1] // FANOUT))
    depth = len(widths) - 1
    if depth > MAX_DEPTH:
        raise ValueError(f"capacity: expected at most {TOP_MAX * FANOUT ** MAX_DEPTH} leaves, got {capacity}")
    padded = [-(-w // FANOUT) * FANOUT for w in widths[:-1]] + [widths[-1]]
    n_rows = [p // FANOUT for p in padded[:-1]]
    n_rows0 = n_rows[0] if depth else 0
    meta = np.zeros(HEADER + 2 * n_rows0, np.int64)
    meta[I_DEPTH], meta[I_CAPACITY], meta[I_TOP_N] = depth, capacity, widths[-1]
    off = 0
    for level in range(depth + 1):
        meta[I_VAL + level] = off
        off += padded[level]
    for level in range(depth):
        meta[I_PRE + level] = off
        meta[I_ROWS + level] = n_rows[level]
        off += n_rows[level] * (FANOUT + 1)
    meta[I_PRE + depth] = off  # the top running sum: [0, s0, s0+s1, ...]
    off += widths[-1] + 1
    for table in (I_MIN, I_MAX):
        for level in range(1, depth + 1):
            meta[table + level] = off
            off += padded[level]
    meta[I_SCALARS] = off
    nodes = np.zeros(off + 3, np.float64)
    for level in range(1, depth + 1):
        nodes[meta[I_MIN + level]:meta[I_MIN + level] + padded[level]] = np.inf
    nodes[off + 1] = np.inf  # min_positive of an empty tree
    return meta, nodes


# ---------------------------------------------------------------------------------------------- writes


@njit(cache=True, nogil=True)
def check_set(meta: np.ndarray, idx: np.ndarray, values: np.ndarray) -> int:
    """-1 when every ``idx`` is in ``[0, capacity)`` and every value (one per index, or ``values[0]``
    for all when ``values`` has one entry) is finite and >= 0; else ``2 * i`` for a bad index at
    position ``i``, ``2 * i + 1`` for a bad value (the first bad position; an index before a value)."""
    cap = meta[I_CAPACITY]
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
def tree_set(meta: np.ndarray, nodes: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
    """Write leaf masses in order (a repeated index ends with its last value); no validation here
    (``check_set`` first). ``values`` has one entry per index, or one entry for all."""
    n = idx.shape[0]
    if n == 0:
        return
    depth = meta[I_DEPTH]
    leaves = meta[I_VAL]  # offset 0
    one = values.shape[0] == 1
    count = meta[I_COUNT]
    nd = meta[I_NDIRTY]
    n_rows0 = meta[I_ROWS] if depth else 0
    flags = I_LIST + n_rows0
    for i in range(n):
        j = idx[i]
        v = (values[0] if one else values[i]) + 0.0  # -0.0 is stored as 0.0
        old = nodes[leaves + j]
        if v != 0.0:
            count += 1
        if old != 0.0:
            count -= 1
        nodes[leaves + j] = v
        if depth:
            r = j >> SHIFT
            if meta[flags + r] == 0:
                meta[flags + r] = 1
                meta[I_LIST + nd] = r
                nd += 1
    meta[I_COUNT] = count
    meta[I_NDIRTY] = nd
    meta[I_STALE] = 1


@njit(cache=True, nogil=True)
def tree_set_with(meta: np.ndarray, nodes: np.ndarray, idx: np.ndarray, values: np.ndarray, side: np.ndarray,
                  side_values: np.ndarray, flags: np.ndarray) -> None:
    """``tree_set(meta, nodes, idx, values)``, and in the same pass ``side[idx] = side_values`` and
    ``flags[idx] = True`` (``side_values`` one per index): a prioritized sampler's raw priorities and
    changed-slot flags beside its tree."""
    for i in range(idx.shape[0]):
        side[idx[i]] = side_values[i]
        flags[idx[i]] = True
    tree_set(meta, nodes, idx, values)


@njit(cache=True, nogil=True)
def tree_load(meta: np.ndarray, nodes: np.ndarray, leaves: np.ndarray) -> None:
    """Replace every leaf (``leaves``: capacity finite masses >= 0) and rebuild the whole tree."""
    cap = meta[I_CAPACITY]
    count = 0
    for j in range(cap):
        v = leaves[j] + 0.0
        nodes[j] = v
        if v != 0.0:
            count += 1
    meta[I_COUNT] = count
    depth = meta[I_DEPTH]
    if depth:
        n_rows0 = meta[I_ROWS]
        for r in range(n_rows0):
            meta[I_LIST + n_rows0 + r] = 0
        _rebuild_all(meta, nodes)
    meta[I_NDIRTY] = 0
    _rebuild_top(meta, nodes)
    meta[I_STALE] = 0


# ----------------------------------------------------------------------------------------- propagation


@njit(cache=True, nogil=True, inline="always")
def _running(nodes: np.ndarray, src: int, n: int, pre: int) -> float:
    """``nodes[pre + 1 + i]`` = sum of ``nodes[src .. src + i]`` (strictly sequential), then ``+inf`` from
    the first entry that reaches the total on; returns the total. The running sum of non-negative
    numbers never decreases, so the entries that reach the total are a suffix: found from the end."""
    acc = 0.0
    for i in range(n):
        acc += nodes[src + i]
        nodes[pre + 1 + i] = acc
    i = n - 1
    while i >= 0 and nodes[pre + 1 + i] >= acc:
        nodes[pre + 1 + i] = np.inf
        i -= 1
    return acc


@njit(cache=True, nogil=True, inline="always")
def _row(meta: np.ndarray, nodes: np.ndarray, level: int, r: int) -> None:
    """Recompute row ``r`` of ``level``: its running sum, its node one level up, that node's min and max."""
    child = meta[I_VAL + level] + r * FANOUT
    nodes[meta[I_VAL + level + 1] + r] = _running(nodes, child, FANOUT, meta[I_PRE + level] + r * (FANOUT + 1))
    lo = np.inf
    hi = 0.0
    if level == 0:
        for c in range(FANOUT):
            v = nodes[child + c]
            if v > 0.0 and v < lo:
                lo = v
            hi = max(hi, v)
    else:
        mins = meta[I_MIN + level] + r * FANOUT
        maxs = meta[I_MAX + level] + r * FANOUT
        for c in range(FANOUT):
            lo = min(lo, nodes[mins + c])
            hi = max(hi, nodes[maxs + c])
    nodes[meta[I_MIN + level + 1] + r] = lo
    nodes[meta[I_MAX + level + 1] + r] = hi


@njit(cache=True, nogil=True)
def _rebuild_all(meta: np.ndarray, nodes: np.ndarray) -> None:
    for level in range(meta[I_DEPTH]):
        for r in range(meta[I_ROWS + level]):
            _row(meta, nodes, level, r)


@njit(cache=True, nogil=True)
def _rebuild_top(meta: np.ndarray, nodes: np.ndarray) -> None:
    depth = meta[I_DEPTH]
    n = meta[I_TOP_N]
    val = meta[I_VAL + depth]
    total = _running(nodes, val, n, meta[I_PRE + depth])
    lo = np.inf
    hi = 0.0
    if depth:
        mins = meta[I_MIN + depth]
        maxs = meta[I_MAX + depth]
        for i in range(n):
            lo = min(lo, nodes[mins + i])
            hi = max(hi, nodes[maxs + i])
    else:
        for i in range(n):
            v = nodes[val + i]
            if v > 0.0 and v < lo:
                lo = v
            hi = max(hi, v)
    s = meta[I_SCALARS]
    nodes[s] = total
    nodes[s + 1] = lo
    nodes[s + 2] = hi


@njit(cache=True, nogil=True)
def tree_flush(meta: np.ndarray, nodes: np.ndarray) -> None:
    """Propagate pending leaf writes to every level; afterwards ``nodes[meta[I_SCALARS]:][:3]`` holds
    ``total``, ``min_positive`` and ``max``."""
    if meta[I_STALE] == 0:
        return
    depth = meta[I_DEPTH]
    nd = meta[I_NDIRTY]
    if depth and nd:
        n_rows0 = meta[I_ROWS]
        flags = I_LIST + n_rows0
        if nd * 4 > n_rows0:  # past a quarter of the rows, one pass over everything is cheaper
            for i in range(nd):
                meta[flags + meta[I_LIST + i]] = 0
            _rebuild_all(meta, nodes)
        else:
            rows = meta[I_LIST:I_LIST + nd].copy()
            for i in range(nd):
                meta[flags + rows[i]] = 0
            for level in range(depth):
                rows.sort()
                prev = -1
                kept = 0
                for i in range(rows.shape[0]):
                    r = rows[i]
                    if r != prev:
                        _row(meta, nodes, level, r)
                        rows[kept] = r >> SHIFT
                        kept += 1
                        prev = r
                rows = rows[:kept]
        meta[I_NDIRTY] = 0
    _rebuild_top(meta, nodes)
    meta[I_STALE] = 0


# -------------------------------------------------------------------------------------------- searches


@njit(cache=True, nogil=True, inline="always")
def _descend_one(meta: np.ndarray, nodes: np.ndarray, m: float) -> int:
    depth = meta[I_DEPTH]
    top = meta[I_PRE + depth]  # nodes[top + i] = mass before top node i; nodes[top + 1 + i] inclusive
    # first top node whose inclusive sum exceeds m (the +inf tail guarantees one exists)
    lo = 0
    hi = meta[I_TOP_N]
    while lo < hi:
        mid = (lo + hi) >> 1
        if nodes[top + 1 + mid] > m:
            hi = mid
        else:
            lo = mid + 1
    node = lo
    if depth == 0:
        return node
    m -= nodes[top + node]
    for level in range(depth - 1, -1, -1):
        row = meta[I_PRE + level] + node * (FANOUT + 1)
        c = 0
        while not nodes[row + 1 + c] > m:
            c += 1
        if level:
            m -= nodes[row + c]
        node = (node << SHIFT) + c
    return node


@njit(cache=True, nogil=True)
def tree_find(meta: np.ndarray, nodes: np.ndarray, points: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` = the leaf holding ``points[i]`` (points in ``[0, total]``, validated by the caller)."""
    tree_flush(meta, nodes)
    for i in range(points.shape[0]):
        out[i] = _descend_one(meta, nodes, points[i])


@njit(cache=True, nogil=True)
def tree_stratified(meta: np.ndarray, nodes: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """Stratified draw: point i is ``(i + u[i]) * (total / n)`` (``u`` uniform in [0, 1)), as the numpy
    tree computes it; ``out[i]`` its leaf. The total must be positive."""
    tree_flush(meta, nodes)
    n = u.shape[0]
    scale = nodes[meta[I_SCALARS]] / n
    for i in range(n):
        out[i] = _descend_one(meta, nodes, (i + u[i]) * scale)


@njit(cache=True, nogil=True)
def tree_stratified_normalised(meta: np.ndarray, nodes: np.ndarray, u: np.ndarray, out: np.ndarray,
                               ratio: np.ndarray) -> None:
    """``tree_stratified``, and ``ratio[i]`` the mass of leaf ``out[i]`` divided by the smallest positive
    leaf mass (float64): what importance weights are computed from, without a second pass in numpy."""
    tree_stratified(meta, nodes, u, out)
    lo = nodes[meta[I_SCALARS] + 1]
    leaves = meta[I_VAL]
    for i in range(u.shape[0]):
        ratio[i] = nodes[leaves + out[i]] / lo


@njit(cache=True, nogil=True)
def tree_proportional(meta: np.ndarray, nodes: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """Independent draws: point i is ``u[i] * total``; ``out[i]`` its leaf. The total must be positive."""
    tree_flush(meta, nodes)
    total = nodes[meta[I_SCALARS]]
    for i in range(u.shape[0]):
        out[i] = _descend_one(meta, nodes, u[i] * total)
