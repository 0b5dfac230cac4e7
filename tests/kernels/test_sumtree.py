"""Tests of mmreplay.sampling.sumtree.SumTree, through its public API only.

The oracle is plain numpy on the leaf array: with small-integer masses every
cumulative sum is exact in float64, so the expected leaf of a point is
``searchsorted(cumsum, m, side="right")`` clamped to the last positive leaf.

Capacities 3000 and 100_003 matter: the tree switches layout above 2048
leaves (one row level below the top at 3000, two at 100_003, which is also
prime), so those capacities exercise the row descent and its propagation.
"""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from mmreplay.sampling.numpy_sumtree import NumpySumTree
from mmreplay.sampling.sumtree import LeafIndexError, SumTree

CAPACITIES = [1, 7, 50, 1024, 3000, 100_003]
TREES = pytest.mark.parametrize("Tree", [SumTree, NumpySumTree], ids=["native", "numpy"])

# 0.999 quantile of the chi-square distribution with 39 degrees of freedom
# (40 positive leaves). Computed offline by bisection on the regularized lower
# incomplete gamma function P(39/2, x/2) (series expansion); the same code gives
# the textbook 10.828 for 1 and 29.588 for 10 degrees of freedom.
CHI2_39_Q999 = 72.0547


# ----------------------------------------------------------------- helpers


def expected_leaf(leaves: np.ndarray, masses: np.ndarray) -> np.ndarray:
    """Oracle for find(): exact when the masses are small integers."""
    cumsum = np.cumsum(leaves)
    found = np.searchsorted(cumsum, masses, side="right")
    return np.minimum(found, np.flatnonzero(leaves)[-1])


def snapshot(tree: SumTree) -> dict:
    probes = np.linspace(0.0, float(tree.total), 97) if tree.total > 0 else None
    return {
        "leaves": tree.leaves(),
        "total": tree.total,
        "min_positive": tree.min_positive,
        "count": tree.count_positive,
        "found": None if probes is None else tree.find(probes),
    }


def assert_same_tree(a: SumTree, b: SumTree) -> None:
    """Bit-for-bit the same observable tree: leaves, root, minimum, count and searches."""
    sa, sb = snapshot(a), snapshot(b)
    np.testing.assert_array_equal(sa["leaves"], sb["leaves"])
    assert sa["total"] == sb["total"]
    assert sa["min_positive"] == sb["min_positive"]
    assert sa["count"] == sb["count"]
    if sa["found"] is not None:
        np.testing.assert_array_equal(sa["found"], sb["found"])


def assert_matches_leaves(tree: SumTree, leaves: np.ndarray) -> None:
    np.testing.assert_array_equal(tree.leaves(), leaves)
    positive = leaves[leaves > 0]
    assert tree.count_positive == positive.size
    assert tree.min_positive == (positive.min() if positive.size else np.inf)
    assert math.isclose(tree.total, math.fsum(leaves), rel_tol=1e-12, abs_tol=0.0)


# ------------------------------------------------------------- basic state


@TREES
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_new_tree_is_empty(capacity, Tree):
    tree = Tree(capacity)
    assert tree.capacity == capacity
    assert tree.total == 0.0
    assert tree.min_positive == np.inf
    assert tree.count_positive == 0
    leaves = tree.leaves()
    assert leaves.dtype == np.float64 and leaves.shape == (capacity,)
    assert not leaves.any()
    with pytest.raises(ValueError, match="total == 0"):
        tree.sample_stratified(np.random.default_rng(0), 4)
    with pytest.raises(ValueError, match="total == 0"):
        tree.find([0.0])


@TREES
def test_get_and_leaves_return_float64_copies(Tree):
    tree = Tree(10)
    tree.set([2, 5], [1.5, 2.5])
    got = tree.get([[2, 5], [5, 0]])
    assert got.dtype == np.float64 and got.shape == (2, 2)
    np.testing.assert_array_equal(got, [[1.5, 2.5], [2.5, 0.0]])
    got[:] = 99.0
    leaves = tree.leaves()
    leaves[:] = 99.0
    assert tree.get(2) == 1.5 and tree.total == 4.0


@TREES
def test_negative_zero_is_stored_as_zero(Tree):
    tree = Tree(4)
    tree.set([1, 2], [-0.0, 3.0])
    assert not np.signbit(tree.get(1))
    assert tree.count_positive == 1 and tree.min_positive == 3.0


