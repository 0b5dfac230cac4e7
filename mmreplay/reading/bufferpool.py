"""Recycled output buffers for frame reads (``FramePool``)."""

from __future__ import annotations

import sys
import threading

import numpy as np


class FramePool:
    """Recycles the memory of obs/next_obs outputs the caller no longer references.

    A fresh output of megabytes per batch costs page faults and zeroing on every call (glibc serves
    such sizes with a new mmap each time), about as much as the gather itself. A buffer is reused
    only when this pool holds the sole reference to it: a batch array still alive anywhere
    (also as the base of a view, or wrapped by ``torch.from_numpy``) keeps its buffer out.

    How many buffers are alive at once depends on the caller: a ``sample()`` loop needs two
    (the batch in use, the one being filled), ``batches(prefetch=p)`` up to ``p + 3`` (queued
    batches hold theirs), a learner that keeps the previous batch one more. A fixed count
    fails as soon as the caller needs more: every batch then pays a new allocation. So the pool tracks every buffer it handed out that is still alive (up to
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
