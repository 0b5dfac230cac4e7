"""mr.RateLimit: samples per insert held across the writer and reader processes of a store (SEMANTICS.md,
"Rate limiting"): the two rules at every moment, waiting and timeouts, the immediate error of a process
that would wait on itself, and the counts across commits, reopenings, crashes and clear()."""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import signal
import time
from typing import Any

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.options import Schema

SPI, MIN, EB = 2.0, 10, 6.0


def _create(path, spi=SPI, min_size=MIN, eb=EB, timeout=0.0, **kw) -> mr.ReplayStore:
    s = mr.ReplayStore.create(path, capacity=kw.pop("capacity", 1000), obs_shape=(1,), chunk_size=64,
                              rate_limit=mr.RateLimit(spi, min_size, eb, timeout=timeout), **kw)
    if not s.episode_open.any():
        s.reset(np.zeros((s.num_envs, 1) if s.schema.vector else 1, np.uint8))
    return s


def _step(s: mr.ReplayStore, t: int = 0) -> None:
    s.step(0, 1.0, np.full(1, t % 256, np.uint8), False, False)


def _counts(s: mr.ReplayStore) -> tuple[int, int, int]:
    c = s.inspect()["rate_limit"]
    return c["inserted"], c["sampled"], c["size"]


# -- the option -------------------------------------------------------------------------------------------
def test_rate_limit_validates_and_round_trips(tmp_path):
    rl = mr.RateLimit(samples_per_insert=8, min_size=100, error_buffer=50, timeout=2)
    assert rl == mr.RateLimit.from_json(json.loads(json.dumps(rl.to_json())))
    assert rl.samples_per_insert == 8.0 and isinstance(rl.samples_per_insert, float)
    for kwargs, err, msg in [
        (dict(samples_per_insert=0, min_size=1, error_buffer=1), ValueError, r"samples_per_insert must be in \(0"),
        (dict(samples_per_insert=float("nan"), min_size=1, error_buffer=1), ValueError, "samples_per_insert"),
        (dict(samples_per_insert=1, min_size=0, error_buffer=1), ValueError, "min_size must be >= 1"),
        (dict(samples_per_insert=1, min_size=1.5, error_buffer=1), TypeError, "min_size must be an int"),
        (dict(samples_per_insert=1, min_size=1, error_buffer=-1), ValueError, "error_buffer"),
        (dict(samples_per_insert=1, min_size=1, error_buffer=1, timeout=-1), ValueError, "timeout"),
        (dict(samples_per_insert="8", min_size=1, error_buffer=1), TypeError, "samples_per_insert"),
    ]:
        with pytest.raises(err, match=msg):
            mr.RateLimit(**kwargs)
    s = mr.ReplayStore.create(tmp_path / "s", capacity=1000, obs_shape=(1,), n_step=3, rate_limit=rl)
    s.close()
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    assert r.schema.rate_limit == rl
    r.close()
    assert Schema.from_json(json.loads(json.dumps(r.schema.to_json()))) == r.schema


def test_create_refuses_limits_a_store_can_never_meet(tmp_path):
    with pytest.raises(ValueError, match="min_size=2,000 is more than capacity=1,000"):
        mr.ReplayStore.create(tmp_path / "a", capacity=1000, obs_shape=(1,), rate_limit=mr.RateLimit(1, 2000, 10))
    with pytest.raises(ValueError, match=r"error_buffer=10 is too small for n_step=3, num_envs=2.*error_buffer >= 48"):
        mr.ReplayStore.create(tmp_path / "b", capacity=1000, obs_shape=(1,), n_step=3, num_envs=2,
                              rate_limit=mr.RateLimit(8, 100, 10))
    with pytest.raises(TypeError, match="rate_limit must be mr.RateLimit"):
        mr.ReplayStore.create(tmp_path / "c", capacity=1000, obs_shape=(1,), rate_limit=(8, 100, 10))
    assert not any((tmp_path / n).exists() for n in "abc")


