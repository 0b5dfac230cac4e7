"""``store.batches()``: sampling with the next batches prepared ahead.

Rule (DESIGN §2b): with ``prefetch=p``, batch ``i+p`` is *drawn* (ids, and
weights for prioritized stores) in the caller's thread at the moment batch
``i`` is handed out; copying its frames happens later, in a background thread
or in the caller's. So the RNG is consumed in exactly the order of repeated
``sample()`` calls, and a priority update made after receiving batch ``i``
first affects batch ``i+p+1``. With no priority updates the batches equal
repeated ``sample()``.

Who copies. A drawn batch is a job that either the store's prefetch thread or
the caller's thread runs, whichever claims it first, oldest first. The caller
claims work only when it would otherwise wait: if the batch it must hand out
is not ready, it copies the oldest batch nobody has started (often that very
batch) instead of sleeping. The first version always handed the copy to the
prefetch thread and waited for it: on warm data it ran at half the rate of a
``sample()`` loop in issue 15's measurement, 0.73-0.85 in same-run A/B tests
here (2 cores), because every batch paid thread hand-offs and wake-ups (tens
of microseconds, milliseconds when other processes keep the cores busy) and
the two threads' Python took turns on the GIL, while the copy itself, already
split across the reader's threads, gained nothing from one more thread. Now a
consumer slower than the copies (a learner) finds its batches ready, copied
while it worked; a faster one copies them itself, as ``sample()`` would, while
the prefetch thread works on the next, so two batches are in flight, which is
what helps on cold data (their page reads overlap). ``prefetch=0`` never
involves the prefetch thread.

The store keeps track of live iterators: ``commit()``/``save()`` record the
RNG state as of the last batch handed out plus the drawn-but-not-handed-out
batches, and the chunk log waits for in-flight copies before it unmaps a
chunk (``drain``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .batch import Batch
from .index import Plan


@dataclass
class Draw:
    """A batch drawn but not yet handed out."""

    ids: np.ndarray
    weight: np.ndarray | None
    rng_before: dict[str, Any]  # the sampling RNG state just before this draw
    order: int  # position among the store's draws
    plan: Plan | None = None  # row arithmetic, fixed when drawn


_PENDING, _RUNNING, _DONE = 0, 1, 2


class _Job:
    """A drawn batch on its way to being copied (guarded by its iterator's lock)."""

    __slots__ = ("draw", "state", "batch", "error", "done")

    def __init__(self, draw: Draw) -> None:
        self.draw = draw
        self.state = _PENDING
        self.batch: Batch | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()


class BatchIterator(Iterator[Batch]):
    """Iterator returned by ``ReplayStore.batches``; infinite; ``close()`` (or the store's) ends it."""

    def __init__(self, draw: Callable[[], Draw], assemble: Callable[[Draw], Batch], executor: ThreadPoolExecutor,
                 prefetch: int, pending: list[Draw] | None = None) -> None:
        self._draw = draw
        self._assemble = assemble
        self._executor = executor
        self._prefetch = prefetch
        self._jobs: deque[_Job] = deque()
        self._lock = threading.Lock()
        self._closed = False
        for d in pending or []:  # draws a committed run had made but not handed out
            self._add(d)

    def _add(self, d: Draw) -> None:
        with self._lock:  # the prefetch thread walks the deque in _claim
            self._jobs.append(_Job(d))
        if self._prefetch:  # with prefetch=0 the caller copies every batch itself: no hand-off
            self._executor.submit(self._work)

    def _fill(self) -> None:
        while len(self._jobs) < self._prefetch + 1:
            self._add(self._draw())

    def _claim(self) -> _Job | None:
        """The oldest job nobody has started, now marked running (or None)."""
        with self._lock:
            for job in self._jobs:
                if job.state == _PENDING:
                    job.state = _RUNNING
                    return job
        return None

    def _run(self, job: _Job) -> None:
        try:
            job.batch = self._assemble(job.draw)
        except BaseException as exc:  # handed to the caller with this batch
            job.error = exc
        with self._lock:
            job.state = _DONE
        job.done.set()

    def _work(self) -> None:
        """One executor task per drawn batch: copy the oldest unstarted one, if the caller has not."""
        job = self._claim()
        if job is not None:
            self._run(job)

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        self._fill()  # batches i .. i+p are drawn when batch i is handed out
        head = self._jobs[0]
        while not head.done.is_set():
            job = self._claim()  # rather than wait: copy the oldest batch nobody has started
            if job is None:
                head.done.wait()
                break
            self._run(job)
        with self._lock:
            self._jobs.popleft()
        if head.error is not None:
            raise head.error
        assert head.batch is not None
        return head.batch

    def pending(self) -> list[Draw]:
        """Drawn, not yet handed out (oldest first)."""
        with self._lock:
            return [job.draw for job in self._jobs]

    def drain(self) -> None:
        """Finish every drawn batch's copy (before chunks are unmapped): the unstarted ones here."""
        while (job := self._claim()) is not None:
            self._run(job)
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.done.wait()

    def close(self) -> None:
        with self._lock:  # unstarted copies are dropped; running ones are waited for
            jobs = list(self._jobs)
            for job in jobs:
                if job.state == _PENDING:
                    job.state = _DONE
                    job.done.set()
        for job in jobs:
            job.done.wait()
        with self._lock:
            self._jobs.clear()
        self._closed = True
