"""Reading frame stacks out of the ring: output recycling and reads split across cores.

All reads of frames go through ``FrameReader``: ``stacks`` for sampled batches, ``gather`` for any
slot array read for sampling (sequences), ``take`` for anything else (current state, episodes,
exports). One native kernel per part of a read decodes the frames of compressed chunks and copies
raw ones (the open chunk, chunks not compressed yet, stores without compression) straight into the
output buffer; numpy (``np.take``) and numcodecs do it where numba is missing.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import numpy as np

from .errors import CorruptStoreError
from .native.codes import E_UNMAPPED, ERRORS, KIND_LZ4, KIND_RAW
from .storage import framefile
from .storage.ring import ChunkRing
from .storage.vmem import PAGE, RangeAdvisor, memory_budget


class PostedStacks:
    """A ``FrameReader.post_stacks`` read: its task, its output, and the slot arrays it reads (kept alive
    until joined)."""

    __slots__ = ("helper", "task", "both", "obs", "nxt", "error")

    def __init__(self, helper: Any, task: tuple[int, int], both: np.ndarray, obs: np.ndarray, nxt: np.ndarray) -> None:
        self.helper, self.task, self.both, self.obs, self.nxt = helper, task, both, obs, nxt
        self.error: tuple[int, int] | None = None  # (error code, slot) once joined


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


def _advise(starts: np.ndarray, ends: np.ndarray) -> None:
    advisor = RangeAdvisor()
    try:
        advisor.willneed(starts, ends)
    finally:
        advisor.close()


_KERNELS: list[tuple[ModuleType, ModuleType | None] | None] = []


def native_kernels() -> tuple[ModuleType, ModuleType | None] | None:
    """``(mmreplay.native.lz4, mmreplay.native.parallel)``, or None where numba cannot be imported or does not
    compile (``NUMBA_DISABLE_JIT=1``; then frames are copied by numpy and decoded by the numcodecs reference
    path, ~10x slower). The second is None where the threading layer asked for cannot load (no parallel
    launch: the reader splits batches through its thread pool)."""
    if not _KERNELS:
        found: tuple[ModuleType, ModuleType | None] | None
        try:
            from .native import jit_enabled, parallel_layer_loadable

            if jit_enabled():
                from .native import lz4, parallel
                found = lz4, parallel if parallel_layer_loadable() else None
            else:
                found = None
        except ImportError:  # pragma: no cover - numba is a dependency
            found = None
        _KERNELS.append(found)
    return _KERNELS[0]


class WayChooser:
    """Which of two ways to read a batch is faster now: 0, one parallel launch; 1, the calling thread and
    the thread pool. From what reads cost per output byte: the way in use is averaged over its recent
    reads (each clipped to 4x the average: switching takes a run of slow reads, not one), the other is
    tried every ``PROBE`` reads (and once early) and taken as measured. A launch after a pause in launching
    wakes sleeping threads (the first launch also starts them), so it is not timed: a probe of launching
    launches twice and times the second.

    Why measure: a launch's threads spin while they wait for each other, which pays on idle cores (a
    batch of 32 Atari stacks: 2x faster) and costs when other processes keep the cores busy (the
    thread that is not running holds up the one that is). Measured with the test suite running beside it
    on 2 cores: launches 620-2,180 us per batch, the pool 370-530 us."""

    PROBE = 128
    EARLY = 4
    WEIGHT = 0.05  # of a read in the average of the way in use
    AVERAGE, MEASURED, UNTIMED = 0, 1, 2  # how ``record`` takes a read

    def __init__(self) -> None:
        self.cost = [0.0, 0.0]  # seconds per output byte (0.0: not measured yet)
        self.reads = 0

    def pick(self) -> tuple[int, int]:
        """The way for the next read, and how to take its time (``AVERAGE``, ``MEASURED``, ``UNTIMED``)."""
        self.reads += 1
        r = self.reads
        launch, other = self.cost
        if r == 1:
            return 0, self.UNTIMED  # the first launch starts the threads
        if other == 0.0 and r >= self.EARLY:
            return 1, self.MEASURED
        if launch == 0.0 or other == 0.0 or launch <= other:
            return (1, self.MEASURED) if r % self.PROBE == 0 else (0, self.AVERAGE)
        if r % self.PROBE in (0, 1):
            return 0, self.UNTIMED if r % self.PROBE == 0 else self.MEASURED
        return 1, self.AVERAGE

    def record(self, way: int, seconds: float, nbytes: int, how: int) -> None:
        if how == self.UNTIMED:
            return
        c = seconds / max(1, nbytes)
        old = self.cost[way]
        if old == 0.0 or how == self.MEASURED:
            self.cost[way] = c
        else:  # one slow read (a thread woken late) must not switch ways: clipped, and a slow average
            self.cost[way] = old + self.WEIGHT * (min(c, 4 * old) - old)


class PostGate:
    """Whether ``FrameReader.post_stacks`` posts: not while joins, the time the caller spends reading what
    the helper has not read and waiting for the rest, cost more per byte than a plain read of the way in
    use (``WayChooser``'s costs). A join that waits on a helper the system has descheduled (other processes
    keep the cores busy) can take a time slice. Joins are averaged like ``WayChooser`` averages reads (each
    clipped to 4x the average), after ``UNTIMED`` joins (a helper that had gone to sleep wakes up during
    the first ones); once the average is over, ``OFF`` reads go through ``stacks`` (they also bring the
    chooser's costs up to date), then posting is tried again."""

    OFF = 256
    UNTIMED = 8
    WEIGHT = 0.05
    SLOWER = 1.0  # joins at most this times the plain read's cost

    def __init__(self) -> None:
        self.cost = 0.0  # seconds per byte of a join (0.0: none yet)
        self.off = 0  # reads left before posting is tried again
        self.untimed = self.UNTIMED
        self.times_off = 0

    def open(self) -> bool:
        if self.off:
            self.off -= 1
            return False
        return True

    def joined(self, per_byte: float, plain: list[float]) -> None:
        if self.untimed:
            self.untimed -= 1
            return
        c = self.cost
        self.cost = per_byte if c == 0.0 else c + self.WEIGHT * (min(per_byte, 4 * c) - c)
        measured = [x for x in plain if x > 0.0]
        if measured and self.cost > self.SLOWER * min(measured):
            self.off, self.cost, self.untimed = self.OFF, 0.0, self.UNTIMED
            self.times_off += 1


class FrameReader:
    """Gathers frame stacks from the ring's frame array into recycled output buffers.

    One core does not saturate memory bandwidth, and decoding is CPU work, so a batch's rows are
    split into up to ``threads`` parts read at once: through one parallel launch of the native
    kernels (``native.parallel``: a batch of 32 Atari stacks on 2 cores, 173 us -> 81 us raw,
    255 us -> 132 us compressed), or, where numba cannot launch safely and cheaply, between the
    calling thread and ``threads - 1`` pool threads (a hand-off costs tens of microseconds).

    Cold data: a plain gather faults pages in one at a time. Requesting all of a batch's
    frame runs first (``request``) keeps many reads in flight, but costs ~300 us per batch
    when the pages are cached. ``prefetch_io="auto"`` therefore counts the process's major page
    faults (faults that had to wait for the disk) during a plain gather: from ``COLD_FAULTS`` on,
    batches are requested first; every ``PROBE_EVERY`` such batches one goes without, to notice
    the data turning warm again. (Counting faults, not timing, keeps a busy CPU from looking cold.)
    A store with compressed chunks is then also read ahead whole if it fits (``_read_ahead``).
    """

    MIN_PART_BYTES = 64 * 1024  # one parallel launch: each part writes at least this much
    MIN_SPLIT_BYTES = 256 * 1024  # the thread pool: below this, handing work to a thread costs more than it saves
    # The thread pool: a raw (uncompressed) gather of warm data is a memory copy; below this size one thread
    # is faster than two (measured warm at 100K, 84x84 frames: B=32, 1.8 MB, one thread 1.08x two; B=64, 3.6 MB,
    # 0.95x; B=128 0.78x). Batches read while the data is cold (requested first) still split: their
    # threads wait on page faults in parallel (one thread measured 0.9x cold, 0.8x two batches ahead).
    MIN_SPLIT_RAW_BYTES = 3 * 1024 * 1024
    PROBE_EVERY = 64
    COLD_FAULTS = 4
    POST_CHUNKS = 64  # post_stacks: a batch's rows in up to this many runs, claimed one at a time

    def __init__(self, frames: np.ndarray, threads: int | None = None, prefetch_io: bool | str = "auto",
                 ring: ChunkRing | None = None, native: bool = True, parallel: bool = True) -> None:
        if prefetch_io not in (True, False, "auto"):
            raise ValueError(f"prefetch_io: expected True, False or 'auto', got {prefetch_io!r}")
        self.frames = frames
        self._ring = ring
        kernels = native_kernels() if native else None
        self._native = kernels[0] if kernels else None
        self._par = kernels[1] if kernels and parallel else None  # None: split through the thread pool
        self.threads = default_threads() if threads is None else max(1, int(threads))
        self.prefetch_io = prefetch_io
        self._pool = FramePool()
        self._executor: ThreadPoolExecutor | None = None
        self._advisor = RangeAdvisor()
        self._cold_batches = 0  # > 0: requesting first; counts down to the next plain probe
        self._bounds: dict[tuple[int, int], np.ndarray] = {}  # (items, parts) -> where each part starts
        self._ways = WayChooser()  # warm reads: one launch or the pool, whichever is faster now
        self._read_ahead_started = False
        self._helper: Any = None  # native.handoff.Helper, started by the first post_stacks
        self._handoff: Any = None  # the native.handoff module, imported then
        self._ring_fields: np.ndarray | None = None  # the ring's part of a posted task's fields
        self._posts = 0
        self._gate = PostGate()

    def stacks(self, obs_slots: np.ndarray, next_slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``frames[obs_slots]`` and ``frames[next_slots]`` (both ``(B, k)``) as two ``(B, k, *frame)`` arrays."""
        frames = self.frames
        b, k = obs_slots.shape
        both = self._pool.get((2, b, k) + frames.shape[1:], frames.dtype)
        requested = self.prefetch_io is True or (self.prefetch_io == "auto" and self._cold_batches > 0)
        if requested:
            self.request(np.concatenate((obs_slots.reshape(-1), next_slots.reshape(-1))))
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        if self._native is not None and self._ring is not None:
            self._pairs(obs_slots, next_slots, both, requested)
        else:  # numpy: no numba, or no ring
            index = np.concatenate((obs_slots.reshape(-1), next_slots.reshape(-1)))
            flat = both.reshape((-1,) + frames.shape[1:])
            if self._ring is not None and self._ring.compressed:
                flat[:] = self._reference(index)
            else:
                self._take_split(frames, index, flat, requested)
        self._count_faults(requested, faults)
        return both[0], both[1]  # C-contiguous views of one buffer

    def post_stacks(self, obs_slots: np.ndarray, next_slots: np.ndarray) -> PostedStacks | None:
        """Start reading ``stacks(obs_slots, next_slots)`` in the helper thread (``native.handoff``) and
        return at once; ``join_stacks`` gives the two arrays. None when the read had better be made by
        ``stacks`` when needed: no native kernels or ring; ``OMP_WAIT_POLICY=passive`` (no thread may wait
        awake); cold data (its reads go through the fault counting and requests of ``stacks``); and while
        ``PostGate`` has found joins slower than plain reads (the cores are busy elsewhere)."""
        par, ring = self._par, self._ring
        if (self._native is None or ring is None or par is None or par.CORES.passive or self.prefetch_io is True
                or self._cold_batches > 0 or not self._gate.open()):
            return None
        if self._helper is None:
            from .native import handoff

            self._handoff, self._helper = handoff, handoff.Helper()
        handoff = self._handoff
        self._posts += 1
        if self._ring_fields is None:  # the arrays and numbers of _kernel_args, as the helper's task fields
            raw, comp, _, kind, table, end, rows_alloc, cstride, fb = self._kernel_args()
            f = np.zeros(handoff.CTL_SIZE - handoff.OBS, np.int64)
            for at, value in ((handoff.RAW, raw.ctypes.data), (handoff.RAW_BYTES, raw.size),
                              (handoff.COMP, comp.ctypes.data), (handoff.COMP_BYTES, comp.size),
                              (handoff.KIND, kind.ctypes.data), (handoff.TABLE, table.ctypes.data),
                              (handoff.END, end.ctypes.data), (handoff.POSITIONS, kind.size),
                              (handoff.ROWS_ALLOC, rows_alloc), (handoff.CSTRIDE, cstride), (handoff.FRAME_BYTES, fb)):
                f[at - handoff.OBS] = value
            self._ring_fields = f
        b, k = obs_slots.shape
        both = self._pool.get((2, b, k) + self.frames.shape[1:], self.frames.dtype)
        obs = np.ascontiguousarray(obs_slots, np.int64)
        nxt = np.ascontiguousarray(next_slots, np.int64)
        fields = self._ring_fields.copy()
        o = handoff.OBS
        fields[handoff.OBS - o] = obs.ctypes.data
        fields[handoff.NXT - o] = nxt.ctypes.data
        fields[handoff.ROWS - o] = b
        fields[handoff.STACK - o] = k
        fields[handoff.OUT - o] = both.ctypes.data
        fields[handoff.OUT_BYTES - o] = both.nbytes
        fields[handoff.CHUNK_ROWS - o] = max(1, b // self.POST_CHUNKS)
        posted = PostedStacks(self._helper, (0, 0), both, obs, nxt)
        posted.task = self._helper.post(fields, b, posted)
        return posted

    def settle(self) -> None:
        """Wait until the helper has no read in flight (before chunks are unmapped)."""
        if self._helper is not None:
            self._helper.settle()

    def ring_resized(self, frames: np.ndarray) -> None:
        self.settle()
        self.frames = frames
        self._ring_fields = None

    def join_stacks(self, posted: PostedStacks) -> tuple[np.ndarray, np.ndarray]:
        """The stacks ``post_stacks`` started reading, once read (this thread reads what the helper has not
        started). May be called again (the same arrays, or the same error)."""
        if posted.error is None:
            start = time.perf_counter()
            err, slot = posted.helper.join(posted.task)
            posted.error = (err, slot)
            self._gate.joined((time.perf_counter() - start) / posted.both.nbytes, self._ways.cost)
        if posted.error[0]:
            raise self._error(*posted.error)
        return posted.both[0], posted.both[1]

    def _count_faults(self, requested: bool, faults: int) -> None:
        """After a read: count down the requested (cold) batches, or notice that a plain one went to the disk."""
        if self.prefetch_io == "auto":
            if requested:
                self._cold_batches -= 1  # at 0 the next batch is a plain probe
            elif resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults >= self.COLD_FAULTS:
                self._cold_batches = self.PROBE_EVERY
                self._read_ahead()

    def _parts(self, items: int, nbytes: int, raw: bool, cold: bool, pool: bool = False) -> tuple[int, bool]:
        """How many parts to split a read of ``items`` rows (or frames) and ``nbytes`` output into, and whether
        they run through one parallel launch (``native.parallel``) rather than the thread pool (``pool``:
        always the pool).

        Cold reads (their pages requested first) go to the pool: their threads mostly wait on page faults,
        and ``batches()`` then copies two batches at once, one in the caller's thread and one in its
        prefetch thread, which cannot launch. Measured cold at 100K (raw Atari frames, 150 batches after
        dropping the page cache): with launches, sample() 518-548 batches/s and batches(2) 496-508; through
        the pool, sample() 452-489 and batches(2) 578-604: ``batches()`` is the way to read from disk."""
        cores = self._par.CORES if self._par is not None and not pool and not cold else None
        launched = cores is not None and cores.usable
        if cores is not None and launched:
            parts = min(cores.threads(self.threads), nbytes // self.MIN_PART_BYTES)
        elif raw and nbytes < self.MIN_SPLIT_RAW_BYTES and not cold:
            parts = 1
        else:
            parts = min(self.threads, nbytes // self.MIN_SPLIT_BYTES)
        return max(1, min(parts, items)), launched

    def _pairs(self, obs_slots: np.ndarray, next_slots: np.ndarray, both: np.ndarray, cold: bool) -> None:
        """Both stacks of every row into ``both`` by the native kernel (``lz4.gather_pairs``: compressed frames
        decoded, raw ones copied; a row's next_obs frames that its obs stack holds copied from the output)."""
        lz4, par, ring = self._native, self._par, self._ring
        assert lz4 is not None and ring is not None
        obs = np.ascontiguousarray(obs_slots, np.int64)
        nxt = np.ascontiguousarray(next_slots, np.int64)
        out = both.reshape(-1).view(np.uint8)
        args = self._kernel_args()
        self._run(obs.shape[0], both.nbytes, not ring.compressed, cold,
                  lambda a, b: lz4.gather_pairs(obs, nxt, a, b, out, *args),
                  lambda bounds: par.gather_pairs(obs, nxt, bounds, out, *args))  # type: ignore[union-attr]

    def _run(self, items: int, nbytes: int, raw: bool, cold: bool, part: Callable[[int, int], Any],
             launch: Callable[[np.ndarray], np.ndarray]) -> None:
        """A read of ``items`` rows or frames split into parts (``_parts``): ``part(a, b)`` reads items
        ``a .. b-1`` in the calling thread, ``launch(bounds)`` all parts at once in one parallel launch; both
        return ``(error code, slot)`` per part. In one call when there is one part or another thread
        launches; through the thread pool where parallel launches are unusable, and for cold reads."""
        parts, launched = self._parts(items, nbytes, raw, cold)
        way, how = -1, WayChooser.AVERAGE
        if launched and parts > 1:  # (cold reads never launch; see _parts)
            way, how = self._ways.pick()
            if way == 1:
                parts, launched = self._parts(items, nbytes, raw, cold, pool=True)
        start = time.perf_counter()
        bounds = self._bounds.get((items, parts))
        if bounds is None:
            bounds = self._bounds[(items, parts)] = np.arange(parts + 1, dtype=np.int64) * items // parts
            if len(self._bounds) > 64:  # (batch sizes change rarely; keep the table small)
                self._bounds.clear()
        par = self._par
        if parts == 1 or (launched and not par.CORES.begin(parts)):  # type: ignore[union-attr]
            if way == 0:
                way = -1  # another thread launches: this read measures neither way
            results = [part(0, items)]
        elif launched:
            try:
                results = launch(bounds).tolist()
            finally:
                par.CORES.end(parts)  # type: ignore[union-attr]
        else:
            futures = [self._workers().submit(part, int(bounds[i]), int(bounds[i + 1])) for i in range(1, parts)]
            results = [part(0, int(bounds[1]))] + [f.result() for f in futures]
        if way >= 0:
            self._ways.record(way, time.perf_counter() - start, nbytes, how)
        for err, slot in results:
            if err:
                raise self._error(int(err), int(slot))

    def _take_split(self, frames: np.ndarray, index: np.ndarray, flat: np.ndarray, cold: bool) -> None:
        """``flat[:] = frames[index]`` through numpy (no native kernels, or no ring), in equal parts run in
        parallel when it is large enough or ``cold`` (its pages were requested first: the threads wait on page
        faults side by side)."""
        parts, _ = self._parts(index.size, flat.nbytes, True, cold, pool=True)
        bounds = [index.size * i // parts for i in range(parts + 1)]
        futures = [self._workers().submit(np.take, frames, index[bounds[i]:bounds[i + 1]], 0,
                                          flat[bounds[i]:bounds[i + 1]], "clip") for i in range(1, parts)]
        np.take(frames, index[:bounds[1]], axis=0, out=flat[:bounds[1]], mode="clip")
        for f in futures:
            f.result()

    def gather(self, slots: np.ndarray) -> np.ndarray:
        """``frames[slots]`` for a slot array of any shape: ``slots.shape + frame_shape`` (a recycled buffer,
        like ``stacks``), split across the same threads, with the same read-ahead of cold pages; frames of
        compressed chunks are decoded straight into it."""
        frames = self.frames
        out = self._pool.get(slots.shape + frames.shape[1:], frames.dtype)
        index = np.ascontiguousarray(slots, np.int64).reshape(-1)
        requested = self.prefetch_io is True or (self.prefetch_io == "auto" and self._cold_batches > 0)
        if requested:
            self.request(index)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        flat = out.reshape((-1,) + frames.shape[1:])
        lz4, par, ring = self._native, self._par, self._ring
        if lz4 is not None and ring is not None:
            args = self._kernel_args()
            raw = flat.reshape(-1).view(np.uint8)
            fb = ring.frame_bytes
            self._run(index.size, flat.nbytes, not ring.compressed, requested,
                      lambda a, b: lz4.gather(index[a:b], raw[a * fb:b * fb], *args),
                      lambda bounds: par.gather(index, bounds, raw, *args))  # type: ignore[union-attr]
        elif self._ring is not None and self._ring.compressed:
            flat[:] = self._reference(index)
        else:
            self._take_split(frames, index, flat, requested)
        self._count_faults(requested, faults)
        return out

    def _read_ahead(self) -> None:
        """Once per reader, when reads turn out cold in a store with compressed chunks: have the kernel
        read every compressed frame file and small column file into the page cache, in the background,
        if together they fit in half the memory this process can use (``memory_budget``: its cgroup's
        limit counts). Compression is what lets a whole store fit in memory; one sequential read of it
        then beats faulting it in a few pages per batch (the per-batch requests go on meanwhile)."""
        ring = self._ring
        if self._read_ahead_started or ring is None or not ring.compressed:
            return
        self._read_ahead_started = True
        starts, ends = ring.readahead_spans()
        if int((ends - starts).sum()) > memory_budget() // 2:
            return
        threading.Thread(target=_advise, args=(starts, ends), daemon=True, name="mmreplay-readahead").start()

    def _kernel_args(self) -> tuple[Any, ...]:
        ring = self._ring
        assert ring is not None
        return (ring.raw_frames, ring.comp_bytes, ring.comp_words, ring.frame_kind, ring.comp_table, ring.comp_end,
                ring.rows_alloc, ring.cstride, ring.frame_bytes)

    def take(self, slots: np.ndarray) -> np.ndarray:
        """Frames at ``slots`` (any shape) as a new array ``slots.shape + frame shape``."""
        ring = self._ring
        if ring is None or not ring.compressed:
            return self.frames[slots]
        flat = np.ascontiguousarray(slots, np.int64).reshape(-1)
        out = np.empty(flat.shape + self.frames.shape[1:], self.frames.dtype)
        if self._native is None:
            out[:] = self._reference(flat)
        else:
            err, slot = self._native.gather(flat, out.reshape(-1).view(np.uint8), *self._kernel_args())
            if err:
                raise self._error(int(err), int(slot))
        return out.reshape(slots.shape + self.frames.shape[1:])

    def _reference(self, slots: np.ndarray) -> np.ndarray:
        """Frames at ``slots`` (1-D) decoded one by one with numcodecs: the path without numba (and the
        reference the kernels are tested against)."""
        ring = self._ring
        assert ring is not None
        fb = ring.frame_bytes
        out = np.empty((slots.size, fb), np.uint8)
        for i, slot in enumerate(slots.tolist()):
            pos, row = divmod(slot, ring.rows_alloc)
            if not 0 <= pos < ring.positions or ring.frame_kind[pos] not in (KIND_RAW, KIND_LZ4):
                raise self._error(E_UNMAPPED, slot)
            if ring.frame_kind[pos] == KIND_RAW:
                out[i] = ring.raw_frames[slot * fb:(slot + 1) * fb]
                continue
            base = pos * ring.cstride
            rec = np.frombuffer(ring.comp_bytes[base + int(ring.comp_table[pos]) + 16 * row:][:16].tobytes(),
                                framefile.RECORD)[0]
            off, length, crc = int(rec["offset"]), int(rec["length"]), int(rec["crc"])
            if off < ring.comp_table[pos] or length < 1 or length > fb or off + length > ring.comp_end[pos]:
                raise self._error(2, slot)
            entry = ring.comp_bytes[base + off:base + off + length].tobytes()
            out[i] = np.frombuffer(framefile.decode_entry(ring.frames_file(slot), entry, crc, fb, row), np.uint8)
        return out.view(self.frames.dtype).reshape((slots.size,) + self.frames.shape[1:])

    def _error(self, err: int, slot: int) -> Exception:
        ring = self._ring
        assert ring is not None
        if err == E_UNMAPPED:
            return RuntimeError(f"frame slot {slot} is not in a mapped chunk (an mmreplay bug; please report it)")
        row = slot % ring.rows_alloc
        return CorruptStoreError(f"{ring.frames_file(slot)}: frame {row} is damaged ({ERRORS.get(err, err)});"
                                 " `mmreplay verify` lists every damaged file")

    def request(self, slots: np.ndarray) -> None:
        """Start reading the frames at ``slots`` into the page cache, all at once, in file order.

        Adjacent frames (a row's stack and n-step window) are coalesced into one range. Cheap when
        the pages are cached; when they are not, the gather that follows waits on reads already in
        flight instead of faulting them in one by one.
        """
        run = np.unique(slots)
        if run.size == 0:
            return
        ring = self._ring
        if ring is not None and ring.compressed:
            kind = ring.frame_kind[run // ring.rows_alloc]
            self._request_compressed(run[kind == KIND_LZ4])
            run = run[kind == KIND_RAW]
            if run.size == 0:
                return
        breaks = np.flatnonzero(np.diff(run) != 1) + 1
        first = run[np.concatenate(([0], breaks))]
        last = run[np.concatenate((breaks - 1, [run.size - 1]))]
        row = self.frames.strides[0]
        base = self.frames.ctypes.data
        self._advisor.willneed(base + first * row, base + (last + 1) * row)

    def _request_compressed(self, slots: np.ndarray) -> None:
        """``request`` for frames in compressed files: their records first, then their entries."""
        ring = self._ring
        if ring is None or slots.size == 0:
            return
        base = ring.comp_bytes.ctypes.data
        pos, row = np.divmod(slots, ring.rows_alloc)
        rec = pos * ring.cstride + ring.comp_table[pos] + 16 * row  # byte offset of each record
        self._willneed_runs(base + rec, base + rec + 16)
        start = ring.comp_words[rec // 8]
        length = ring.comp_words[rec // 8 + 1] & 0xFFFFFFFF
        # clipped to each file's data region: a damaged record must not advise beyond its file
        lo = np.clip(start, ring.comp_table[pos], ring.comp_end[pos])
        hi = np.clip(start + length, lo, ring.comp_end[pos])
        self._willneed_runs(base + pos * ring.cstride + lo, base + pos * ring.cstride + hi)

    def _willneed_runs(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Advise sorted byte ranges, merging those that share or touch a page."""
        lo = starts // PAGE
        hi = -(-ends // PAGE)
        new = np.concatenate(([True], lo[1:] > hi[:-1]))
        first = np.flatnonzero(new)
        last_hi = np.maximum.reduceat(hi, first)
        self._advisor.willneed(lo[first] * PAGE, last_hi * PAGE)

    def _workers(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="mmreplay-read")
        return self._executor

    def close(self) -> None:
        self._advisor.close()
        if self._helper is not None:
            self._helper.close()
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def forked(self) -> None:
        """In a forked child: drop what belongs to the parent's threads, never joining it (its pool, whose
        idle thread the child does not have, would queue reads for ever; its helper thread; a buffer pool
        whose lock a parent's thread may have held at the fork). Reads go on through the inherited mappings."""
        self._executor = None
        self._helper = None
        self._pool = FramePool()
