"""BatchIterator's scheduling, with stand-in draw and copy functions: whoever copies a batch (the prefetch
thread or the caller), batches come out in draw order, each copied once, errors with their batch."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mmreplay.reading.batch import Batch
from mmreplay.reading.prefetch import BatchIterator, DrawnBatch
from tests._support.helpers import interrupt_at, wait_until


def _batch(i: int) -> Batch:
    z = np.zeros(1)
    return Batch(obs=z, action=z, reward=z, next_obs=z, discount=z, terminated=z, truncated=z,
                 index=np.array([i]), weight=z)


class Recorder:
    def __init__(self, delay: float = 0.0, fail: set[int] | None = None) -> None:
        self.drawn = 0
        self.copied: list[int] = []
        self.threads: list[str] = []
        self.lock = threading.Lock()
        self.delay = delay
        self.fail = fail or set()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # a prefetch thread reached the gate

    def draw(self) -> DrawnBatch:
        d = DrawnBatch(np.array([self.drawn]), None, {}, self.drawn)
        self.drawn += 1
        return d

    def assemble(self, d: DrawnBatch) -> Batch:
        i = int(d.ids[0])
        if threading.current_thread().name.startswith("prefetch"):
            self.entered.set()
            self.gate.wait()  # a prefetch thread that is stuck (descheduled, slow disk) until the gate opens
        if self.delay:
            time.sleep(self.delay * ((i * 7919) % 5) / 4)
        with self.lock:
            self.copied.append(i)
            self.threads.append(threading.current_thread().name)
        if i in self.fail:
            raise OSError(f"copy of batch {i} failed")
        return _batch(i)


def _away_until_copied_ahead(it: BatchIterator, rec: Recorder, count: int) -> tuple[list[int], dict[int, str]]:
    """``count`` batches, the caller away after each until the batch after it was copied (while it is away
    nobody but the prefetch thread copies); the batches handed out and who copied each batch meanwhile."""
    before = set(rec.copied)
    rec.copied.clear()
    rec.threads.clear()
    handed = []
    for _ in range(count):
        handed.append(int(next(it).index[0]))
        ahead = handed[-1] + 1
        wait_until(lambda n=ahead: n in rec.copied or n in before, f"batch {ahead}")
    return handed, dict(zip(rec.copied, rec.threads, strict=True))


@pytest.fixture
def executor():
    ex = ThreadPoolExecutor(1, thread_name_prefix="prefetch")
    yield ex
    ex.shutdown(wait=False, cancel_futures=True)


@pytest.mark.parametrize("prefetch", [0, 1, 2, 5])
@pytest.mark.parametrize("delay", [0.0, 0.002])
def test_batches_come_out_in_draw_order_each_copied_once(executor, prefetch, delay):
    rec = Recorder(delay)
    it = BatchIterator(rec.draw, rec.assemble, executor, prefetch)
    got = [int(next(it).index[0]) for _ in range(40)]
    assert got == list(range(40))
    assert rec.drawn == 40 + prefetch  # batches i .. i+p are drawn when batch i is handed out
    it.drain()
    assert sorted(rec.copied) == list(range(40 + prefetch))  # once each, the drawn-ahead ones by drain
    it.close()


def test_prefetch_zero_never_hands_a_copy_to_the_prefetch_thread(executor):
    rec = Recorder()
    it = BatchIterator(rec.draw, rec.assemble, executor, 0)
    for _ in range(10):
        next(it)
    assert rec.threads == [threading.current_thread().name] * 10


def test_on_cold_data_a_stuck_prefetch_thread_does_not_stop_the_caller(executor):
    """The prefetch thread is stuck in the oldest batch: while the caller waits for it, the caller copies
    every other drawn batch itself; once the thread moves on, nothing is copied twice."""
    rec = Recorder()
    rec.gate.clear()
    it = BatchIterator(rec.draw, rec.assemble, executor, 3)
    it._cold = True  # as after a copy that read the disk (the stand-in copies read nothing)
    it.COLD_READS = 0  # and stays so
    it._fill()
    assert rec.entered.wait(60)  # the prefetch thread took batch 0 and is stuck in it
    done: list[int] = []
    t = threading.Thread(target=lambda: done.extend(int(next(it).index[0]) for _ in range(3)), name="learner")
    t.start()
    wait_until(lambda: len(rec.copied) == 3, "the learner's copies")
    assert t.is_alive() and done == []  # batch 0 is the stuck thread's: the learner waits for it...
    assert rec.copied == [1, 2, 3] and set(rec.threads) == {"learner"}  # ...having copied the others
    rec.gate.set()
    t.join(5.0)
    assert done == [0, 1, 2]
    assert [int(next(it).index[0]) for _ in range(5)] == [3, 4, 5, 6, 7]
    it.drain()
    assert sorted(rec.copied) == list(range(11))
    it.close()


def test_on_warm_data_the_caller_copies_its_batches_and_the_prefetch_thread_works_while_it_is_away(executor):
    """Warm (no disk reads): inside next() the caller copies the batch it hands out; the prefetch thread
    copies ahead only while the caller is away (a learner's step), so a fast caller is not slowed by a
    second copy competing with its own, and a slow one finds its batches ready."""
    rec = Recorder()
    it = BatchIterator(rec.draw, rec.assemble, executor, 2)
    for _ in range(20):  # a tight loop: mostly the caller's own copies
        next(it)
    ours = sum(name == threading.current_thread().name for name in rec.threads)
    assert ours >= 10
    # a learner step between batches, as long as the prefetch thread takes to copy ahead
    handed, by = _away_until_copied_ahead(it, rec, 10)
    # every batch after the first was copied while the caller was away: by the thread
    assert len(by) >= 10 and all(name.startswith("prefetch") for i, name in by.items() if i != handed[0])
    it.close()


def test_an_error_comes_with_its_batch_and_the_next_ones_still_come(executor):
    rec = Recorder(fail={3})
    it = BatchIterator(rec.draw, rec.assemble, executor, 2)
    assert [int(next(it).index[0]) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OSError, match="batch 3"):
        next(it)
    assert int(next(it).index[0]) == 4
    it.close()


def test_resumed_draws_come_first(executor):
    rec = Recorder()
    rec.drawn = 100
    pending = [DrawnBatch(np.array([7]), None, {}, 0), DrawnBatch(np.array([8]), None, {}, 1)]
    it = BatchIterator(rec.draw, rec.assemble, executor, 2, pending)
    assert [int(next(it).index[0]) for _ in range(4)] == [7, 8, 100, 101]
    assert [int(d.ids[0]) for d in it.pending()] == [102, 103]
    it.close()


def test_close_drops_unstarted_copies_and_waits_for_running_ones(executor):
    rec = Recorder()
    rec.gate.clear()
    it = BatchIterator(rec.draw, rec.assemble, executor, 4)
    it._fill()  # five drawn; the prefetch thread takes the oldest and is stuck in it
    assert rec.entered.wait(60)
    closer = threading.Thread(target=it.close)
    closer.start()
    wait_until(lambda: it._closed, "close()")
    closer.join(0.05)
    assert closer.is_alive()  # waiting for the running copy
    rec.gate.set()
    closer.join(5.0)
    assert not closer.is_alive()
    assert len(rec.copied) <= 1  # the unstarted ones were dropped, not copied
    with pytest.raises(StopIteration):
        next(it)


class Poster(Recorder):
    """A Recorder whose batches' frames can be posted (a stand-in for the reader's helper threads): ``accept``
    says whether a post starts a read (False: as when posting rests, on cold data or busy cores)."""

    def __init__(self) -> None:
        super().__init__()
        self.accept = True
        self.posted: list[int] = []
        self.joined: list[int] = []
        self.every: list[int] = []  # every batch copied, by anyone

    def post(self, d: DrawnBatch) -> tuple[str, int] | None:
        if not self.accept:
            return None
        self.posted.append(int(d.ids[0]))
        return ("read", int(d.ids[0]))

    def assemble(self, d: DrawnBatch, posted: tuple[str, int] | None = None, then=None) -> Batch:  # noqa: ANN001
        if posted is not None:
            assert posted == ("read", int(d.ids[0]))  # a batch is finished from its own posted read
            self.joined.append(int(d.ids[0]))
        if then is not None:
            then()
        self.every.append(int(d.ids[0]))
        return super().assemble(d)


def test_while_posting_starts_reads_the_prefetch_thread_leaves_a_learner_s_batches_to_the_helpers(executor):
    """A learner away between batches: the caller posts each next batch's read as it hands one out, the
    helpers read it meanwhile, and the prefetch thread (whose Python would take turns with the learner on the
    GIL) copies nothing; once posts stop starting reads, the thread copies ahead again."""
    rec = Poster()
    it = BatchIterator(rec.draw, rec.assemble, executor, 2, post=rec.post)
    got = []
    for _ in range(15):
        got.append(int(next(it).index[0]))
        time.sleep(0.01)  # a learner's step: 20 times the thread's AWAY
    assert got == list(range(15))
    assert set(rec.threads) == {threading.current_thread().name}
    assert rec.joined == list(range(1, 15))  # every batch after the first, from its posted read
    assert rec.posted == list(range(1, 16))  # one read at a time: the next batch's, as each is handed out
    rec.accept = False
    handed, by = _away_until_copied_ahead(it, rec, 10)
    got += handed
    assert got == list(range(25))
    # every batch after the first (posted before posts stopped) was copied while the caller was away: by the thread
    assert len(by) >= 10 and all(name.startswith("prefetch") for i, name in by.items() if i != handed[0])
    rec.accept = True  # posting again once a post starts a read: the thread steps aside
    for _ in range(6):
        got.append(int(next(it).index[0]))
        time.sleep(0.01)
    rec.threads.clear()
    for _ in range(8):
        got.append(int(next(it).index[0]))
        time.sleep(0.01)
    assert got == list(range(39))
    assert set(rec.threads) == {threading.current_thread().name}
    it.drain()
    assert sorted(rec.every) == list(range(41))  # each drawn batch copied once (the last two by drain)
    it.close()


class SlowPoster(Poster):
    """A Poster whose prefetch thread is stuck inside its post (descheduled) until ``post_gate`` opens, and
    whose caller's posts are refused (posting rests: the thread posts when the caller is away)."""

    def __init__(self) -> None:
        super().__init__()
        self.post_gate = threading.Event()
        self.posting = threading.Event()  # the prefetch thread is inside post()

    def post(self, d: DrawnBatch) -> tuple[str, int] | None:
        if not threading.current_thread().name.startswith("prefetch"):
            return None
        self.posting.set()
        self.post_gate.wait()
        return super().post(d)