def test_no_limit_means_no_files_and_always_allowed(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(1,))
    assert not s.can_sample(1) and s.can_insert()  # nothing sampleable yet: sample() would raise
    s.reset(np.zeros(1, np.uint8))
    s.step(0, 1.0, np.zeros(1, np.uint8), True, False)
    assert s.can_sample(10**9) and s.can_insert()
    assert "rate_limit" not in s.inspect()
    assert not any(n.startswith("ratelimit") for n in os.listdir(tmp_path / "s"))
    s.close()


# -- the rules, in one process ------------------------------------------------------------------------------
def test_every_call_is_allowed_exactly_when_the_rules_say(tmp_path):
    """A random sequence of steps and samples of random sizes: each call goes through exactly when the two
    rules allow it (timeout=0: otherwise RateLimitTimeout at once), and can_* agree beforehand."""
    s = _create(tmp_path / "s", stack=1, n_step=1)  # every transition is sampleable at once: len == inserted
    rng = np.random.default_rng(7)
    inserted = sampled = 0
    allowed_samples = refused_samples = allowed_steps = refused_steps = 0
    for t in range(3000):
        if rng.random() < (0.9 if (t // 150) % 2 else 0.1):  # phases where the writer runs ahead, then readers
            ok = SPI * (inserted + 1) <= sampled + EB + SPI * MIN
            assert s.can_insert() == ok
            try:
                _step(s, t)
            except mr.RateLimitTimeout:
                assert not ok
                refused_steps += 1
            else:
                assert ok
                inserted += 1
                allowed_steps += 1
        else:
            b = int(rng.integers(1, 9))
            ok = inserted >= MIN and sampled + b <= SPI * inserted + EB
            assert s.can_sample(b) == ok
            try:
                batch = s.sample(b)
            except mr.RateLimitTimeout as exc:
                assert not ok and "waiting would never end" in str(exc)  # the writer waits on nobody but itself
                refused_samples += 1
            else:
                assert ok and len(batch) == b
                sampled += b
                allowed_samples += 1
        assert _counts(s)[:2] == (inserted, sampled)
        assert sampled <= SPI * inserted + EB and SPI * inserted <= sampled + EB + SPI * MIN
    assert min(allowed_samples, refused_samples, allowed_steps, refused_steps) > 50
    s.close()


def test_min_size_counts_sampleable_transitions(tmp_path):
    s = _create(tmp_path / "s", min_size=10, eb=20, n_step=3)  # windows at the head stay open
    for t in range(11):
        _step(s, t)
    assert len(s) == 9 and not s.can_sample(1)
    with pytest.raises(mr.RateLimitTimeout, match="len\\(store\\) is 9, below min_size=10"):
        s.sample(1)
    _step(s, 11)
    assert len(s) == 10 and s.can_sample(1)
    s.sample(1)
    s.close()


def test_a_batch_the_limit_can_never_allow_is_refused(tmp_path):
    s = _create(tmp_path / "s")  # at most 2 * 6 + 2 * 10 = 32 rows are ever available at once
    for t in range(13):
        _step(s, t)
    with pytest.raises(ValueError, match="a batch of 33 rows can never be allowed.*error_buffer >= 7"):
        s.sample(33)
    assert _counts(s)[1] == 0
    s.sample(32)
    s.close()


def test_a_block_the_limit_can_never_allow_is_refused_and_writes_nothing(tmp_path):
    s = _create(tmp_path / "s")  # the writer is at most (2 * 6 + 2 * 10) / 2 = 16 transitions ahead of readers
    assert s.schema.rate_limit.most_inserted_at_once == 16
    obs = np.zeros((17, 1), np.uint8)
    with pytest.raises(ValueError, match="a block of 17 transitions can never be allowed.*at most 16 steps.*"
                                         "error_buffer >= 7"):
        s.extend(np.zeros(17, np.int64), np.ones(17), obs, np.zeros(17, bool), np.zeros(17, bool))
    assert s.id_range == (0, 0) and _counts(s)[0] == 0
    s.extend(np.zeros(16, np.int64), np.ones(16), obs[:16], np.zeros(16, bool), np.zeros(16, bool))
    assert _counts(s)[0] == 16
    s.close()


@pytest.mark.parametrize("spi, eb", [(1e-320, 1.0), (1e-300, 1.0), (1e-12, 1e18)])
def test_a_tiny_samples_per_insert_bounds_nothing_and_steps_at_once(tmp_path, spi, eb):
    # the writer's bound (eb + spi * min) / spi is beyond any count: computed without stepping to it
    s = _create(tmp_path / "s", spi=spi, min_size=1, eb=eb)
    for t in range(3):
        _step(s, t)
    assert s.can_insert() and _counts(s)[0] == 3
    s.close()


def test_invalidating_below_min_size_lets_the_writer_refill(tmp_path):
    # 15 inserts need no sample; invalidating 10 leaves len 5 < min_size: readers wait for len >= min_size, so
    # the writer may store until it is back there, or each would wait for the other
    s = _create(tmp_path / "s", spi=1.0, min_size=10, eb=5.0, timeout=0.5)
    r = mr.ReplayStore.open(tmp_path / "s", mode="r", seed=1)
    for t in range(15):
        _step(s, t)
    assert not s.can_insert()
    s.invalidate(np.arange(10))
    assert len(s) == 5 and s.can_insert()
    for t in range(15, 19):
        _step(s, t)  # no wait: len(store) 6 .. 9
    s.commit()
    r.refresh()
    assert len(s) == 9 and not r.can_sample(1)
    _step(s, 19)  # len 10 = min_size: the readers may sample, and the writer's rule applies again
    s.commit()
    r.refresh()
    assert len(s) == 10 and r.can_sample(1)
    assert not s.can_insert()
    with pytest.raises(mr.RateLimitTimeout, match="readers must sample"):
        _step(s, 20)
    r.sample(7)  # 7 <= 1 * 20 + 5, and then 1 * 21 <= 7 + 5 + 1 * 10
    _step(s, 20)
    r.close()
    s.close()


def test_a_step_waiting_for_the_limit_when_another_thread_closes_the_store(tmp_path):
    import threading

    s = _create(tmp_path / "s", timeout=None)
    r = mr.ReplayStore.open(tmp_path / "s", mode="r", seed=1)  # (so the step waits)
    for t in range(13):
        _step(s, t)
    s.commit()
    r.refresh()
    r.sample(2)
    _step(s, 13)
    errors: list[BaseException] = []

    def step() -> None:
        try:
            _step(s, 14)  # waits: readers must sample first
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=step)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()
    s.close()
    t.join(10)
    assert not t.is_alive() and len(errors) == 1
    assert isinstance(errors[0], mr.StoreClosedError), errors[0]
    r.close()


def test_the_writer_raises_at_once_instead_of_waiting_on_itself(tmp_path):
    s = _create(tmp_path / "s", timeout=None)  # would wait forever
    for t in range(13):
        _step(s, t)
    start = time.monotonic()
    s.sample(1)
    with pytest.raises(mr.RateLimitTimeout, match=r"only this store's own step\(\) could allow it.*Step more"):
        s.sample(32)
    s.sample(31)
    rng_before = s.inspect()["rng"]
    with pytest.raises(mr.RateLimitTimeout, match="sampled 32 \\+ 1 rows would exceed"):
        s.sample(1)
    assert s.inspect()["rng"] == rng_before  # a refused sample leaves the RNG as it was
    # it has sampled, and nobody else has the store open: a step that needs samples cannot wait
    with pytest.raises(mr.RateLimitTimeout, match=r"no reader store is open: only this store's own sample\(\)"):
        for t in range(13, 100):
            _step(s, t)
    assert time.monotonic() - start < 5
    assert _counts(s)[0] == 29  # 2 * 29 <= 32 + 6 + 2 * 10 < 2 * 30
    s.close()


def test_the_writer_waits_while_a_reader_could_sample(tmp_path):
    s = _create(tmp_path / "s", timeout=0.3)
    for t in range(14):  # 2 * 14 <= 2 + 6 + 2 * 10 once 2 rows are sampled
        if t == 13:
            s.sample(2)
        _step(s, t)
    s.commit()
    reader = mr.ReplayStore.open(tmp_path / "s", mode="r", seed=1)
    start = time.monotonic()
    with pytest.raises(mr.RateLimitTimeout, match=r"step\(\) waited 0.3 s for the rate limit: .*readers must sample ~2"):
        _step(s, 14)
    assert time.monotonic() - start >= 0.3
    reader.sample(2)  # the reader makes room
    _step(s, 14)
    reader.close()
    with pytest.raises(mr.RateLimitTimeout, match="no reader store is open"):
        _step(s, 15)
    s.close()


def test_a_reader_times_out(tmp_path):
    s = _create(tmp_path / "s", timeout=0.25)
    for t in range(12):
        _step(s, t)
    s.commit()
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    r.sample(30)  # 30 <= 2 * 12 + 6
    start = time.monotonic()
    with pytest.raises(mr.RateLimitTimeout, match=r"waited 0.25 s .*sampled 30 \+ 1 rows would exceed .* = 30;"
                                                  r" the writer must store ~1 more"):
        r.sample(1)
    assert 0.25 <= time.monotonic() - start < 5
    assert not r.can_sample(1)
    _step(s, 12)
    assert r.can_sample(2) and not r.can_sample(3)
    r.sample(2)
    assert isinstance(mr.RateLimitTimeout("x"), TimeoutError) and isinstance(mr.RateLimitTimeout("x"), mr.MMReplayError)
    r.close()
    s.close()


def test_batches_count_rows_when_handed_out(tmp_path):
    s = _create(tmp_path / "s", eb=8.0)
    for t in range(12):
        _step(s, t)
    it = s.batches(8, prefetch=2)
    got = [next(it) for _ in range(4)]  # 32 rows = 2 * 12 + 8
    assert _counts(s)[1] == 32
    queued = [d.ids.copy() for d in it.pending()]
    with pytest.raises(mr.RateLimitTimeout, match="waiting would never end"):
        next(it)
    assert _counts(s)[1] == 32
    for t in range(12, 16):
        _step(s, t)
    b = next(it)  # the batch that was refused is the one handed out now
    np.testing.assert_array_equal(b.index, queued[0])
    assert _counts(s)[1] == 40 and len(got) == 4
    s.close()


# -- durability -----------------------------------------------------------------------------------------------
def test_counts_persist_at_commit_and_reopen(tmp_path):
    path = tmp_path / "s"
    s = _create(path)
    for t in range(13):
        _step(s, t)
    s.sample(20)
    s.commit()
    assert json.load(open(path / "manifest.json"))["rate_limit"] == {"inserted": 13, "sampled": 20,
                                                                    "sampled_total": 20, "size": 13}
    s.sample(5)  # rows handed out after the commit stay counted
    _step(s, 13)  # a transition after the commit is lost with it
    s.close(commit=False)
    s = mr.ReplayStore.open(path)
    assert _counts(s) == (13, 25, 13)
    s.close()  # commits
    os.unlink(path / "ratelimit.npy")  # a lost counters file is made again from the last commit
    r = mr.ReplayStore.open(path, mode="r")
    assert _counts(r) == (13, 25, 13)
    r.close()


def test_clear_starts_the_counts_again(tmp_path):
    s = _create(tmp_path / "s")
    for t in range(13):
        _step(s, t)
    s.sample(30)
    s.clear()
    assert _counts(s) == (0, 0, 0) and s.can_insert() and not s.can_sample(1)
    for t in range(13):
        _step(s, t)
    assert not s.can_insert()
    s.sample(32)
    s.commit()
    s.close()
    s = mr.ReplayStore.open(tmp_path / "s")
    assert _counts(s)[:2] == (13, 32)
    s.close()


def test_snapshots_carry_the_counts(tmp_path):
    s = _create(tmp_path / "s")
    for t in range(13):
        _step(s, t)
    s.sample(10)
    snap = s.save(str(tmp_path / "snap"))
    s.close()
    view = mr.ReplayStore.open(snap, mode="r")  # a snapshot is never written to: no limit applies
    assert "rate_limit" not in view.inspect() and len(view.sample(100)) == 100
    view.close()
    assert not any(n.startswith("ratelimit") for n in os.listdir(snap))
    loaded = mr.ReplayStore.load(snap, tmp_path / "loaded")
    assert _counts(loaded) == (13, 10, 13)
    loaded.close()


def _writer_that_dies(path: str) -> None:
    s = mr.ReplayStore.open(path)
    for t in range(13):
        _step(s, t)
    s.sample(8)
    s.commit()
    s.sample(4)
    _step(s, 13)
    os.kill(os.getpid(), signal.SIGKILL)


def _reader_that_dies(path: str, q: mp.Queue) -> None:
    r = mr.ReplayStore.open(path, mode="r", seed=5)
    r.sample(3)
    q.put("sampled")
    time.sleep(0.5)  # holding the store open
    os.kill(os.getpid(), signal.SIGKILL)


def test_crashed_writer_and_reader(tmp_path):
    path = str(tmp_path / "s")
    _create(path).close()
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_writer_that_dies, args=(path,))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    s = mr.ReplayStore.open(path)
    # the commit's transitions; every row handed out, also the 4 after the commit
    assert _counts(s) == (13, 12, 13)
    s.sample(2)
    q = ctx.Queue()
    p = ctx.Process(target=_reader_that_dies, args=(path, q))
    p.start()
    assert q.get(timeout=60) == "sampled"
    assert _counts(s)[1] == 17  # the reader's rows count at once, live
    for t in range(13, 16):
        _step(s, t)
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    assert _counts(s)[1] == 17  # and stay counted after it died
    # its lock went with it: nobody else could sample now, so the step that needs samples raises at once
    start = time.monotonic()
    with pytest.raises(mr.RateLimitTimeout, match="no reader store is open"):
        for t in range(16, 30):
            _step(s, t)
    assert time.monotonic() - start < 5
    s.close()


