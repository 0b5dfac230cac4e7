"""``batches(prefetch=p)``: same batches as repeated sample(), the documented update timing, exact resume."""

from __future__ import annotations

import time

import numpy as np
import pytest

import mmreplay as mr


def _fill(path, prio=None, steps=400, capacity=150, chunk_size=32):
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(3,), obs_dtype="int32", stack=3, n_step=2,
                              chunk_size=chunk_size, prioritized=prio, seed=5)
    s.reset(np.zeros(3, np.int32))
    for t in range(steps):
        end = t % 37 == 36
        s.step(t % 4, float(t % 3), np.full(3, t + 1, np.int32), end, False)
        if end:
            s.reset(np.full(3, -t, np.int32))
    return s


def _same(a: mr.Batch, b: mr.Batch) -> None:
    for name in ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index", "weight"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize("prefetch", [0, 1, 3])
@pytest.mark.parametrize("prio", [None, mr.Prioritized()])
def test_batches_equal_repeated_sample(tmp_path, prefetch, prio):
    a = _fill(tmp_path / "a", prio)
    b = _fill(tmp_path / "b", prio)
    it = a.batches(16, prefetch=prefetch)
    for _ in range(20):
        _same(next(it), b.sample(16))
    a.close()
    b.close()


def test_priority_update_after_batch_i_first_affects_batch_i_plus_p_plus_1(tmp_path):
    p = 2
    a = _fill(tmp_path / "a", mr.Prioritized())
    b = _fill(tmp_path / "b", mr.Prioritized())
    it = a.batches(8, prefetch=p)
    got = [next(it) for _ in range(3)]  # batches 0,1,2 handed out; 3,4 are drawn
    hot = got[0].index[:1]
    a.update_priorities(hot, [1e6])  # made after batch 2: first affects batch 2 + p + 1 = 5
    ref = [b.sample(8) for _ in range(5)]  # the reference sees the update before drawing batch 5
    for x, y in zip(got + [next(it), next(it)], ref, strict=True):
        _same(x, y)
    b.update_priorities(hot, [1e6])
    after_a, after_b = next(it), b.sample(8)
    _same(after_a, after_b)
    assert (after_a.index == hot[0]).mean() > 0.5  # the update is visible now
    a.close()
    b.close()


@pytest.mark.parametrize("prio", [None, mr.Prioritized()])
def test_commit_mid_iteration_resumes_the_same_batches(tmp_path, prio):
    a = _fill(tmp_path / "a", prio)
    it = a.batches(16, prefetch=2)
    rng = np.random.default_rng(0)
    for _ in range(5):
        b = next(it)
        if prio is not None:
            a.update_priorities(b.index, rng.random(16) + 0.1)
    a.commit()
    tail = []
    for _ in range(6):
        b = next(it)
        tail.append(b)
        if prio is not None:
            a.update_priorities(b.index, rng.random(16) + 0.1)
    it.close()
    # crash: reopen the committed state and repeat the same calls
    a.close(commit=False)
    r = mr.ReplayStore.open(tmp_path / "a")
    rng = np.random.default_rng(0)
    for _ in range(5):
        rng.random(16)
    it2 = r.batches(16, prefetch=2)
    for want in tail:
        got = next(it2)
        _same(got, want)
        if prio is not None:
            r.update_priorities(got.index, rng.random(16) + 0.1)
    r.close()


@pytest.mark.parametrize("ops", [
    ["sample", "next", "next", "sample", "next"],  # a sample() before the resumed iterator exists
    ["step"] * 10 + ["crash", "next", "next", "next"],  # a commit before the resumed iterator exists
    ["crash", "sample", "step", "crash", "next", "sample", "next"],
    ["next", "crash", "sample", "next", "next"],
])
@pytest.mark.parametrize("prio", [None, mr.Prioritized()])
def test_a_resume_continues_as_the_committed_run_whatever_draws_first(tmp_path, ops, prio):
    """A store committed while an iterator holds drawn batches, resumed, and given the same calls as the
    run that goes on uninterrupted, gives the same batches: the resumed ``batches()`` hands out the pending
    ones first, whenever it is made; ``sample()`` draws after them, as it does beside the live iterator; a
    commit before the resumed iterator exists keeps them. "crash": the resumed store commits, is dropped
    uncommitted and opened again (its iterator made again at the next "next")."""
    a = _fill(tmp_path / "a", prio, capacity=1000)  # (no retirement: every drawn row stays sampleable)
    b = _fill(tmp_path / "b", prio, capacity=1000)  # the same run up to the commit, then resumed
    a_it, b_it = a.batches(16, prefetch=2), b.batches(16, prefetch=2)
    for _ in range(3):
        _same(next(a_it), next(b_it))
    assert len(a_it.pending()) == 2
    a.commit()
    b.commit()
    b.close(commit=False)
    b = mr.ReplayStore.open(tmp_path / "b")
    resumed = None
    upd = np.random.default_rng(1)
    for k, op in enumerate(ops):
        if op == "sample":
            _same(a.sample(16), b.sample(16))
        elif op == "next":
            if resumed is None:
                resumed = b.batches(16, prefetch=2)
            x, y = next(a_it), next(resumed)
            _same(x, y)
            if prio is not None:
                p = upd.random(16) + 0.1
                a.update_priorities(x.index, p)
                b.update_priorities(y.index, p)
        elif op == "step":
            for s in (a, b):
                s.step(1, 0.5, np.full(3, 10_000 + k, np.int32), False, False)
        else:  # "crash"
            b.commit()
            b.close(commit=False)
            b = mr.ReplayStore.open(tmp_path / "b")
            resumed = None
    a.close()
    b.close()


