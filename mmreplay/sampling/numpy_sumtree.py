"""The sum tree in plain numpy: the reference ``mr.SumTree``'s kernels are tested against.

``NumpySumTree`` has the public API of ``mmreplay.sampling.sumtree.SumTree`` (its base class) and
replaces the compiled kernels (``mmreplay.native.sumtree``) by numpy calls over the same layout.
The two hold the same float64 numbers for the same leaves; the tests compare every observable
result of the two, bit for bit. It is also the pure-numpy path where numba is not wanted.

The tree answers three questions about ``capacity`` non-negative masses
(a transition's priority ``p ** alpha``; 0 for slots that cannot be sampled):
their ``total``, the smallest *positive* mass (``min``, the importance-weight
normaliser) and the largest (``max``), and, for a batch of points ``m`` in
``[0, total)``, which leaf's cumulative-sum interval holds each point
(``find``, and the samplers on top of it).

Layout, and why it is not a binary heap
---------------------------------------
For a batch of 32 the cost is the number of numpy calls, not the elements
(each call's fixed overhead is larger than the work on 32 elements; a
reduction or a running sum along an axis costs a few calls' worth). A binary
heap over 2**20 leaves has 20 levels at about 5 calls each (BENCHMARKS.md,
"Figures behind the code"). So this tree is wide and shallow:

* leaves are grouped in rows of ``_FANOUT`` = 32; each row's total is a node
  one level up, and so on until a level has at most ``_TOP_MAX`` = 2048
  nodes. That top level is searched with one ``searchsorted`` over its
  running sum. 2**20 leaves take two row levels under the top; up to 2048
  leaves take none.
* each row stores ``[0, c0, c0+c1, ..., c0+...+c31]`` (F + 1 entries, a
  sequential running sum of its children), so descending one level is
  "gather the rows, find the first entry above the point, subtract the entry
  before it": five calls whatever the fan-out.
* in a stored running sum, every entry from the first one that reaches the
  row total on is ``+inf``. A point that rounding pushed to or past a node's
  total therefore lands on the node's last positive child, never on a
  zero-mass one, without a clamp per level; and the last entry, always
  ``+inf``, guarantees the search finds a child.

All sums live in one flat float64 array (``_sums``: the node values of every
level with the leaves first, the rows' running sums, the top running sum);
the smallest positive leaf below each node lives in a second flat float64
array (``_mins``, ``+inf`` for a subtree without a positive leaf), the largest
in a third (``_maxs``).

Exactness. A node is always recomputed from its children, never adjusted by
a delta, and every running sum is strictly sequential (``np.add.accumulate``)
so its result does not depend on how many rows are processed together. The
tree is therefore the same deterministic function of the current leaves
however it got there: ``total`` stays within ~1e-13 relative of an exact sum
after any number of updates, and ``from_leaves(tree.leaves())`` is bit for
bit the same tree, so a checkpoint that stores only the leaves resumes
sampling exactly.

Lazy propagation. ``set`` writes the leaves and records which rows changed;
rows and levels above them are recomputed at the next read of ``total``,
``min`` or ``max``, or search (or once 4096 leaf writes are pending). The ``set`` calls between two sampled batches thus
share one propagation, and a ``set`` of one leaf does no propagation of its own.
The tree is not thread-safe.

The cumulative sums ``find`` works with are those of this hierarchy: the
top running sum to the leaf's ancestor, then each row's running sum on the
way down, subtracted from the point level by level. For masses that add up
exactly in float64 (small integers, say) they are the exact cumulative sums;
otherwise they differ from ``np.cumsum(leaves)`` by rounding only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .sumtree import SumTree

__all__ = ["NumpySumTree"]

_SHIFT = 5
_FANOUT = 1 << _SHIFT  # leaves (or nodes) per row
_TOP_MAX = 2048  # the widest level kept as a single running sum
_FLUSH_PENDING = 4096  # pending leaf writes that force a propagation


class NumpySumTree(SumTree):
    """``SumTree`` computed with numpy calls instead of compiled kernels (same API, same numbers)."""

    __slots__ = (
        "_depth",
        "_sums",
        "_mins",
        "_maxs",
        "_values",
        "_value_rows",
        "_prefix_rows",
        "_node_mins",
        "_min_rows",
        "_node_maxs",
        "_max_rows",
        "_top_prefix",
        "_top_inclusive",
        "_total",
        "_min_positive",
        "_max",
        "_n_positive",
        "_pending",
        "_n_pending",
        "_stale",
    )

    def _new_state(self, capacity: int) -> None:
        # Real node counts per level, leaves first; row levels are padded to a
        # whole number of rows with zero-mass nodes, the top level is not.
        widths = [capacity]
        while widths[-1] > _TOP_MAX:
            widths.append(-(-widths[-1] // _FANOUT))
        depth = len(widths) - 1
        padded = [-(-w // _FANOUT) * _FANOUT for w in widths[:-1]] + [widths[-1]]
        n_rows = [p // _FANOUT for p in padded[:-1]]
        self._depth = depth

        # One flat float64 array: node values of every level, every row's running
        # sum (F + 1 entries: 0, then the inclusive sums), the top running sum.
        sizes = padded + [r * (_FANOUT + 1) for r in n_rows] + [widths[-1] + 1]
        self._sums = np.zeros(sum(sizes), dtype=np.float64)
        views = _split(self._sums, sizes)
        self._values = views[: depth + 1]
        self._value_rows = [v.reshape(-1, _FANOUT) for v in self._values[:depth]]
        self._prefix_rows = [v.reshape(-1, _FANOUT + 1) for v in views[depth + 1 : 2 * depth + 1]]
        self._top_prefix = views[-1]  # [0, s0, s0+s1, ...]: [i] is the mass before top node i
        self._top_inclusive = self._top_prefix[1:]

        # Minimum positive (and maximum) leaf below each node of levels 1..depth (index 0 unused).
        self._mins = np.full(sum(padded[1:]), np.inf, dtype=np.float64)
        self._node_mins = [np.empty(0)] + _split(self._mins, padded[1:])
        self._min_rows = [np.empty((0, _FANOUT))] + [m.reshape(-1, _FANOUT) for m in self._node_mins[1:depth]]
        self._maxs = np.zeros(sum(padded[1:]), dtype=np.float64)
        self._node_maxs = [np.empty(0)] + _split(self._maxs, padded[1:])
        self._max_rows = [np.empty((0, _FANOUT))] + [m.reshape(-1, _FANOUT) for m in self._node_maxs[1:depth]]

        self._total = np.float64(0.0)
        self._min_positive = np.float64(np.inf)
        self._max = np.float64(0.0)
        self._n_positive = 0
        self._pending: list[np.ndarray] = []  # leaf-row ids written since the last propagation
        self._n_pending = 0
        self._stale = False

    # ------------------------------------------------------------------ hooks of SumTree

    def _stats(self) -> tuple[np.float64, np.float64, np.float64]:
        self._flush()
        return self._total, self._min_positive, self._max

    def _count(self) -> int:
        return self._n_positive

    def _leaf_array(self) -> np.ndarray:
        return self._values[0]

    def _bad_set(self, idx: np.ndarray, vals: np.ndarray) -> int:
        bad_idx = np.flatnonzero((idx < 0) | (idx >= self._capacity))
        ok = (vals >= 0) & (vals < np.inf)
        bad_val = np.flatnonzero(~ok)
        first_idx = int(bad_idx[0]) if bad_idx.size else idx.shape[0]
        if vals.shape[0] == 1 and idx.shape[0]:
            first_val = 0 if bad_val.size else idx.shape[0]
        else:
            first_val = int(bad_val[0]) if bad_val.size else idx.shape[0]
        if first_idx == first_val == idx.shape[0]:
            return -1
        return 2 * first_idx if first_idx <= first_val else 2 * first_val + 1

    def _write_with(self, idx: np.ndarray, vals: np.ndarray, side: np.ndarray, side_vals: np.ndarray,
                    flags: np.ndarray) -> None:
        if idx.shape[0]:
            last, values = _keep_last(idx, side_vals) if idx.shape[0] > 1 else (idx, side_vals)
            side[last] = values
            flags[idx] = True
        self._write(idx, vals)

    def _write(self, idx: np.ndarray, vals: np.ndarray) -> None:
        if idx.shape[0] == 0:
            return
        values = vals + 0.0  # a private copy; -0.0 becomes 0.0
        if values.shape[0] == 1:
            values = np.full(idx.shape[0], values[0])
        if idx.shape[0] > 1:
            idx, values = _keep_last(idx, values)
        leaves = self._values[0]
        self._n_positive += int(np.count_nonzero(values)) - int(np.count_nonzero(leaves[idx]))
        leaves[idx] = values
        self._stale = True
        if self._depth:
            self._pending.append(idx >> _SHIFT)  # a new array: the caller may reuse idx
            self._n_pending += idx.shape[0]
            if self._n_pending >= _FLUSH_PENDING:
                self._flush()

    def _load(self, leaves: np.ndarray) -> None:
        arr = leaves + 0.0
        self._values[0][: self._capacity] = arr
        self._n_positive = int(np.count_nonzero(arr))
        self._pending.clear()
        self._n_pending = 0
        with np.errstate(over="ignore"):
            self._rebuild_rows(None)
            self._rebuild_top()
        self._stale = False

    def _stratified(self, u: np.ndarray) -> np.ndarray:
        n = u.shape[0]
        points = np.arange(n, dtype=np.float64)
        points += u
        points *= self.total / n
        # A point that rounds up to `total` is fine: the +inf tails send it to the
        # last positive leaf.
        return self._descend(points)

    def _stratified_normalised(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        leaves = self._stratified(u)
        ratio = self._leaf_array()[leaves]
        with np.errstate(over="ignore"):  # inf, as the kernel gives (a weight of 0 then)
            ratio /= self.min
        return leaves, ratio

    def _proportional(self, u: np.ndarray) -> np.ndarray:
        return self._descend(u * self.total)

    def _descend(self, points: np.ndarray) -> np.ndarray:
        """Leaf index (int64) per point of the 1-D float64 ``points`` (not modified)."""
        self._flush()
        m = points.copy()
        # Top level: top node i covers [prefix[i], prefix[i+1]); the inclusive sums are
        # +inf from the first that reaches the total, so i is always a positive node.
        node = self._top_inclusive.searchsorted(m, side="right")
        if self._depth == 0:
            return node
        m -= self._top_prefix.take(node)
        # Entry (r, c) of the gathered rows, flattened, is r*(F+1) + c.
        base = np.arange(m.shape[0], dtype=np.int64) * (_FANOUT + 1)
        for level in range(self._depth - 1, -1, -1):
            rows = self._prefix_rows[level].take(node, axis=0)  # (k, F+1): 0, then inclusive sums
            # Child c covers [rows[c], rows[c+1]); the inclusive sums are sorted and
            # end in +inf, so the first one above m is the child and always exists.
            child = (rows[:, 1:] > m[:, None]).argmax(axis=1)
            if level:
                m -= rows.reshape(-1).take(base + child)  # rows[i, child[i]]: mass before the child
            node <<= _SHIFT
            node += child
        return node

    # --------------------------------------------------------------- propagation

    def _flush(self) -> None:
        """Propagate pending leaf writes to every level above the leaves."""
        if not self._stale:
            return
        with np.errstate(over="ignore"):  # a total past float64's range is inf, refused by the samplers
            self._propagate()

    def _propagate(self) -> None:
        if self._pending:
            rows = self._pending[0] if len(self._pending) == 1 else np.concatenate(self._pending)
            self._pending.clear()
            self._n_pending = 0
            # Past a quarter of the rows, one pass over everything beats gathering.
            self._rebuild_rows(None if rows.shape[0] * 4 > self._value_rows[0].shape[0] else rows)
        self._rebuild_top()
        self._stale = False

    def _rebuild_rows(self, rows: np.ndarray | None) -> None:
        """Recompute the row levels for leaf rows ``rows`` (int64, duplicates allowed), or all rows."""
        for level in range(self._depth):
            if rows is None:
                sel: Any = slice(0, self._value_rows[level].shape[0])
                children = self._value_rows[level]
            else:
                sel = rows
                children = self._value_rows[level].take(rows, axis=0)
            # accumulate is strictly sequential, so a row's sums never depend on how
            # many rows are processed together (incremental == rebuilt, bit for bit).
            running = np.add.accumulate(children, axis=1)
            self._values[level + 1][sel] = running[:, -1]
            np.copyto(running, np.inf, where=running >= running[:, -1:])
            self._prefix_rows[level][sel, 1:] = running
            if level == 0:
                mins = _row_min_positive(children)
                maxs = np.maximum.reduce(children, axis=1)
            else:
                below_min = self._min_rows[level] if rows is None else self._min_rows[level].take(rows, axis=0)
                below_max = self._max_rows[level] if rows is None else self._max_rows[level].take(rows, axis=0)
                mins = np.minimum.reduce(below_min, axis=1)
                maxs = np.maximum.reduce(below_max, axis=1)
            self._node_mins[level + 1][sel] = mins
            self._node_maxs[level + 1][sel] = maxs
            if rows is not None:
                rows = rows >> _SHIFT

    def _rebuild_top(self) -> None:
        top = self._values[self._depth]
        running = np.add.accumulate(top)
        self._total = running[-1]
        np.copyto(running, np.inf, where=running >= self._total)
        self._top_inclusive[:] = running
        if self._depth:
            self._min_positive = np.minimum.reduce(self._node_mins[self._depth])
            self._max = np.maximum.reduce(self._node_maxs[self._depth])
        else:
            self._min_positive = _row_min_positive(top[None, :])[0]
            self._max = np.maximum.reduce(top)


def _keep_last(idx: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop every occurrence of a repeated index but its last one."""
    order = idx.argsort(kind="stable")
    ordered = idx[order]
    repeated = ordered[1:] == ordered[:-1]
    if not np.count_nonzero(repeated):
        return idx, values
    # The sort is stable, so the last of each run of equal indices is the last occurrence.
    keep = order[np.append(~repeated, True)]
    return idx[keep], values[keep]


def _row_min_positive(rows: np.ndarray) -> np.ndarray:
    """Smallest positive entry of each row of a 2-D array of masses >= 0; +inf for an all-zero row."""
    # Non-negative float64 order like their bit patterns; minus one as uint64 sends
    # 0.0 to the top, so a plain integer min skips zeros (cheaper than np.where).
    low = np.minimum.reduce(rows.view(np.uint64) - np.uint64(1), axis=1) + np.uint64(1)
    mins = low.view(np.float64)
    mins[mins == 0] = np.inf  # the all-zero rows wrapped around to 0
    return mins


def _split(flat: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """Consecutive views of ``flat`` with the given lengths."""
    bounds = np.cumsum([0, *sizes]).tolist()
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
