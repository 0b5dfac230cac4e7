"""Reading frame stacks out of the ring: output recycling and reads split across cores.

All reads of frames go through ``FrameReader``: ``stacks`` for sampled batches, ``gather`` for any
slot array read for sampling (sequences), ``take`` for anything else (current state, episodes,
exports). One native kernel per part of a read decodes the frames of compressed chunks and copies
raw ones (the open chunk, chunks not compressed yet, stores without compression) straight into the
output buffer; numpy (``np.take``) and numcodecs (``reading/reference_read.py``) do it where numba is missing.
Outputs come from a ``bufferpool.FramePool``; how a read is made (threads, shared or alone, posted
ahead) is chosen by ``reading/readpolicy.py``.
"""

from __future__ import annotations

import resource
import threading
import time
from types import ModuleType
from typing import Any

import numpy as np

from ..native import plan as native_plan
from ..native import sample as native_sample
from ..native.codes import FLAT, KIND_LZ4, KIND_RAW, PAIRS
from ..storage.ring import ChunkRing
from ..storage.vmem import PAGE, RangeAdvisor, memory_budget
from .bufferpool import FramePool
from .readpolicy import ALONE, SHARED, PostGate, WayChooser, default_threads, usable_cpus
from .reference_read import frame_error, reference_frames

# whose major page faults tell a cold read: the calling thread's (it reads part of every read, and asking for
# one thread's counts is cheaper than summing every thread's), or the process's where there is no such call
_FAULTS_OF = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


PlanInputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""``Index.plan_inputs``: the native plan's arguments (``native.plan.plan_batch``'s) for a batch's slots."""


class PostedStacks:
    """A ``FrameReader.post_stacks`` read: its task, its output, and the slot arrays it reads (kept alive
    until joined)."""

    __slots__ = ("helper", "task", "both", "obs", "nxt", "error")

    def __init__(self, helper: Any, task: tuple[int, int], both: np.ndarray, obs: np.ndarray, nxt: np.ndarray) -> None:
        self.helper, self.task, self.both, self.obs, self.nxt = helper, task, both, obs, nxt
        self.error: tuple[int, int] | None = None  # (error code, slot) once joined


def _advise(starts: np.ndarray, ends: np.ndarray) -> None:
    advisor = RangeAdvisor()
    try:
        advisor.willneed(starts, ends)
    finally:
        advisor.close()


_KERNELS: list[tuple[ModuleType, ModuleType | None] | None] = []


def native_kernels() -> tuple[ModuleType, ModuleType | None] | None:
    """``(mmreplay.native.lz4, mmreplay.native.crew)`` (the crew None where helpers cannot sleep in the kernel:
    not Linux), or None where numba cannot be imported or does not compile (``NUMBA_DISABLE_JIT=1``): then
    frames are copied by numpy and decoded by the numcodecs reference path."""
    if not _KERNELS:
        found: tuple[ModuleType, ModuleType | None] | None
        try:
            from ..native import jit_enabled

            if not jit_enabled():
                raise ImportError("numba's compiler is disabled")
            from ..native import crew, lz4
            found = lz4, (crew if crew.SUPPORTED else None)
        except ImportError:
            found = None
        _KERNELS.append(found)
    return _KERNELS[0]