@pytest.mark.parametrize("end", ["drain", "close"])
def test_a_post_in_flight_in_the_prefetch_thread_is_finished_before_drain_or_close_returns(executor, end):
    """The prefetch thread posts without the store's lock: a chunk log draining the iterators meanwhile (before
    it unmaps chunks), or a close, must not take that batch and finish it while its post is still to start a
    read of those chunks; it waits for the post, then joins the read."""
    rec = SlowPoster()
    it = BatchIterator(rec.draw, rec.assemble, executor, 2, post=rec.post)
    assert int(next(it).index[0]) == 0  # its post of batch 1 refused: the thread posts while the caller is away
    assert rec.posting.wait(60)
    ender = threading.Thread(target=getattr(it, end), daemon=True)
    ender.start()
    try:
        ender.join(0.05)
        assert ender.is_alive()  # waiting for the post in flight
    finally:
        rec.post_gate.set()  # (also when the assert fails: the stuck thread would hold up the interpreter's exit)
    ender.join(5.0)
    assert not ender.is_alive()
    assert rec.posted == [1] and rec.joined == [1]  # the read the post started was joined before it returned
    if end == "drain":
        assert [int(next(it).index[0]) for _ in range(3)] == [1, 2, 3]
    it.close()


@pytest.mark.parametrize("line", ["posted = self._post(", "start = False", "self._posting = posted is not None"])
def test_a_signal_s_exception_in_the_caller_s_post_leaves_nothing_waiting_for_ever(executor, line):
    """Ctrl-C in the caller's thread anywhere around its post of the next batch: the batch is unstarted again (or
    posted), and the next ``next()``, ``drain()`` and ``close()`` go on (none waits for a post that will never
    return)."""
    rec = Poster()
    it = BatchIterator(rec.draw, rec.assemble, executor, 2, post=rec.post)
    with pytest.raises(KeyboardInterrupt), interrupt_at(BatchIterator._post_next, line):
        next(it)  # batch 0 is copied; its post of batch 1 is interrupted
    done = threading.Event()

    def rest() -> None:
        got.extend(int(next(it).index[0]) for _ in range(4))
        it.drain()
        it.close()
        done.set()

    got: list[int] = []
    threading.Thread(target=rest, daemon=True).start()
    assert done.wait(20), "next(), drain() or close() waits for ever"
    assert got[0] in (0, 1) and got == list(range(got[0], got[0] + 4))


