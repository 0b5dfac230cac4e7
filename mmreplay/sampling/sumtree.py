"""Sum tree over float64 leaf masses, for prioritized replay (Schaul et al. 2015).

The tree answers three questions about ``capacity`` non-negative masses
(a transition's priority ``p ** alpha``; 0 for slots that cannot be sampled):
their ``total``, the smallest *positive* mass (``min_positive``, the
importance-weight normaliser), and, for a batch of points ``m`` in
``[0, total)``, which leaf's cumulative-sum interval holds each point
(``find``, and ``sample_stratified`` on top of it).

Layout, and why it is not a binary heap
---------------------------------------
For a batch of 32 the cost is the number of numpy calls, not the elements:
about 1 us per call on the development machine, 3-6 us for a reduction or a
running sum along an axis. A binary heap over 2**20 leaves has 20 levels at
about 5 calls each; measured there: 70-140 us per ``find`` of 32 and
120-220 us per ``set`` of 32. So this tree is wide and shallow:

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
array (``_mins``, ``+inf`` for a subtree without a positive leaf).

Exactness. A node is always recomputed from its children, never adjusted by
a delta, and every running sum is strictly sequential (``np.add.accumulate``)
so its result does not depend on how many rows are processed together. The
tree is therefore the same deterministic function of the current leaves
however it got there: ``total`` stays within ~1e-13 relative of an exact sum
after any number of updates, and ``from_leaves(tree.leaves())`` is bit for
bit the same tree, so a checkpoint that stores only the leaves resumes
sampling exactly.

Lazy propagation. ``set`` writes the leaves and records which rows changed;
rows and levels above them are recomputed at the next ``total``,
``min_positive``, ``find`` or ``sample_stratified`` (or once 4096 leaf
writes are pending). The ``set`` calls between two sampled batches thus
share one propagation, and a ``set`` of one leaf costs a few microseconds.
The tree is not thread-safe.

The cumulative sums ``find`` works with are those of this hierarchy: the
top running sum to the leaf's ancestor, then each row's running sum on the
way down, subtracted from the point level by level. For masses that add up
exactly in float64 (small integers, say) they are the exact cumulative sums;
otherwise they differ from ``np.cumsum(leaves)`` by rounding only.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["SumTree"]

_SHIFT = 5
_FANOUT = 1 << _SHIFT  # leaves (or nodes) per row
_TOP_MAX = 2048  # the widest level kept as a single running sum
_FLUSH_PENDING = 4096  # pending leaf writes that force a propagation
# Bit patterns of finite, non-negative float64 values (read as uint64) are exactly
# those below the pattern of +inf: negative numbers carry the sign bit, inf/NaN the
# all-ones exponent. One comparison then validates a whole batch.
_INF_BITS = np.uint64(0x7FF0000000000000)


class SumTree:
    """Masses over ``capacity`` leaves with batched update, search and stratified sampling.

    Parameters
    ----------
    capacity:
        Number of leaves, ``>= 1``. All masses start at 0.

    Leaves hold float64 masses ``>= 0``. Leaf indices returned by ``find`` and
    ``sample_stratified`` are int64 and always name a leaf of positive mass.
    See the module docstring for the layout and its exactness guarantees.

    Raises
    ------
    TypeError
        ``capacity`` is not an integer.
    ValueError
        ``capacity < 1``.
    """

    __slots__ = (
        "_capacity",
        "_depth",
        "_sums",
        "_mins",
        "_values",
        "_value_rows",
        "_prefix_rows",
        "_node_mins",
        "_min_rows",
        "_top_prefix",
        "_top_inclusive",
        "_total",
        "_min_positive",
        "_count",
        "_pending",
        "_n_pending",
        "_stale",
    )

    def __init__(self, capacity: int) -> None:
        capacity = _validate_capacity(capacity, "capacity")
        self._capacity = capacity

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

        # Minimum positive leaf below each node of levels 1..depth (index 0 unused).
        self._mins = np.full(sum(padded[1:]), np.inf, dtype=np.float64)
        self._node_mins = [np.empty(0)] + _split(self._mins, padded[1:])
        self._min_rows = [np.empty((0, _FANOUT))] + [m.reshape(-1, _FANOUT) for m in self._node_mins[1:depth]]

        self._total = np.float64(0.0)
        self._min_positive = np.float64(np.inf)
        self._count = 0
        self._pending: list[np.ndarray] = []  # leaf-row ids written since the last propagation
        self._n_pending = 0
        self._stale = False

    # ------------------------------------------------------------------ reads

    @property
    def capacity(self) -> int:
        """Number of leaves (int)."""
        return self._capacity

    @property
    def total(self) -> np.float64:
        """Sum of all leaf masses (float64; the root of the tree)."""
        self._flush()
        return self._total

    @property
    def min_positive(self) -> np.float64:
        """Smallest positive leaf mass (float64); ``+inf`` when no leaf is positive."""
        self._flush()
        return self._min_positive

    @property
    def count_positive(self) -> int:
        """Number of leaves with a positive mass (int)."""
        return self._count

    def get(self, idx: npt.ArrayLike) -> np.ndarray:
        """Leaf masses at ``idx`` (any integer array-like): float64 array of ``idx``'s shape.

        Raises ``TypeError`` for a non-integer ``idx`` and ``ValueError`` naming
        the first index outside ``[0, capacity)``.
        """
        idx = _validate_indices(idx, self._capacity, "idx", allow_nd=True)
        return self._values[0][idx]

    def leaves(self) -> np.ndarray:
        """A copy of every leaf mass: float64 array of shape ``(capacity,)``."""
        return self._values[0][: self._capacity].copy()

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray]]:
        # The levels are views into shared buffers; copying them one by one (as
        # copy/pickle would) would cut the links, so rebuild from the leaves.
        return (type(self).from_leaves, (self.leaves(),))

    def __repr__(self) -> str:
        return (
            f"SumTree(capacity={self._capacity}, total={float(self.total)!r}, count_positive={self._count})"
        )

    # ----------------------------------------------------------------- update

    def set(self, idx: npt.ArrayLike, values: npt.ArrayLike) -> None:
        """Set the masses of leaves ``idx`` to ``values``.

        ``idx``: integer scalar or 1-D array, each in ``[0, capacity)``.
        ``values``: finite float64-convertible masses ``>= 0``, either one per
        index (same length) or a scalar applied to every index. When an index
        occurs more than once in ``idx``, the value of its **last occurrence
        wins**. ``-0.0`` is stored as ``0.0``.

        Raises ``TypeError`` for a non-integer ``idx``; ``ValueError`` (naming
        the first bad position) for an index out of range, a NaN, infinite or
        negative value, or lengths that differ. On error nothing changes.
        """
        idx = _validate_indices(idx, self._capacity, "idx")
        values = _validate_masses(values, "values", length=idx.shape[0], length_of="idx")
        if idx.shape[0] == 0:
            return
        if idx.shape[0] > 1:
            idx, values = _keep_last(idx, values)
        self.set_distinct(idx, values)

    def set_distinct(self, idx: np.ndarray, values: np.ndarray | float) -> None:
        """``set`` without validation, for callers that already guarantee its preconditions:
        ``idx`` a 1-D int64 array of distinct in-range indices (owned by the tree afterwards),
        ``values`` finite float64 masses >= 0 (one per index, or a scalar)."""
        if np.ndim(values) == 0:
            values = np.full(idx.shape[0], values, np.float64)
        leaves = self._values[0]
        self._count += int(np.count_nonzero(values)) - int(np.count_nonzero(leaves[idx]))
        leaves[idx] = values
        self._stale = True
        if self._depth:
            self._pending.append(idx >> _SHIFT)  # a new array: the caller may reuse idx
            self._n_pending += idx.shape[0]
            if self._n_pending >= _FLUSH_PENDING:
                self._flush()

    def load_leaves(self, leaves: npt.ArrayLike) -> None:
        """Replace every leaf mass at once and rebuild the tree in O(capacity).

        ``leaves``: 1-D, length ``capacity``, finite masses ``>= 0``. Raises
        ``ValueError`` (naming the first bad position) otherwise; on error
        nothing changes. The result is bit-identical to reaching the same
        leaves through ``set`` calls.
        """
        if np.ndim(leaves) != 1:
            raise ValueError(
                f"leaves: expected a 1-D array of {self._capacity} masses, got shape {np.shape(leaves)}"
            )
        arr = _validate_masses(leaves, "leaves", length=self._capacity, length_of="leaf")
        self._values[0][: self._capacity] = arr
        self._count = int(np.count_nonzero(arr))
        self._pending.clear()
        self._n_pending = 0
        self._rebuild_rows(None)
        self._rebuild_top()
        self._stale = False

    @classmethod
    def from_leaves(cls, leaves: npt.ArrayLike) -> SumTree:
        """A new tree of capacity ``len(leaves)`` holding ``leaves`` (1-D finite masses ``>= 0``).

        Raises ``ValueError`` for an empty, non-1-D or invalid array (naming
        the first bad position).
        """
        arr = np.asarray(leaves, dtype=np.float64)
        if arr.ndim != 1 or arr.shape[0] == 0:
            raise ValueError(f"leaves: expected a non-empty 1-D array of masses, got shape {arr.shape}")
        tree = cls(arr.shape[0])
        tree.load_leaves(arr)
        return tree

    def resize(self, new_capacity: int) -> SumTree:
        """A new tree of ``new_capacity`` leaves: leaves ``[0, min(old, new))`` are copied, the rest are 0.

        ``self`` is unchanged. Raises like the constructor.
        """
        new_capacity = _validate_capacity(new_capacity, "new_capacity")
        keep = min(self._capacity, new_capacity)
        leaves = np.zeros(new_capacity, dtype=np.float64)
        leaves[:keep] = self._values[0][:keep]
        return type(self).from_leaves(leaves)

    # ----------------------------------------------------------------- search

    def find(self, masses: npt.ArrayLike) -> np.ndarray:
        """Leaf holding each point of ``masses`` in the cumulative sum of the leaf masses.

        ``masses``: float array-like of any shape, each in ``[0, total]``.
        Returns an int64 array of the same shape: for each ``m`` the leaf ``i``
        with ``S[i-1] <= m < S[i]`` (``S`` the cumulative sum, ``S[-1] = 0``).
        A point exactly on a boundary goes to the next positive leaf; a point
        at (or, by rounding, past) the total goes to the last positive leaf.
        A zero-mass leaf is never returned.

        Raises ``ValueError`` when every mass is 0, or naming the first point
        that is NaN or outside ``[0, total]``.
        """
        total = self.total
        m = np.array(masses, dtype=np.float64)  # a private copy: the descent subtracts in place
        if total == 0:
            raise ValueError("cannot search an empty tree: every leaf mass is 0 (total == 0)")
        flat = m.reshape(-1)
        if flat.shape[0] and not (flat.min() >= 0 and flat.max() <= total):
            bad = int(np.flatnonzero(~((flat >= 0) & (flat <= total)))[0])
            raise ValueError(
                f"masses[{bad}] = {float(flat[bad])!r}: expected a point in [0, total] = [0, {float(total)!r}]"
            )
        return self._descend(flat).reshape(m.shape)

    def sample_stratified(self, rng: np.random.Generator, batch_size: int) -> np.ndarray:
        """Draw ``batch_size`` leaves with probability proportional to their mass, stratified.

        ``[0, total)`` is cut into ``batch_size`` equal segments and one
        uniform point is drawn in each, from a single ``rng.random(batch_size)``
        call (so exactly ``batch_size`` doubles of the generator are consumed).
        Returns int64 leaf indices of shape ``(batch_size,)``, in segment
        order (hence non-decreasing). Sampling is with replacement.

        Raises ``TypeError`` if ``rng`` is not a ``numpy.random.Generator`` or
        ``batch_size`` not an integer; ``ValueError`` if ``batch_size < 1`` or
        every mass is 0.
        """
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
        batch_size = _validate_capacity(batch_size, "batch_size")
        total = self.total
        if total == 0:
            raise ValueError("cannot sample: every leaf mass is 0 (total == 0)")
        points = np.arange(batch_size, dtype=np.float64)
        points += rng.random(batch_size)
        points *= total / batch_size
        # A point that rounds up to `total` is fine: the +inf tails send it to the
        # last positive leaf.
        return self._descend(points)

    # --------------------------------------------------------------- internal

    def _descend(self, m: np.ndarray) -> np.ndarray:
        """Leaf index (int64) per point of the 1-D float64 ``m`` (consumed: modified in place)."""
        self._flush()
        # Top level: top node i covers [prefix[i], prefix[i+1]); the inclusive sums
        # are +inf from the first that reaches the total, so i is always a positive node.
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

    def _flush(self) -> None:
        """Propagate pending leaf writes to every level above the leaves."""
        if not self._stale:
            return
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
            elif rows is None:
                mins = np.minimum.reduce(self._min_rows[level], axis=1)
            else:
                mins = np.minimum.reduce(self._min_rows[level].take(rows, axis=0), axis=1)
            self._node_mins[level + 1][sel] = mins
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
        else:
            self._min_positive = _row_min_positive(top[None, :])[0]


# ---------------------------------------------------------------- validation


def _validate_capacity(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from None
    if value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value}")
    return value


def _validate_indices(idx: Any, capacity: int, name: str, allow_nd: bool = False) -> np.ndarray:
    """``idx`` as an int64 array (1-D unless ``allow_nd``), every entry in ``[0, capacity)``."""
    arr = np.asarray(idx)
    if arr.dtype.kind not in "iu":
        if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float64
            arr = arr.astype(np.int64)
        else:
            raise TypeError(f"{name}: expected integer leaf indices, got dtype {arr.dtype}")
    if not allow_nd:
        if arr.ndim > 1:
            raise ValueError(f"{name}: expected a scalar or 1-D array, got shape {arr.shape}")
        arr = arr.reshape(-1)
    if arr.size == 0:
        return arr.astype(np.int64, copy=False)
    if arr.dtype == np.int64:
        # Negative int64 read as uint64 are >= 2**63, so one comparison checks both ends.
        bad = np.count_nonzero(arr.view(np.uint64) >= capacity)
    else:
        bad = arr.min() < 0 or arr.max() >= capacity
    if bad:
        flat = arr.reshape(-1)
        pos = int(np.flatnonzero((flat < 0) | (flat >= capacity))[0])
        raise ValueError(f"{name}[{pos}] = {flat[pos]}: expected 0 <= {name} < capacity = {capacity}")
    return arr.astype(np.int64, copy=False)


def _validate_masses(values: Any, name: str, length: int, length_of: str) -> np.ndarray:
    """``values`` as a new 1-D float64 array of ``length`` finite masses >= 0 (a scalar is broadcast)."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected float masses, got {type(values).__name__}") from None
    if arr.ndim == 0:
        arr = np.full(length, arr)
    elif arr.ndim != 1 or arr.shape[0] != length:
        raise ValueError(
            f"{name}: expected {length} masses (one per {length_of}) or a scalar, got shape {arr.shape}"
        )
    # + 0.0 turns -0.0 into 0.0 and gives a private copy.
    arr = arr + 0.0
    if np.count_nonzero(arr.view(np.uint64) >= _INF_BITS):
        pos = int(np.flatnonzero(~((arr >= 0) & (arr < np.inf)))[0])
        raise ValueError(f"{name}[{pos}] = {float(arr[pos])!r}: expected a finite mass >= 0")
    return arr


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
