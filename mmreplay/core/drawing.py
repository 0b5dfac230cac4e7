"""The sampling RNG and the batches drawn with it: the one consumer of the RNG and its durable state.

Every batch's ids are chosen here (by the store's sampler), in the caller's
thread, in the order batches are handed out, so the RNG advances exactly as a
loop of ``sample()`` calls would advance it. Prefetching iterators
(``store.batches``) draw ahead; their drawn-but-not-handed-out batches are part
of the state a commit records (FORMAT.md "Sampling state"), so a resumed
``batches()`` hands out the same batches.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import numpy as np

from ..errors import NotSampleableError
from ..native import jit_enabled
from ..native.rng import Pcg64State
from ..reading.prefetch import BatchIterator, DrawnBatch
from ..sampling import Sampler
from .index import Index

T = TypeVar("T")


class DrawState:
    """RNG, draw counter and live prefetching iterators of one open store."""

    def __init__(self, manifest: dict[str, Any], seed: int | None) -> None:
        self.rng = np.random.default_rng(seed)
        # batches the committed run had drawn but not handed out, until the first iterator (``iterator``)
        self._resume_draws: list[DrawnBatch] = []
        if seed is None:
            self.rng.bit_generator.state = manifest["rng"]
            self._resume_draws, rng_after = _pending_from_manifest(manifest)
            if self._resume_draws:
                # the committed run's generator had made those draws: whatever draws next continues after
                # them, as it would have there (``sample()`` beside the iterator that held them)
                self.rng.bit_generator.state = rng_after
        # the RNG's state read cheaply before each prefetched draw (most such states are never looked at)
        self._pcg = Pcg64State.attach(self.rng) if jit_enabled() else None
        self._count = len(self._resume_draws)  # draws made (orders the pending draws of several iterators)
        self._iterators: weakref.WeakSet[BatchIterator[Any]] = weakref.WeakSet()
        self._pool: ThreadPoolExecutor | None = None

    def draw(self, sampler: Sampler, index: Index, batch_size: int, replace: bool, beta: float | None,
             plan_now: bool = False) -> DrawnBatch:
        """Choose a batch's ids (and weights). With ``plan_now``, also fix its row arithmetic now (for a copy
        made later in another thread) and remember the RNG state before it (for ``state``)."""
        before = self._state_now() if plan_now else {}
        ids, weight, slots = self.draw_now(sampler, index, batch_size, replace, beta)
        return DrawnBatch(ids, weight, before, self._count, index.plan(slots) if plan_now else None, slots=slots)

    def draw_now(self, sampler: Sampler, index: Index, batch_size: int, replace: bool, beta: float | None
                 ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """``draw`` for a batch assembled at once (``sample()``): ``(ids, weight, slots)``, the same draw."""
        self._count += 1
        ids, weight, slots = sampler.draw(self.rng, batch_size, replace, beta)
        return ids, weight, index.slots_of(ids) if slots is None else slots

    def draw_sequences(self, sampler: Sampler, index: Index, batch_size: int, length: int, strict: bool,
                       beta: float | None) -> DrawnBatch:
        """Choose the starts of a batch of sequences (and their weights) and fix their row arithmetic.

        Non-strict starts are drawn exactly as ``draw`` draws transitions; strict ones among the starts with
        ``length`` steps in their episode (``Sampler.draw_where``). A strict draw that finds no such start
        raises ``NotSampleableError`` and leaves the RNG as it was.
        """
        before = self._state_now()
        if strict:
            got = sampler.draw_where(self.rng, batch_size, lambda slots: index.sequence_fits(slots, length), beta,
                                     lambda: index.fitting_starts(length))
            if got is None:
                self.rng.bit_generator.state = self.rng_state(before)
                raise NotSampleableError(
                    f"sample_sequences(strict=True): no sampleable transition has {length} steps in its episode"
                    " (written so far); use a smaller length, strict=False (masked sequences), or add more steps")
        else:
            got = sampler.draw(self.rng, batch_size, True, beta)[:2]
        self._count += 1
        ids, weight = got
        head = index.rows.copy()  # each stream's rows now (the index's counters change as rows are written)
        return DrawnBatch(ids, weight, before, self._count, index.sequence_plan(index.slots_of(ids), length, head),
                    length, strict, head)

    def iterator(self, draw: Callable[[], DrawnBatch], assemble: Callable[..., T], index: Index,
                 kind: tuple[int, int, bool], prefetch: int, handout: Callable[[int], None] | None = None,
                 post: Callable[[DrawnBatch], Any] | None = None,
                 guard: AbstractContextManager[Any] | None = None) -> BatchIterator[T]:
        """A prefetching iterator of draws of one ``kind`` (``DrawnBatch.kind``: batch size, sequence length or 0,
        strict). The first one after a resume first hands out the batches the committed run had drawn but
        not handed out (if they are of this kind and still sampleable; else they are dropped), then draws
        from the RNG as it is (it continued after them from the resume on).
        ``handout(rows)`` runs before each batch is handed out (the rate limit); ``post(draw)`` starts
        reading a draw's frames in the reader's helper thread, and ``assemble(draw, posted, then)`` finishes
        such a draw (``BatchIterator``); ``guard`` (the store's lock) is held by each ``next()``."""
        pending: list[DrawnBatch] = []
        if (self._resume_draws and all(d.kind == kind for d in self._resume_draws)
                and index.ids_valid(np.concatenate([d.ids for d in self._resume_draws])).all()):
            # (a manifest naming ids that are not sampleable is not handed out: draw afresh from ``rng``)
            try:
                for d in self._resume_draws:
                    slots = index.slots_of(d.ids)
                    d.plan = index.sequence_plan(slots, d.length, d.head) if d.length else index.plan(slots)
                pending = self._resume_draws
            except ValueError:  # a head that cannot hold its starts (a forged manifest): draw afresh too
                pending = []
        self._resume_draws = []
        it = BatchIterator(draw, assemble, self._executor(), prefetch, pending, handout, post, guard)
        self._iterators.add(it)
        return it

    def _state_now(self) -> dict[str, Any] | bytes:
        return self._pcg.snapshot() if self._pcg is not None else dict(self.rng.bit_generator.state)

    @staticmethod
    def rng_state(before: dict[str, Any] | bytes) -> dict[str, Any]:
        """NumPy's ``bit_generator.state`` of a ``DrawnBatch.rng_before``."""
        return Pcg64State.state_dict(before) if isinstance(before, bytes) else before

    def _pending(self) -> list[DrawnBatch]:
        """Batches drawn but not handed out, oldest first: a resume's not yet taken by an iterator (there is
        no iterator then), else the live iterators'."""
        live = sorted((d for it in list(self._iterators) for d in it.pending()), key=lambda d: d.order)
        return self._resume_draws + live

    def state(self, index: Index) -> dict[str, Any]:
        """The manifest's ``rng`` and ``pending_draws``: the RNG as of the last batch handed out, plus
        batches drawn but not handed out (with the RNG state after them): a resumed store's own, which no
        iterator has taken yet, or those of live iterators."""
        pending = self._pending()
        if not pending:
            return {"rng": self.rng.bit_generator.state, "pending_draws": None}
        if len({d.kind for d in pending}) > 1 or not index.ids_valid(np.concatenate([d.ids for d in pending])).all():
            # Rows drawn before a retirement evicted them cannot be handed out again after a resume, nor
            # can draws of several kinds (one resumed iterator takes them all): record the rule's state
            # only (the resumed run re-draws from the last batch handed out).
            return {"rng": self.rng_state(pending[0].rng_before), "pending_draws": None}
        entry: dict[str, Any] = {
            "rng_after": self.rng.bit_generator.state,
            # each one's RNG state before it: a resumed store that hands out the first of them and commits
            # again records the state before the next one as its ``rng``
            "rng_before": [self.rng_state(d.rng_before) for d in pending],
            "ids": [d.ids.tolist() for d in pending],
            "weights": None if pending[0].weight is None else [d.weight.tolist() for d in pending if d.weight is not None]}
        if pending[0].length:
            entry["sequences"] = {"length": pending[0].length, "strict": pending[0].strict,
                                  "heads": [_head_json(d.head) for d in pending]}
        return {"rng": self.rng_state(pending[0].rng_before), "pending_draws": entry}

    def discard_pending(self) -> None:
        """Forget every batch drawn but not handed out (``invalidate``/``clear`` changed what may be drawn)
        and rewind the RNG to before the first of them: the batches handed out next are those repeated
        ``sample()`` calls would give from here."""
        pending = self._pending()
        self._resume_draws = []
        if not pending:
            return
        self.rng.bit_generator.state = self.rng_state(pending[0].rng_before)
        for it in list(self._iterators):
            it.discard()

    def drain(self) -> None:
        """Wait until no background copy is running (before chunks are unmapped)."""
        for it in list(self._iterators):
            it.drain()

    def end_iterators(self) -> None:
        """End every live iterator (a reader moving to a newer commit, or closing)."""
        for it in list(self._iterators):
            it.close()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="mmreplay-prefetch")
        return self._pool

    def forked(self, guard: AbstractContextManager[Any] | None = None) -> None:
        """In a forked child: the prefetch thread is the parent's. Its pool is dropped, never joined (a pool
        whose thread was idle at the fork would queue work for a thread the child does not have), and live
        iterators go on with a new one and ``guard``, the store's new lock (``BatchIterator.forked``)."""
        self._pool = None
        for it in list(self._iterators):
            it.forked(self._executor(), guard)

    def close(self) -> None:
        self.end_iterators()
        pool, self._pool = self._pool, None
        if pool is not None:
            # a store dropped unclosed is released by its finalizer in whichever thread collects it, which
            # may be this pool's own: that one cannot wait for itself (it ends when its task returns)
            pool.shutdown(wait=threading.current_thread() not in getattr(pool, "_threads", ()))


