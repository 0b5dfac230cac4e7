"""The compiled sum tree (``mr.SumTree``) against the numpy tree (``NumpySumTree``), bit for bit.

Both compute every node from its children with the same float64 additions in the same order, so after
the same operations every observable is identical: leaves, total, min, max, count, searches, and draws
from generators in the same state. Hypothesis drives random and adversarial programs: zeros and -0.0,
repeated indices in one update, capacities at the layout's boundaries (32 and 2048 leaves, a second row
level past 65,536) and primes, masses from subnormal to near overflow (a total that overflows to inf
must be refused by both), reads between writes or none (lazy propagation, including flushes of
thousands of pending rows), and relayouts through ``from_leaves`` as the store does when its ring grows.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from mmreplay.sampling import prioritized
from mmreplay.sampling.numpy_sumtree import NumpySumTree
from mmreplay.sampling.sumtree import SumTree

CAPACITIES = st.one_of(
    st.sampled_from([1, 2, 31, 32, 33, 1023, 2047, 2048, 2049, 3000, 65_536, 65_537, 100_003]),
    st.integers(1, 5000),
)
MASSES = st.one_of(
    st.sampled_from([0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.0, 0.1, 1e308]),
    st.floats(1e-300, 1e-200),
    st.floats(0.0, 10.0),
    st.floats(1e200, 1e300),
    st.integers(0, 7).map(float),
)


@st.composite
def programs(draw):
    capacity = draw(CAPACITIES)
    ops = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["set", "set", "dups", "scalar", "read", "draw", "relayout", "bulk"]))
        if kind in ("set", "dups", "scalar"):
            n = draw(st.integers(0, 64))
            if kind == "dups":  # a few indices, each repeated: the last value must win
                pool = draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=3))
                idx = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
            else:
                idx = draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n))
            values = draw(MASSES) if kind == "scalar" else draw(st.lists(MASSES, min_size=n, max_size=n))
            ops.append(("set", np.array(idx, np.int64), np.array(values, np.float64)))
        elif kind == "bulk":  # thousands of writes without a read: wide lazy propagation
            ops.append(("bulk", draw(st.integers(0, 2**32 - 1)), draw(st.integers(1, 3 * capacity + 10))))
        elif kind == "relayout":  # the store's ring growth: blocks of leaves moved into a new tree
            ops.append(("relayout", draw(st.integers(0, 2**32 - 1)), draw(st.integers(1, 2 * capacity + 40))))
        else:
            ops.append((kind, draw(st.integers(0, 2**32 - 1)), draw(st.integers(1, 300))))
    return capacity, ops


def observe(tree: SumTree, seed: int, n: int) -> dict:
    """Everything public the tree says, reading it (so pending writes propagate)."""
    out = {"leaves": tree.leaves(), "total": tree.total, "min": tree.min, "max": tree.max,
           "count": tree.count_positive, "len": len(tree)}
    total = float(out["total"])
    if 0 < total < np.inf:
        out["stratified"] = tree.stratified_sample(np.random.default_rng(seed), n)
        leaves, out["normalised"] = tree.stratified_sample_normalised(np.random.default_rng(seed), n)
        np.testing.assert_array_equal(leaves, out["stratified"])  # same leaves, same use of the rng
        with np.errstate(over="ignore"):
            assert (out["normalised"] == out["leaves"][leaves] / out["min"]).all()
        out["sample"] = tree.sample(np.random.default_rng(seed + 1), n)
        # points on and next to the cumulative sums (node boundaries, rounded either way), and the ends
        rng = np.random.default_rng(seed + 2)
        cum = np.cumsum(out["leaves"])[rng.integers(0, tree.capacity, 64)]
        points = np.concatenate([[0.0, total], cum, np.nextafter(cum, 0), np.nextafter(cum, np.inf),
                                 rng.random(64) * total])
        out["find"] = tree.find(np.clip(points, 0.0, total))
    elif total == np.inf:
        with pytest.raises(ValueError, match="overflows"):
            tree.stratified_sample(np.random.default_rng(seed), n)
        out["refused"] = True
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        if isinstance(a[key], np.ndarray):  # -0.0 stored as 0.0 by both: compare bits too
            assert a[key].tobytes() == b[key].tobytes(), key


def run(program, check_every_read: bool = True) -> None:
    capacity, ops = program
    trees = [SumTree(capacity), NumpySumTree(capacity)]
    for op in ops:
        kind = op[0]
        if kind == "set":
            _, idx, values = op
            idx = idx % trees[0].capacity  # a relayout may have shrunk the tree
            for t in trees:
                t[idx] = values
        elif kind == "bulk":
            rng = np.random.default_rng(op[1])
            idx = rng.integers(0, trees[0].capacity, op[2])
            values = rng.random(op[2]) * (rng.random(op[2]) < 0.7)
            for t in trees:
                t.set(idx, values)
        elif kind == "relayout":
            rng = np.random.default_rng(op[1])
            old = trees[0].leaves()
            new = np.zeros(op[2])
            for _ in range(3):  # blocks of the old ring land at new positions
                length = int(rng.integers(1, min(old.size, new.size) + 1))
                src = int(rng.integers(0, old.size - length + 1))
                dst = int(rng.integers(0, new.size - length + 1))
                new[dst:dst + length] = old[src:src + length]
            trees = [type(t).from_leaves(new) for t in trees]
        elif check_every_read:
            assert_same(observe(trees[0], op[1], op[2]), observe(trees[1], op[1], op[2]))
    assert_same(observe(trees[0], 7, 33), observe(trees[1], 7, 33))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_native_tree_equals_numpy_tree(program):
    run(program)


@pytest.mark.parametrize("capacity", [1, 32, 2048, 2049, 65_537, 1_100_000])
def test_long_random_history_equals_numpy_tree(capacity):
    """A learner's history: batches of updates (with repeats, zeros, a 1e12 spread) and draws."""
    rng = np.random.default_rng(capacity)
    a, b = SumTree(capacity), NumpySumTree(capacity)
    for step in range(300):
        n = int(rng.integers(1, 513))
        idx = rng.integers(0, capacity, n)
        values = 10.0 ** rng.uniform(-6, 6, n) * (rng.random(n) < 0.9)
        a.set(idx, values)
        b.set(idx, values)
        if step % (3 if capacity < 10**6 else 60) == 0:
            seed = int(rng.integers(2**32))
            assert_same(observe(a, seed, 32), observe(b, seed, 32))
    assert_same(observe(a, 1, 512), observe(b, 1, 512))
    assert_same(observe(SumTree.from_leaves(a.leaves()), 1, 512), observe(a, 1, 512))