def test_a_signal_s_exception_in_a_copy_goes_on_at_once_and_the_batch_is_copied_again(executor):
    """A copy made by drain() (a writer retiring chunks) or by next() interrupted by a signal's exception: it is
    raised there and then, never kept as the batch's error or dropped, and the batch is unstarted again."""

    class Interrupted(Recorder):
        armed = True

        def assemble(self, d: DrawnBatch) -> Batch:
            if self.armed and threading.current_thread() is threading.main_thread():
                self.armed = False
                raise SystemExit(0)
            return super().assemble(d)

    rec = Interrupted()
    it = BatchIterator(rec.draw, rec.assemble, executor, 0)
    it._fill()
    with pytest.raises(SystemExit):
        it.drain()
    assert [int(next(it).index[0]) for _ in range(3)] == [0, 1, 2]
    it.close()


def test_a_drain_interrupted_while_it_waits_lets_posting_start_again(executor):
    rec = Poster()
    it = BatchIterator(rec.draw, rec.assemble, executor, 2, post=rec.post)
    next(it)
    it.drain()
    with pytest.raises(KeyboardInterrupt), interrupt_at(BatchIterator.drain, "self._await_posts_locked()"):
        it.drain()
    assert not it._draining
    rec.posted.clear()
    for _ in range(3):
        next(it)
    assert rec.posted  # the caller posts its next batch again
    it.close()
