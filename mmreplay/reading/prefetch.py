"""``store.batches()``: sampling with the next batches prepared ahead.

Rule: with ``prefetch=p``, batch ``i+p`` is *drawn* (ids, and
weights for prioritized stores) in the caller's thread at the moment batch
``i`` is handed out; copying its frames happens later, in a background thread
or in the caller's. So the RNG is consumed in exactly the order of repeated
``sample()`` calls, and a priority update made after receiving batch ``i``
first affects batch ``i+p+1``. With no priority updates the batches equal
repeated ``sample()``.

Who copies. A drawn batch is a job that the store's prefetch thread or the
caller's thread runs, whichever claims it first, oldest first:

- on warm data, once the caller has the frames of the batch it hands out, it
  *posts* the frames of the next one to the reader's helper threads
  (``FrameReader.post_stacks``; for ``frames="distinct"``, ``post_gather`` of
  its distinct frames into the caller's buffer; ``native.crew``), which wait for work in the
  kernel, without the GIL: they read them while the caller hands out the
  batch, runs the learner's step and draws the batch after, and the caller,
  back in ``next()``, reads the rows no helper has started and waits for the
  rest. A loop of ``sample()`` leaves the other cores idle while its thread
  runs Python; here they copy meanwhile (BENCHMARKS.md "Batches"). A posted
  batch is finished by the caller (or ``drain``/``close``), never by the
  prefetch thread;
- inside ``next()``, if the batch to hand out is not ready and nobody has
  started it, the caller copies it itself, as ``sample()`` would: no hand-off;
- the prefetch thread copies ahead while the caller is away from ``next()``
  (a learner's step), so a learner slower than the copies finds its batches
  ready, but only while posting rests (cold data, or ``PostGate`` found joins
  slower than reads): while posts start reads, the caller posts the next
  batch at every hand-out, also after one the thread copied, and the thread
  steps aside. Its copies run Python (the assembling around the kernels),
  and beside a learner whose Python holds the GIL that Python takes turns
  with the learner's, and every time the thread takes the GIL back after a
  kernel it may wait for the interpreter's switch interval; a posted read
  runs in the helpers' native code from post to join, and the caller's
  ``next()`` finds it done. When posting rests, the thread tries a post
  before each copy, so posting starts again as soon as it can.
  While the caller keeps coming back at once (a tight loop), the
  thread stays out of the way: a second copy at the same time would compete
  for the cores and the memory bus with the caller's own (more CPU per batch
  at large batches), and waking it for every batch costs more than it saves.
  It checks every 0.5 ms, backing off to 20 ms;
- on cold data (a copy read from the disk: major page faults or blocks read)
  both copy at once, the caller helping with the next unstarted batch while it
  waits: the page reads of two batches overlap.

Why the caller copies on warm data rather than waiting for the prefetch
thread: every batch handed to a thread pays hand-offs and wake-ups (more when
other processes keep the cores busy) and the threads' Python takes turns on
the GIL, while the copy itself, already split across the reader's threads,
gains nothing from one more thread; waiting for the thread ran slower than a
``sample()`` loop. ``prefetch=0`` never involves the prefetch thread.

The store keeps track of live iterators: ``commit()``/``save()`` record the
RNG state as of the last batch handed out plus the drawn-but-not-handed-out
batches, and the chunk log waits for in-flight copies before it unmaps a
chunk (``drain``).
"""

from __future__ import annotations

import resource
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from ..core.plan import Plan
from ..core.sequences import SequencePlan

T = TypeVar("T")


@dataclass
class DrawnBatch:
    """A batch drawn but not yet handed out."""

    ids: np.ndarray
    weight: np.ndarray | None
    rng_before: dict[str, Any] | bytes  # the sampling RNG state just before this draw (DrawState.rng_state)
    order: int  # position among the store's draws
    plan: Plan | SequencePlan | None = None  # row arithmetic, fixed when drawn
    length: int = 0  # sequences: their length (0: a batch of transitions)
    strict: bool = False  # sequences: drawn with strict=True
    head: Any = 0  # sequences: each stream's rows when drawn, an array (re-planning a resumed draw uses it)
    slots: np.ndarray | None = None  # the ids' ring slots when drawn (``sample()`` assembles from them)

    @property
    def kind(self) -> tuple[int, int, bool]:
        """What an iterator must ask for to hand this draw out: (batch size, length, strict)."""
        return int(self.ids.size), self.length, self.strict


# a job's state: drawn; being copied; copied (or dropped by close); frames posted to the reader's helper
# thread, to be finished by the caller (or drain/close), never by the prefetch thread; being posted (by a
# thread that does not hold the store's lock: nobody may claim it until its post has returned, see drain)
_PENDING, _RUNNING, _DONE, _POSTED, _POSTING = 0, 1, 2, 3, 4


