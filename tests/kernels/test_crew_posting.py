"""Frames posted to the reader's helper threads (``native.crew``) are the frames read in one thread, whoever
reads which rows; ``batches()`` hands out ``sample()``'s batches while posting; nothing a posted read
uses is freed or unmapped under it (an iterator dropped unclosed, a closed store, a forked child); and
posting stops while joins cost more than plain reads."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from mmreplay.reading.reader import FrameReader
from mmreplay.reading.readpolicy import PostGate
from tests._support import internals
from tests._support.compression import atari_frames
from tests._support.crew import atari_store, damaged_slots, damaged_store, finished_by_helpers


def _atari_store(path: str, compression: str | None, capacity: int = 600) -> mr.ReplayStore:
    return atari_store(path, compression, capacity, game="breakout", truncate_every=211)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):  # noqa: ANN201
    root = tmp_path_factory.mktemp("handoff")
    made = {kind: _atari_store(str(root / kind), None if kind == "raw" else "lz4") for kind in ("raw", "lz4")}
    assert internals.log(made["lz4"]).ring.compressed
    yield made
    for s in made.values():
        s.close()


def _plan(store: mr.ReplayStore, b: int, seed: int):  # noqa: ANN202
    idx = internals.log(store).index
    ids = np.random.default_rng(seed).choice(store.sampleable_ids(), b)
    return idx.plan(idx.slots_of(ids))


def _reference(store: mr.ReplayStore) -> FrameReader:
    ring = internals.log(store).ring
    return FrameReader(ring.arrays["obs"], 1, False, ring=ring, native=False)  # numpy / numcodecs, one thread


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["raw", "lz4"]), b=st.integers(1, 40), chunks=st.integers(1, 64),
       wait=st.booleans(), seed=st.integers(0, 2**16))
def test_a_posted_read_is_the_one_thread_read(stores, kind, b, chunks, wait, seed):
    store = stores[kind]
    ring = internals.log(store).ring
    reader = FrameReader(ring.arrays["obs"], 2, False, ring=ring)
    reader.CHUNKS = chunks
    one = _reference(store)
    try:
        for i in range(3):  # the helper's second and third tasks too
            plan = _plan(store, b, seed + i)
            posted = reader.post_stacks(plan.obs_slots, plan.next_slots)
            assert posted is not None
            if wait:  # the helper reads every row; the join only waits
                assert finished_by_helpers(posted.helper, posted.task)
            got = reader.join_stacks(posted)
            want = one.stacks(plan.obs_slots, plan.next_slots)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)
            again = reader.join_stacks(posted)  # joining twice: the same arrays
            assert again[0] is got[0] or np.shares_memory(again[0], got[0])
    finally:
        reader.close()
        one.close()


def test_many_tasks_racing_the_helper_read_right(stores):
    """Compressed frames (the decoder writes scratch bytes past a match): each row read by one thread only."""
    store = stores["lz4"]
    ring = internals.log(store).ring
    reader = FrameReader(ring.arrays["obs"], 2, False, ring=ring)
    one = _reference(store)
    rng = np.random.default_rng(5)
    try:
        for i in range(300):
            plan = _plan(store, int(rng.integers(1, 64)), i)
            posted = reader.post_stacks(plan.obs_slots, plan.next_slots)
            assert posted is not None
            if i % 3 == 1:
                time.sleep(float(rng.uniform(0, 2e-4)))  # the helper gets a head start of any length
            got = reader.join_stacks(posted)
            want = one.stacks(plan.obs_slots, plan.next_slots)
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), i
    finally:
        reader.close()
        one.close()


def _damaged_read(s: mr.ReplayStore, target: str, row: int) -> tuple[FrameReader, np.ndarray, np.ndarray]:
    """A reader of ``s``'s frames with two helpers, and the stacks of a read whose obs holds the damaged frame
    (row 13) and of an intact read (``good``)."""
    ring = internals.log(s).ring
    bad, good = damaged_slots(s, target, row)
    good = good[:40].reshape(20, 2)
    obs = good.copy()
    obs[13, 1] = bad
    return FrameReader(ring.arrays["obs"], 2, False, ring=ring), obs, good


def test_a_damaged_frame_in_a_posted_read_is_reported(tmp_path):
    path = tmp_path / "s"
    target, row = damaged_store(str(path))
    with mr.ReplayStore.open(path, mode="r") as s:
        reader, obs, good = _damaged_read(s, target, row)
        try:
            posted = reader.post_stacks(obs, good)
            assert posted is not None
            for _ in range(2):  # the error, each time the read is joined
                with pytest.raises(mr.CorruptStoreError, match=f"{target}: frame {row} is damaged"):
                    reader.join_stacks(posted)
            posted = reader.post_stacks(good, good)  # the reader goes on serving the frames that are intact
            assert posted is not None
            o, n = reader.join_stacks(posted)
            np.testing.assert_array_equal(o, n)
            np.testing.assert_array_equal(o, _reference(s).stacks(good, good)[0])
        finally:
            reader.close()


def test_a_posted_read_s_damage_is_reported_after_another_read_went_through_the_helpers(tmp_path):
    """A read shared with the helpers between a post and its join (a ``sample()`` between two ``next()``) settles
    the posted read first: its error is kept for its join, not lost with the helpers' error slots."""
    path = tmp_path / "s"
    target, row = damaged_store(str(path))
    with mr.ReplayStore.open(path, mode="r") as s:
        reader, obs, good = _damaged_read(s, target, row)
        reader.SHARE = True  # (reads shared with the helpers, as the reader chooses where that is faster)
        reader.MIN_SHARED_BYTES = 0
        try:
            posted = reader.post_stacks(obs, good)
            assert posted is not None
            o, n = reader.stacks(good, good)  # an intact read in between, through the helpers
            np.testing.assert_array_equal(o, _reference(s).stacks(good, good)[0])
            for _ in range(2):
                with pytest.raises(mr.CorruptStoreError, match=f"{target}: frame {row} is damaged"):
                    reader.join_stacks(posted)
        finally:
            reader.close()


