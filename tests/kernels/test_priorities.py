"""``native.priorities.priority_update`` against its numpy reference, and against the rules it implements."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmreplay.native.priorities import BAD_PRIORITY, NEVER_ISSUED, OK, priority_update
from mmreplay.native.reference import priority_update_numpy

PRIORITY = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 5e-324, 1e308]),
    st.floats(0.0, 100.0),
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not x >= 0),  # the bad ones, rarely
    st.floats(0.0, 1e300),
)


@st.composite
def updates(draw):
    """A ring of ``size`` slots holding ids [oldest, next) (id -> slot via id2slot[id % size]), some of
    them sampleable, and an update mixing retained, evicted, never-issued and repeated ids."""
    size = draw(st.integers(1, 300))
    oldest = draw(st.integers(0, 10_000))
    retained = draw(st.integers(0, size))
    nxt = oldest + retained
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    id2slot = rng.permutation(size).astype(np.int64)
    valid = rng.random(size) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    n = draw(st.integers(0, 80))
    pool = draw(st.lists(st.integers(max(0, oldest - 5), nxt + 2), min_size=1, max_size=max(1, n)))
    ids = np.array(draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n)), np.int64)
    if draw(st.booleans()) and n:  # an id below 0 somewhere
        ids[draw(st.integers(0, n - 1))] = -draw(st.integers(1, 2**62))
    allow_bad = draw(st.booleans())
    good = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 5e-324, 1e308]), st.floats(0.0, 1e300))
    p = np.array(draw(st.lists(PRIORITY if allow_bad else good, min_size=n, max_size=n)), np.float64)
    return ids, p, oldest, nxt, id2slot, valid


def naive(ids, p, oldest, nxt, id2slot, valid):
    """The rules, one id at a time."""
    for i, v in enumerate(p):
        if not (v >= 0 and v < np.inf):
            return BAD_PRIORITY, i
    for i, j in enumerate(ids):
        if j < 0 or j >= nxt:
            return NEVER_ISSUED, i
    last: dict[int, float] = {}
    order: list[int] = []
    skipped = 0
    for j, v in zip(ids.tolist(), p.tolist(), strict=True):
        if j < oldest or not valid[id2slot[j % id2slot.size]]:
            skipped += 1
            continue
        s = int(id2slot[j % id2slot.size])
        if s in last:
            order.remove(s)
        last[s] = v + 0.0
        order.append(s)
    return OK, -1, order, [last[s] for s in order], skipped


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(updates())
def test_kernel_equals_numpy_reference_and_the_rules(case):
    got = priority_update(*case)
    ref = priority_update_numpy(*case)
    rule = naive(*case)
    assert got[:2] == ref[:2] == rule[:2]
    if got[0] != OK:
        return
    np.testing.assert_array_equal(got[2], ref[2])
    assert got[3].tobytes() == ref[3].tobytes()  # bit for bit, -0.0 turned into 0.0 by both
    assert got[2].tolist() == rule[2] and got[3].tolist() == rule[3]
    assert got[4] == ref[4] == rule[4]
    assert got[5] == ref[5] == (max(rule[3]) if rule[3] else 0.0)
    assert got[2].dtype == np.int64 and got[3].dtype == np.float64


def test_adversarial_cases():
    id2slot = np.array([3, 0, 2, 1], np.int64)  # ids 10..13 retained: id -> slot id2slot[id % 4]
    valid = np.array([True, True, False, True])  # slot 2 (id 10) is not sampleable
    ids = np.array([12, 13, 12, 10, 12, 9, 13], np.int64)
    p = np.array([1.0, 2.0, 3.0, -0.0, 4.0, 5.0, 6.0])
    for fn in (priority_update, priority_update_numpy):
        status, pos, slots, values, skipped, top = fn(ids, p, 10, 14, id2slot, valid)
        assert (status, pos) == (OK, -1)
        # 12 -> slot 3, last value 4.0 at position 4; 13 -> slot 0, last value 6.0 at position 6
        assert slots.tolist() == [3, 0] and values.tolist() == [4.0, 6.0]
        assert skipped == 2  # id 10 (not sampleable) and id 9 (evicted)
        assert top == 6.0
        zero = fn(np.array([13]), np.array([-0.0]), 10, 14, id2slot, valid)
        assert zero[3].tobytes() == np.zeros(1).tobytes() and zero[5] == 0.0
        # priorities are checked before ids, over the whole array
        bad = fn(np.array([10, 99, 11]), np.array([1.0, 1.0, np.nan]), 10, 14, id2slot, valid)
        assert bad[:2] == (BAD_PRIORITY, 2)
        assert fn(np.array([10, 99, -1]), np.ones(3), 10, 14, id2slot, valid)[:2] == (NEVER_ISSUED, 1)
        assert fn(np.array([10, -(2**63)]), np.ones(2), 10, 14, id2slot, valid)[:2] == (NEVER_ISSUED, 1)
        assert fn(np.array([11]), np.array([np.inf]), 10, 14, id2slot, valid)[:2] == (BAD_PRIORITY, 0)
        empty = fn(np.empty(0, np.int64), np.empty(0), 10, 14, id2slot, valid)
        assert empty[0] == OK and empty[2].size == 0 and empty[4] == 0 and empty[5] == 0.0


def test_many_repeats_of_few_slots():
    """4096 updates of 3 ids (a hash set under pressure): the last value of each wins."""
    rng = np.random.default_rng(0)
    id2slot = np.arange(1000, dtype=np.int64)
    valid = np.ones(1000, np.bool_)
    ids = rng.choice(np.array([5, 500, 37]), 4096)
    p = rng.random(4096)
    got, ref = priority_update(ids, p, 0, 1000, id2slot, valid), priority_update_numpy(ids, p, 0, 1000, id2slot, valid)
    np.testing.assert_array_equal(got[2], ref[2])
    np.testing.assert_array_equal(got[3], ref[3])
    assert got[2].size == 3