def _late_writer(path: str) -> None:
    time.sleep(0.5)
    s = mr.ReplayStore.open(path)
    _step(s, 99)
    s.close()


def test_a_reader_opened_before_the_writer_waits_for_it(tmp_path):
    path = str(tmp_path / "s")
    s = _create(path, timeout=60)
    for t in range(13):
        _step(s, t)
    s.close()
    r = mr.ReplayStore.open(path, mode="r")
    r.sample(32)  # 32 <= 2 * 13 + 6
    assert r.inspect()["rate_limit"]["writer_pid"] == 0 and not r.can_sample(1)
    p = mp.get_context("spawn").Process(target=_late_writer, args=(path,))
    p.start()
    start = time.monotonic()
    r.sample(2)  # waits until the writer, started after this reader, stores one more transition
    assert time.monotonic() - start >= 0.3
    p.join(60)
    assert p.exitcode == 0
    assert _counts(r) == (14, 34, 14)  # the new writer kept the rows this reader had sampled
    r.close()


# -- processes, checked continuously --------------------------------------------------------------------------
P_SPI, P_MIN, P_EB, P_B, P_STEPS = 4.0, 200, 64.0, 16, 3000


def _p_writer(path: str, out: str, ready: Any) -> None:
    try:
        s = mr.ReplayStore.open(path)
        ready.wait(120)  # both readers are up: neither takes every sample because the other started late
        seen, waited = [], 0
        for t in range(P_STEPS):
            start = time.monotonic()
            while True:  # as an actor would: a timed-out step stored nothing, so try it again
                try:
                    _step(s, t)
                    break
                except mr.RateLimitTimeout:
                    if time.monotonic() - start > 120:  # the readers are gone: fail the test
                        raise
                    time.sleep(0.01)  # raised at once while no reader has opened the store yet
            waited += time.monotonic() - start > 0.004  # held back by the limit (the readers pause now and then)
            if t % 50 == 49:
                s.commit()
            if t % 7 == 0:
                seen.append(_counts(s))
        s.close()
        np.save(out, np.array(seen, np.int64))
        np.save(out + ".waits.npy", np.array([waited]))
    finally:
        open(path + ".done", "w").close()  # the readers and the monitor stop, also when the writer failed