class FrameReader:
    """Gathers frame stacks from the ring's frame array into recycled output buffers.

    Decoding is CPU work and one core does not saturate memory bandwidth, so a read is shared between the
    calling thread and up to ``threads - 1`` helper threads (``native.crew``): the caller posts the read and
    reads it itself, and each helper that wakes in time takes rows the caller has not reached. Helpers sleep
    in the kernel between reads, never spinning, and they are used only while reads measure faster with
    them than alone (``WayChooser``); where they cannot run (no numba, not Linux, one CPU) the caller reads
    alone. ``threads`` defaults to the CPUs this process may use (``usable_cpus``), at most 4.

    Cold data: a plain gather faults pages in one at a time. Reading all of a batch's
    frame runs ahead first (``read_ahead_slots``) keeps many reads in flight, but costs per batch
    when the pages are cached. ``read_ahead="auto"`` therefore counts the calling thread's major page
    faults (faults that had to wait for the disk) during a plain gather: from ``COLD_FAULTS`` on,
    batches are read ahead first; every ``PROBE_EVERY`` such batches one goes without, to notice
    the data turning warm again. (Counting faults, not timing, keeps a busy CPU from looking cold.)
    A store with compressed chunks is then also read ahead whole if it fits (``_read_ahead_store``).
    """

    MIN_SHARED_BYTES = 128 * 1024  # a smaller read is not worth waking a helper for
    PROBE_EVERY = 64
    COLD_FAULTS = 4
    CHUNKS = 64  # a read's rows in up to this many runs, claimed one at a time
    SHARE: bool | None = None  # None: as WayChooser finds faster; True/False: always/never with the helpers
    RECHECK = 256  # reads between two looks at the CPUs this process may use (its affinity can change)

    def __init__(self, frames: np.ndarray, threads: int | None = None, read_ahead: bool | str = "auto",
                 ring: ChunkRing | None = None, native: bool = True, parallel: bool = True) -> None:
        if read_ahead not in (True, False, "auto"):
            raise ValueError(f"read_ahead: expected True, False or 'auto', got {read_ahead!r}")
        self.frames = frames
        self._ring = ring
        kernels = native_kernels() if native else None
        self._native = kernels[0] if kernels else None
        self.threads = default_threads() if threads is None else max(1, int(threads))
        crew_module = kernels[1] if kernels and parallel else None
        # None: the caller reads alone
        self._crew: Any = crew_module.Crew(self.threads - 1) if crew_module is not None and self.threads > 1 else None
        self._crew_module = crew_module
        self.read_ahead = read_ahead
        self._pool = FramePool()
        self._advisor = RangeAdvisor()
        self._cold_batches = 0  # > 0: reading ahead first; counts down to the next plain probe
        self._ways = WayChooser()  # shared with helpers, or alone: whichever is faster now
        self._store_read_ahead_started = False
        self._ring_fields: np.ndarray | None = None  # the ring's part of a task's fields
        self._args: tuple[Any, ...] | None = None  # _kernel_args
        self._gate = PostGate()
        # the last post's (ring fields, (slot shape, output bytes, CHUNKS), task fields): ``_posted_fields``
        self._post_template: tuple[Any, tuple[Any, ...], np.ndarray] | None = None
        self._reads = 0
        self._cpus = min(self.threads, usable_cpus())  # threads that may read at once now
        if self._crew is not None:
            self._crew.limit(self._cpus - 1)

    def stacks(self, obs_slots: np.ndarray, next_slots: np.ndarray, out: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """``frames[obs_slots]`` and ``frames[next_slots]`` (both ``(B, k)``) as two ``(B, k, *frame)`` arrays:
        the halves of a recycled ``(2, B, k, *frame)`` buffer, or of ``out`` (the caller's C-contiguous array
        of that shape and the frames' dtype, e.g. pinned host memory), read straight into."""
        b = obs_slots.shape[0]
        both = self._output((2,) + obs_slots.shape, out)
        ahead = self._ahead()
        self._stacks_into(both, obs_slots, next_slots, ahead, self._way(b, both.nbytes, ahead))
        return both[0], both[1]  # C-contiguous views of one buffer

    def planned_stacks(self, plan_inputs: PlanInputs, reward: np.ndarray, discounts: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A batch planned by the native plan and read: ``(obs, next_obs, values, ends)``, as
        ``native.plan.plan_returns`` then ``stacks`` and the zeroing of its padding give them (``values``:
        float32 (3, B) n-step rewards, discounts and ones; ``ends``: bool (3, B) terminated, truncated,
        next_missing). ``plan_inputs``: ``Index.plan_inputs``' answer; ``reward``: the ring's reward column;
        ``discounts``: the float32 ``gamma**m`` table.

        A read this thread makes alone on warm data is one native call (``native.sample.plan_gather``: no
        plan arrays cross into Python); a shared or cold read plans first, then reads as ``stacks`` does."""
        slots, flags, episode_pos, seq_of_pos, config, gammas = plan_inputs
        b, k = slots.shape[0], int(config[native_plan.C_STACK])
        frames = self.frames
        both = self._pool.get((2, b, k) + frames.shape[1:], frames.dtype)
        ahead = self._ahead()
        way = self._way(b, both.nbytes, ahead)
        if ahead or way[0] == SHARED or self._native is None or self._ring is None:
            stacks, pad, values, ends, zeros = native_plan.plan_returns(slots, flags, episode_pos, seq_of_pos, config,
                                                                        gammas, reward, discounts)
            self._stacks_into(both, stacks[0], stacks[1], ahead, way)
            if zeros:  # (nearly always 0)
                both[pad] = 0
                both[1][ends[2]] = 0
            return both[0], both[1], values, ends
        values = np.empty((3, b), np.float32)
        ends = np.empty((3, b), np.bool_)
        faults = resource.getrusage(_FAULTS_OF).ru_majflt
        timed = self._crew is not None
        start = time.perf_counter() if timed else 0.0
        err, slot = native_sample.plan_gather(slots, flags, episode_pos, seq_of_pos, config, gammas, reward, discounts,
                                              values, ends, both.reshape(-1).view(np.uint8), *self._kernel_args())
        if timed:
            self._ways.record(ALONE, time.perf_counter() - start, both.nbytes, way[1])
        if err:
            raise self._error(int(err), int(slot))
        self._count_faults(False, faults)
        return both[0], both[1], values, ends

    def _ahead(self) -> bool:
        """Whether the next read reads its frames' pages ahead first (cold data, see the class)."""
        return self.read_ahead is True or (self.read_ahead == "auto" and self._cold_batches > 0)

    def _stacks_into(self, both: np.ndarray, obs_slots: np.ndarray, next_slots: np.ndarray, ahead: bool,
                     way: tuple[int, int]) -> None:
        """``stacks``' read into ``both`` (2, B, k, *frame), the way ``_way`` chose."""
        frames = self.frames
        b = obs_slots.shape[0]
        if ahead:
            self.read_ahead_slots(np.concatenate((obs_slots.reshape(-1), next_slots.reshape(-1))))
        faults = resource.getrusage(_FAULTS_OF).ru_majflt
        if self._native is not None and self._ring is not None:
            obs = np.ascontiguousarray(obs_slots, np.int64)
            nxt = np.ascontiguousarray(next_slots, np.int64)
            self._read(PAIRS, obs, nxt, both, b, ahead, way)
        else:  # numpy: no numba, or no ring
            index = np.concatenate((obs_slots.reshape(-1), next_slots.reshape(-1)))
            flat = both.reshape((-1,) + frames.shape[1:])
            if self._ring is not None and self._ring.compressed:
                flat[:] = self._reference(index)
            else:
                np.take(frames, index, axis=0, out=flat, mode="clip")
        self._count_faults(ahead, faults)

    def _fields(self, mode: int, slots: np.ndarray, nxt: np.ndarray | None, rows: int, out: np.ndarray) -> np.ndarray:
        """A crew task's fields (``native.crew``: ``ctl[OBS:]``) for reading ``rows`` rows into ``out``."""
        crew: Any = self._crew_module
        if self._ring_fields is None:  # the arrays and numbers of _kernel_args, as task fields
            raw, comp, _, kind, table, end, rows_alloc, cstride, fb = self._kernel_args()
            f = np.zeros(crew.FIELDS, np.int64)
            for at, value in ((crew.RAW, raw.ctypes.data), (crew.RAW_BYTES, raw.size),
                              (crew.COMP, comp.ctypes.data), (crew.COMP_BYTES, comp.size),
                              (crew.KIND, kind.ctypes.data), (crew.TABLE, table.ctypes.data),
                              (crew.END, end.ctypes.data), (crew.POSITIONS, kind.size),
                              (crew.ROWS_ALLOC, rows_alloc), (crew.CSTRIDE, cstride), (crew.FRAME_BYTES, fb)):
                f[at - crew.OBS] = value
            self._ring_fields = f
        fields = self._ring_fields.copy()
        o = crew.OBS
        fields[crew.MODE - o] = mode
        fields[crew.OBS - o] = slots.ctypes.data
        fields[crew.NXT - o] = 0 if nxt is None else nxt.ctypes.data
        fields[crew.ROWS - o] = rows
        fields[crew.STACK - o] = slots.shape[1] if slots.ndim == 2 else 1
        fields[crew.OUT - o] = out.ctypes.data
        fields[crew.OUT_BYTES - o] = out.nbytes
        fields[crew.CHUNK_ROWS - o] = max(1, -(-rows // self.CHUNKS))
        return fields

    def _way(self, rows: int, nbytes: int, cold: bool) -> tuple[int, int]:
        """How the next read of ``rows`` rows (``nbytes`` of output) is made: shared with the helpers when
        there are any, the read is large enough and ``WayChooser`` finds that faster now (cold reads are
        always shared: their threads wait on page faults side by side, and they are not timed); else in this
        thread alone. Returns the way and how ``WayChooser`` takes its time."""
        way, how = ALONE, WayChooser.AVERAGE
        crew = self._crew
        self._reads += 1
        if crew is not None and self._reads % self.RECHECK == 0:
            self._cpus = min(self.threads, usable_cpus())
            crew.limit(self._cpus - 1)
        if (crew is not None and rows > 1 and nbytes >= self.MIN_SHARED_BYTES and self.SHARE is not False
                and (self._cpus > 1 or self.SHARE)):
            way, how = (SHARED, WayChooser.UNTIMED) if cold or self.SHARE else self._ways.pick()
        return way, how

    def _read(self, mode: int, slots: np.ndarray, nxt: np.ndarray | None, out: np.ndarray, rows: int,
              cold: bool, way: tuple[int, int] | None = None) -> None:
        """Read ``rows`` rows (``mode``: ``PAIRS`` of stacks, or ``FLAT`` frames) into ``out``, the way
        ``_way`` chose (``way``, or asked now)."""
        lz4 = self._native
        assert lz4 is not None
        crew = self._crew
        how_way, how = self._way(rows, out.nbytes, cold) if way is None else way
        start = time.perf_counter()
        if how_way == SHARED:
            task = crew.post(self._fields(mode, slots, nxt, rows, out), rows, (slots, nxt, out))
            err, slot, _ = crew.join(task)
        elif mode == PAIRS:
            err, slot = lz4.gather_pairs(slots, nxt, 0, rows, out.reshape(-1).view(np.uint8), *self._kernel_args())
        else:
            err, slot = lz4.gather(slots, out.reshape(-1).view(np.uint8), *self._kernel_args())
        if crew is not None and not cold:
            self._ways.record(how_way, time.perf_counter() - start, out.nbytes, how)
        if err:
            raise self._error(int(err), int(slot))

    def may_post(self) -> bool:
        """Whether a read posted now would start in the helper threads (``post_stacks``, ``post_gather``); not
        with no helpers; on cold data (its reads go through the fault counting and read-ahead of ``stacks``);
        nor while ``PostGate`` has found joins slower than plain reads (the cores are busy elsewhere). Each
        call counts as one read towards the gate's next try."""
        return not (self._native is None or self._ring is None or self._crew is None or self.read_ahead is True
                    or self._cpus <= 1 or self._cold_batches > 0 or not self._gate.open())

    def post_stacks(self, obs_slots: np.ndarray, next_slots: np.ndarray, out: np.ndarray | None = None
                    ) -> PostedStacks | None:
        """Start reading ``stacks(obs_slots, next_slots)`` in the helper threads and return at once;
        ``join_stacks`` gives the two arrays. None when the read had better be made by ``stacks`` when needed
        (``may_post``). ``out``: as for ``stacks``; posted only where ``may_post()`` just said so (the caller
        took ``out`` for this read)."""
        if out is None and not self.may_post():
            return None
        crew = self._crew
        assert crew is not None
        b = obs_slots.shape[0]
        both = self._output((2,) + obs_slots.shape, out)
        obs = np.ascontiguousarray(obs_slots, np.int64)
        nxt = np.ascontiguousarray(next_slots, np.int64)
        posted = PostedStacks(crew, (0, 0), both, obs, nxt)
        posted.task = crew.post(self._posted_fields(obs, nxt, both), b, posted)
        self._gate.posts += 1
        return posted

    def buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        """A recycled output buffer of frames ``shape + frame shape`` (as ``gather`` reads into)."""
        return self._output(shape, None)

    def post_gather(self, slots: np.ndarray, out: np.ndarray) -> PostedStacks:
        """Start reading ``gather(slots, out)`` (``slots`` 1-D, ``out`` the caller's C-contiguous array of the
        frames' dtype and shape ``(slots.size, *frame)``, e.g. pinned host memory) in the helper threads and
        return at once; ``join_gather`` finishes it. Only where ``may_post()`` just said so."""
        crew = self._crew
        assert crew is not None
        self._check_out(out, slots.shape[:1] + self.frames.shape[1:])
        index = np.ascontiguousarray(slots, np.int64)
        posted = PostedStacks(crew, (0, 0), out, index, index)
        posted.task = crew.post(self._fields(FLAT, index, None, index.size, out), index.size, posted)
        self._gate.posts += 1
        return posted

    def _output(self, slots_shape: tuple[int, ...], out: np.ndarray | None) -> np.ndarray:
        """Where frames of slots of ``slots_shape`` are read: ``out`` (checked), else a recycled buffer."""
        shape = slots_shape + self.frames.shape[1:]
        if out is None:
            return self._pool.get(shape, self.frames.dtype)
        self._check_out(out, shape)
        return out

    def _check_out(self, out: np.ndarray, shape: tuple[int, ...]) -> None:
        """Raise ``ValueError`` unless ``out`` is a C-contiguous array of the frames' dtype and ``shape``."""
        dtype = self.frames.dtype
        if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
            raise ValueError(f"out: expected a C-contiguous {dtype} array of shape {shape}, got"
                             f" {out.dtype} {out.shape}{'' if out.flags.c_contiguous else ' (not C-contiguous)'}")

    def join_gather(self, posted: PostedStacks) -> np.ndarray:
        """The frames ``post_gather`` started reading, once read (as ``join_stacks``): its ``out``."""
        self._join(posted)
        return posted.both

    def _posted_fields(self, obs: np.ndarray, nxt: np.ndarray, both: np.ndarray) -> np.ndarray:
        """``_fields(PAIRS, obs, nxt, rows, both)``, from the last post's fields when only the three arrays
        differ (a feed posts batches of one shape: setting three pointers costs less than building the task)."""
        crew: Any = self._crew_module
        last = self._post_template
        key = (obs.shape, both.nbytes, self.CHUNKS)
        if last is None or last[0] is not self._ring_fields or last[1] != key:
            fields = self._fields(PAIRS, obs, nxt, obs.shape[0], both)
            self._post_template = (self._ring_fields, key, fields)
            return fields
        fields = last[2].copy()
        o = crew.OBS
        fields[crew.OBS - o] = obs.ctypes.data
        fields[crew.NXT - o] = nxt.ctypes.data
        fields[crew.OUT - o] = both.ctypes.data
        return fields

    def settle(self) -> None:
        """Wait until the helpers have no read in flight (before chunks are unmapped)."""
        if self._crew is not None:
            self._crew.settle()

    def ring_resized(self, frames: np.ndarray) -> None:
        self.settle()
        self.frames = frames
        self._ring_fields = None
        self._args = None

    def join_stacks(self, posted: PostedStacks) -> tuple[np.ndarray, np.ndarray]:
        """The stacks ``post_stacks`` started reading, once read (this thread reads what the helpers have not
        started). May be called again (the same arrays, or the same error)."""
        self._join(posted)
        return posted.both[0], posted.both[1]

    def _join(self, posted: PostedStacks) -> None:
        if posted.error is None:
            start = time.perf_counter()
            err, slot, _ = posted.helper.join(posted.task)
            posted.error = (err, slot)
            self._gate.joined((time.perf_counter() - start) / max(1, posted.both.nbytes), self._ways.cost)
        if posted.error[0]:
            raise self._error(*posted.error)

    def _count_faults(self, ahead: bool, faults: int) -> None:
        """After a read: count down the read-ahead (cold) batches, or notice that a plain one went to the disk."""
        if self.read_ahead == "auto":
            if ahead:
                self._cold_batches -= 1  # at 0 the next batch is a plain probe
            elif resource.getrusage(_FAULTS_OF).ru_majflt - faults >= self.COLD_FAULTS:
                self._cold_batches = self.PROBE_EVERY
                self._read_ahead_store()

    def gather(self, slots: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``frames[slots]`` for a slot array of any shape: ``slots.shape + frame_shape`` (a recycled buffer,
        like ``stacks``), shared with the same helpers, with the same read-ahead of cold pages; frames of
        compressed chunks are decoded straight into it. ``out``: the caller's C-contiguous array of that
        shape and the frames' dtype (e.g. pinned host memory) to read into instead; it is returned."""
        frames = self.frames
        out = self._output(slots.shape, out)
        index = np.ascontiguousarray(slots, np.int64).reshape(-1)
        ahead = self._ahead()
        if ahead:
            self.read_ahead_slots(index)
        faults = resource.getrusage(_FAULTS_OF).ru_majflt
        flat = out.reshape((-1,) + frames.shape[1:])
        if self._native is not None and self._ring is not None:
            self._read(FLAT, index, None, flat, index.size, ahead)
        elif self._ring is not None and self._ring.compressed:
            flat[:] = self._reference(index)
        else:
            np.take(frames, index, axis=0, out=flat, mode="clip")
        self._count_faults(ahead, faults)
        return out

    def _read_ahead_store(self) -> None:
        """Once per reader, when reads turn out cold in a store with compressed chunks: have the kernel
        read every compressed frame file and small column file into the page cache, in the background,
        if together they fit in half the memory this process can use (``memory_budget``: its cgroup's
        limit counts). Compression is what lets a whole store fit in memory; one sequential read of it
        then beats faulting it in a few pages per batch (the per-batch read-ahead goes on meanwhile)."""
        ring = self._ring
        if self._store_read_ahead_started or ring is None or not ring.compressed:
            return
        self._store_read_ahead_started = True
        starts, ends = ring.read_ahead_spans()
        if int((ends - starts).sum()) > memory_budget() // 2:
            return
        threading.Thread(target=_advise, args=(starts, ends), daemon=True, name="mmreplay-read-ahead").start()

    def _kernel_args(self) -> tuple[Any, ...]:
        """The ring's arrays and numbers every frame kernel takes (kept until the ring is re-laid out:
        ``ring_resized``; in between the arrays are updated in place)."""
        args = self._args
        if args is None:
            ring = self._ring
            assert ring is not None
            args = self._args = (ring.raw_frames, ring.comp_bytes, ring.comp_words, ring.frame_kind, ring.comp_table,
                                 ring.comp_end, ring.rows_alloc, ring.cstride, ring.frame_bytes)
        return args

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
        """Frames at ``slots`` (1-D) decoded one by one with numcodecs (``reading/reference_read.py``)."""
        assert self._ring is not None
        out = reference_frames(self._ring, slots)
        return out.view(self.frames.dtype).reshape((slots.size,) + self.frames.shape[1:])

    def _error(self, err: int, slot: int) -> Exception:
        assert self._ring is not None
        return frame_error(self._ring, err, slot)

    def read_ahead_slots(self, slots: np.ndarray) -> None:
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
            self._read_ahead_compressed(run[kind == KIND_LZ4])
            run = run[kind == KIND_RAW]
            if run.size == 0:
                return
        breaks = np.flatnonzero(np.diff(run) != 1) + 1
        first = run[np.concatenate(([0], breaks))]
        last = run[np.concatenate((breaks - 1, [run.size - 1]))]
        row = self.frames.strides[0]
        base = self.frames.ctypes.data
        self._advisor.willneed(base + first * row, base + (last + 1) * row)

    def _read_ahead_compressed(self, slots: np.ndarray) -> None:
        """``read_ahead_slots`` for frames in compressed files: their records first, then their entries."""
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

    def close(self) -> None:
        self._advisor.close()
        if self._crew is not None:
            self._crew.close()

    def forked(self) -> None:
        """In a forked child: drop what belongs to the parent's threads, never joining it (the helpers, which
        did not survive the fork: the child starts its own on its first shared read; a buffer pool whose lock
        a parent's thread may have held at the fork). Reads go on through the inherited mappings."""
        if self._crew is not None:
            self._crew.forked()
        self._pool = FramePool()
