"""Frames read by one parallel launch (``native.parallel``) are the frames read in one thread, and the
launcher's rules hold: an unsafe threading layer is used once and never again, a forked child of a
process that launched reads in its own thread, a thread that finds another launching reads alone."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest
from compression_helpers import atari_frames
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compression import _compressed_chunk, _flip, drive

import mmreplay as mr
from mmreplay.native import lz4, parallel
from mmreplay.reader import FrameReader
from mmreplay.storage import framefile


def atari_store(path: str, compression: str | None, capacity: int = 600, game: str = "seaquest",
                truncate_every: int = 0) -> mr.ReplayStore:
    """700 real frames of ``game`` in episodes ending every 97 steps (and truncated every
    ``truncate_every`` steps), committed."""
    frames = atari_frames(game)[:700]
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=frames.shape[1:], stack=4, n_step=3, chunk_size=64,
                              compression=compression, seed=0)
    s.reset(frames[0])
    for t in range(1, len(frames)):
        end = t % 97 == 0
        cut = not end and truncate_every > 0 and t % truncate_every == 0
        s.step(t % 4, float(t % 3), frames[t], end, cut)
        if end or cut:
            s.reset(frames[t])
    s.commit()
    return s


@pytest.fixture(scope="module")
def stores(tmp_path_factory):  # noqa: ANN201
    root = tmp_path_factory.mktemp("parallel")
    made = {kind: atari_store(str(root / kind), None if kind == "raw" else "lz4") for kind in ("raw", "lz4")}
    assert made["lz4"]._parts.log.ring.compressed  # sealed chunks whose frames are read compressed
    yield made
    for s in made.values():
        s.close()


def _readers(store: mr.ReplayStore, threads: int) -> tuple[FrameReader, FrameReader]:
    ring = store._parts.log.ring
    fast = FrameReader(ring.arrays["obs"], threads, False, ring=ring)
    fast.MIN_PART_BYTES = 1  # split even one row
    one = FrameReader(ring.arrays["obs"], 1, False, ring=ring, native=False)  # numpy / numcodecs, one thread
    return fast, one


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["raw", "lz4"]), b=st.integers(1, 40), threads=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_a_parallel_read_is_the_one_thread_read(stores, kind, b, threads, seed):
    store = stores[kind]
    idx = store._parts.log.index
    ids = np.random.default_rng(seed).choice(store.sampleable_ids(), b)
    plan = idx.plan(idx.slots_of(ids))
    fast, one = _readers(store, threads)
    before = parallel.CORES.launches
    got = fast.stacks(plan.obs_slots, plan.next_slots)
    want = one.stacks(plan.obs_slots, plan.next_slots)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    slots = plan.stacks.reshape(2, -1)[:, :b * 3]  # a 2-D slot array of another length
    np.testing.assert_array_equal(fast.gather(slots), one.gather(slots))
    if threads > 1 and parallel.CORES.threads(threads) > 1:
        assert parallel.CORES.launches >= before + 1 + (b > 1)  # (stacks of one row: one part)
    fast.close()
    one.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["raw", "lz4"]), b=st.integers(1, 40), cuts=st.lists(st.integers(0, 40), max_size=6),
       seed=st.integers(0, 2**16))
def test_parts_that_take_each_others_rows_read_every_row_once(stores, kind, b, cuts, seed):
    """``parallel.gather_pairs`` with any split into parts (empty ones too, more parts than threads): parts that
    finish early take the rows of the others from the back, and the output is the one-thread kernel's."""
    store = stores[kind]
    idx = store._parts.log.index
    ids = np.random.default_rng(seed).choice(store.sampleable_ids(), b)
    plan = idx.plan(idx.slots_of(ids))
    reader = FrameReader(store._parts.log.ring.arrays["obs"], 2, False, ring=store._parts.log.ring)
    args = reader._kernel_args()
    bounds = np.array([0, *sorted(min(c, b) for c in cuts), b], np.int64)
    frame = store._parts.log.ring.arrays["obs"].shape[1:]
    got = np.full((2, b, 4, *frame), 7, np.uint8)
    want = np.zeros_like(got)
    res = parallel.gather_pairs(plan.obs_slots, plan.next_slots, bounds, got.reshape(-1), *args)
    assert res.shape == (bounds.size - 1, 2) and not res.any()
    assert lz4.gather_pairs(plan.obs_slots, plan.next_slots, 0, b, want.reshape(-1), *args) == (0, 0)
    np.testing.assert_array_equal(got, want)
    reader.close()