def _p_reader(path: str, seed: int, out: str, ready: Any) -> None:
    r = mr.ReplayStore.open(path, mode="r", seed=seed)
    ready.wait(120)
    seen, waited = [], 0
    while True:
        r.refresh()
        if len(r) == 0:
            time.sleep(0.001)
            continue
        start = time.monotonic()
        try:
            b = r.sample(P_B)
        except mr.RateLimitTimeout:
            if os.path.exists(path + ".done"):
                break
            continue
        waited += time.monotonic() - start > 0.004
        assert len(b) == P_B
        seen.append(_counts(r))
        if len(seen) % 25 == 0:
            time.sleep(0.05)  # a slow learner step: the writer runs into its side of the limit
    r.close()
    np.save(out, np.array(seen, np.int64))
    np.save(out + ".waits.npy", np.array([waited]))


def _p_monitor(path: str, out: str) -> None:
    """An independent observer: reads the counters file with numpy, under the samplers' lock."""
    seen = []
    counts = np.load(os.path.join(path, "ratelimit.npy"), mmap_mode="r")
    with open(os.path.join(path, "ratelimit.npy"), "rb") as f:
        while not os.path.exists(path + ".done"):
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            c = counts.copy()
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            seen.append((c[0], c[1] - c[2], c[3]))
            time.sleep(0.0005)
    np.save(out, np.array(seen, np.int64))


