# numba intrinsics take a typing context first, which mypy sees as an argument:
# mypy: disable-error-code="call-arg,return-value,var-annotated,index"
"""A read shared between the calling thread and helper threads that sleep in the kernel when idle.

A read (a batch's stacks, or any array of frame slots) is *posted* as a task split into chunks of
rows; the caller then *joins* it: it reads every chunk nobody has claimed yet, then waits for the
chunks a helper is reading. Helpers are plain threads that run one nogil kernel (``serve``) for
their whole life: they claim chunks as tasks are posted and, when there is nothing to claim, sleep
on a futex until the next post. Nothing ever spins: an idle helper costs nothing, and a helper the
system does not run in time (other processes keep the cores busy) only means the caller reads more
of the task itself. Because a helper waits in native code and never needs the GIL, waking it does
not wait for the caller's Python to let go of the GIL either.

No OpenMP, TBB or numba ``parallel=True``: those runtimes are process-wide (a PyTorch in the same
process shares GNU OpenMP's pool and its thread-count setting) and their workers spin between
launches.

Protocol (one task at a time, ``ctl`` an int64 array shared by all threads; every access below is an
atomic with sequential consistency):

- ``ctl[NEXT]`` holds ``seq << 40 | chunks << 20 | c``: a thread claims chunk ``c`` of task ``seq``
  by adding 1 and owns it if ``c < chunks``. The task's number travels in the same word, so a thread
  that read an old task's word cannot take a chunk of a newer task by mistake.
- ``ctl[DONE]`` holds ``seq << 40 | chunks done``; the task is done when the count reaches ``chunks``.
  A new task is posted only after the last one is done, so a chunk's owner always finds its task's
  fields (pointers to the slots, the output and the ring's arrays) as posted.
- Each row is read by exactly one thread: the LZ4 decoder writes a few bytes past a match and
  overwrites them later, so two threads decoding one frame into the same output could read each
  other's scratch bytes.
- Sleeping: a helper with nothing to claim reads ``ctl[BELL]``, adds itself to ``ctl[PARKED]``, looks
  for work once more and only then waits on the futex ``BELL`` for a change of that value. ``post``
  stores the task, adds 1 to ``BELL`` and wakes as many helpers as ``PARKED`` counts. Either the
  helper's last look sees the task, or the post sees the helper parked (and the wait returns at once
  if ``BELL`` changed before it began): a post never leaves work with every helper asleep. The wait
  also ends after ``WAIT_SECONDS`` (a safety net: an idle helper looks once per period).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import platform
import threading
import weakref
from typing import Any

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._mem import atomic_add, atomic_load, atomic_store
from .codes import PAIRS
from .lz4 import gather as gather_frames
from .lz4 import gather_pairs as gather_pair_rows

NEXT, DONE, STOP, PARKED, ERR, ERR_SLOT, BELL, SYSCALL = range(8)
# the task's fields: MODE is PAIRS (OBS and NXT are (ROWS, STACK) slot arrays, the output (2, ROWS, STACK,
# frame)) or FLAT (OBS is ROWS slots, the output ROWS frames)
OBS, NXT, ROWS, STACK, OUT, OUT_BYTES, RAW, RAW_BYTES, COMP, COMP_BYTES, KIND, TABLE, END, POSITIONS = range(8, 22)
ROWS_ALLOC, CSTRIDE, FRAME_BYTES, CHUNK_ROWS, MODE = range(22, 27)
FUTEX_NR, YIELD_NR, TS_SEC, TS_NSEC = 27, 28, 29, 30  # futex(2)'s and sched_yield(2)'s numbers; the wait's timeout
SPINS = 256  # pauses a join waits for a helper's last chunk before it yields the CPU instead
WAKE = 31  # at most this many helpers are woken per post (the CPUs the process may use, less the caller's)
FIELDS = MODE + 1 - OBS  # a task's fields: ctl[OBS:OBS + FIELDS]
CTL_SIZE = 32
SEQ_SHIFT, CHUNK_SHIFT, LOW = 40, 20, (1 << 20) - 1
SEQ_WRAP = 1 << 22
ERRORS_KEPT = 64  # errors of settled tasks kept for their joins (a task joined that long after is not)
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129
WAIT_SECONDS = 1

# futex(2)'s number where helpers can sleep in the kernel; elsewhere reads stay in the calling thread
_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_YIELD = {"x86_64": 24, "amd64": 24, "aarch64": 124, "arm64": 124}.get(platform.machine().lower())
_X86 = platform.machine().lower() in ("x86_64", "amd64")


def _syscall_address() -> int:
    """The address of libc's ``syscall`` (0 where there is none)."""
    try:
        fn = ctypes.CDLL(None).syscall
    except (OSError, AttributeError):
        return 0
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