# ------------------------------------------------- batched update == scalar


@st.composite
def update_batches(draw):
    capacity = draw(st.sampled_from(CAPACITIES))
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(1, 64))
    idx = draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n))
    values = draw(
        st.lists(
            st.one_of(st.just(0.0), st.floats(1e-300, 1e300), st.floats(0.0, 10.0)), min_size=n, max_size=n
        )
    )
    return capacity, seed, np.array(idx, dtype=np.int64), np.array(values)


@TREES
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=update_batches())
def test_batched_set_equals_sequence_of_scalar_sets(case, Tree):
    capacity, seed, idx, values = case
    # A starting state with zeros and positives, so updates also flip leaves.
    start = np.random.default_rng(seed).random(capacity) * 100
    start[start < 30] = 0.0
    expected = start.copy()
    for i, v in zip(idx, values, strict=True):
        expected[i] = v

    batched = Tree.from_leaves(start)
    batched.set(idx, values)

    scalar = Tree.from_leaves(start)
    for i, v in zip(idx, values, strict=True):
        scalar.set(int(i), float(v))
        _ = scalar.total  # propagate after every single update

    assert_matches_leaves(batched, expected)
    assert_same_tree(batched, scalar)
    assert_same_tree(batched, Tree.from_leaves(expected))


@TREES
@pytest.mark.parametrize("capacity", [7, 3000, 100_003])
def test_duplicate_indices_last_occurrence_wins(capacity, Tree):
    tree = Tree(capacity)
    last = capacity - 1
    tree.set([3, 5, 3, last, 3, last], [1.0, 2.0, 7.0, 9.0, 4.0, 0.0])
    assert tree.get(3) == 4.0 and tree.get(5) == 2.0 and tree.get(last) == 0.0
    assert tree.count_positive == 2
    assert tree.total == 6.0
    # A positive that comes back to zero, then positive again, in one call.
    tree.set([5, 5, 3, 3], [0.0, 8.0, 2.0, 0.0])
    assert tree.get(5) == 8.0 and tree.get(3) == 0.0
    assert tree.count_positive == 1 and tree.total == 8.0 and tree.min_positive == 8.0


@TREES
def test_set_keeps_no_reference_to_caller_arrays(Tree):
    # Propagation is deferred to the next read; reusing the caller's buffers in
    # between must not change what was written.
    tree = Tree(100_003)
    idx = np.array([10, 50_000, 100_002], dtype=np.int64)
    values = np.array([1.0, 2.0, 3.0])
    tree.set(idx, values)
    idx[:] = 0
    values[:] = 100.0
    np.testing.assert_array_equal(tree.get([10, 50_000, 100_002]), [1.0, 2.0, 3.0])
    assert tree.total == 6.0
    np.testing.assert_array_equal(tree.find([0.5, 1.5, 3.5]), [10, 50_000, 100_002])


@TREES
def test_scalar_value_applies_to_every_index(Tree):
    tree = Tree(3000)
    tree.set([1, 2000, 2999], 2.5)
    np.testing.assert_array_equal(tree.get([1, 2000, 2999]), [2.5, 2.5, 2.5])
    assert tree.total == 7.5 and tree.count_positive == 3


# ------------------------------------------------------------------- find


# Masses [0, 1, 0, 2, 3, 0] placed at six positions: cumulative sums 0, 1, 1, 3, 6, 6.
FIND_CASES = [  # (point, position of the expected leaf in the pattern)
    (0.0, 1),  # leaf 0 has no mass: a point at 0 goes to the first positive leaf
    (0.5, 1),
    (1.0, 3),  # boundary: goes to the next positive leaf, skipping the zero leaf 2
    (2.999, 3),
    (3.0, 4),
    (5.999, 4),
    (6.0, 4),  # the total itself: last positive leaf, not the zero leaf 5
]
LAYOUTS = [
    (6, [0, 1, 2, 3, 4, 5]),
    (3000, [0, 31, 32, 33, 2047, 2999]),  # across row boundaries of 32
    (100_003, [5, 1023, 1024, 32_768, 65_535, 100_002]),  # across level-2 nodes too
]