def test_a_writer_and_readers_in_processes_hold_the_ratio_at_every_moment(tmp_path):
    path = str(tmp_path / "s")
    s = mr.ReplayStore.create(path, capacity=2000, obs_shape=(1,), chunk_size=256,
                              rate_limit=mr.RateLimit(P_SPI, P_MIN, P_EB, timeout=0.5))
    s.reset(np.zeros(1, np.uint8))
    s.close()
    ctx = mp.get_context("spawn")
    outs = {name: str(tmp_path / f"{name}.npy") for name in ("writer", "r0", "r1", "monitor")}
    ready = ctx.Barrier(3)
    procs = [ctx.Process(target=_p_monitor, args=(path, outs["monitor"])),
             ctx.Process(target=_p_reader, args=(path, 1, outs["r0"], ready)),
             ctx.Process(target=_p_reader, args=(path, 2, outs["r1"], ready)),
             ctx.Process(target=_p_writer, args=(path, outs["writer"], ready))]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(240)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    finally:
        open(path + ".done", "w").close()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    seen = {name: np.load(out) for name, out in outs.items()}
    waits = {name: int(np.load(out + ".waits.npy")[0]) for name, out in outs.items() if name != "monitor"}
    assert waits["writer"] > 0 and waits["r0"] + waits["r1"] > 0, waits  # both sides were held back
    assert len(seen["monitor"]) > 100 and len(seen["r0"]) > 20 and len(seen["r1"]) > 20
    for name, rows in seen.items():
        ins, sampled, size = rows[:, 0], rows[:, 1], rows[:, 2]
        assert (sampled <= P_SPI * ins + P_EB).all(), (name, rows[sampled > P_SPI * ins + P_EB][:5])
        assert (P_SPI * ins <= sampled + P_EB + P_SPI * P_MIN).all(), name
        if name in ("r0", "r1"):
            assert (size >= P_MIN).all() and (np.diff(sampled) >= P_B).all()  # every sample was counted
    final = mr.ReplayStore.open(path, mode="r")
    ins, sampled, _ = _counts(final)
    final.close()
    assert ins == P_STEPS
    # the readers kept up: the writer finished, so they drained the allowance to within one batch
    assert P_SPI * ins + P_EB - P_B < sampled <= P_SPI * ins + P_EB
    assert len(seen["r0"]) + len(seen["r1"]) == sampled // P_B