def test_a_posted_gather_into_the_callers_array_is_the_one_thread_read_and_reports_damage(tmp_path):
    """``post_gather`` (the distinct frames of a device feed's batch, read into its host buffer): the frames of
    one thread's read; a damaged frame among them is reported at each join, and the reader goes on."""
    path = tmp_path / "s"
    target, row = damaged_store(str(path))
    with mr.ReplayStore.open(path, mode="r") as s:
        ring = internals.log(s).ring
        bad, good = damaged_slots(s, target, row)
        good = np.ascontiguousarray(good[:40])
        reader = FrameReader(ring.arrays["obs"], 2, False, ring=ring)
        try:
            assert reader.may_post()
            out = np.full((good.size,) + ring.arrays["obs"].shape[1:], 7, ring.arrays["obs"].dtype)
            posted = reader.post_gather(good, out)
            assert reader.join_gather(posted) is out
            np.testing.assert_array_equal(out, _reference(s).gather(good))
            slots = good.copy()
            slots[29] = bad
            posted = reader.post_gather(slots, np.empty_like(out))
            for _ in range(2):
                with pytest.raises(mr.CorruptStoreError, match=f"{target}: frame {row} is damaged"):
                    reader.join_gather(posted)
            with pytest.raises(ValueError, match="out: expected a C-contiguous"):
                reader.post_gather(good, out[:-1])
            posted = reader.post_gather(good, out)
            np.testing.assert_array_equal(reader.join_gather(posted), _reference(s).gather(good))
        finally:
            reader.close()


@pytest.mark.parametrize("kind", ["raw", "lz4"])
def test_batches_posting_hand_out_the_sampled_batches(tmp_path, kind):
    a = _atari_store(str(tmp_path / "a"), None if kind == "raw" else "lz4")
    b = _atari_store(str(tmp_path / "b"), None if kind == "raw" else "lz4")
    try:
        want = [a.sample(16) for _ in range(80)]
        it = b.batches(16, prefetch=2)
        it.AWAY = 3600.0  # (a thread held up by other work: the prefetch thread would take batches)
        internals.reader(b)._gate.SLOWER = 1e9  # (joins slowed by other work: posting would rest)
        got = []
        for i in range(80):  # a tight loop (the caller keeps coming back: posting, not the prefetch thread)
            got.append(next(it))
            if i % 20 == 10:
                time.sleep(0.003)  # a learner's step: the helper reads the next batch alone
        assert internals.reader(b)._gate.posts >= 60  # (the first batch of an iterator is read in the caller's thread)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            for name in ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index"):
                np.testing.assert_array_equal(getattr(g, name), getattr(w, name), err_msg=f"{name} {i}")
        it.close()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("what", ["sequences", "sequences-distinct", "distinct"])
@pytest.mark.parametrize("kind", ["raw", "lz4"])
def test_sequence_and_distinct_frame_batches_posting_hand_out_the_sampled_ones(tmp_path, kind, what):
    """``sequence_batches()`` (states, or distinct frames) and ``batches(frames="distinct")`` post their frames
    to the helpers as ``batches()`` does, and hand out what ``sample_sequences()``/``sample()`` give."""
    a = _atari_store(str(tmp_path / "a"), None if kind == "raw" else "lz4")
    b = _atari_store(str(tmp_path / "b"), None if kind == "raw" else "lz4")
    try:
        sequences = what.startswith("sequences")
        frames = "distinct" if what.endswith("distinct") else "stacks"
        want = [a.sample_sequences(8, 12) if sequences else a.sample(16) for _ in range(40)]
        it = b.sequence_batches(8, 12, frames=frames) if sequences else b.batches(16, frames=frames)
        it.AWAY = 3600.0  # (as above)
        gate = internals.reader(b)._gate
        gate.SLOWER = 1e9
        got = []
        for i in range(40):
            got.append(next(it))
            if i % 10 == 5:
                time.sleep(0.003)
        it.close()
        assert gate.posts >= 30
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            g = g.to_batch() if frames == "distinct" else g
            for name in ("obs", "action", "reward", "terminated", "truncated", "index", "weight"):
                np.testing.assert_array_equal(getattr(g, name), getattr(w, name), err_msg=f"{name} {i}")
            if not sequences:
                np.testing.assert_array_equal(g.next_obs, w.next_obs, err_msg=f"next_obs {i}")
    finally:
        a.close()
        b.close()