class _Job:
    """A drawn batch on its way to being copied (guarded by its iterator's lock)."""

    __slots__ = ("draw", "state", "batch", "error", "posted")

    def __init__(self, draw: DrawnBatch) -> None:
        self.draw = draw
        self.state = _PENDING
        self.batch: Any = None
        self.error: BaseException | None = None
        self.posted: Any = None  # FrameReader.post_stacks' answer: its frames are being read


class BatchIterator(Iterator[T], Generic[T]):
    """Iterator returned by ``ReplayStore.batches`` and ``sequence_batches``; infinite; ``close()`` (or the
    store's) ends it."""

    COLD_READS = 4  # major page faults + blocks read from disk during one copy that make it "cold"
    AWAY = 0.0005  # seconds out of __next__ after which a warm caller counts as busy elsewhere
    AWAY_MAX = 0.02  # the longest pause between two looks at a caller that keeps coming back

    def __init__(self, draw: Callable[[], DrawnBatch], assemble: Callable[..., T], executor: ThreadPoolExecutor,
                 prefetch: int, pending: list[DrawnBatch] | None = None,
                 handout: Callable[[int], None] | None = None, post: Callable[[DrawnBatch], Any] | None = None,
                 guard: AbstractContextManager[Any] | None = None) -> None:
        self._draw = draw
        # held for the whole of ``__next__`` (the store's lock): drawing a batch and queueing its job are one
        # step for a thread that retires chunks (it drains the queued jobs before unmapping, see ``drain``),
        # and a call in another thread (``invalidate`` discarding the drawn batches) never lands mid-hand-out
        self._guard: AbstractContextManager[Any] = nullcontext() if guard is None else guard
        self._assemble = assemble
        self._post = post  # starts reading a draw's frames in the reader's helper thread, or returns None
        self._handout = handout  # called with a batch's rows just before it is handed out (may wait or raise)
        self._executor = executor
        self._prefetch = prefetch
        self._jobs: deque[_Job] = deque()
        self._lock = threading.Lock()
        self._caller_left = threading.Condition(self._lock)  # the prefetch thread waits on it
        self._copied = threading.Condition(self._lock)  # a job is done (the caller and drain wait on it)
        self._waiting = 0  # threads waiting on _copied
        self._in_next = False  # the caller is inside __next__ (copying or waiting)
        self._left_at = time.monotonic()  # when the caller last left __next__
        self._working = False  # a prefetch-thread task of this iterator is queued or running
        self._cold = False  # the last copy read from the disk
        self._posted: _Job | None = None  # the job whose frames were posted, until they are read
        self._posting = False  # the last post started a read: warm batches are read by the helpers, not the thread
        self._draining = False  # drain() is finishing the drawn batches: no new post may start
        self._closed = False
        for d in pending or []:  # draws a committed run had made but not handed out
            self._add(d)

    def _add(self, d: DrawnBatch) -> None:
        with self._lock:  # the prefetch thread walks the deque in _claim
            self._jobs.append(_Job(d))
            start = self._start_locked()
        if start:
            self._executor.submit(self._work)

    def _start_locked(self) -> bool:
        """Whether to submit the prefetch thread's task now (then marked working). One task at a time, looping
        while there is work; none with prefetch=0 (the caller copies every batch itself), nor while posting
        reads the warm batches (the thread's copies would take turns with the caller on the GIL)."""
        start = self._prefetch > 0 and not self._working and not self._closed and (self._cold or not self._posting)
        self._working = self._working or start
        return start

    def _fill(self) -> None:
        while len(self._jobs) < self._prefetch + 1:
            self._add(self._draw())

    def _claim(self, oldest_only: bool = False) -> _Job | None:
        """The oldest job nobody has started (with ``oldest_only``: the oldest job, if nobody has started
        it), now marked running; or None. Jobs whose frames were posted count as not started."""
        with self._lock:
            return self._claim_locked(oldest_only, True)

    def _claim_locked(self, oldest_only: bool = False, posted: bool = False) -> _Job | None:
        for job in self._jobs:
            if job.state == _PENDING or (posted and job.state == _POSTED):
                job.state = _RUNNING
                return job
            if oldest_only:
                break
        return None

    def _post_next(self, caller: bool = True) -> bool:
        """Post the frames of the batch after the one being handed out (the caller's thread, its frames
        just read): the reader's helper thread reads them while the caller is away and draws the next
        batch, and the caller reads what is left when it comes for it. Warm data only. Not ``caller``: the
        prefetch thread posts the oldest unstarted batch instead of copying it (posting starts again after
        it rested). Returns whether a read started."""
        mine: _Job | None = None
        posted = None
        start = False
        try:
            with self._lock:
                if self._cold or self._closed or self._draining or self._posted is not None:
                    return False
                if caller:
                    job = self._jobs[1] if len(self._jobs) > 1 else None
                else:
                    job = next((j for j in self._jobs if j.state == _PENDING), None)
                if job is None or job.state != _PENDING:
                    return False
                # The prefetch thread posts without the store's lock: a chunk log draining meanwhile must wait
                # for this post to return, then finish its read, before it unmaps what the read reads. The
                # caller posts holding it (inside next()), so nothing drains meanwhile, and its job may be
                # claimed as posted at once: a signal's exception (only the main thread gets them) left there
                # leaves a job anyone may finish, never one everybody waits for.
                job.state = _POSTED if caller else _POSTING
                mine = job
            posted = self._post(job.draw)  # type: ignore[misc]
        finally:
            if mine is not None:
                with self._lock:
                    self._posting = posted is not None
                    mine.posted = posted
                    mine.state = _PENDING if posted is None else _POSTED
                    if posted is not None:
                        self._posted = mine
                    if self._waiting:
                        self._copied.notify_all()
                    start = caller and posted is None and self._start_locked()
                if start:  # posting rests (cold data, busy cores): the thread copies while the caller is away
                    self._executor.submit(self._work)
        return posted is not None

    def _joined(self) -> None:
        """The posted batch's frames are read: post the next one."""
        with self._lock:
            self._posted = None
        self._post_next()

    def _run(self, job: _Job, caller: bool = False) -> None:
        """Copy a claimed job (``caller``: in ``__next__``, which may post the next one)."""
        # a posted job's frames were read by the helpers: its join says nothing of the disk (data turning cold
        # shows as joins slower than reads, and posting rests: FrameReader.post_stacks)
        before = _reads() if job.posted is None else -1
        try:
            if job.posted is None:
                job.batch = self._assemble(job.draw)
                if caller and self._post is not None:
                    self._post_next()
            else:
                then = self._joined if caller and self._post is not None else None
                job.batch = self._assemble(job.draw, job.posted, then)
        except Exception as exc:  # handed to the caller with this batch
            job.error = exc
        except BaseException:
            # a signal's exception (Ctrl-C, a SIGTERM handler's sys.exit()) is the running thread's, whoever's
            # batch this is: it goes on at once, and the batch is unstarted again (its draw is kept; a read
            # posted for it is settled by the reader's next post or before chunks are unmapped)
            with self._lock:
                job.state, job.posted, job.batch = _PENDING, None, None
                if self._posted is job:
                    self._posted = None
                if self._waiting:
                    self._copied.notify_all()
            raise
        cold = self._cold if before < 0 else _reads() - before >= self.COLD_READS
        start = False
        with self._lock:
            job.state = _DONE
            if self._posted is job:
                self._posted = None
            if self._waiting:
                self._copied.notify_all()
            if cold != self._cold:
                self._cold = cold
                self._caller_left.notify_all()
                start = cold and self._start_locked()
        if start:
            self._executor.submit(self._work)

    def _work(self) -> None:
        """The prefetch thread's task: copy the oldest unstarted batches until none is left.

        On warm data it first waits until the caller has stayed out of ``__next__`` for ``AWAY``
        seconds (a learner's step): a caller in a tight loop copies its own batches, and a second copy
        at the same time would only compete with it for the cores and the memory bus. While the caller
        is inside ``__next__`` it looks again after a pause that doubles up to ``AWAY_MAX``, so a tight
        loop costs it a few wake-ups per second rather than one per batch. On cold data it goes ahead
        at once: the page reads of two batches overlap. On warm data it posts the oldest unstarted batch
        rather than copy it where a post starts a read, and leaves while posting goes on.
        """
        pause = self.AWAY
        while True:
            with self._lock:
                while not (self._closed or self._cold):
                    if self._in_next:
                        pause = min(2 * pause, self.AWAY_MAX)
                        self._caller_left.wait(pause)
                        continue
                    away = time.monotonic() - self._left_at
                    if away >= self.AWAY:
                        pause = self.AWAY
                        break  # out of __next__ for a while: a learner's step
                    self._caller_left.wait(self.AWAY - away)
                if self._posting and not self._cold:  # the helpers read the warm batches, posted by the caller
                    self._working = False
                    return
                post = self._post is not None and not self._cold and not self._closed and self._posted is None
            if post and self._post_next(caller=False):
                continue  # (posting again: the caller posts the next ones)
            with self._lock:
                job = self._claim_locked()
                if job is None:
                    self._working = False
                    return
            self._run(job)

    def __next__(self) -> T:
        with self._guard:
            return self._next()

    def _next(self) -> T:
        if self._closed:
            raise StopIteration
        with self._lock:
            self._in_next = True
        try:
            self._fill()  # batches i .. i+p are drawn when batch i is handed out
            head = self._jobs[0]
            if self._handout is not None:  # e.g. a rate limit: if it raises, the batch stays first in line
                self._handout(int(head.draw.ids.size))
            if head.state == _DONE and self._post is not None:
                self._post_next()  # copied by the prefetch thread: posting the next one starts again here
            while head.state != _DONE:
                # rather than wait: copy the batch to hand out if nobody has started it, and on cold
                # data (reads to overlap) the oldest batch nobody has started
                job = self._claim(oldest_only=not self._cold)
                if job is None:
                    if self._posted_now(head):  # its post (the prefetch thread's) has returned: finish it here
                        continue
                    self._wait(head)
                    break
                self._run(job, job is head)
            with self._lock:
                self._jobs.popleft()
        finally:
            with self._lock:
                self._in_next = False
                self._left_at = time.monotonic()
        if head.error is not None:
            # neither the job nor this frame keeps the error: its traceback holds both (frames of ``_run`` and
            # of this method), and a cycle would keep what the failed batch holds (a feed's ring buffer) until
            # a garbage collection
            error, head.error = head.error, None
            try:
                raise error
            finally:
                del error
        assert head.batch is not None
        batch: T = head.batch
        return batch

    def pending(self) -> list[DrawnBatch]:
        """Drawn, not yet handed out (oldest first)."""
        with self._lock:
            return [job.draw for job in self._jobs]

    def drain(self) -> None:
        """Finish every drawn batch's copy (before chunks are unmapped): the unstarted ones here, and the
        posted ones, once a post in flight (the prefetch thread's, made without the store's lock) returned;
        no post starts meanwhile."""
        try:
            with self._lock:
                self._draining = True
                self._await_posts_locked()
            while (job := self._claim()) is not None:
                self._run(job)
            with self._lock:
                jobs = list(self._jobs)
            for job in jobs:
                self._wait(job)
        finally:
            with self._lock:
                self._draining = False

    def _posted_now(self, job: _Job) -> bool:
        """Wait while ``job`` is being posted; whether it can be claimed now (posted or unstarted)."""
        with self._lock:
            self._wait_locked(lambda: job.state == _POSTING)
            return job.state in (_PENDING, _POSTED)

    def _await_posts_locked(self) -> None:
        """Wait (the iterator's lock held) until no job is being posted: each is then posted or unstarted."""
        self._wait_locked(lambda: any(job.state == _POSTING for job in self._jobs))

    def _wait_locked(self, busy: Callable[[], bool]) -> None:
        """Wait (the iterator's lock held) while ``busy()``: until a job's state changes, then look again."""
        self._waiting += 1
        try:
            while busy():
                self._copied.wait()
        finally:  # (also when a signal's exception ends the wait)
            self._waiting -= 1

    def discard(self) -> None:
        """Forget the drawn batches (their rows changed under them); later ones are drawn afresh."""
        self.drain()
        with self._lock:
            self._jobs.clear()

    def _wait(self, job: _Job) -> None:
        with self._lock:
            self._wait_locked(lambda: job.state != _DONE)

    def forked(self, executor: ThreadPoolExecutor, guard: AbstractContextManager[Any] | None) -> None:
        """In a forked child: the parent's threads are gone. Locks a parent's thread held at the fork would stay
        held, copies it was making would never finish: fresh locks (``guard``: the store's new one), and jobs
        being copied (by the prefetch thread, or posted to the reader's helper) are unstarted again;
        ``executor`` replaces the parent's pool."""
        self._executor = executor
        self._guard = nullcontext() if guard is None else guard
        self._lock = threading.Lock()
        self._caller_left = threading.Condition(self._lock)
        self._copied = threading.Condition(self._lock)
        self._waiting = 0
        self._in_next = False
        self._working = False
        self._posted = None
        self._posting = False
        self._draining = False
        for job in self._jobs:
            if job.state in (_RUNNING, _POSTED, _POSTING):
                job.state, job.posted, job.batch, job.error = _PENDING, None, None, None

    def close(self) -> None:
        with self._guard:  # (never while another thread is inside __next__)
            self._close()

    def _close(self) -> None:
        with self._lock:  # unstarted copies are dropped; running ones are waited for, posted ones finished
            self._closed = True
            self._caller_left.notify_all()
            self._await_posts_locked()  # (no post starts once closed)
            jobs = list(self._jobs)
            posted = [job for job in jobs if job.state == _POSTED]
            for job in jobs:
                if job.state == _PENDING:
                    job.state = _DONE
                elif job.state == _POSTED:
                    job.state = _RUNNING
        for job in posted:
            self._run(job)
        for job in jobs:
            self._wait(job)
        with self._lock:
            self._jobs.clear()


def _reads() -> int:
    """Major page faults and blocks read from storage by this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_majflt + r.ru_inblock
