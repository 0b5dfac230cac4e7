"""Frames read by the calling thread together with helper threads (``native.crew``) are the frames read in one
thread, whoever reads which rows; helpers sleep when there is nothing to read; the reader shares a read only
while that measures faster; its thread count follows the CPUs the process may use; a forked child reads
with helpers of its own."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from mmreplay.native import crew
from mmreplay.native.codes import FLAT, PAIRS
from mmreplay.reading.reader import FrameReader
from mmreplay.reading.readpolicy import WayChooser, cgroup_cpu_quota, usable_cpus
from tests._support import internals
from tests._support.crew import atari_store, damaged_slots, damaged_store, finished_by_helpers


@pytest.fixture(scope="module")
def stores(tmp_path_factory):  # noqa: ANN201
    root = tmp_path_factory.mktemp("crew")
    made = {kind: atari_store(str(root / kind), None if kind == "raw" else "lz4") for kind in ("raw", "lz4")}
    assert internals.log(made["lz4"]).ring.compressed  # sealed chunks whose frames are read compressed
    yield made
    for s in made.values():
        s.close()


def _readers(store: mr.ReplayStore, threads: int) -> tuple[FrameReader, FrameReader]:
    ring = internals.log(store).ring
    fast = FrameReader(ring.arrays["obs"], threads, False, ring=ring)
    fast.SHARE = True  # every read shared with the helpers, even one of a few rows
    fast.MIN_SHARED_BYTES = 1
    one = FrameReader(ring.arrays["obs"], 1, False, ring=ring, native=False)  # numpy / numcodecs, one thread
    return fast, one


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["raw", "lz4"]), b=st.integers(1, 40), threads=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_a_shared_read_is_the_one_thread_read(stores, kind, b, threads, seed):
    store = stores[kind]
    idx = internals.log(store).index
    ids = np.random.default_rng(seed).choice(store.sampleable_ids(), b)
    plan = idx.plan(idx.slots_of(ids))
    fast, one = _readers(store, threads)
    got = fast.stacks(plan.obs_slots, plan.next_slots)
    want = one.stacks(plan.obs_slots, plan.next_slots)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    slots = plan.stacks.reshape(2, -1)[:, :b * 3]  # a 2-D slot array of another length
    np.testing.assert_array_equal(fast.gather(slots), one.gather(slots))
    if threads > 1 and b > 1 and crew.SUPPORTED:
        assert fast._crew.threads == threads - 1  # the reads were posted to the helpers
    fast.close()
    one.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["raw", "lz4"]), b=st.integers(2, 40), helpers=st.integers(1, 3),
       chunks=st.integers(1, 64), flat=st.booleans(), seed=st.integers(0, 2**16))
def test_rows_read_by_the_helpers_alone_are_the_one_thread_read(stores, kind, b, helpers, chunks, flat, seed):
    """The caller joins only once the helpers have read every chunk (it reads none): their rows are right."""
    if not crew.SUPPORTED:
        pytest.skip("helpers sleep on a Linux futex")
    store = stores[kind]
    idx = internals.log(store).index
    plan = idx.plan(idx.slots_of(np.random.default_rng(seed).choice(store.sampleable_ids(), b)))
    ring = internals.log(store).ring
    reader = FrameReader(ring.arrays["obs"], helpers + 1, False, ring=ring)
    reader.CHUNKS = chunks
    one = FrameReader(ring.arrays["obs"], 1, False, ring=ring, native=False)
    c = reader._crew
    try:
        for _ in range(3):  # the helpers' second and third tasks too
            if flat:
                slots = np.ascontiguousarray(plan.stacks.reshape(-1), np.int64)
                out = np.zeros((slots.size,) + ring.arrays["obs"].shape[1:], np.uint8)
                task = c.post(reader._fields(FLAT, slots, None, slots.size, out), slots.size, None)
                want = one.gather(slots)
            else:
                obs = np.ascontiguousarray(plan.obs_slots, np.int64)
                nxt = np.ascontiguousarray(plan.next_slots, np.int64)
                out = np.zeros((2, b, 4) + ring.arrays["obs"].shape[1:], np.uint8)
                task = c.post(reader._fields(PAIRS, obs, nxt, b, out), b, None)
                want = np.stack(one.stacks(plan.obs_slots, plan.next_slots))
            assert finished_by_helpers(c, task)
            assert c.join(task) == (0, 0, 0)  # nothing left for the caller
            np.testing.assert_array_equal(out, want)
    finally:
        reader.close()
        one.close()


def test_many_reads_racing_the_helpers_read_right(stores):
    """Compressed frames (the decoder writes scratch bytes past a match): each row read by one thread only."""
    store = stores["lz4"]
    idx = internals.log(store).index
    fast, one = _readers(store, 3)
    rng = np.random.default_rng(5)
    try:
        for i in range(300):
            b = int(rng.integers(1, 64))
            plan = idx.plan(idx.slots_of(rng.choice(store.sampleable_ids(), b)))
            got = fast.stacks(plan.obs_slots, plan.next_slots)
            want = one.stacks(plan.obs_slots, plan.next_slots)
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), i
    finally:
        fast.close()
        one.close()


def _thread_cpu(tid: int) -> float:
    """CPU seconds of thread ``tid`` of this process (utime + stime from /proc)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not crew.SUPPORTED, reason="helpers sleep on a Linux futex")