def test_an_iterator_dropped_with_a_posted_read_frees_and_unmaps_nothing_in_use(tmp_path):
    s = _atari_store(str(tmp_path / "s"), "lz4", capacity=300)
    frames = atari_frames("breakout")
    try:
        for _ in range(5):
            it = s.batches(32, prefetch=2)
            for _ in range(50):  # (the prefetch thread may take a batch first when this thread is held up)
                next(it)
                if it._posted is not None:
                    break
            assert it._posted is not None  # the next batch's frames are being read
            del it
            gc.collect()
            for t in range(200):  # evicts and unmaps chunks, reuses output buffers
                s.step(1, 0.0, frames[t], t % 50 == 49, False)
                if t % 50 == 49:
                    s.reset(frames[t])
            s.sample(32)
        s.commit()
    finally:
        s.close()
    assert not any(t.name == "mmreplay-read" and t.is_alive() for t in threading.enumerate())


def _child_batches(path: str, q: multiprocessing.Queue) -> None:
    with mr.ReplayStore.open(path, mode="r", seed=3) as s:
        it = s.batches(16, prefetch=2)
        got = [next(it) for _ in range(5)]
        q.put(([g.obs.tobytes() for g in got], internals.reader(s)._gate.posts))


def test_a_forked_child_posts_with_its_own_helper(stores, tmp_path):
    store = stores["raw"]
    it = store.batches(16, prefetch=2)
    for _ in range(3):
        next(it)
    assert internals.reader(store)._gate.posts > 0  # this process's helpers are running
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_batches, args=(store.path, q))
    p.start()
    obs, posts = q.get(timeout=60)
    p.join(60)
    it.close()
    assert p.exitcode == 0 and posts > 0
    with mr.ReplayStore.open(store.path, mode="r", seed=3) as s:
        assert obs == [s.sample(16).obs.tobytes() for _ in range(5)]


def test_no_posting_where_there_are_no_helpers(stores):
    store = stores["raw"]
    plan = _plan(store, 8, 0)
    ring = internals.log(store).ring
    reader = FrameReader(ring.arrays["obs"], 1, False, ring=ring)  # one thread: the caller reads alone
    assert reader.post_stacks(plan.obs_slots, plan.next_slots) is None
    reader.close()


def test_posting_stops_while_joins_cost_more_than_plain_reads():
    gate = PostGate()
    plain = [1.0, 3.0]  # the reader's ways: per byte
    for _ in range(gate.UNTIMED):
        assert gate.open()
        gate.joined(100.0, plain)  # a helper waking up: not counted
    assert gate.times_off == 0
    for _ in range(50):
        assert gate.open()
        gate.joined(0.5, plain)  # joins cheaper than the plain read: go on posting
    assert gate.times_off == 0
    while gate.times_off == 0:
        assert gate.open()
        gate.joined(4.0, plain)  # the cores got busy elsewhere
    assert [gate.open() for _ in range(gate.OFF)] == [False] * gate.OFF
    assert gate.open()  # then tried again
    gate.joined(4.0, [0.0, 0.0])  # nothing to compare with: on
    assert gate.open()


def test_two_threads_posting_through_one_reader_each_get_their_frames(stores):
    store = stores["lz4"]
    ring = internals.log(store).ring
    reader = FrameReader(ring.arrays["obs"], 2, False, ring=ring)
    plans = [[_plan(store, 8 + t, 100 * t + i) for i in range(100)] for t in range(2)]
    want = [[_reference(store).stacks(p.obs_slots, p.next_slots) for p in ps] for ps in plans]
    bad: list[tuple[int, int]] = []

    def run(t: int) -> None:
        for i, p in enumerate(plans[t]):
            posted = reader.post_stacks(p.obs_slots, p.next_slots)
            if posted is None:
                bad.append((t, -i))
                continue
            got = reader.join_stacks(posted)
            if not all(np.array_equal(g, w) for g, w in zip(got, want[t][i], strict=True)):
                bad.append((t, i))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    reader.close()
    assert bad == []