@TREES
@pytest.mark.parametrize("capacity, positions", LAYOUTS)
def test_find_hand_computed(capacity, positions, Tree):
    tree = Tree(capacity)
    tree.set(positions, [0.0, 1.0, 0.0, 2.0, 3.0, 0.0])
    assert tree.total == 6.0
    points = np.array([p for p, _ in FIND_CASES])
    expected = np.array([positions[k] for _, k in FIND_CASES])
    np.testing.assert_array_equal(tree.find(points), expected)
    # Any shape in, the same shape out.
    assert tree.find(points.reshape(7, 1)).shape == (7, 1)
    assert tree.find(points).dtype == np.int64


@TREES
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.sampled_from(CAPACITIES),
    seed=st.integers(0, 2**32 - 1),
    zero_fraction=st.sampled_from([0.0, 0.5, 0.95]),
)
def test_find_matches_exact_cumsum_oracle(capacity, seed, zero_fraction, Tree):
    rng = np.random.default_rng(seed)
    leaves = rng.integers(1, 8, capacity).astype(np.float64)
    leaves[rng.random(capacity) < zero_fraction] = 0.0
    if not leaves.any():
        leaves[rng.integers(capacity)] = 3.0
    tree = Tree(capacity)
    tree.set(np.arange(capacity), leaves)
    total = float(leaves.sum())
    cumsum = np.cumsum(leaves)
    # Every boundary (exact integers), the points just below them, random points.
    points = np.concatenate([[0.0], cumsum[:2000], np.nextafter(cumsum[:2000], 0), rng.random(500) * total])
    found = tree.find(points)
    np.testing.assert_array_equal(found, expected_leaf(leaves, points))
    assert (leaves[found] > 0).all()


# ------------------------------------------------------ stratified sampling


@TREES
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("capacity, a, b", [(3, 0, 2), (100_003, 70, 99_000)])
def test_sample_stratified_hand_computed(seed, capacity, a, b, Tree):
    # Masses 1 at a and 3 at b, total 4, four segments of width 1: whatever the
    # uniform draws, segment 0 lies in leaf a and segments 1-3 in leaf b.
    tree = Tree(capacity)
    tree.set([a, b], [1.0, 3.0])
    got = tree.sample_stratified(np.random.default_rng(seed), 4)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [a, b, b, b])


@TREES
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_sample_stratified_points_and_rng_consumption(capacity, Tree):
    rng = np.random.default_rng(capacity)
    leaves = rng.integers(0, 5, capacity).astype(np.float64)
    leaves[-1] = 2.0
    tree = Tree.from_leaves(leaves)
    batch = 37
    sampler, twin = np.random.default_rng(123), np.random.default_rng(123)
    got = tree.sample_stratified(sampler, batch)
    points = (np.arange(batch) + twin.random(batch)) * (leaves.sum() / batch)
    np.testing.assert_array_equal(got, expected_leaf(leaves, points))
    assert (leaves[got] > 0).all()
    assert (np.diff(got) >= 0).all()  # segments are in order
    # Exactly `batch` doubles were consumed.
    assert sampler.random() == twin.random()


@TREES
@pytest.mark.parametrize("layout", ["dense-50", "sparse-100003"])
def test_sample_stratified_frequencies_chi_square(layout, Tree):
    rng = np.random.default_rng(2024)
    if layout == "dense-50":
        capacity, positions = 50, np.sort(rng.choice(50, size=40, replace=False))
    else:
        capacity, positions = 100_003, np.sort(rng.choice(100_003, size=40, replace=False))
    masses = rng.gamma(2.0, size=40) + 0.05  # spread over two orders of magnitude
    tree = Tree(capacity)
    tree.set(positions, masses)

    draws = [tree.sample_stratified(rng, 2000) for _ in range(100)]
    counts = np.bincount(np.concatenate(draws), minlength=capacity)
    n = counts.sum()
    assert n == 200_000
    zero = np.ones(capacity, dtype=bool)
    zero[positions] = False
    assert counts[zero].sum() == 0  # zero-mass leaves are never drawn

    expected = n * masses / masses.sum()
    assert expected.min() >= 5  # the chi-square approximation holds
    statistic = float((((counts[positions] - expected) ** 2) / expected).sum())
    assert statistic < CHI2_39_Q999
    # ...and the threshold can reject: swapping two masses' roles is detected.
    swapped = expected.copy()
    lo, hi = int(np.argmin(masses)), int(np.argmax(masses))
    swapped[[lo, hi]] = swapped[[hi, lo]]
    assert float((((counts[positions] - swapped) ** 2) / swapped).sum()) > CHI2_39_Q999