def test_idle_helpers_sleep(stores):
    """After a burst of shared reads, the helpers use no CPU while nothing is posted (no spinning)."""
    store = stores["lz4"]
    idx = internals.log(store).index
    plan = idx.plan(idx.slots_of(store.sampleable_ids()[:32]))
    fast, one = _readers(store, 3)
    try:
        for _ in range(200):
            fast.stacks(plan.obs_slots, plan.next_slots)
        tids = [t.native_id for t in fast._crew._threads]
        assert len(tids) == 2 and all(tids)
        before = [_thread_cpu(t) for t in tids]
        time.sleep(1.0)
        after = [_thread_cpu(t) for t in tids]
        assert max(a - b for a, b in zip(after, before, strict=True)) <= 0.02  # clock ticks: 10 ms each
        got = fast.stacks(plan.obs_slots, plan.next_slots)  # and they wake up for the next read
        np.testing.assert_array_equal(got[1], one.stacks(plan.obs_slots, plan.next_slots)[1])
    finally:
        fast.close()
        one.close()
    assert not any(t.name == "mmreplay-read" and t.native_id in tids and t.is_alive() for t in threading.enumerate())


@pytest.mark.skipif(not crew.SUPPORTED or len(os.sched_getaffinity(0)) < 2, reason="needs helpers and 2 CPUs")
def test_helpers_are_kept_off_the_cpu_of_the_thread_that_posts(stores):
    """A posted read's helpers may run on every CPU the posting thread may use but the one it runs on (the
    scheduler may otherwise put a woken helper on the poster's CPU, to take turns with it), following the
    poster to another CPU and to a new affinity; the frames read are the same."""
    store = stores["lz4"]
    idx = internals.log(store).index
    plan = idx.plan(idx.slots_of(store.sampleable_ids()[:32]))
    fast, one = _readers(store, 3)
    want = one.stacks(plan.obs_slots, plan.next_slots)
    seen: list[tuple[set[int], int, list[set[int]]]] = []

    def post_from(cpus: set[int] | None) -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)  # (this thread only)
            fast._crew.limit(fast._crew.helpers)  # (what the reader does when it looks at its CPUs again)
        got = fast.stacks(plan.obs_slots, plan.next_slots)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
        helpers = [os.sched_getaffinity(t.native_id) for t in fast._crew._threads]
        seen.append((os.sched_getaffinity(0), fast._crew._off, helpers))

    try:
        post_from(None)
        two = set(sorted(os.sched_getaffinity(0))[-2:])
        t = threading.Thread(target=post_from, args=(two,))
        t.start()
        t.join()
    finally:
        fast.close()
        one.close()
    assert len(seen) == 2
    for allowed, off, helpers in seen:
        assert off in allowed
        assert len(helpers) == 2 and all(h == allowed - {off} for h in helpers)
    assert seen[1][0] == two and seen[1][2][0] < two  # the second poster's CPUs, less the one it was on


@pytest.mark.parametrize("last", [False, True])
def test_a_damaged_frame_in_any_part_is_reported(tmp_path, last):
    path = tmp_path / "s"
    target, row = damaged_store(str(path))
    with mr.ReplayStore.open(path, mode="r") as s:
        bad, good = damaged_slots(s, target, row)
        slots = np.append(good, bad) if last else np.insert(good, 0, bad)
        fast, _ = _readers(s, 2)
        with pytest.raises(mr.CorruptStoreError, match=f"{target}: frame {row} is damaged"):
            fast.gather(slots)
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


def _child_reads(path: str, q: multiprocessing.Queue) -> None:
    with mr.ReplayStore.open(path, mode="r", seed=3) as s:
        internals.reader(s).SHARE = True
        got = [s.sample(32).obs.tobytes() for _ in range(5)]
        q.put((got, internals.reader(s)._crew.threads if internals.reader(s)._crew is not None else -1))


def test_a_forked_child_of_a_sharing_process_reads_with_its_own_helpers(stores):
    store = stores["raw"]
    internals.reader(store).SHARE = True
    try:
        for _ in range(20):
            store.sample(32)  # this process's helpers are running
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_child_reads, args=(store.path, q))
        p.start()
        obs, threads = q.get(timeout=60)
        p.join(60)
    finally:
        internals.reader(store).SHARE = None
    assert p.exitcode == 0
    assert threads == (internals.reader(store).threads - 1 if crew.SUPPORTED else -1)
    with mr.ReplayStore.open(store.path, mode="r", seed=3) as s:
        assert obs == [s.sample(32).obs.tobytes() for _ in range(5)]


def test_a_second_thread_reads_the_same_frames(stores):
    store = stores["raw"]
    idx = internals.log(store).index
    plan = idx.plan(idx.slots_of(store.sampleable_ids()[:32]))
    fast, one = _readers(store, 2)
    fast.stacks(plan.obs_slots, plan.next_slots)
    got: list = []
    t = threading.Thread(target=lambda: got.append(fast.stacks(plan.obs_slots, plan.next_slots)))
    t.start()
    t.join(60)
    for g, w in zip(got[0], one.stacks(plan.obs_slots, plan.next_slots), strict=True):
        np.testing.assert_array_equal(g, w)
    fast.close()
    one.close()


