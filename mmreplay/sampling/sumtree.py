"""``mr.SumTree``: the store's sum tree as a standalone, vectorized class.

Prioritized replay (Schaul et al. 2015) draws transition ``i`` with probability ``p_i / sum(p)``
and weights it by ``(p_i / p_min) ** -beta``. A sum tree answers both in O(log n): the total, the
smallest positive entry, and which entry's cumulative-sum interval holds a point. This one is built
for batches: a whole batch is written, searched or drawn in one call into a compiled kernel
(``mmreplay.native.sumtree``) instead of a Python loop or a dozen numpy calls.

How it is laid out (rows of 32 with running sums, a top level of at most 2048 nodes searched by
bisection, +inf tails so a point never lands on an empty entry) and why it stays exact is explained
in ``mmreplay.sampling.numpy_sumtree``, the pure-numpy implementation of the same tree. The two hold
the same float64 numbers: every node is recomputed from its children with the same additions in the
same order, never adjusted by a delta, so the total does not drift however many updates are made, and
``SumTree.from_leaves(tree.leaves())`` is bit for bit the tree it came from (a checkpoint that keeps
only the leaves resumes sampling exactly). Writes are propagated lazily, once, at the next read.

Example::

    import numpy as np
    import mmreplay as mr

    tree = mr.SumTree(1_000_000)
    tree[[0, 1, 2]] = [1.0, 3.0, 0.5]     # or tree.set(idx, p); a repeated index: the last value wins
    tree.total, tree.min, tree.max       # 4.5, 0.5 (smallest positive), 3.0
    rng = np.random.default_rng(0)
    idx = tree.stratified_sample(rng, 32)   # one draw in each of 32 equal slices of the total
    weight = (tree[idx] / tree.min) ** -0.4  # importance weights, max 1

The tree is not thread-safe: one thread at a time (reads propagate pending writes).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import numpy.typing as npt

from ..native import jit_enabled
from ..native import sumtree as k

__all__ = ["LeafIndexError", "SumTree"]


class LeafIndexError(IndexError, ValueError):
    """A leaf index outside ``[0, capacity)``. An ``IndexError`` (as for a sequence) and a
    ``ValueError`` (as earlier versions raised)."""


class SumTree:
    """Non-negative float64 masses over ``capacity`` leaves, with batched update, search and sampling.

    Parameters
    ----------
    capacity:
        Number of leaves (an int ``>= 1``); all start at 0. ``len(tree)`` is the capacity.

    Reading and writing (``idx``: an int, a 1-D array-like of ints, or a slice):

    - ``tree[idx] = p`` / ``tree.set(idx, p)``: ``p`` a finite float ``>= 0``, one per index or one
      for all. A repeated index takes its last value. ``-0.0`` is stored as ``0.0``.
    - ``tree[idx]`` / ``tree.get(idx)``: float64 (a scalar for an int index, else an array of
      ``idx``'s shape).
    - ``tree.total``, ``tree.min`` (the smallest *positive* leaf, ``inf`` when none is),
      ``tree.max`` (0.0 for an empty tree), ``tree.count_positive``: float64 / int, O(1) after the
      first read following a write.

    Drawing (``rng`` a ``numpy.random.Generator``; leaves of mass 0 are never drawn):

    - ``tree.sample(rng, n)``: ``n`` independent draws, leaf ``i`` with probability ``p_i / total``
      (with replacement). Consumes ``n`` doubles of ``rng``.
    - ``tree.stratified_sample(rng, n)``: ``[0, total)`` cut into ``n`` equal segments, one uniform
      point in each (as in Schaul et al.): lower variance; the result is in segment order
      (non-decreasing). Consumes ``n`` doubles of ``rng``.

    Errors (nothing changes when one is raised): ``TypeError`` for non-integer indices or
    non-numeric masses; ``LeafIndexError`` (an ``IndexError`` and a ``ValueError``) for an index
    outside ``[0, capacity)``; ``ValueError`` for NaN, infinite or negative masses, mismatched
    lengths, and sampling an all-zero tree. Messages name the first bad position:
    ``"values[2]: expected a finite mass >= 0, got nan"``.
    """

    __slots__ = ("_capacity", "_meta", "_nodes", "_one", "_scalars")

    def __new__(cls, *args: Any, **kwargs: Any) -> SumTree:
        # Where numba does not compile (NUMBA_DISABLE_JIT=1) the kernels would run as Python loops: the numpy
        # tree holds the same numbers (``numpy_sumtree``)
        if cls is SumTree and not jit_enabled():
            from .numpy_sumtree import NumpySumTree

            cls = NumpySumTree
        return super().__new__(cls)

    def __init__(self, capacity: int) -> None:
        self._capacity = _validate_count(capacity, "capacity")
        self._one = np.zeros(1, np.float64)  # a scalar mass handed to the kernels
        self._new_state(self._capacity)

    # -------------------------------------------------------------------------------------- state

    @property
    def capacity(self) -> int:
        """Number of leaves (int)."""
        return self._capacity

    def __len__(self) -> int:
        return self._capacity

    @property
    def total(self) -> np.float64:
        """Sum of all leaf masses (float64)."""
        return self._stats()[0]

    @property
    def min(self) -> np.float64:
        """Smallest positive leaf mass (float64): the importance-weight normaliser; ``inf`` if none."""
        return self._stats()[1]

    min_positive = min  # the name the store uses

    @property
    def max(self) -> np.float64:
        """Largest leaf mass (float64); 0.0 when every leaf is 0."""
        return self._stats()[2]

    @property
    def count_positive(self) -> int:
        """Number of leaves with a positive mass (int)."""
        return self._count()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(capacity={self._capacity}, total={float(self.total)!r}, "
                f"count_positive={self.count_positive})")

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray]]:
        return (type(self).from_leaves, (self.leaves(),))

    # ------------------------------------------------------------------------------- read, write

    def get(self, idx: npt.ArrayLike) -> Any:
        """Masses at ``idx`` (an int, or an integer array-like of any shape): float64, same shape."""
        arr = self._indices(idx, "idx", allow_nd=True)
        return self._leaf_array()[arr]

    def drawn_masses(self, leaves: np.ndarray) -> np.ndarray:
        """``get(leaves)`` without validating ``leaves`` (int64, known to be in range: leaves this tree's
        sampling returned, or ring slots of the store it serves); a new array. Every prioritized draw reads
        its batch's masses for the weights."""
        return self._leaf_array()[leaves]

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            return self._leaf_array()[: self._capacity][idx].copy()
        return self.get(idx)

    def set(self, idx: npt.ArrayLike, values: npt.ArrayLike) -> None:
        """Set the masses of leaves ``idx`` (int or 1-D) to ``values`` (one per index, or a scalar).

        A repeated index ends with its last value. Raises as the class docstring says; on error
        nothing changes.
        """
        arr = self._indices(idx, "idx")
        vals = _masses(values, "values", arr.shape[0], "index")
        bad = self._bad_set(arr, vals)
        if bad >= 0:
            i = bad // 2
            if bad % 2 == 0:
                raise LeafIndexError(
                    f"idx[{i}]: expected a leaf index in [0, {self._capacity}), got {int(arr[i])}")
            v = vals[0 if vals.shape[0] == 1 else i]
            raise ValueError(f"values[{i}]: expected a finite mass >= 0, got {float(v)!r}")
        self._write(arr, vals)

    def __setitem__(self, idx: Any, values: npt.ArrayLike) -> None:
        if isinstance(idx, slice):
            idx = np.arange(self._capacity, dtype=np.int64)[idx]
        self.set(idx, values)

    def set_distinct(self, idx: np.ndarray, values: np.ndarray | float) -> None:
        """``set`` without validation, for callers that guarantee its preconditions: ``idx`` a 1-D int64
        array of in-range indices, ``values`` finite float64 masses >= 0 (one per index, or a scalar).
        (Distinct indices are no longer required: a repeated one takes its last value.)"""
        if isinstance(values, np.ndarray) and values.ndim == 1:
            self._write(idx, values)
        else:
            self._one[0] = values
            self._write(idx, self._one)

    def set_distinct_with(self, idx: np.ndarray, values: np.ndarray, side: np.ndarray, side_values: np.ndarray,
                          flags: np.ndarray) -> None:
        """``set_distinct(idx, values)`` (same preconditions, ``values`` one per index), and in the same pass
        ``side[idx] = side_values`` (float64, one per index) and ``flags[idx] = True`` (bool): arrays of per-leaf
        state kept beside the tree (a prioritized sampler's raw priorities and changed-slot flags), at least
        ``capacity`` long."""
        self._write_with(idx, values, side, side_values, flags)

    def leaves(self) -> np.ndarray:
        """A copy of every leaf mass: float64 array of shape ``(capacity,)``."""
        return self._leaf_array()[: self._capacity].copy()

    def load_leaves(self, leaves: npt.ArrayLike) -> None:
        """Replace every leaf mass at once (1-D, ``capacity`` finite masses >= 0) and rebuild the tree in
        O(capacity); bit-identical to reaching the same leaves through ``set``. On error nothing changes."""
        if np.ndim(leaves) != 1:
            raise ValueError(
                f"leaves: expected a 1-D array of {self._capacity} masses, got shape {np.shape(leaves)}")
        arr = _masses(leaves, "leaves", self._capacity, "leaf")
        _check_masses(arr, "leaves")
        self._load(arr)

    @classmethod
    def from_leaves(cls, leaves: npt.ArrayLike) -> SumTree:
        """A new tree of capacity ``len(leaves)`` holding ``leaves`` (1-D finite masses ``>= 0``)."""
        arr = np.asarray(leaves, dtype=np.float64)
        if arr.ndim != 1 or arr.shape[0] == 0:
            raise ValueError(f"leaves: expected a non-empty 1-D array of masses, got shape {arr.shape}")
        tree = cls(arr.shape[0])
        tree.load_leaves(arr)
        return tree

    def resize(self, new_capacity: int) -> SumTree:
        """A new tree of ``new_capacity`` leaves: leaves ``[0, min(old, new))`` copied, the rest 0.
        ``self`` is unchanged."""
        new_capacity = _validate_count(new_capacity, "new_capacity")
        keep = min(self._capacity, new_capacity)
        leaves = np.zeros(new_capacity, dtype=np.float64)
        leaves[:keep] = self._leaf_array()[:keep]
        return type(self).from_leaves(leaves)

    # ------------------------------------------------------------------------------------ search

    def find(self, masses: npt.ArrayLike) -> np.ndarray:
        """Leaf holding each point of ``masses`` (floats in ``[0, total]``, any shape) in the cumulative
        sum of the leaves: int64, same shape. For ``m`` the leaf ``i`` with ``S[i-1] <= m < S[i]``
        (``S`` the cumulative sum); a point on a boundary goes to the next positive leaf, a point at the
        total to the last positive leaf: a zero-mass leaf is never returned.

        Raises ``ValueError`` for an all-zero tree or an infinite total, or naming the first point
        that is NaN or outside ``[0, total]``.
        """
        total = self._searchable_total("search")
        m = np.array(masses, dtype=np.float64)
        flat = m.reshape(-1)
        if flat.shape[0] and not (flat.min() >= 0 and flat.max() <= total):
            bad = int(np.flatnonzero(~((flat >= 0) & (flat <= total)))[0])
            raise ValueError(
                f"masses[{bad}]: expected a point in [0, total] = [0, {float(total)!r}], got {float(flat[bad])!r}")
        return self._descend(flat).reshape(m.shape)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` leaves drawn independently with probability proportional to their mass (with
        replacement): int64, shape ``(n,)``. Point i is ``rng.random(n)[i] * total``."""
        u = self._uniform(rng, n)
        return self._proportional(u)

    def stratified_sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` leaves drawn proportionally to their mass, stratified: point i is
        ``(i + rng.random(n)[i]) * total / n``. int64, shape ``(n,)``, non-decreasing."""
        u = self._uniform(rng, n)
        return self._stratified(u)

    sample_stratified = stratified_sample  # the name the store uses

    def stratified_sample_normalised(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``stratified_sample(rng, n)`` (same leaves, same use of ``rng``) and each drawn leaf's mass divided
        by ``min_positive`` (float64, >= 1): what importance weights are computed from, in the same pass."""
        u = self._uniform(rng, n)
        return self._stratified_normalised(u)

    def _uniform(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
        n = _validate_count(n, "n")
        self._searchable_total("sample")
        return rng.random(n)

    def _searchable_total(self, what: str) -> np.float64:
        total = self.total
        if total == 0:
            raise ValueError(f"cannot {what}: every leaf mass is 0 (total == 0)")
        if total == np.inf:
            raise ValueError(f"cannot {what}: the total mass overflows float64 (expected a finite total, got"
                             " inf); scale the masses down")
        return total

    # ---------------------------------------------------------- the implementation (native kernels)
    # NumpySumTree (numpy_sumtree.py) overrides these with numpy; the tests compare the two.

    def _new_state(self, capacity: int) -> None:
        self._meta, self._nodes = k.new_state(capacity)
        self._scalars = int(self._meta[k.I_SCALARS])

    def _stats(self) -> tuple[np.float64, np.float64, np.float64]:
        nodes = self._nodes
        if self._meta[k.I_STALE]:
            k.tree_flush(self._meta, nodes)
        s = self._scalars
        return nodes[s], nodes[s + 1], nodes[s + 2]

    def _count(self) -> int:
        return int(self._meta[k.I_COUNT])

    def _leaf_array(self) -> np.ndarray:
        return self._nodes  # leaves first; indices are validated against the capacity

    def _bad_set(self, idx: np.ndarray, vals: np.ndarray) -> int:
        return int(k.check_set(self._meta, idx, vals))

    def _write(self, idx: np.ndarray, vals: np.ndarray) -> None:
        k.tree_set(self._meta, self._nodes, idx, vals)

    def _write_with(self, idx: np.ndarray, vals: np.ndarray, side: np.ndarray, side_vals: np.ndarray,
                    flags: np.ndarray) -> None:
        k.tree_set_with(self._meta, self._nodes, idx, vals, side, side_vals, flags)

    def _load(self, leaves: np.ndarray) -> None:
        k.tree_load(self._meta, self._nodes, leaves)

    def _descend(self, points: np.ndarray) -> np.ndarray:
        out = np.empty(points.shape[0], np.int64)
        k.tree_find(self._meta, self._nodes, points, out)
        return out

    def _stratified(self, u: np.ndarray) -> np.ndarray:
        out = np.empty(u.shape[0], np.int64)
        k.tree_stratified(self._meta, self._nodes, u, out)
        return out

    def _stratified_normalised(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = np.empty(u.shape[0], np.int64)
        ratio = np.empty(u.shape[0], np.float64)
        k.tree_stratified_normalised(self._meta, self._nodes, u, out, ratio)
        return out, ratio

    def _proportional(self, u: np.ndarray) -> np.ndarray:
        out = np.empty(u.shape[0], np.int64)
        k.tree_proportional(self._meta, self._nodes, u, out)
        return out

    # ---------------------------------------------------------------------------------- validation

    def _indices(self, idx: Any, name: str, allow_nd: bool = False) -> np.ndarray:
        """``idx`` as an int64 array (1-D unless ``allow_nd``; an int gives a 0-d array with
        ``allow_nd``, else one element), every entry in ``[0, capacity)``."""
        if isinstance(idx, (bool, np.bool_)):
            raise TypeError(f"{name}: expected integer leaf indices, got {idx!r}")
        arr = np.asarray(idx)
        if arr.dtype.kind not in "iu":
            if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float64
                arr = arr.astype(np.int64)
            else:
                raise TypeError(f"{name}: expected integer leaf indices, got dtype {arr.dtype}")
        if not allow_nd:
            if arr.ndim > 1:
                raise ValueError(f"{name}: expected an int or a 1-D array of ints, got shape {arr.shape}")
            arr = arr.reshape(-1)
        if arr.size == 0:
            return arr.astype(np.int64, copy=False)
        cap = self._capacity
        if arr.dtype == np.int64:
            # negative int64 read as uint64 are >= 2**63: one comparison checks both ends
            bad = bool(np.count_nonzero(arr.view(np.uint64) >= cap))
        else:
            bad = bool(arr.min() < 0 or arr.max() >= cap)
        if bad:
            flat = arr.reshape(-1)
            pos = int(np.flatnonzero((flat < 0) | (flat >= cap))[0])
            where = f"{name}[{pos}]" if arr.ndim else name
            raise LeafIndexError(f"{where}: expected a leaf index in [0, {cap}), got {flat[pos]}")
        return arr.astype(np.int64, copy=False)


# ------------------------------------------------------------------------------------- validation


def _validate_count(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an integer >= 1, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer >= 1, got {type(value).__name__}") from None
    if value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value}")
    return int(value)


def _masses(values: Any, name: str, length: int, length_of: str) -> np.ndarray:
    """``values`` as a 1-D float64 array of ``length`` entries, or of one entry for a scalar (not yet
    checked for NaN or sign: the kernels do that in the same pass as the indices)."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected float masses, got {type(values).__name__}") from None
    if arr.ndim == 0:
        return arr.reshape(1)
    if arr.ndim != 1 or arr.shape[0] != length:
        raise ValueError(
            f"{name}: expected {length} masses (one per {length_of}) or a scalar, got shape {arr.shape}")
    return arr


def _check_masses(arr: np.ndarray, name: str) -> None:
    ok = (arr >= 0) & (arr < np.inf)  # False for NaN; True for -0.0 (stored as 0.0)
    if not ok.all():
        pos = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"{name}[{pos}]: expected a finite mass >= 0, got {float(arr[pos])!r}")