def damaged_store(path: str) -> tuple[str, int]:
    """A small store at ``path`` with one compressed frame damaged: its file and row."""
    with mr.ReplayStore.create(path, capacity=200, obs_shape=(8, 8), stack=2, n_step=2, chunk_size=32,
                               seed=0) as s:
        drive([s], 150, 2, ends=0.02)
    _, target = _compressed_chunk(str(path))
    buf = framefile.read_file(target)
    records = framefile.read_records(target, buf, 32)
    row = int(np.flatnonzero((records["length"] < 64) & (records["length"] > 8))[0])
    _flip(target, int(records[row]["offset"]) + 6)
    return target, row


def damaged_slots(s: mr.ReplayStore, target: str, row: int) -> tuple[int, np.ndarray]:
    """The damaged frame's slot, and slots of intact frames."""
    ring = s._parts.log.ring
    seq = next(q for q, name in ring.mapped.items() if target.endswith(f"{name}.obs.lz4"))
    bad = (seq % ring.positions) * ring.rows_alloc + row
    good = np.array([q * ring.rows_alloc + r for q in range(ring.positions) for r in range(20)
                     if ring.frame_kind[q] >= 0 and q * ring.rows_alloc + r != bad])
    return bad, good


@pytest.mark.parametrize("last", [False, True])
def test_a_damaged_frame_in_any_part_is_reported(tmp_path, last):
    path = tmp_path / "s"
    target, row = damaged_store(str(path))
    with mr.ReplayStore.open(path, mode="r") as s:
        bad, good = damaged_slots(s, target, row)
        slots = np.append(good, bad) if last else np.insert(good, 0, bad)
        fast, _ = _readers(s, 2)
        before = parallel.CORES.launches
        with pytest.raises(mr.CorruptStoreError, match=f"{target}: frame {row} is damaged"):
            fast.gather(slots)
        assert parallel.CORES.launches == before + (parallel.CORES.threads(2) > 1)
        fast.gather(good)  # the reader goes on serving the frames that are intact
        fast.close()


@pytest.mark.parametrize("where", [0, 5, 19, 39])
def test_a_damaged_frame_in_any_row_of_a_batch_of_stacks_is_reported(tmp_path, where):
    path = tmp_path / "s"
    target, row = damaged_store(str(path))
    with mr.ReplayStore.open(path, mode="r") as s:
        bad, good = damaged_slots(s, target, row)
        obs = np.resize(good, (40, 2)).astype(np.int64)
        obs[where, 1] = bad
        nxt = np.roll(obs, -1, axis=0)
        fast, _ = _readers(s, 2)
        with pytest.raises(mr.CorruptStoreError, match=f"{target}: frame {row} is damaged"):
            fast.stacks(obs, nxt)
        obs[where, 1] = good[0]
        a, b = fast.stacks(obs, np.roll(obs, -1, axis=0))  # the reader goes on serving the frames that are intact
        np.testing.assert_array_equal(a[1:], b[:-1])
        fast.close()


def test_a_thread_that_finds_another_launching_reads_alone(stores):
    store = stores["lz4"]
    idx = store._parts.log.index
    plan = idx.plan(idx.slots_of(store.sampleable_ids()[:32]))
    fast, one = _readers(store, 2)
    assert parallel.CORES.begin(2)  # another thread's launch in progress
    try:
        before = parallel.CORES.launches
        got = fast.stacks(plan.obs_slots, plan.next_slots)
        assert parallel.CORES.launches == before
    finally:
        parallel.CORES.end(2)
    for g, w in zip(got, one.stacks(plan.obs_slots, plan.next_slots), strict=True):
        np.testing.assert_array_equal(g, w)


def test_an_unsafe_threading_layer_is_launched_once(monkeypatch):
    cores = parallel.Cores()
    monkeypatch.setattr(parallel.nb, "threading_layer", lambda: "workqueue")
    assert cores.usable and cores.begin(2)
    cores.end(2)
    assert not cores.usable and not cores.begin(2)


def test_a_safe_threading_layer_stays_usable(monkeypatch):
    cores = parallel.Cores()
    monkeypatch.setattr(parallel.nb, "threading_layer", lambda: "omp")
    assert cores.begin(2)
    cores.end(2)
    assert cores.usable and cores.begin(2)
    cores.end(2)