def test_overflowing_total_is_refused_by_both():
    for tree in (SumTree(3000), NumpySumTree(3000)):
        tree[[0, 2999]] = [1.7e308, 1.7e308]
        assert tree.total == np.inf and tree.max == 1.7e308
        with pytest.raises(ValueError, match="overflows"):
            tree.sample(np.random.default_rng(0), 4)
        with pytest.raises(ValueError, match="overflows"):
            tree.find([1.0])
        tree[[0, 2999]] = [1.0, 3.0]  # back to a finite total: usable again
        assert tree.stratified_sample(np.random.default_rng(0), 4).tolist() == [0, 2999, 2999, 2999]


def _prioritized_run(path, tree_class, monkeypatch) -> list[tuple]:
    """A prioritized store whose ring grows (short episodes) and wraps, sampled and updated."""
    monkeypatch.setattr(prioritized, "SumTree", tree_class)
    s = mr.ReplayStore.create(path, capacity=60, obs_shape=(2,), obs_dtype="int32", stack=2, n_step=2,
                              chunk_size=16, prioritized=mr.Prioritized(alpha=0.6, beta=0.4), seed=3)
    rng = np.random.default_rng(0)
    out = []
    s.reset(np.zeros(2, np.int32))
    for t in range(600):
        end = rng.random() < (0.6 if 200 <= t < 300 else 0.05)  # a burst of 1-2 step episodes: growth
        s.step(t % 3, float(t % 5), np.array([t, 1], np.int32), end, False)
        if end:
            s.reset(np.array([t, 2], np.int32))
        if t > 20 and t % 7 == 0:
            b = s.sample(8)
            out.append((b.index.copy(), b.weight.copy(), b.obs.copy()))
            p = rng.random(8) * (rng.random(8) < 0.8)
            p[0] = 1e-300 if t % 2 else 1e6
            s.update_priorities(np.concatenate([b.index, b.index[:3]]), np.concatenate([p, p[:3] * 2]))
    out.append((s.priorities(s.sampleable_ids()),))
    s.close()
    return out


