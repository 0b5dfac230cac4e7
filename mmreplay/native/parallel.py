# numba intrinsics take a typing context first, which mypy sees as an argument:
# mypy: disable-error-code="call-arg"
"""A batch's frames read on several cores in one call: the frame kernels of ``lz4`` run over parts of a
batch at once through numba's ``parallel=True`` (its OpenMP or TBB threading layer).

Why not Python threads: handing a part to a thread pool and waiting for it costs ~90 us per batch
here (submit, wake-up, the GIL passed back and forth), as much as half the copy it parallelizes; an
OpenMP launch costs ~3 us. A batch of 32 Atari stacks (1.8 MB) measured on 2 cores: 173 us in one
thread, 81 us in two through one launch (raw frames); 255 us and 132 us decoding compressed ones.

numba's threading layers are process-wide and come with rules, which ``Cores`` keeps:

- The *workqueue* layer (what numba falls back to without an OpenMP runtime, libgomp on Linux, or
  TBB) takes ~230 us per launch and aborts the process when two threads launch at once. The first
  launch tells which layer numba chose; from then on only OpenMP or TBB launch, otherwise the caller
  splits its batch some other way (``FrameReader`` uses its thread pool).
- One thread launches: the first one that does, for as long as it lives; any other thread (``batches()``'s
  prefetch thread when the caller launched first, say) reads in its own thread. GNU OpenMP gives every
  launching thread its own team of workers, and once a process has more OpenMP threads than cores it
  stops letting idle workers wait awake: every launch then pays their wake-up (~150 us here). Measured:
  after a prefetch thread had launched beside the caller, ``sample(32)`` ran 2.2x slower for good.
  A lock, taken without waiting, covers two threads racing to be the first.
- GNU OpenMP terminates a process forked after a launch when that child launches (a
  ``DataLoader`` worker, a ``multiprocessing`` fork): a child of a process that launched never
  launches.
- ``OMP_WAIT_POLICY=passive`` (OpenMP threads sleep between launches; waking them costs more than a
  part saves): never launch.
- Each launch asks for as many threads as it has parts (numba's thread count is per calling thread,
  set back afterwards), so a machine with many cores does not wake all of them for two parts.
"""

from __future__ import annotations

import os
import threading

import numba as nb
import numpy as np

from ._mem import atomic_add
from .lz4 import gather as gather_frames
from .lz4 import pair_row, prefetch_entries, prefetch_records

SAFE_LAYERS = ("omp", "tbb")
LINE = 8  # int64 per cache line


@nb.njit(nogil=True, parallel=True, cache=True)
def gather_pairs(obs_slots: np.ndarray, next_slots: np.ndarray, bounds: np.ndarray, out: np.ndarray,
                 raw: np.ndarray, comp: np.ndarray, comp64: np.ndarray, kind: np.ndarray, table: np.ndarray,
                 data_end: np.ndarray, rows_alloc: int, cstride: int, fb: int) -> np.ndarray:
    """``lz4.gather_pairs`` of every row, in ``bounds.size - 1`` parts at once; returns each part's ``(error
    code, slot)`` (all zero: fine).

    Part ``p`` reads its rows ``bounds[p] .. bounds[p+1]-1`` front to back, then takes rows the other parts
    have not reached, from the back of their ranges. Rows differ in cost (an Atari frame with many LZ4
    sequences decodes several times slower than a plain one): with fixed halves of a batch of 32 one core
    waited for the other ~9% of the time. Every row is read by exactly one part: ``count[q]`` (atomic)
    grants the rows of range ``q`` one at a time, the owner's from the front, the others' (numbered by
    ``count[parts + q]``) from the back, and never more rows than the range has (each counter on a cache line
    of its own: parts reading their own ranges do not contend).
    """
    parts = bounds.size - 1
    res = np.zeros((parts, 2), np.int64)
    count = np.zeros(2 * parts * LINE, np.int64)  # one cache line per counter: parts count their own rows apart
    for p in nb.prange(parts):
        prefetch_records(obs_slots, next_slots, bounds[p], bounds[p + 1], comp, kind, table, rows_alloc, cstride)
        for i in range(parts):
            q = (p + i) % parts
            lo, hi = bounds[q], bounds[q + 1]
            front = lo
            while res[p, 0] == 0 and atomic_add(count, q * LINE, 1) < hi - lo:
                if q == p:
                    r = front
                    front += 1
                    after = r + 1
                else:
                    r = hi - 1 - atomic_add(count, (parts + q) * LINE, 1)
                    after = r - 1
                if lo <= after < hi:  # the entries this part likely reads next: their misses overlap this row
                    prefetch_entries(obs_slots, next_slots, after, comp, comp64, kind, table, rows_alloc, cstride)
                err, slot = pair_row(obs_slots, next_slots, r, out, raw, comp, comp64, kind, table, data_end,
                                     rows_alloc, cstride, fb)
                if err:
                    res[p, 0] = err
                    res[p, 1] = slot
    return res