# --------------------------------------------------------------- exactness


@TREES
def test_root_stays_exact_after_a_million_updates(Tree):
    capacity = 100_003
    rng = np.random.default_rng(7)
    tree = Tree(capacity)
    leaves = np.zeros(capacity)
    for batch in range(500):  # 500 batches of 2000: 10**6 updates
        idx = rng.integers(0, capacity, 2000)
        values = 10.0 ** rng.uniform(-8, 8, 2000)
        values[rng.random(2000) < 0.1] = 0.0
        tree.set(idx, values)
        _, last = np.unique(idx[::-1], return_index=True)  # last occurrence wins
        leaves[np.unique(idx)] = values[::-1][last]
        if batch % 7 == 0:  # sometimes read in between, sometimes let writes pile up
            _ = tree.total
    exact = math.fsum(leaves)
    assert math.isclose(tree.total, exact, rel_tol=1e-9)
    assert abs(tree.total - exact) <= 1e-12 * exact  # in fact much tighter
    assert_matches_leaves(tree, leaves)
    assert_same_tree(tree, Tree.from_leaves(leaves))


@TREES
@pytest.mark.parametrize("capacity", [50, 100_003])
def test_no_residue_after_a_huge_mass_is_removed(capacity, Tree):
    # A tree that adds deltas would keep rounding garbage of 1e20 forever.
    tree = Tree(capacity)
    tree.set([0, 1, capacity - 1], [0.1, 0.2, 0.3])
    tree.set(1, 1e20)
    assert tree.total == pytest.approx(1e20)
    tree.set(1, 0.2)
    assert tree.total == Tree.from_leaves(tree.leaves()).total
    assert math.isclose(tree.total, 0.6, rel_tol=1e-15)


@TREES
@pytest.mark.parametrize("capacity", [5, 3000, 100_003])
def test_min_positive_ignores_zeros(capacity, Tree):
    tree = Tree(capacity)
    last = capacity - 1
    tree.set([0, 1, 3, last], [0.0, 5.0, 2.0, 0.0])
    assert tree.min_positive == 2.0 and tree.count_positive == 2
    tree.set(3, 0.0)
    assert tree.min_positive == 5.0 and tree.count_positive == 1
    tree.set(last, 1e-300)
    assert tree.min_positive == 1e-300
    tree.set([1, last], 0.0)
    assert tree.min_positive == np.inf and tree.count_positive == 0 and tree.total == 0.0


# -------------------------------------------------------------- validation


BAD_SETS = [  # (idx, values, exception, fragment of the message)
    ([0, 1, 2, 3], [1.0, 1.0, np.nan, 1.0], ValueError, r"values\[2\]"),
    ([0, 1, 2], [1.0, np.inf, 1.0], ValueError, r"values\[1\]"),
    ([0, 1], [1.0, -np.inf], ValueError, r"values\[1\]"),
    ([0, 1, 2, 3], [1.0, 1.0, 1.0, -0.5], ValueError, r"values\[3\]"),
    ([0, "capacity", 4], [1.0, 1.0, 1.0], ValueError, r"idx\[1\]"),
    ([-1, 2], [1.0, 1.0], ValueError, r"idx\[0\]"),
    (np.array([4, -7], dtype=np.int32), [1.0, 1.0], ValueError, r"idx\[1\]"),
    (np.array([1, 2**63 + 5], dtype=np.uint64), [1.0, 1.0], ValueError, r"idx\[1\]"),
    ([0, 1, 2], [1.0, 1.0], ValueError, r"expected 3 masses"),
    ([[0, 1]], [1.0, 1.0], ValueError, r"1-D"),
    ([0.0, 1.0], [1.0, 1.0], TypeError, r"integer"),
    ([True, False], [1.0, 1.0], TypeError, r"integer"),
]


@TREES
@pytest.mark.parametrize("idx, values, exc, fragment", BAD_SETS)
@pytest.mark.parametrize("capacity", [2048, 3000])  # without and with row levels
def test_invalid_set_raises_and_changes_nothing(idx, values, exc, fragment, capacity, Tree):
    if isinstance(idx, list) and "capacity" in idx:
        idx = [capacity if i == "capacity" else i for i in idx]
    tree = Tree(capacity)
    tree.set([0, 4, capacity - 1], [1.0, 2.0, 3.0])
    before = snapshot(tree)  # reads, so propagation has happened
    tree.set(7, 4.0)  # leave one write pending across the failed call
    with pytest.raises(exc, match=fragment):
        tree.set(idx, values)
    assert tree.get(7) == 4.0
    tree.set(7, 0.0)
    after = snapshot(tree)
    np.testing.assert_array_equal(after["leaves"], before["leaves"])
    assert after["total"] == before["total"] and after["count"] == before["count"]
    np.testing.assert_array_equal(after["found"], before["found"])


