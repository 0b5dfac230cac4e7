"""A reader draws its iterators' uniform batches several at a time (``DrawState``'s reserve), and nothing
can tell: every sequence of calls gives the same batches, sequences and sampling state as the same reader
drawing each batch on its own."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from tests._support import internals


class Writer:
    """Episodes of 37 steps whose frames encode the step, committed in runs."""

    def __init__(self, path) -> None:
        self.s = mr.ReplayStore.create(path, capacity=150, obs_shape=(3,), obs_dtype="int32", stack=3, n_step=2,
                                       chunk_size=32, seed=5)
        self.t = 0
        self.s.reset(np.zeros(3, np.int32))
        self.steps(400)

    def steps(self, n: int) -> None:
        for _ in range(n):
            end = self.t % 37 == 36
            self.s.step(self.t % 4, float(self.t % 3), np.full(3, self.t + 1, np.int32), end, False)
            if end:
                self.s.reset(np.full(3, -self.t, np.int32))
            self.t += 1
        self.s.commit()


def _same(a, b) -> None:
    for name in ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index", "weight",
                 "mask"):
        if hasattr(a, name):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def _readers(path, seed: int = 3) -> tuple[mr.ReplayStore, mr.ReplayStore]:
    a = mr.ReplayStore.open(path, mode="r", seed=seed)
    b = mr.ReplayStore.open(path, mode="r", seed=seed)
    internals.without_reserve(b)
    return a, b


def test_a_readers_batches_are_drawn_ahead_and_equal_repeated_sample(tmp_path):
    w = Writer(tmp_path / "s")
    a = mr.ReplayStore.open(tmp_path / "s", mode="r", seed=3)
    ref = mr.ReplayStore.open(tmp_path / "s", mode="r", seed=3)
    it = a.batches(16, prefetch=2)
    for i in range(30):
        _same(next(it), ref.sample(16))
        if i == 0:
            # three batches are the iterator's (prefetch 2); the rest of the run waits in the reserve
            assert internals.reserved(a) > 0
    # what a commit would record, and the RNG inspect() shows, are as if only the iterator's were drawn
    pend = internals.sampling_state(a)
    assert len(pend["pending_draws"]["ids"]) == 2
    ahead = mr.ReplayStore.open(tmp_path / "s", mode="r", seed=3)
    for _ in range(30):
        ahead.sample(16)
    assert pend["rng"] == ahead.inspect()["rng"]
    for _ in range(2):
        ahead.sample(16)
    assert pend["pending_draws"]["rng_after"] == ahead.inspect()["rng"] == a.inspect()["rng"]
    for s in (a, ref, ahead, w.s):
        s.close()


def test_a_writer_and_a_prioritized_reader_draw_each_batch_alone(tmp_path):
    w = Writer(tmp_path / "s")
    it = w.s.batches(8)
    next(it)
    assert internals.reserved(w.s) == 0  # (a writer's index changes between its batches)
    p = mr.ReplayStore.create(tmp_path / "p", capacity=100, obs_shape=(3,), obs_dtype="int32", stack=2,
                              prioritized=mr.Prioritized())
    p.reset(np.zeros(3, np.int32))
    for t in range(60):
        p.step(0, 1.0, np.full(3, t, np.int32), t % 20 == 19, False)
        if t % 20 == 19:
            p.reset(np.zeros(3, np.int32))
    p.close()
    r = mr.ReplayStore.open(tmp_path / "p", mode="r", seed=1)
    next(r.batches(8))
    assert internals.reserved(r) == 0  # (priority updates made after a batch affect the batches after it)
    r.close()
    w.s.close()


OPS = st.one_of(
    st.tuples(st.just("next"), st.integers(0, 1)),
    st.tuples(st.just("close"), st.integers(0, 1)),
    st.tuples(st.just("sample"), st.sampled_from([5, 8])),
    st.tuples(st.just("sequences"), st.just(0)),
    st.tuples(st.just("state"), st.just(0)),
    st.tuples(st.just("refresh"), st.integers(1, 40)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=1, max_size=40), sizes=st.tuples(st.sampled_from([5, 8]), st.sampled_from([5, 8])),
       prefetch=st.tuples(st.integers(0, 2), st.integers(0, 2)))
def test_any_calls_see_what_draws_one_at_a_time_give(tmp_path_factory, ops, sizes, prefetch):
    w = Writer(tmp_path_factory.mktemp("reserve") / "s")
    a, b = _readers(w.s.path)
    its: list[list] = [[None, None], [None, None]]  # per reader, per iterator
    try:
        for op, arg in ops:
            if op == "next":
                for store, mine in ((a, its[0]), (b, its[1])):
                    if mine[arg] is None:
                        mine[arg] = store.batches(sizes[arg], prefetch=prefetch[arg])
                _same(next(its[0][arg]), next(its[1][arg]))
            elif op == "close":
                for mine in its:
                    if mine[arg] is not None:
                        mine[arg].close()
                        mine[arg] = None
            elif op == "sample":
                _same(a.sample(arg), b.sample(arg))
            elif op == "sequences":
                _same(a.sample_sequences(3, 4), b.sample_sequences(3, 4))
            elif op == "state":
                assert internals.sampling_state(a) == internals.sampling_state(b)
                assert a.inspect()["rng"] == b.inspect()["rng"]
            else:
                w.steps(arg)
                assert a.refresh() == b.refresh()
                its = [[None, None], [None, None]]  # (a refresh ends a reader's iterators)
        assert internals.sampling_state(a) == internals.sampling_state(b)
    finally:
        for s in (a, b, w.s):
            s.close()


@pytest.mark.parametrize("between", ["sample", "sequences", "new iterator"])
def test_another_draw_rewinds_the_reserve_and_the_next_one_is_shorter(tmp_path, between):
    w = Writer(tmp_path / "s")
    a, b = _readers(w.s.path)
    ia, ib = a.batches(8, prefetch=0), b.batches(8, prefetch=0)
    _same(next(ia), next(ib))
    held = internals.reserved(a)
    assert held > 0
    if between == "sample":
        _same(a.sample(8), b.sample(8))
    elif between == "sequences":
        _same(a.sample_sequences(2, 3), b.sample_sequences(2, 3))
    else:
        a.batches(5, prefetch=0)
        b.batches(5, prefetch=0)
    assert internals.reserved(a) == 0
    _same(next(ia), next(ib))
    assert 0 < internals.reserved(a) < held  # (the draws thrown away make the next run shorter)
    for s in (a, b, w.s):
        s.close()
