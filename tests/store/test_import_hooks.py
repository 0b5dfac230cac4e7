"""Episodes whose head was lost or whose final frame is missing (what importers write): the sampleable
rule, the rows, and an index rebuilt on open that matches the one built while writing."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import mmreplay as mr

K, N = 3, 2



def _write(s, episodes):
    """episodes: (length, head_lost, end) with end in {"terminated", "truncated", "missing-term", "missing-trunc"}."""
    t = 0
    info = []
    for length, head_lost, end in episodes:
        s.reset(np.array([t, 0], np.int32), head_lost=head_lost)
        first = s.id_range[1]
        for j in range(length):
            t += 1
            last = j == length - 1
            if last and end.startswith("missing"):
                s.step(j % 3, float(j), None, end == "missing-term", end == "missing-trunc")
            else:
                s.step(j % 3, float(j), np.array([t, j + 1], np.int32), last and end == "terminated",
                       last and end == "truncated")
        info.append((first, length, head_lost, end))
    return info


def test_rules_for_lost_heads_and_missing_finals(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=500, obs_shape=(2,), obs_dtype="int32", stack=K, n_step=N,
                              chunk_size=16)
    info = _write(s, [(6, True, "terminated"), (5, False, "missing-term"), (5, False, "missing-trunc"),
                      (4, True, "missing-trunc")])
    valid = set(s.sampleable_ids().tolist())
    for first, length, head_lost, end in info:
        for t in range(length):
            ok = first + t in valid
            window_hits_end = t + N >= length
            want = True
            if head_lost and t < K - 1:
                want = False  # the stack would need frames the source no longer had
            if end == "missing-trunc" and window_hits_end:
                want = False  # it would bootstrap from the missing final frame
            assert ok == want, (first, t, end, head_lost)
            if ok and end == "missing-term" and window_hits_end:
                b = s.gather([first + t])
                assert not b.next_obs.any() and b.discount[0] == 0 and b.terminated[0]
    s.close()


@settings(max_examples=30, deadline=None)
@given(eps=st.lists(st.tuples(st.integers(1, 9), st.booleans(),
                              st.sampled_from(["terminated", "truncated", "missing-term", "missing-trunc"])),
                    min_size=1, max_size=25),
       capacity=st.integers(3, 40))
def test_index_rebuilt_on_open_matches_the_live_one(tmp_path_factory, eps, capacity):
    path = tmp_path_factory.mktemp("ih") / "s"
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(2,), obs_dtype="int32", stack=K, n_step=N,
                              chunk_size=8)
    _write(s, eps)
    ids = s.sampleable_ids().tolist()
    live = s.gather(ids) if ids else None
    tab = s.episodes()
    s.close()
    with mr.ReplayStore.open(path, mode="r") as r:
        assert r.sampleable_ids().tolist() == ids
        if live is not None:
            again = r.gather(ids)
            for name in ("obs", "next_obs", "reward", "discount", "terminated", "truncated", "action"):
                np.testing.assert_array_equal(getattr(again, name), getattr(live, name))
        tab2 = r.episodes()
        for name in ("first_row", "length", "head_lost", "ended", "terminated", "final_missing", "complete"):
            np.testing.assert_array_equal(getattr(tab2, name), getattr(tab, name))