@TREES
@pytest.mark.parametrize("bad", [[0, 2, 3], [np.nan, 1.0, 1.0], [1.0, -2.0, 1.0], [[1.0, 2.0, 3.0]], 5.0])
def test_invalid_load_leaves_raises_and_changes_nothing(bad, Tree):
    tree = Tree.from_leaves([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match=r"leaves"):
        tree.load_leaves(bad)
    np.testing.assert_array_equal(tree.leaves(), [1.0, 2.0, 3.0, 4.0])
    assert tree.total == 10.0 and tree.count_positive == 4


@TREES
def test_load_leaves_names_the_bad_position(Tree):
    tree = Tree(5)
    with pytest.raises(ValueError, match=r"leaves\[3\]: expected a finite mass >= 0, got inf"):
        tree.load_leaves([0.0, 1.0, 2.0, np.inf, 1.0])
    with pytest.raises(ValueError, match=r"leaves\[1\]"):
        Tree.from_leaves([1.0, np.nan])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        Tree.from_leaves([])


@TREES
@pytest.mark.parametrize("capacity", [7, 3000])
def test_invalid_find_and_get(capacity, Tree):
    tree = Tree(capacity)
    tree.set([1, 5], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"masses\[1\]"):
        tree.find([0.5, 3.5])
    with pytest.raises(ValueError, match=r"masses\[0\]"):
        tree.find([-1e-9, 1.0])
    with pytest.raises(ValueError, match=r"masses\[2\]"):
        tree.find([0.0, 1.0, np.nan])
    with pytest.raises(ValueError, match=r"idx\[1\]"):
        tree.get([0, capacity])
    with pytest.raises(TypeError):
        tree.get([0.5])


@TREES
def test_invalid_arguments_to_constructor_and_sampler(Tree):
    with pytest.raises(ValueError, match="capacity"):
        Tree(0)
    with pytest.raises(TypeError, match="capacity"):
        Tree(2.0)
    with pytest.raises(TypeError, match="capacity"):
        Tree(True)
    tree = Tree.from_leaves([1.0, 2.0])
    with pytest.raises(ValueError, match="n: expected an integer >= 1, got 0"):
        tree.sample_stratified(np.random.default_rng(0), 0)
    with pytest.raises(TypeError, match="n: expected an integer"):
        tree.sample_stratified(np.random.default_rng(0), 2.5)
    with pytest.raises(TypeError, match="Generator"):
        tree.sample_stratified(np.random.RandomState(0), 4)
    with pytest.raises(ValueError, match="new_capacity"):
        tree.resize(0)


# ------------------------------------------------ rebuild, resize, restore


@TREES
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_from_leaves_reproduces_an_updated_tree_bit_for_bit(capacity, Tree):
    rng = np.random.default_rng(capacity)
    tree = Tree(capacity)
    for _ in range(20):
        idx = rng.integers(0, capacity, 64)
        values = rng.exponential(size=64) * (rng.random(64) < 0.8)
        tree.set(idx, values)
        _ = tree.total
    tree.set(capacity - 1, 1.5)  # at least one positive leaf, to sample from
    restored = Tree.from_leaves(tree.leaves())
    assert_same_tree(tree, restored)
    # A checkpoint of the leaves plus the RNG state resumes the same batches.
    a = tree.sample_stratified(np.random.default_rng(99), 32)
    b = restored.sample_stratified(np.random.default_rng(99), 32)
    np.testing.assert_array_equal(a, b)

    reloaded = Tree(capacity)
    reloaded.set(np.arange(min(capacity, 10)), 5.0)  # state that load_leaves must replace
    reloaded.load_leaves(tree.leaves())
    assert_same_tree(tree, reloaded)


@pytest.mark.parametrize(
    "old, new", [(50, 3000), (3000, 100_003), (100_003, 3000), (3000, 50), (1024, 1024), (7, 1)]
)
@TREES
def test_resize_keeps_the_common_prefix(old, new, Tree):
    rng = np.random.default_rng(old + new)
    leaves = rng.integers(0, 4, old).astype(np.float64)
    leaves[0] = 1.0
    tree = Tree.from_leaves(leaves)
    resized = tree.resize(new)
    keep = min(old, new)
    expected = np.zeros(new)
    expected[:keep] = leaves[:keep]
    assert resized.capacity == new
    assert_matches_leaves(resized, expected)
    assert_same_tree(resized, Tree.from_leaves(expected))
    # The original is untouched and independent of the new tree.
    resized.set(0, 100.0)
    np.testing.assert_array_equal(tree.leaves(), leaves)
    assert tree.total == leaves.sum()


@TREES
@pytest.mark.parametrize("capacity", [50, 100_003])
def test_copy_and_pickle_give_independent_equal_trees(capacity, Tree):
    tree = Tree(capacity)
    tree.set([1, 2, capacity - 1], [1.0, 2.0, 3.0])  # still pending when copied
    for clone in (copy.copy(tree), copy.deepcopy(tree), pickle.loads(pickle.dumps(tree))):
        assert_same_tree(clone, tree)
        clone.set(capacity - 1, 10.0)
        assert clone.total == 13.0 and clone.find([12.0])[0] == capacity - 1
        assert tree.total == 6.0 and tree.get(capacity - 1) == 3.0


# ------------------------------------------- the public class against a naive reference (issue 16)


class NaiveTree:
    """What ``mr.SumTree`` promises, in the plainest Python: a list of floats, searched linearly."""

    def __init__(self, capacity: int) -> None:
        self.p = [0.0] * capacity

    def __len__(self) -> int:
        return len(self.p)

    def set(self, idx, values) -> None:
        idx = list(range(len(self.p))[idx]) if isinstance(idx, slice) else np.atleast_1d(idx).tolist()
        values = np.broadcast_to(np.asarray(values, float), (len(idx),)).tolist()
        for i, v in zip(idx, values, strict=True):  # in order: a repeated index keeps its last value
            self.p[i] = v + 0.0

    def get(self, idx):
        if isinstance(idx, slice):
            return self.p[idx]
        return [self.p[i] for i in idx] if isinstance(idx, list) else self.p[idx]

    @property
    def total(self) -> float:
        return math.fsum(self.p)

    @property
    def min(self) -> float:
        return min((v for v in self.p if v > 0), default=math.inf)

    @property
    def max(self) -> float:
        return max(self.p)

    def leaf_of(self, m: float) -> int:
        """First leaf whose cumulative sum exceeds m; past the end, the last positive leaf (exact for
        integer masses)."""
        acc = 0.0
        for i, v in enumerate(self.p):
            acc += v
            if acc > m:
                return i
        return max(i for i, v in enumerate(self.p) if v > 0)

    def sample(self, rng, n):
        total = self.total
        return [self.leaf_of(u * total) for u in rng.random(n)]

    def stratified_sample(self, rng, n):
        total = self.total
        return [self.leaf_of((i + u) * (total / n)) for i, u in enumerate(rng.random(n))]


@st.composite
def api_programs(draw, integer_masses: bool):
    capacity = draw(st.sampled_from([1, 5, 33, 2049, 3000]))
    mass = st.integers(0, 9).map(float) if integer_masses else st.one_of(
        st.just(0.0), st.floats(1e-300, 1e300), st.floats(0.0, 10.0))
    index = st.integers(0, capacity - 1)
    ops = []
    for _ in range(draw(st.integers(1, 8))):
        form = draw(st.sampled_from(["item", "list", "scalar-list", "slice", "method", "array"]))
        if form == "item":
            ops.append((form, draw(index), draw(mass)))
        elif form == "slice":
            a, b = sorted(draw(st.lists(st.integers(0, capacity), min_size=2, max_size=2)))
            ops.append((form, slice(a, b, draw(st.sampled_from([None, 2, 3]))), draw(mass)))
        else:
            n = draw(st.integers(0, 40))
            idx = draw(st.lists(index, min_size=n, max_size=n))
            vals = draw(mass) if form == "scalar-list" else draw(st.lists(mass, min_size=n, max_size=n))
            ops.append((form, idx, vals))
    return capacity, ops, draw(st.integers(0, 2**32 - 1))


def _apply(tree, naive, ops) -> None:
    for form, idx, vals in ops:
        naive.set(idx, vals)
        if form == "method":
            tree.set(idx, vals)
        elif form == "array":
            tree[np.array(idx, np.int32)] = np.array(vals, np.float64)
        else:
            tree[idx] = vals


@TREES
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=api_programs(integer_masses=True))
def test_public_api_matches_naive_reference_exactly(case, Tree):
    """Integer masses: every sum is exact, so totals, searches and draws must equal the naive ones."""
    capacity, ops, seed = case
    tree, naive = Tree(capacity), NaiveTree(capacity)
    _apply(tree, naive, ops)
    assert len(tree) == len(naive) == capacity
    assert tree[:].tolist() == naive.get(slice(None)) == tree.leaves().tolist()
    assert tree[1::2].tolist() == naive.get(slice(1, None, 2))
    probe = [0, capacity - 1, capacity // 2, 0]
    assert tree[probe].tolist() == tree.get(probe).tolist() == naive.get(probe)
    assert tree[capacity - 1] == naive.get(capacity - 1)
    assert tree.total == naive.total and tree.max == naive.max and tree.min == naive.min
    assert tree.count_positive == sum(v > 0 for v in naive.p)
    if naive.total == 0:
        with pytest.raises(ValueError, match="total == 0"):
            tree.sample(np.random.default_rng(seed), 3)
        return
    for n in (1, 7, 64):
        assert tree.sample(np.random.default_rng(seed), n).tolist() == naive.sample(np.random.default_rng(seed), n)
        assert (tree.stratified_sample(np.random.default_rng(seed), n).tolist()
                == naive.stratified_sample(np.random.default_rng(seed), n))


@TREES
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=api_programs(integer_masses=False))
def test_public_api_matches_naive_reference_on_any_masses(case, Tree):
    """Masses from 1e-300 to 1e300: leaves, min and max exact, the total to float64 rounding, and
    draws land only on positive leaves, each inside its stratum's leaves."""
    capacity, ops, seed = case
    tree, naive = Tree(capacity), NaiveTree(capacity)
    _apply(tree, naive, ops)
    assert tree.leaves().tolist() == naive.p
    assert tree.max == naive.max and tree.min == naive.min
    assert math.isclose(tree.total, naive.total, rel_tol=1e-12, abs_tol=0.0)
    if naive.total > 0:
        for draw in (tree.sample(np.random.default_rng(seed), 50), tree.stratified_sample(np.random.default_rng(seed), 50)):
            assert all(naive.p[i] > 0 for i in draw.tolist())