def test_a_store_collected_in_its_own_prefetch_thread_releases_everything(tmp_path):
    """A store dropped unclosed is released by its finalizer in whichever thread collects it, also its own
    prefetch thread, which cannot wait for itself: every part is still released (no chunk of it stays
    mapped)."""
    import os

    from tests._support import internals

    s = _fill(tmp_path / "s")
    it = s.batches(16, prefetch=2)
    next(it)
    root = os.path.realpath(tmp_path / "s")

    def mapped() -> bool:
        with open("/proc/self/maps") as f:
            return any(root in line for line in f)

    assert mapped()
    internals.release_in_prefetch_thread(s)
    assert not mapped()


def test_prefetch_survives_chunk_retirement(tmp_path):
    a = _fill(tmp_path / "a", capacity=40, chunk_size=8)
    b = _fill(tmp_path / "b", capacity=40, chunk_size=8)
    it = a.batches(8, prefetch=3)
    for t in range(300):
        for s in (a, b):
            if s.episode_open[0]:
                s.step(1, 1.0, np.full(3, 1000 + t, np.int32), t % 29 == 28, False)
            else:
                s.reset(np.full(3, -1000 - t, np.int32))
        if t % 3 == 0:
            x = next(it)
            assert x.obs.shape == (8, 3, 3)
    a.close()
    b.close()


def test_bad_prefetch_arguments(tmp_path):
    a = _fill(tmp_path / "a")
    with pytest.raises(ValueError, match="prefetch"):
        a.batches(4, prefetch=-1)
    with pytest.raises(ValueError, match="prioritized"):
        a.batches(4, beta=0.5)
    a.close()


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_read_paths_return_the_same_rows(tmp_path, threads):
    """Reader threads and I/O requests change how frames are copied, never which: same seed, same rows,
    including rows whose stacks cross chunk boundaries and a store that has retired chunks."""
    a = _fill(tmp_path / "a", capacity=60, chunk_size=8, steps=300)
    a.close()
    plain = mr.ReplayStore.open(tmp_path / "a", mode="r", seed=3, read_threads=1, read_ahead=False)
    fast = mr.ReplayStore.open(tmp_path / "a", mode="r", seed=3, read_threads=threads, read_ahead=True)
    assert plain.id_range[0] > 0  # chunks were retired
    for _ in range(30):
        _same(fast.sample(64), plain.sample(64))
    ok = plain.sampleable_ids()
    _same(fast.gather(ok), plain.gather(ok))
    it = fast.batches(64, prefetch=2)
    for _ in range(5):
        _same(next(it), plain.sample(64))
    plain.close()
    fast.close()



def test_prefetched_batches_are_planned_when_drawn(tmp_path):
    """A batch drawn before the writer moves on reflects the store at its draw: writing (even a reset that
    ends an episode inside a drawn row's window) while it is copied in the background changes nothing."""
    a = _fill(tmp_path / "a", steps=200)
    b = _fill(tmp_path / "b", steps=200)
    it = a.batches(64, prefetch=3)
    want = [b.sample(64) for _ in range(4)]  # what sample() gives at the moments of the draws
    got = [next(it)]  # batches 0..3 are drawn now
    for s in (a,):
        for t in range(50):
            if s.episode_open[0]:
                s.step(0, 0.0, np.full(3, 5000 + t, np.int32), False, False)
            s.reset(np.full(3, -5000 - t, np.int32))  # ends the episode open at the head
    got += [next(it) for _ in range(3)]
    for x, y in zip(got, want, strict=True):
        _same(x, y)
    a.close()
    b.close()


def test_a_learner_away_between_batches_gets_them_read_by_the_helpers(tmp_path):
    """A learner's step between batches: the caller posts each next batch's frames to the reader's helper
    threads as it hands one out (no Python thread copies between draw and hand-out), and the batches are still
    repeated ``sample()``'s, with a priority update first affecting batch i + p + 1."""
    from mmreplay.reading.readpolicy import usable_cpus
    from tests._support import internals

    if usable_cpus() < 2:
        pytest.skip("needs 2 CPUs: the helpers read only beside the caller")
    a = _fill(tmp_path / "a", mr.Prioritized(), steps=3000, capacity=2000, chunk_size=256)
    b = _fill(tmp_path / "b", mr.Prioritized(), steps=3000, capacity=2000, chunk_size=256)
    a.close()
    b.close()
    a = mr.ReplayStore.open(tmp_path / "a", read_threads=2)
    b = mr.ReplayStore.open(tmp_path / "b")
    gate = internals.posting_always(a)
    copied_by = internals.record_batch_copies(a)
    it = a.batches(512, prefetch=2)
    for i in range(30):
        got = next(it)
        _same(got, b.sample(512))
        if i == 20:  # first affects the batch drawn at the hand-out after next: 20 + 2 + 1
            a.update_priorities(got.index[:1], [1e6])
            b_pending = [b.sample(512) for _ in range(2)]
            b.update_priorities(got.index[:1], [1e6])
            for want in b_pending:
                _same(next(it), want)
        time.sleep(0.005)  # the learner's step
    assert gate.posts >= 25
    assert copied_by.count("posted") >= 25 and not any(n.startswith("mmreplay-prefetch") for n in copied_by)
    it.close()
    a.close()
    b.close()