def _child_sample(path: str, q: multiprocessing.Queue) -> None:
    with mr.ReplayStore.open(path, mode="r", seed=3) as s:
        b = s.sample(32)
        q.put((parallel.CORES.usable, parallel.CORES.launches, b.obs.tobytes(), b.next_obs.tobytes()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX-only")
def test_a_forked_child_of_a_launching_process_reads_in_its_own_thread(stores):
    path = stores["lz4"].path
    with mr.ReplayStore.open(path, mode="r", seed=3) as s:
        want = s.sample(32)
    launched = parallel.CORES.launches > 0
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_sample, args=(path, q))
    p.start()
    usable, launches, obs, nxt = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    assert obs == want.obs.tobytes() and nxt == want.next_obs.tobytes()
    if launched:  # (always, where numba has a safe layer)
        assert not usable


@pytest.mark.parametrize("policy, usable", [("passive", False), (" PASSIVE ", False), ("active", True), ("", True)])
def test_openmp_threads_that_sleep_between_launches_are_not_launched(monkeypatch, policy, usable):
    monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    assert parallel.Cores().usable is usable


def test_only_the_first_launching_thread_launches_while_it_lives(monkeypatch):
    import threading

    cores = parallel.Cores()
    monkeypatch.setattr(parallel.nb, "threading_layer", lambda: "omp")
    release, launched = threading.Event(), threading.Event()

    def first() -> None:
        assert cores.begin(2)
        cores.end(2)
        launched.set()
        release.wait(30)

    t = threading.Thread(target=first)
    t.start()
    assert launched.wait(30)
    assert not cores.begin(2)  # the first launcher is alive: this thread reads in its own thread
    release.set()
    t.join(30)
    assert cores.begin(2)  # it ended: this thread launches from now on
    cores.end(2)
    assert cores.usable


def test_a_second_thread_reads_the_same_frames_without_launching(stores):
    import threading

    store = stores["raw"]
    idx = store._parts.log.index
    plan = idx.plan(idx.slots_of(store.sampleable_ids()[:32]))
    fast, one = _readers(store, 2)
    fast.stacks(plan.obs_slots, plan.next_slots)  # this thread launches (or launched before)
    before = parallel.CORES.launches
    got: list = []
    t = threading.Thread(target=lambda: got.append(fast.stacks(plan.obs_slots, plan.next_slots)))
    t.start()
    t.join(60)
    assert parallel.CORES.launches == before
    for g, w in zip(got[0], one.stacks(plan.obs_slots, plan.next_slots), strict=True):
        np.testing.assert_array_equal(g, w)


def test_the_faster_way_is_used_and_the_other_is_tried_now_and_then():
    from mmreplay.reader import WayChooser

    w = WayChooser()
    avg, measured, untimed = w.AVERAGE, w.MEASURED, w.UNTIMED
    # the first launch (it starts the threads) is not timed; then launches, then the other way once
    assert [w.pick() for _ in range(4)] == [(0, untimed), (0, avg), (0, avg), (1, measured)]
    w.record(0, 1e-3, 1000, avg)
    w.record(1, 2e-3, 1000, measured)
    picks = [w.pick() for _ in range(2 * w.PROBE)]
    probes = [i for i, (_, how) in enumerate(picks) if how != avg]
    assert all(p == (0, avg) for i, p in enumerate(picks) if i not in probes)
    assert len(probes) == 2 and all(picks[i] == (1, measured) for i in probes)
    for _ in range(60):  # launches turn slow (other processes keep the cores busy): averaged in
        w.record(0, 5e-3, 1000, avg)
    w.record(0, 1.0, 1000, untimed)  # (an untimed read changes nothing)
    assert w.cost[0] < 5e-6
    picks = [w.pick() for _ in range(w.PROBE + 2)]
    assert {p for p in picks} == {(1, avg), (0, untimed), (0, measured)}
    wake = picks.index((0, untimed))  # a probe of launching: the first wakes the threads, the second is timed
    assert picks[wake + 1] == (0, measured)
    w.record(0, 0.5e-3, 1000, measured)  # taken as measured: launching is faster again
    assert w.pick() == (0, avg)


def test_a_reader_whose_launches_are_slow_reads_the_same_frames_without_launching(stores):
    store = stores["lz4"]
    idx = store._parts.log.index
    plan = idx.plan(idx.slots_of(store.sampleable_ids()[:32]))
    fast, one = _readers(store, 2)
    fast._ways.cost = [1.0, 1e-9]  # as measured under load: the other way is faster
    fast._ways.reads = 1
    before = parallel.CORES.launches
    got = fast.stacks(plan.obs_slots, plan.next_slots)
    assert parallel.CORES.launches == before
    assert fast._ways.cost[1] != 1e-9  # the read was timed
    for g, w in zip(got, one.stacks(plan.obs_slots, plan.next_slots), strict=True):
        np.testing.assert_array_equal(g, w)