SUPPORTED = platform.system() == "Linux" and _FUTEX is not None and _YIELD is not None and _syscall_address() != 0


def _cpu_getter() -> Any:
    """libc's ``sched_getcpu`` (the CPU the calling thread runs on), or None where there is none."""
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn


_getcpu = _cpu_getter()


@intrinsic
def _call5(typingctx: Any, fn: Any, a: Any, b: Any, c: Any, d: Any, e: Any) -> Any:
    """``fn(a, b, c, d, e)`` for the address ``fn`` of a C function of five integer (or pointer) arguments
    returning a long (libc's ``syscall``). The address is an argument, not a constant, so the kernels that
    call it stay cacheable."""
    sig = types.int64(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [i64] * 5)
        return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))

    return sig, codegen


@intrinsic
def pause(typingctx: Any) -> Any:
    """A spin-wait hint to the CPU (x86 ``pause``), else nothing."""
    sig = types.void()

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])

    return sig, codegen


@intrinsic
def _voidptr(typingctx: Any, address: Any) -> Any:
    sig = types.voidptr(types.int64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return sig, codegen


@nb.njit(nogil=True, cache=True)
def _futex(ctl: np.ndarray, op: int, value: int, timeout: int) -> None:
    """futex(2) on the low 32 bits of ``ctl[BELL]`` (little-endian)."""
    _call5(ctl[SYSCALL], ctl[FUTEX_NR], ctl.ctypes.data + 8 * BELL, op, value, timeout)


@nb.njit(nogil=True, cache=True)
def _chunk(ctl: np.ndarray, c: int) -> None:
    """Read the rows of chunk ``c`` of the posted task (the caller owns the chunk)."""
    rows = ctl[ROWS]
    r0 = c * ctl[CHUNK_ROWS]
    r1 = min(rows, r0 + ctl[CHUNK_ROWS])
    positions = ctl[POSITIONS]
    fb = ctl[FRAME_BYTES]
    out = nb.carray(_voidptr(ctl[OUT]), ctl[OUT_BYTES], np.uint8)
    raw = nb.carray(_voidptr(ctl[RAW]), ctl[RAW_BYTES], np.uint8)
    comp = nb.carray(_voidptr(ctl[COMP]), ctl[COMP_BYTES], np.uint8)
    comp64 = nb.carray(_voidptr(ctl[COMP]), ctl[COMP_BYTES] // 8, np.int64)
    kind = nb.carray(_voidptr(ctl[KIND]), positions, np.int8)
    table = nb.carray(_voidptr(ctl[TABLE]), positions, np.int64)
    end = nb.carray(_voidptr(ctl[END]), positions, np.int64)
    if ctl[MODE] == PAIRS:
        k = ctl[STACK]
        obs = nb.carray(_voidptr(ctl[OBS]), (rows, k), np.int64)
        nxt = nb.carray(_voidptr(ctl[NXT]), (rows, k), np.int64)
        err, slot = gather_pair_rows(obs, nxt, r0, r1, out, raw, comp, comp64, kind, table, end, ctl[ROWS_ALLOC],
                                     ctl[CSTRIDE], fb)
    else:
        slots = nb.carray(_voidptr(ctl[OBS]), rows, np.int64)
        err, slot = gather_frames(slots[r0:r1], out[r0 * fb:r1 * fb], raw, comp, comp64, kind, table, end,
                                  ctl[ROWS_ALLOC], ctl[CSTRIDE], fb)
    if err:
        ctl[ERR_SLOT] = slot
        ctl[ERR] = err  # (published by the DONE add that follows)


@nb.njit(nogil=True, cache=True)
def _open(v: int, seq: int) -> bool:
    """Whether the NEXT word ``v`` has a chunk left (of task ``seq`` only, unless ``seq`` < 0)."""
    return (v & LOW) < ((v >> CHUNK_SHIFT) & LOW) and (seq < 0 or (v >> SEQ_SHIFT) == seq)


@nb.njit(nogil=True, cache=True)
def _work(ctl: np.ndarray, seq: int) -> int:
    """Claim and read chunks of the posted task until none is left; returns how many this thread read."""
    n = 0
    while _open(atomic_load(ctl, NEXT), seq):
        v = atomic_add(ctl, NEXT, 1)
        if not _open(v, seq):
            break  # (another thread took the last chunk; or, seq >= 0, it was of a newer task)
        _chunk(ctl, v & LOW)
        atomic_add(ctl, DONE, 1)
        n += 1
    return n


@nb.njit(nogil=True, cache=True)
def serve(ctl: np.ndarray) -> None:
    """A helper thread's life: read chunks as tasks are posted, sleep when there are none (see the module's
    protocol); return when ``ctl[STOP]`` is set."""
    while atomic_load(ctl, STOP) == 0:
        if _work(ctl, -1):
            continue
        seen = atomic_load(ctl, BELL)
        atomic_add(ctl, PARKED, 1)
        if atomic_load(ctl, STOP) == 0 and not _open(atomic_load(ctl, NEXT), -1):
            _futex(ctl, FUTEX_WAIT_PRIVATE, seen & 0xFFFFFFFF, ctl.ctypes.data + 8 * TS_SEC)
        atomic_add(ctl, PARKED, -1)


@nb.njit(nogil=True, cache=True)
def post(ctl: np.ndarray, seq: int, chunks: int, fields: np.ndarray) -> None:
    """Post task ``seq`` (the last one must be done): its fields (``ctl[OBS:]``), then its chunks; wake the
    parked helpers."""
    for i in range(min(fields.size, FIELDS)):
        ctl[OBS + i] = fields[i]
    ctl[ERR] = 0
    ctl[ERR_SLOT] = 0
    atomic_store(ctl, DONE, seq << SEQ_SHIFT)
    atomic_store(ctl, NEXT, (seq << SEQ_SHIFT) | (chunks << CHUNK_SHIFT))
    atomic_add(ctl, BELL, 1)
    parked = atomic_load(ctl, PARKED)
    wake = min(parked, chunks - 1, ctl[WAKE])
    if wake > 0:
        _futex(ctl, FUTEX_WAKE_PRIVATE, wake, 0)


@nb.njit(nogil=True, cache=True)
def join(ctl: np.ndarray, seq: int, chunks: int) -> tuple[int, int, int]:
    """Finish task ``seq``: read the chunks nobody has claimed, then wait for the others. Returns ``(error
    code, slot, chunks read here)``, the task's error (0: none) while it is the latest task."""
    n = _work(ctl, seq)
    waited = 0
    while True:
        d = atomic_load(ctl, DONE)
        if (d >> SEQ_SHIFT) != seq:
            return 0, 0, n  # a newer task was posted: this one was done
        if (d & LOW) >= chunks:
            break
        # a helper is reading the last chunks: a row takes microseconds, unless the system stopped running
        # the helper (busy cores), and then the CPU is better given away than spent watching
        waited += 1
        if waited < SPINS:
            pause()
        else:
            _call5(ctl[SYSCALL], ctl[YIELD_NR], 0, 0, 0, 0)
    return ctl[ERR], ctl[ERR_SLOT], n


@nb.njit(nogil=True, cache=True)
def wake_all(ctl: np.ndarray) -> None:
    atomic_add(ctl, BELL, 1)
    _futex(ctl, FUTEX_WAKE_PRIVATE, 1 << 30, 0)


class Crew:
    """``helpers`` threads that read posted tasks beside the caller (started at the first ``post``, and again
    in a forked child: threads do not survive a fork). One task at a time: ``post`` then ``join``."""

    def __init__(self, helpers: int) -> None:
        _CREWS.add(self)
        self.helpers = max(0, int(helpers))
        self._posting = threading.Lock()
        self._fresh()

    def _fresh(self) -> None:
        self.ctl = np.zeros(CTL_SIZE, np.int64)
        self.ctl[SYSCALL] = _syscall_address()
        self.ctl[FUTEX_NR] = _FUTEX or 0
        self.ctl[YIELD_NR] = _YIELD or 0
        self.ctl[TS_SEC] = WAIT_SECONDS
        self.ctl[WAKE] = self.helpers
        self._seq = 0
        self._threads: list[threading.Thread] = []
        self._current: tuple[int, int] | None = None  # the last task posted, until joined by settle
        self._keep: Any = None
        # errors of tasks settled by a later post, by seq: their own join finds the kernel's error slots
        # reset for the newer task, and must still report the damage (kept for the last ERRORS_KEPT)
        self._errors: dict[int, tuple[int, int]] = {}
        self._off = -1  # the CPU the helpers were last kept off (``_steer``); -1: none yet

    def _start(self) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        while len(self._threads) < self.helpers:
            t = threading.Thread(target=serve, args=(self.ctl,), daemon=True, name="mmreplay-read")
            t.start()
            self._threads.append(t)
        self._off = -1  # (a new thread may run anywhere the poster may)

    def limit(self, helpers: int) -> None:
        """Wake at most ``helpers`` helpers per post from now on (the others sleep on)."""
        self.ctl[WAKE] = max(0, min(self.helpers, helpers))
        self._off = -1  # (the CPUs the caller may use may have changed: steer again at the next post)

    @property
    def threads(self) -> int:
        """Helper threads alive now."""
        return sum(t.is_alive() for t in self._threads)

    def post(self, fields: np.ndarray, rows: int, keep: Any) -> tuple[int, int]:
        """Start a task (``fields``: ``ctl[OBS:]``); returns its ``(seq, chunks)`` for ``join``. ``keep``
        (what holds the arrays the fields point into) is referenced until the next post or ``settle``, so a
        caller that drops its task unjoined frees nothing in use."""
        with self._posting:  # (two threads posting through one reader: one after the other)
            if len(self._threads) < self.helpers:
                self._start()
            self.settle()
            self._steer()
            self._seq = (self._seq + 1) % SEQ_WRAP
            self._errors.pop(self._seq, None)  # (a seq used again: its old task's error is not this one's)
            chunk_rows = int(fields[CHUNK_ROWS - OBS])
            chunks = -(-rows // chunk_rows)
            task = self._current = (self._seq, chunks)
            self._keep = keep
            post(self.ctl, self._seq, chunks, fields)
            return task

    def _steer(self) -> None:
        """Keep the helpers off the CPU the posting thread runs on (on the other CPUs it may use).

        A woken thread is placed by the system's scheduler, and it may put it on the CPU of the thread that
        woke it, even with other CPUs idle: in a virtual machine an idle virtual CPU reads as "preempted" to a
        guest's scheduler, which then avoids it. A helper placed there takes turns with the poster (a learner
        stepping while its next batch is read, or a caller reading its own share of a shared read) instead
        of running beside it, until the scheduler balances the two, milliseconds later. The helpers' allowed
        CPUs change only when the poster is found on another CPU than at the last post (or when ``limit``
        is called), so a poster that stays put pays one ``sched_getcpu`` per post."""
        if _getcpu is None or not self._threads:
            return
        cpu = int(_getcpu())
        if cpu == self._off or cpu < 0:
            return
        self._off = cpu
        try:
            allowed = os.sched_getaffinity(0)  # (the posting thread's own CPUs)
        except OSError:
            return
        if len(allowed) > 1:
            allowed.discard(cpu)
        for t in self._threads:
            try:
                os.sched_setaffinity(t.native_id, allowed)  # type: ignore[arg-type]
            except (OSError, TypeError):  # (a thread that just ended; no native id)
                pass

    def settle(self) -> None:
        """Wait until the last task is read (whoever posted it), keeping its error for its own ``join``."""
        current = self._current
        if current is not None:
            err, slot, _ = join(self.ctl, *current)
            if err:
                self._errors[current[0]] = (int(err), int(slot))
                while len(self._errors) > ERRORS_KEPT:
                    del self._errors[next(iter(self._errors))]
            if self._current is current:
                self._current = self._keep = None

    def join(self, task: tuple[int, int]) -> tuple[int, int, int]:
        """Wait until task ``(seq, chunks)`` is read, reading what nobody has started; ``(error, slot, chunks
        this thread read)``."""
        err, slot, n = join(self.ctl, task[0], task[1])
        if not err and task[0] in self._errors:  # settled by a newer post: its error was kept then
            err, slot = self._errors[task[0]]
        # read: the next post need not settle it (looked at again under the lock: a post in another thread
        # may have replaced it, and that post's ``keep`` must stay)
        if self._current is task:
            with self._posting:
                if self._current is task:
                    self._current = self._keep = None
        return int(err), int(slot), int(n)

    def close(self) -> None:
        self.settle()
        if self._threads:
            self.ctl[STOP] = 1
            wake_all(self.ctl)
            for t in self._threads:
                if t.is_alive() and t is not threading.current_thread():
                    t.join()
            self._threads = []

    def forked(self) -> None:
        """In a forked child: the parent's helpers are gone (with any task they were reading); start afresh."""
        self._posting = threading.Lock()
        self._fresh()


_CREWS: weakref.WeakSet[Crew] = weakref.WeakSet()


def _forked() -> None:
    for crew in list(_CREWS):
        crew.forked()


def _exiting() -> None:
    for crew in list(_CREWS):
        crew.close()


if hasattr(os, "register_at_fork"):
    # (numba's compile lock around a fork is taken by store.py's at-fork hook, after the stores' locks)
    os.register_at_fork(after_in_child=_forked)
atexit.register(_exiting)  # helpers leave their kernel before the interpreter tears down
