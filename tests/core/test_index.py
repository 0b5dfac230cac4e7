"""The index on its own: ids <-> slots, validity as windows close, retirement, growth, batch plans."""

from __future__ import annotations

import numpy as np
import pytest

from mmreplay.core.index import TERMINATED, TRUNCATED
from mmreplay.errors import EpisodeStateError, NotSampleableError
from tests._support.parts import RS, Feed


def test_a_transition_becomes_valid_when_its_window_closes():
    f = Feed(n_step=3)
    f.reset()
    for _ in range(4):
        f.step()
    idx = f.idx
    new = idx.update_validity()  # ids 0, 1 have their 3 window rows; 2, 3 wait
    np.testing.assert_array_equal(np.sort(idx.ids_of(new)), [0, 1])
    assert idx.n_valid == 2
    f.step(TERMINATED)  # the episode ends: every window inside it is complete
    np.testing.assert_array_equal(np.sort(idx.ids_of(idx.update_validity())), [2, 3, 4])
    np.testing.assert_array_equal(idx.valid_ids(), [0, 1, 2, 3, 4])
    assert idx.update_validity().size == 0  # nothing new was written


def test_ids_and_slots_round_trip_and_bad_ids_are_named():
    f = Feed()
    f.reset()
    slots = [f.step() for _ in range(5)] + [f.step(TRUNCATED)]
    f.idx.update_validity()
    ids = np.arange(6)
    np.testing.assert_array_equal(f.idx.slots_of(ids), slots)
    np.testing.assert_array_equal(f.idx.ids_of(np.array(slots)), ids)
    np.testing.assert_array_equal(f.idx.slots_of_range(2, 5), slots[2:5])
    np.testing.assert_array_equal(f.idx.ids_valid(np.array([-1, 0, 5, 6, 99])), [False, True, True, False, False])
    with pytest.raises(NotSampleableError, match=r"index\[1\] = 6 was never issued \(next id is 6\)"):
        f.idx.check_ids(np.array([0, 6]))


def test_plan_stops_the_window_at_the_episode_end_and_pads_the_stack():
    f = Feed(stack=3, n_step=3)
    s0 = f.reset()
    s1 = f.step()
    s2 = f.step(TERMINATED)
    f.reset()
    f.step()
    idx = f.idx
    idx.update_validity()
    plan = idx.plan(idx.slots_of(np.array([0, 1])))
    np.testing.assert_array_equal(plan.window, [2, 1])  # both windows stop at the termination
    np.testing.assert_array_equal(plan.terminated, [True, True])
    np.testing.assert_array_equal(plan.obs_pad, [[True, True, False], [True, False, False]])
    np.testing.assert_array_equal(plan.obs_slots[1, 1:], [s0, s1])
    np.testing.assert_array_equal(plan.next_slots[0, 2], s2)  # next state of id 0 ends at the final frame
    np.testing.assert_array_equal(plan.reward_weights, [[1.0, 0.5, 0.0], [1.0, 0.0, 0.0]])


def test_pad_first_repeats_the_first_frame():
    f = Feed(stack=3, n_step=1, pad="first")
    s0 = f.reset()
    f.step()
    f.step(TERMINATED)
    idx = f.idx
    idx.update_validity()
    plan = idx.plan(idx.slots_of(np.array([0])))
    np.testing.assert_array_equal(plan.obs_slots[0], [s0, s0, s0])
    assert not plan.obs_pad.any()


def test_retiring_a_chunk_evicts_its_ids_and_cuts_stacks_that_reached_into_it():
    f = Feed(stack=2, n_step=1, positions=4)
    f.reset()
    for _ in range(2 * RS - 1):
        f.step()
    idx = f.idx
    idx.update_validity()
    before = idx.n_valid
    cleared = idx.retire(0, oldest_id=RS - 1)  # chunk 0 holds rows 0..7 = START + ids 0..6
    assert idx.oldest_id == RS - 1 and idx.oldest_row.tolist() == [RS]
    # the observation stacks (2 frames) of id 7 (rows 6, 7) and id 8 (rows 7, 8) reach into the retired
    # chunk; id 9's (rows 8, 9) does not
    np.testing.assert_array_equal(idx.ids_valid(np.arange(RS - 1, RS + 2)), [False, False, True])
    assert idx.n_valid == before - (RS - 1) - 2
    assert set(idx.ids_of(cleared[cleared < RS]).tolist()) == {-1}  # the chunk's slots are forgotten
    with pytest.raises(NotSampleableError, match="was evicted"):
        idx.check_ids(np.array([0]))


def test_resize_keeps_every_retained_slot_and_reports_the_moves():
    f = Feed(positions=2)
    f.reset()
    for _ in range(RS + 3):
        f.step()
    idx = f.idx
    idx.update_validity()
    ids = idx.valid_ids()
    moves = idx.resize(5)
    assert len(moves) == 2 and idx.size == 5 * RS
    np.testing.assert_array_equal(idx.valid_ids(), ids)
    np.testing.assert_array_equal(idx.ids_of(idx.slots_of(ids)), ids)


def test_latest_stacks_needs_a_frame():
    f = Feed(stack=3)
    with pytest.raises(EpisodeStateError):
        f.idx.latest_stacks()
    s0 = f.reset()
    s1 = f.step()
    slots, pad = f.idx.latest_stacks()
    np.testing.assert_array_equal(slots[0, 1:], [s0, s1])
    np.testing.assert_array_equal(pad, [[True, False, False]])