def _head_json(head: Any) -> Any:
    """A draw's head for the manifest: one count when every stream had written as many rows, else a list."""
    h = np.asarray(head, np.int64).reshape(-1)
    return int(h[0]) if (h == h[0]).all() else h.tolist()


def _pending_from_manifest(manifest: dict[str, Any]) -> tuple[list[DrawnBatch], dict[str, Any]]:
    state = manifest.get("pending_draws")
    if not state:
        return [], {}
    weights = state["weights"] or [None] * len(state["ids"])
    # the RNG state before each (the first one's is the committed "rng", the state as of the last batch
    # handed out); a manifest without "rng_before" (written before it was recorded) gives that one to all
    before = state.get("rng_before") or [manifest["rng"]] * len(state["ids"])
    draws = [DrawnBatch(np.asarray(ids, np.int64), None if w is None else np.asarray(w, np.float32), b, i)
             for i, (ids, w, b) in enumerate(zip(state["ids"], weights, before, strict=True))]
    seq = state.get("sequences")
    if seq:
        for d, head in zip(draws, seq["heads"], strict=True):
            # one count per stream (format 1: one count, every stream's)
            d.length, d.strict, d.head = int(seq["length"]), bool(seq["strict"]), np.asarray(head, np.int64)
    return draws, state["rng_after"]