def test_the_faster_way_is_used_and_the_other_is_tried_now_and_then():
    w = WayChooser()
    avg, measured, untimed = w.AVERAGE, w.MEASURED, w.UNTIMED
    # the first shared read (it starts the helpers) is not timed; then shared reads, then alone once
    assert [w.pick() for _ in range(4)] == [(0, untimed), (0, avg), (0, avg), (1, measured)]
    w.record(0, 1e-3, 1000, avg)
    w.record(1, 2e-3, 1000, measured)
    picks = [w.pick() for _ in range(2 * w.PROBE)]
    probes = [i for i, (_, how) in enumerate(picks) if how != avg]
    assert all(p == (0, avg) for i, p in enumerate(picks) if i not in probes)
    assert len(probes) == 2 and all(picks[i] == (1, measured) for i in probes)
    for _ in range(60):  # shared reads turn slow (other processes keep the cores busy): averaged in
        w.record(0, 5e-3, 1000, avg)
    w.record(0, 1.0, 1000, untimed)  # (an untimed read changes nothing)
    assert w.cost[0] < 5e-6
    picks = [w.pick() for _ in range(w.PROBE + 2)]
    assert {p for p in picks} == {(1, avg), (0, measured)}
    w.record(0, 0.5e-3, 1000, measured)  # taken as measured: sharing is faster again
    assert w.pick() == (0, avg)


def test_shared_reads_must_save_enough_time_to_be_worth_their_cpu():
    w = WayChooser()
    for _ in range(4):
        w.pick()
    alone = 2e-3
    w.record(1, alone, 1000, w.MEASURED)
    w.record(0, alone * (w.GAIN + 0.05), 1000, w.MEASURED)  # faster, but not by enough
    assert w.pick() == (1, w.AVERAGE)
    w.record(0, alone * (w.GAIN - 0.05), 1000, w.MEASURED)  # faster by more than the margin
    assert w.pick() == (0, w.AVERAGE)


def test_a_reader_whose_shared_reads_are_slow_reads_alone(stores):
    store = stores["lz4"]
    idx = internals.log(store).index
    plan = idx.plan(idx.slots_of(store.sampleable_ids()[:32]))
    ring = internals.log(store).ring
    fast = FrameReader(ring.arrays["obs"], 2, False, ring=ring)
    one = FrameReader(ring.arrays["obs"], 1, False, ring=ring, native=False)
    fast._ways.cost = [1.0, 1e-9]  # as measured under load: alone is faster
    fast._ways.reads = 1
    got = fast.stacks(plan.obs_slots, plan.next_slots)
    assert fast._ways.cost[1] != 1e-9  # the read was timed, alone
    assert fast._crew is None or fast._crew.threads == 0  # no helper was woken, or even started
    for g, w in zip(got, one.stacks(plan.obs_slots, plan.next_slots), strict=True):
        np.testing.assert_array_equal(g, w)
    fast.close()
    one.close()


def test_one_usable_cpu_means_no_helpers():
    """The reader's threads follow the CPUs the process may use (its affinity), not the machine's count."""
    code = textwrap.dedent("""
        import os
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        from mmreplay.reading.reader import FrameReader
        from mmreplay.reading.readpolicy import default_threads, usable_cpus
        import numpy as np
        r = FrameReader(np.zeros((4, 8), np.uint8))
        print(usable_cpus(), default_threads(), r.threads, r._crew is None)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1", "1", "True"]
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("files", "want"), [
    ({"cgroup": "0::/a/b\n", "a/b/cpu.max": "150000 100000\n", "a/cpu.max": "max 100000\n"}, 1.5),
    ({"cgroup": "0::/a/b\n", "a/b/cpu.max": "max 100000\n", "a/cpu.max": "300000 100000\n"}, 3.0),
    ({"cgroup": "0::/a\n", "a/cpu.max": "max 100000\n"}, None),
    ({"cgroup": "4:cpu,cpuacct:/job\n", "cpu,cpuacct/job/cpu.cfs_quota_us": "50000\n",
      "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n"}, 0.5),
    ({"cgroup": "4:cpu,cpuacct:/job\n", "cpu,cpuacct/job/cpu.cfs_quota_us": "-1\n",
      "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n"}, None),
])
def test_the_cgroup_cpu_quota_is_read_from_v1_and_v2_hierarchies(tmp_path, files, want):
    root = tmp_path / "cg"
    for name, text in files.items():
        if name == "cgroup":
            continue
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (tmp_path / "cgroup").write_text(files["cgroup"])
    assert cgroup_cpu_quota(str(root), str(tmp_path / "cgroup")) == want


def test_a_missing_cgroup_file_system_means_no_quota(tmp_path):
    assert cgroup_cpu_quota(str(tmp_path / "none"), str(tmp_path / "none" / "cgroup")) is None