@TREES
def test_public_api_forms_and_errors(Tree):
    assert mr.SumTree is SumTree
    tree = Tree(6)
    tree[2] = 3
    tree[[0, 5]] = 1.5
    tree[3:5] = [2.0, 0.0]
    assert len(tree) == 6 and list(tree) == [1.5, 0.0, 3.0, 2.0, 0.0, 1.5]
    assert isinstance(tree[2], np.float64) and tree[np.int64(2)] == 3.0
    assert (tree.total, tree.min, tree.max, tree.count_positive) == (8.0, 1.5, 3.0, 4)
    assert Tree(4).max == 0.0 and Tree(4).min == np.inf
    with pytest.raises(IndexError, match=r"idx\[1\]: expected a leaf index in \[0, 6\), got 6"):
        tree[[0, 6]] = 1.0
    with pytest.raises(IndexError, match=r"idx: expected a leaf index in \[0, 6\), got -1"):
        tree[-1]  # no negative indexing: a slot id is never negative, so -1 is a bug upstream
    with pytest.raises(LeafIndexError):
        tree.get([7])
    with pytest.raises(ValueError, match=r"values\[1\]: expected a finite mass >= 0, got nan"):
        tree.set([0, 1], [1.0, float("nan")])
    with pytest.raises(ValueError, match=r"values\[0\]: expected a finite mass >= 0, got -1.0"):
        tree[0] = -1.0
    with pytest.raises(TypeError, match="idx: expected integer leaf indices"):
        tree[1.0] = 2.0
    with pytest.raises(TypeError, match="values: expected float masses"):
        tree[0] = "heavy"
    with pytest.raises(TypeError, match="Generator"):
        tree.sample(0, 4)
    assert (tree.total, tree.count_positive) == (8.0, 4)  # nothing changed