def test_store_samples_the_same_with_either_tree(tmp_path, monkeypatch):
    native = _prioritized_run(tmp_path / "a", SumTree, monkeypatch)
    numpy_ = _prioritized_run(tmp_path / "b", NumpySumTree, monkeypatch)
    assert len(native) == len(numpy_)
    for x, y in zip(native, numpy_, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=CAPACITIES, seed=st.integers(0, 2**32 - 1), n=st.integers(1, 600),
       zeros=st.sampled_from([0.0, 0.5, 0.97]))
def test_draws_on_node_boundaries_equal_numpy_tree(capacity, seed, n, zeros):
    """The uniforms a generator could return that put points within rounding of a leaf boundary (where a
    different float operation would pick the neighbour), and the extremes 0 and 1 - 2**-53, handed to
    the implementations' draw steps directly."""
    rng = np.random.default_rng(seed)
    leaves = rng.random(capacity) * 10.0 ** rng.integers(-3, 4, capacity)
    leaves[rng.random(capacity) < zeros] = 0.0
    leaves[rng.integers(capacity)] = 1.0
    a, b = SumTree.from_leaves(leaves), NumpySumTree.from_leaves(leaves)
    total = float(a.total)
    bounds = np.cumsum(leaves)[rng.integers(0, capacity, n)]
    stratum = np.minimum((bounds * n / total).astype(np.int64), n - 1)
    u_strat = np.zeros(n)
    u_strat[stratum] = np.clip(bounds * n / total - stratum, 0.0, np.nextafter(1.0, 0.0))
    u_strat[rng.random(n) < 0.1] = np.nextafter(1.0, 0.0)
    u_prop = np.clip(np.concatenate([bounds / total, [0.0, np.nextafter(1.0, 0.0)]]), 0.0, np.nextafter(1.0, 0))
    for u in (u_strat, np.nextafter(u_strat, 0.0), np.nextafter(u_strat, 1.0).clip(0, np.nextafter(1.0, 0))):
        np.testing.assert_array_equal(a._stratified(u), b._stratified(u))
        for x, y in zip(a._stratified_normalised(u), b._stratified_normalised(u), strict=True):
            assert x.tobytes() == y.tobytes()
    np.testing.assert_array_equal(a._proportional(u_prop), b._proportional(u_prop))
    points = np.clip(np.concatenate([bounds, np.nextafter(bounds, 0), np.nextafter(bounds, np.inf)]), 0, total)
    np.testing.assert_array_equal(a._descend(points), b._descend(points))


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 3000), data=st.data())
def test_set_distinct_with_writes_the_side_arrays_as_numpy_would(capacity, data):
    """``set_distinct_with``: the tree as ``set_distinct`` leaves it, ``side[idx] = side_values`` (the last of a
    repeated index wins) and ``flags[idx] = True``, in both implementations."""
    n = data.draw(st.integers(0, 64))
    idx = np.array(data.draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n)), np.int64)
    values = np.array(data.draw(st.lists(MASSES, min_size=n, max_size=n)), np.float64)
    side_values = np.random.default_rng(n).random(n)
    start = np.random.default_rng(capacity).random(capacity)
    want_side, want_flags = start.copy(), np.zeros(capacity, np.bool_)
    for i in range(n):
        want_side[idx[i]] = side_values[i]
        want_flags[idx[i]] = True
    reference = NumpySumTree.from_leaves(start)
    reference.set_distinct(idx, values)
    for tree in (SumTree.from_leaves(start), NumpySumTree.from_leaves(start)):
        side, flags = start.copy(), np.zeros(capacity, np.bool_)
        tree.set_distinct_with(idx, values, side, side_values, flags)
        assert side.tobytes() == want_side.tobytes() and (flags == want_flags).all()
        assert tree.leaves().tobytes() == reference.leaves().tobytes()
        assert tree.total == reference.total and tree.min == reference.min and tree.count_positive == reference.count_positive
