"""Reading frame stacks out of the ring: output recycling and reads split across threads.

All reads of frames for sampling go through ``FrameReader.stacks`` (transition
batches) or ``FrameReader.gather`` (any slot array: sequences) - the reader
interface a compressed or cold-storage chunk format plugs into.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .storage.vmem import RangeAdvisor


class FramePool:
    """Recycles the memory of obs/next_obs outputs the caller no longer references.

    A fresh 2 MB output per batch costs page faults and zeroing on every call (glibc serves
    such sizes with a new mmap each time) - as much as the gather itself. A buffer is reused
    only when this pool holds the sole reference to it: a batch array still alive anywhere
    (also as the base of a view, or wrapped by ``torch.from_numpy``) keeps its buffer out.

    How many buffers are alive at once depends on the caller: a ``sample()`` loop needs two
    (the batch in use, the one being filled), ``batches(prefetch=p)`` up to ``p + 3`` (queued
    batches hold theirs), a learner that keeps the previous batch one more. A fixed count
    (there were 4) fails as soon as the caller needs more: every batch then pays a new
    allocation. So the pool tracks every buffer it handed out that is still alive (up to
    ``max_count``), and limits only what it keeps alive itself: free buffers beyond
    ``max_free_bytes`` are let go (oldest first), so a change of batch size does not pin the
    old size's buffers.
    """

    def __init__(self, max_free_bytes: int = 64 * 2**20, max_count: int = 64) -> None:
        self._max_free_bytes = max_free_bytes
        self._max_count = max_count
        self._bufs: list[np.ndarray] = []
        self._bytes = 0  # of every tracked buffer
        self._lock = threading.Lock()

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        with self._lock:
            for buf in self._bufs:
                # references: the list, the loop variable, getrefcount's argument
                if buf.shape == shape and buf.dtype == dtype and sys.getrefcount(buf) == 3:
                    break
            else:
                buf = np.empty(shape, dtype)
                self._bufs.append(buf)
                self._bytes += buf.nbytes
            if self._bytes > self._max_free_bytes or len(self._bufs) > self._max_count:
                self._trim()  # (free bytes <= all bytes: nothing to do below the limit)
            return buf

    def _trim(self) -> None:
        bufs = self._bufs
        # a free buffer's references: the list and getrefcount's argument (the one being handed out
        # has the caller's too)
        free = [i for i in range(len(bufs)) if sys.getrefcount(bufs[i]) == 2]
        free_bytes = sum(bufs[i].nbytes for i in free)
        drop = set()
        for i in free:  # oldest first
            if free_bytes <= self._max_free_bytes:
                break
            drop.add(i)
            free_bytes -= bufs[i].nbytes
        if drop:
            bufs[:] = [b for i, b in enumerate(bufs) if i not in drop]
        if len(bufs) > self._max_count:  # batches kept by the caller by the dozen: stop tracking the oldest
            del bufs[: len(bufs) - self._max_count]
        self._bytes = sum(b.nbytes for b in bufs)


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class FrameReader:
    """Gathers frame stacks from the ring's frame array into recycled output buffers.

    ``np.take`` releases the GIL, and one core does not saturate memory bandwidth, so a
    batch's rows are split between the calling thread and ``threads - 1`` workers
    (measured on 2 cores: 320 us -> 222 us for the 256 frames of a batch of 32).

    Cold data: a plain gather faults pages in one at a time. Requesting all of a batch's
    frame runs first (``request``) keeps many reads in flight, but costs ~300 us per batch
    when the pages are cached. ``prefetch_io="auto"`` therefore counts the process's major page
    faults (faults that had to wait for the disk) during a plain gather: from ``COLD_FAULTS`` on,
    batches are requested first; every ``PROBE_EVERY`` such batches one goes without, to notice
    the data turning warm again. (Counting faults, not timing, keeps a busy CPU from looking cold.)
    """

    MIN_SPLIT_BYTES = 256 * 1024  # below this, handing work to a thread costs more than it saves
    PROBE_EVERY = 64
    COLD_FAULTS = 4

    def __init__(self, frames: np.ndarray, threads: int | None = None, prefetch_io: bool | str = "auto") -> None:
        if prefetch_io not in (True, False, "auto"):
            raise ValueError(f"prefetch_io: expected True, False or 'auto', got {prefetch_io!r}")
        self.frames = frames
        self.threads = default_threads() if threads is None else max(1, int(threads))
        self.prefetch_io = prefetch_io
        self._pool = FramePool()
        self._executor: ThreadPoolExecutor | None = None
        self._advisor = RangeAdvisor()
        self._cold_batches = 0  # > 0: requesting first; counts down to the next plain probe

    def stacks(self, obs_slots: np.ndarray, next_slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``frames[obs_slots]`` and ``frames[next_slots]`` (both ``(B, k)``) as two ``(B, k, *frame)`` arrays."""
        frames = self.frames
        b, k = obs_slots.shape
        both = self._pool.get((2, b, k) + frames.shape[1:], frames.dtype)
        requested = self.prefetch_io is True or (self.prefetch_io == "auto" and self._cold_batches > 0)
        if requested:
            self.request(np.concatenate((obs_slots.reshape(-1), next_slots.reshape(-1))))
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        self._take(frames, obs_slots, next_slots, both)
        if self.prefetch_io == "auto":
            if requested:
                self._cold_batches -= 1  # at 0 the next batch is a plain probe
            elif resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults >= self.COLD_FAULTS:
                self._cold_batches = self.PROBE_EVERY
        return both[0], both[1]  # C-contiguous views of one buffer

    def gather(self, slots: np.ndarray) -> np.ndarray:
        """``frames[slots]`` for a slot array of any shape: ``slots.shape + frame_shape`` (a recycled buffer,
        like ``stacks``), copied by the same threads, with the same read-ahead of cold pages."""
        frames = self.frames
        out = self._pool.get(slots.shape + frames.shape[1:], frames.dtype)
        index = slots.reshape(-1)
        requested = self.prefetch_io is True or (self.prefetch_io == "auto" and self._cold_batches > 0)
        if requested:
            self.request(index)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        flat = out.reshape((-1,) + frames.shape[1:])
        parts = min(self.threads, max(1, flat.nbytes // self.MIN_SPLIT_BYTES))
        bounds = [index.size * i // parts for i in range(parts + 1)]
        futures = [self._workers().submit(np.take, frames, index[bounds[i]:bounds[i + 1]], 0,
                                          flat[bounds[i]:bounds[i + 1]], "clip") for i in range(1, parts)]
        np.take(frames, index[:bounds[1]], axis=0, out=flat[:bounds[1]], mode="clip")
        for f in futures:
            f.result()
        if self.prefetch_io == "auto":
            if requested:
                self._cold_batches -= 1
            elif resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults >= self.COLD_FAULTS:
                self._cold_batches = self.PROBE_EVERY
        return out

    def _take(self, frames: np.ndarray, obs_slots: np.ndarray, next_slots: np.ndarray, both: np.ndarray) -> None:
        """One gather of all ``2 * B * k`` frames into ``both``, split in equal parts run in parallel.

        (Splitting by rows instead, to keep a row's obs and next_obs copies in one thread, measured
        ~5% slower here: it doubles the number of calls.)
        """
        flat = both.reshape((-1,) + frames.shape[1:])
        index = np.concatenate((obs_slots.reshape(-1), next_slots.reshape(-1)))
        parts = min(self.threads, max(1, flat.nbytes // self.MIN_SPLIT_BYTES))
        bounds = [index.size * i // parts for i in range(parts + 1)]
        futures = [self._workers().submit(np.take, frames, index[bounds[i]:bounds[i + 1]], 0,
                                          flat[bounds[i]:bounds[i + 1]], "clip") for i in range(1, parts)]
        np.take(frames, index[:bounds[1]], axis=0, out=flat[:bounds[1]], mode="clip")
        for f in futures:
            f.result()

    def request(self, slots: np.ndarray) -> None:
        """Start reading the frames at ``slots`` into the page cache, all at once, in file order.

        Adjacent frames (a row's stack and n-step window) are coalesced into one range. Cheap when
        the pages are cached; when they are not, the gather that follows waits on reads already in
        flight instead of faulting them in one by one.
        """
        run = np.unique(slots)
        if run.size == 0:
            return
        breaks = np.flatnonzero(np.diff(run) != 1) + 1
        first = run[np.concatenate(([0], breaks))]
        last = run[np.concatenate((breaks - 1, [run.size - 1]))]
        row = self.frames.strides[0]
        base = self.frames.ctypes.data
        self._advisor.willneed(base + first * row, base + (last + 1) * row)

    def _workers(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="mmreplay-read")
        return self._executor

    def close(self) -> None:
        self._advisor.close()
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