def test_a_vector_step_counts_the_transitions_it_stores(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=1000, obs_shape=(1,), num_envs=3, chunk_size=63,
                              rate_limit=mr.RateLimit(1.0, 5, 3.0, timeout=0))
    s.reset(np.zeros((3, 1), np.uint8))

    def step(term: list[bool]) -> None:
        s.step([0, 0, 0], [1.0] * 3, np.ones((3, 1), np.uint8), term, [False] * 3)

    step([False, False, False])
    step([True, False, False])  # 6 <= 0 + 3 + 5
    assert _counts(s)[0] == 6 and s.can_sample(6) and not s.can_sample(10)
    assert s.can_insert()  # env 0 auto-resets: this step stores 2, and 6 + 2 <= 8
    step([False, False, False])
    assert _counts(s)[0] == 8 and not s.can_insert()
    with pytest.raises(mr.RateLimitTimeout, match=r"\(inserted 8 \+ 3\)"):
        step([False, False, False])
    s.close()


def _forked_sampler(s: mr.ReplayStore, q: mp.Queue, go: mp.Event) -> None:
    s.sample(4)  # the inherited writing store samples as a reader in the child
    q.put(s.inspect()["rate_limit"]["sampled"])
    go.wait(30)


def test_a_forked_child_samples_as_a_reader(tmp_path):
    s = _create(tmp_path / "s", timeout=0.3)
    for t in range(13):
        _step(s, t)
    s.sample(2)
    s.commit()
    ctx = mp.get_context("fork")
    q, go = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_forked_sampler, args=(s, q, go))
    p.start()
    assert q.get(timeout=60) == 6 and _counts(s)[1] == 6  # counted live, in the parent too
    for t in range(13, 16):  # 2 * 16 <= 6 + 6 + 20
        _step(s, t)
    with pytest.raises(mr.RateLimitTimeout, match=r"step\(\) waited 0.3 s"):  # the child could sample: wait
        _step(s, 16)
    go.set()
    p.join(60)
    assert p.exitcode == 0
    with pytest.raises(mr.RateLimitTimeout, match="no reader store is open"):  # now nobody could
        _step(s, 16)
    s.close()


def test_sequences_count_their_starts_and_never_start_at_invalidated_ones(tmp_path):
    s = _create(tmp_path / "s", eb=8.0)
    for t in range(13):
        _step(s, t)
    s.invalidate([0, 1, 2])
    seq = s.sample_sequences(4, 3)
    assert seq.index.size == 4 and not np.isin(seq.index, [0, 1, 2]).any()
    assert _counts(s)[1] == 4  # a sequence counts as one row: its start
    strict = s.sample_sequences(8, 2, strict=True)
    assert not np.isin(strict.index, [0, 1, 2]).any() and _counts(s)[1] == 12
    it = s.sequence_batches(8, 2, prefetch=1)
    next(it)
    assert _counts(s)[1] == 20
    rng = s.inspect()["rng"]
    with pytest.raises(mr.RateLimitTimeout, match="waiting would never end"):
        s.sample_sequences(16, 2)  # 20 + 16 > 2 * 13 + 8
    assert s.inspect()["rng"] == rng and _counts(s)[1] == 20
    next(it)  # 28 <= 34
    with pytest.raises(mr.RateLimitTimeout):
        next(it)  # 36 > 34
    assert _counts(s)[1] == 28
    s.close()
