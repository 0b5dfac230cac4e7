"""The samplers on their own, through the Sampler protocol, over an index fed directly."""

from __future__ import annotations

import numpy as np
import pytest

from mmreplay.core.index import TERMINATED
from mmreplay.core.statefiles import StateDir
from mmreplay.errors import NotSampleableError
from mmreplay.options import Prioritized
from mmreplay.sampling import PrioritizedSampler, UniformSampler
from tests._support.parts import Feed


def _feed(n_tx: int = 12) -> Feed:
    f = Feed(stack=1, n_step=1, positions=4)
    f.reset()
    for i in range(n_tx):
        f.step(TERMINATED if i == n_tx - 1 else 0)
    return f


def test_uniform_draws_only_sampleable_ids_and_refuses_what_it_cannot_do():
    f = _feed(0 + 1)
    s = UniformSampler(f.idx)
    rng = np.random.default_rng(0)
    with pytest.raises(NotSampleableError, match="no sampleable"):
        s.draw(rng, 4, True, None)  # nothing synced yet
    f.idx.update_validity()
    ids, w, slots = s.draw(rng, 5, True, None)
    assert w is None and set(ids.tolist()) == {0}
    np.testing.assert_array_equal(slots, f.idx.slots_of(ids))  # the slots the draw found on the way
    with pytest.raises(NotSampleableError, match="distinct"):
        s.draw(rng, 2, False, None)
    with pytest.raises(ValueError, match="beta"):
        s.draw(rng, 1, True, 0.5)


def test_uniform_without_replacement_gives_distinct_ids():
    f = _feed()
    f.idx.update_validity()
    ids, _, slots = UniformSampler(f.idx).draw(np.random.default_rng(1), 12, False, None)
    assert sorted(ids.tolist()) == list(range(12))
    assert slots is None or (slots == f.idx.slots_of(ids)).all()


def test_prioritized_draws_in_proportion_and_weights_by_the_smallest_mass():
    f = _feed(4)
    s = PrioritizedSampler(f.idx, Prioritized(alpha=1.0, beta=1.0, eps=0.0))
    s.added(f.idx.update_validity())
    assert s.update(np.array([0, 1, 2, 3]), np.array([1.0, 1.0, 2.0, 4.0])) == 0
    ids, w, slots = s.draw(np.random.default_rng(0), 8000, True, None)
    freq = np.bincount(ids, minlength=4) / ids.size
    np.testing.assert_allclose(freq, [0.125, 0.125, 0.25, 0.5], atol=0.02)
    np.testing.assert_allclose(w[ids == 3], 0.25)  # (P_i / P_min) ** -beta
    np.testing.assert_array_equal(slots, f.idx.slots_of(ids))
    with pytest.raises(ValueError, match="replace=False"):
        s.draw(np.random.default_rng(0), 2, False, None)


def test_prioritized_update_rules():
    f = _feed(4)
    s = PrioritizedSampler(f.idx, Prioritized(alpha=0.5, beta=0.4, eps=1e-6))
    s.added(f.idx.update_validity())
    np.testing.assert_array_equal(s.priorities(np.arange(4)), 1.0)  # entered with the maximum
    s.update(np.array([1, 1, 2]), np.array([5.0, 3.0, -0.0]))  # the last of a repeated id wins; -0.0 is 0
    np.testing.assert_array_equal(s.priorities(np.array([1, 2])), [3.0, 0.0])
    assert s.max_priority == 3.0
    with pytest.raises(ValueError, match=r"priorities\[1\] = nan"):
        s.update(np.array([0, 1]), np.array([1.0, np.nan]))
    with pytest.raises(NotSampleableError, match="never issued"):
        s.update(np.array([7]), np.array([1.0]))
    np.testing.assert_array_equal(s.priorities(np.array([1, 2])), [3.0, 0.0])  # failed calls changed nothing


def test_prioritized_state_round_trips_through_state_files(tmp_path):
    (tmp_path / "state").mkdir()
    f = _feed(6)
    valid = f.idx.update_validity()
    a = PrioritizedSampler(f.idx, Prioritized())
    a.added(valid)
    a.update(np.arange(6), np.linspace(0.5, 3.0, 6))
    full = a.save_state(StateDir(str(tmp_path), 1), delta=True)  # no chain yet: a full file
    a.saved(full)
    a.update(np.array([2]), np.array([9.0]))
    entry = a.save_state(StateDir(str(tmp_path), 2), delta=True)
    assert entry["file"] == full["file"] and len(entry["deltas"]) == 1
    b = PrioritizedSampler(f.idx, Prioritized())
    b.restore(StateDir(str(tmp_path), 2), entry, valid)
    np.testing.assert_array_equal(b.priorities(np.arange(6)), a.priorities(np.arange(6)))
    np.testing.assert_array_equal(b.masses(np.arange(6)), a.masses(np.arange(6)))
    assert b.total_mass() == a.total_mass() and b.max_priority == 9.0
    ids_a, w_a, _ = a.draw(np.random.default_rng(5), 16, True, None)
    ids_b, w_b, _ = b.draw(np.random.default_rng(5), 16, True, None)
    np.testing.assert_array_equal(ids_a, ids_b)
    np.testing.assert_array_equal(w_a, w_b)


def test_cleared_and_moved_slots():
    f = _feed(6)
    s = PrioritizedSampler(f.idx, Prioritized())
    s.added(f.idx.update_validity())
    s.slots_cleared(f.idx.slots_of(np.array([0, 1])))
    assert s.positive_slots() == 4
    ids = np.arange(2, 6)
    before = s.masses(ids)
    moves = f.idx.resize(9)
    s.ring_resized(f.idx.size, moves)
    np.testing.assert_array_equal(s.masses(ids), before)
    assert s.positive_slots() == 4


@pytest.mark.parametrize("seed", range(5))
def test_prioritized_weights_of_the_one_pass_draw_equal_the_numpy_computation(seed):
    """``draw`` takes each leaf's mass over the smallest mass from the descent kernel; the weights are bit
    for bit those of numpy's ``(masses[slots] / min) ** -beta`` on the same slots (also with zero priorities,
    ties and masses spread over many orders of magnitude)."""
    rng = np.random.default_rng(seed)
    f = _feed(300)
    s = PrioritizedSampler(f.idx, Prioritized(alpha=0.7, beta=0.5, eps=1e-6))
    s.added(f.idx.update_validity())
    p = rng.random(300) * 10.0 ** rng.integers(-4, 5, 300)
    p[rng.random(300) < 0.2] = 0.0
    p[:10] = 2.5  # ties
    s.update(np.arange(300), p)
    for beta in (None, 0.0, 0.4, 1.0):
        ids, w, slots = s.draw(rng, 64, True, beta)
        ref = s._weights(slots, s.beta if beta is None else beta)
        assert w.dtype == np.float32 and w.tobytes() == ref.tobytes()
        np.testing.assert_array_equal(f.idx.ids_of(slots), ids)
        assert (w <= 1.0).all() and (w > 0).all()