@nb.njit(nogil=True, parallel=True, cache=True)
def gather(slots: np.ndarray, bounds: np.ndarray, out: np.ndarray, raw: np.ndarray, comp: np.ndarray,
           comp64: np.ndarray, kind: np.ndarray, table: np.ndarray, data_end: np.ndarray, rows_alloc: int,
           cstride: int, fb: int) -> np.ndarray:
    """``lz4.gather`` of ``slots[bounds[p]:bounds[p+1]]`` into the matching bytes of ``out``, every part ``p``
    at once; returns each part's ``(error code, slot)``."""
    parts = bounds.size - 1
    res = np.zeros((parts, 2), np.int64)
    for p in nb.prange(parts):
        a, b = bounds[p], bounds[p + 1]
        err, slot = gather_frames(slots[a:b], out[a * fb:b * fb], raw, comp, comp64, kind, table, data_end,
                                  rows_alloc, cstride, fb)
        res[p, 0] = err
        res[p, 1] = slot
    return res


class Cores:
    """Whether a parallel kernel may be launched now, from this thread (see the module's rules).

    ``begin()`` True: launch, then ``end()``. False: do the work another way."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # OMP_WAIT_POLICY=passive puts OpenMP's threads to sleep right after each launch: waking them took
        # ~150 us per launch here, and a batch read in two parts went 2x slower than in one thread
        self.passive = os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"
        self._usable = not self.passive
        self._max_threads = int(nb.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
        self._restore = 0
        self.launches = 0  # parallel launches so far (tests check that a read took this path)
        self._owner: threading.Thread | None = None  # the thread that launches (see the module docstring)

    @property
    def usable(self) -> bool:
        """False once launching is known to be unsafe or slow here (and from then on)."""
        return self._usable

    def threads(self, wanted: int) -> int:
        """How many parts a launch may run at once (numba's thread count caps it)."""
        return max(1, min(wanted, self._max_threads))

    def begin(self, parts: int) -> bool:
        if not self._usable:
            return False
        owner = self._owner
        if owner is not None and owner is not threading.current_thread() and owner.is_alive():
            return False
        if not self._lock.acquire(blocking=False):
            return False
        if not self._usable:  # (a launch that ended just before found the layer unsafe)
            self._lock.release()
            return False
        # numba's thread count for this thread: all of them unless set lower; ask for fewer only when
        # there are more than the parts (reading and setting it back costs ~5 us)
        self._restore = nb.get_num_threads() if parts < self._max_threads else parts
        if self._restore > parts:
            nb.set_num_threads(parts)
        return True

    def end(self, parts: int) -> None:
        try:
            if self._restore > parts:
                nb.set_num_threads(self._restore)
            self.launches += 1
            self._owner = threading.current_thread()
            if self.launches == 1:  # numba picks its layer at the first launch
                if nb.threading_layer() not in SAFE_LAYERS:
                    self._usable = False
        finally:
            self._lock.release()

    def forked(self) -> None:
        """In a forked child: never launch if the parent did (GNU OpenMP would terminate the child)."""
        self._lock = threading.Lock()  # a lock held by a parent's thread at the fork stays held in the child
        if self.launches:
            self._usable = False


CORES = Cores()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=CORES.forked)
    # numba compiles (or loads from its cache) under one process-wide lock. A fork while another thread
    # holds it (a prefetch or helper thread calling a kernel for the first time) would leave the child's
    # lock held by a thread the child does not have: its first kernel call would wait forever. The forking
    # thread takes the lock first, so no other thread holds it at the fork.
    from numba.core.compiler_lock import global_compiler_lock as _compiling

    os.register_at_fork(before=_compiling.acquire, after_in_parent=_compiling.release,
                        after_in_child=_compiling.release)
