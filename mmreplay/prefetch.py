"""``store.batches()``: sampling with the next batches prepared in the background.

Rule: with ``prefetch=p``, batch ``i+p`` is *drawn* (ids, and
weights for prioritized stores) in the caller's thread at the moment batch
``i`` is handed out; copying its frames happens in a background thread. So
the RNG is consumed in exactly the order of repeated ``sample()`` calls, and a
priority update made after receiving batch ``i`` first affects batch
``i+p+1``. With no priority updates the batches equal repeated ``sample()``.

The store keeps track of live iterators: ``commit()``/``save()`` record the
RNG state as of the last batch handed out plus the drawn-but-not-handed-out
batches, and the chunk log waits for in-flight copies before it unmaps a
chunk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from .plan import Plan
from .sequences import SequencePlan

T = TypeVar("T")


@dataclass
class Draw:
    """A batch drawn but not yet handed out."""

    ids: np.ndarray
    weight: np.ndarray | None
    rng_before: dict[str, Any]  # the sampling RNG state just before this draw
    order: int  # position among the store's draws
    plan: Plan | SequencePlan | None = None  # row arithmetic, fixed when drawn
    length: int = 0  # sequences: their length (0: a batch of transitions)
    strict: bool = False  # sequences: drawn with strict=True
    head: int = 0  # sequences: rows written when drawn (re-planning a resumed draw uses it)

    @property
    def kind(self) -> tuple[int, int, bool]:
        """What an iterator must ask for to hand this draw out: (batch size, length, strict)."""
        return int(self.ids.size), self.length, self.strict


class BatchIterator(Iterator[T], Generic[T]):
    """Iterator returned by ``ReplayStore.batches`` and ``sequence_batches``; infinite; ``close()`` (or the
    store's) ends it."""

    def __init__(self, draw: Callable[[], Draw], assemble: Callable[[Draw], T], executor: ThreadPoolExecutor,
                 prefetch: int, pending: list[Draw] | None = None,
                 handout: Callable[[int], None] | None = None) -> None:
        self._draw = draw
        self._assemble = assemble
        self._handout = handout  # called with a batch's rows just before it is handed out (may wait or raise)
        self._executor = executor
        self._prefetch = prefetch
        self._queue: deque[tuple[Draw, Future[T]]] = deque()
        self._closed = False
        for d in pending or []:  # draws a committed run had made but not handed out
            self._queue.append((d, executor.submit(assemble, d)))

    def _fill(self) -> None:
        while len(self._queue) < self._prefetch + 1:
            d = self._draw()
            self._queue.append((d, self._executor.submit(self._assemble, d)))

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        self._fill()  # batches i .. i+p are drawn when batch i is handed out
        if self._handout is not None:  # e.g. a rate limit: if it raises, the batch stays first in line
            self._handout(int(self._queue[0][0].ids.size))
        _, fut = self._queue.popleft()
        return fut.result()

    def pending(self) -> list[Draw]:
        """Drawn, not yet handed out (oldest first)."""
        return [d for d, _ in self._queue]

    def drain(self) -> None:
        """Wait until no background copy is running (before chunks are unmapped)."""
        for _, fut in self._queue:
            fut.exception()

    def discard(self) -> None:
        """Forget the drawn batches (their rows changed under them); later ones are drawn afresh."""
        self.drain()
        self._queue.clear()

    def close(self) -> None:
        self.drain()
        self._queue.clear()
        self._closed = True
