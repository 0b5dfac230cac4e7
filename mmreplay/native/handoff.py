# numba intrinsics take a typing context first, which mypy sees as an argument:
# mypy: disable-error-code="call-arg,return-value,var-annotated,index"
"""A batch's frames copied by a helper thread that waits for work in native code, beside the caller.

``batches()`` knows the next batch before the caller asks for it. Here its frames are *posted*: the
helper thread starts reading them while the caller's thread goes on with Python (handing out the
current batch, the learner's step, drawing the batch after), and the caller, once it needs them,
*joins*: it reads the rows nobody has started yet, then waits for the rest. Python threads cannot
do this through a queue: a thread woken in Python needs the GIL, which the caller holds while it
runs Python, so the hand-off would wait for the caller's next release (tens of microseconds or a
whole switch interval). The helper instead waits in a nogil kernel, watching a shared control word.

Protocol (one task at a time, ``ctl`` an int64 array shared by both threads; every access below is
an atomic with sequential consistency):

- A task is split into ``chunks`` runs of rows. ``ctl[NEXT]`` holds ``seq << 40 | chunks << 20 | c``:
  a thread claims chunk ``c`` of task ``seq`` by adding 1 and owns it if ``c < chunks``. The task's
  number travels in the same word, so a thread that read an old task's word cannot take a chunk of
  a newer task by mistake: what the add returns says which task the chunk is of.
- ``ctl[DONE]`` holds ``seq << 40 | chunks done``; the task is done when the count reaches ``chunks``.
  A new task is posted only after the last one is done, so a chunk's owner always finds its task's
  fields (pointers to the batch's slots, output and the ring's arrays) as posted.
- Each row of a batch is read by exactly one thread: the LZ4 decoder writes a few bytes past a match
  and overwrites them later, so two threads decoding the same frame into one output could read each
  other's scratch bytes.
- The helper watches ``ctl[NEXT]`` for ``spins`` pause instructions after its last chunk, then
  sets ``ctl[PARKED]`` and, if no task has arrived meanwhile, returns to Python to sleep on an event.
  ``post`` stores the task before it loads ``ctl[PARKED]``, and the helper stores ``ctl[PARKED]``
  before it loads the task again: one of the two sees the other's store, so a posted task is never
  left with the helper asleep (and the caller's ``join`` reads every chunk left anyway).
"""

from __future__ import annotations

import os
import platform
import threading
import time
import weakref
from typing import Any

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._mem import atomic_add, atomic_load, atomic_store
from .lz4 import gather_pairs as gather_pair_rows

NEXT, DONE, STOP, PARKED, ERR, ERR_SLOT = 0, 1, 2, 3, 4, 5
# the task's fields
OBS, NXT, ROWS, STACK, OUT, OUT_BYTES, RAW, RAW_BYTES, COMP, COMP_BYTES, KIND, TABLE, END, POSITIONS = range(8, 22)
ROWS_ALLOC, CSTRIDE, FRAME_BYTES, CHUNK_ROWS = range(22, 26)
CTL_SIZE = 32
SEQ_SHIFT, CHUNK_SHIFT, LOW = 40, 20, (1 << 20) - 1
SEQ_WRAP = 1 << 22

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@intrinsic
def pause(typingctx: Any) -> Any:
    """A spin-wait hint to the CPU (x86 ``pause``: the sibling hyperthread runs, less power), else nothing."""
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
def _chunk(ctl: np.ndarray, c: int) -> None:
    """Read the rows of chunk ``c`` of the posted task (the caller owns the chunk)."""
    rows, k = ctl[ROWS], ctl[STACK]
    r0 = c * ctl[CHUNK_ROWS]
    r1 = min(rows, r0 + ctl[CHUNK_ROWS])
    positions = ctl[POSITIONS]
    obs = nb.carray(_voidptr(ctl[OBS]), (rows, k), np.int64)
    nxt = nb.carray(_voidptr(ctl[NXT]), (rows, k), np.int64)
    out = nb.carray(_voidptr(ctl[OUT]), ctl[OUT_BYTES], np.uint8)
    raw = nb.carray(_voidptr(ctl[RAW]), ctl[RAW_BYTES], np.uint8)
    comp = nb.carray(_voidptr(ctl[COMP]), ctl[COMP_BYTES], np.uint8)
    comp64 = nb.carray(_voidptr(ctl[COMP]), ctl[COMP_BYTES] // 8, np.int64)
    kind = nb.carray(_voidptr(ctl[KIND]), positions, np.int8)
    table = nb.carray(_voidptr(ctl[TABLE]), positions, np.int64)
    end = nb.carray(_voidptr(ctl[END]), positions, np.int64)
    err, slot = gather_pair_rows(obs, nxt, r0, r1, out, raw, comp, comp64, kind, table, end, ctl[ROWS_ALLOC],
                                 ctl[CSTRIDE], ctl[FRAME_BYTES])
    if err:
        ctl[ERR_SLOT] = slot
        ctl[ERR] = err  # (published by the DONE add that follows)


@nb.njit(nogil=True, cache=True)
def _work(ctl: np.ndarray, seq: int) -> int:
    """Claim and read chunks of the posted task (of task ``seq`` only, unless ``seq`` < 0) until none is
    left; returns how many this thread read."""
    n = 0
    while True:
        v = atomic_load(ctl, NEXT)
        if (v & LOW) >= ((v >> CHUNK_SHIFT) & LOW) or (seq >= 0 and (v >> SEQ_SHIFT) != seq):
            return n
        v = atomic_add(ctl, NEXT, 1)
        if (v & LOW) >= ((v >> CHUNK_SHIFT) & LOW) or (seq >= 0 and (v >> SEQ_SHIFT) != seq):
            return n  # (another thread took the last chunk; or, seq >= 0, it was of a newer task)
        _chunk(ctl, v & LOW)
        atomic_add(ctl, DONE, 1)
        n += 1


@nb.njit(nogil=True, cache=True)
def serve(ctl: np.ndarray, spins: int) -> None:
    """The helper thread: read chunks as tasks are posted; return after ``spins`` pauses without one (having
    set ``ctl[PARKED]``), or when ``ctl[STOP]`` is set."""
    atomic_store(ctl, PARKED, 0)
    while True:
        idle = 0
        while idle < spins and atomic_load(ctl, STOP) == 0:
            if _work(ctl, -1):
                idle = 0
            else:
                pause()
                idle += 1
        atomic_store(ctl, PARKED, 1)
        v = atomic_load(ctl, NEXT)  # a task posted just before PARKED was stored (see the module docstring)
        if atomic_load(ctl, STOP) != 0 or (v & LOW) >= ((v >> CHUNK_SHIFT) & LOW):
            return
        atomic_store(ctl, PARKED, 0)


@nb.njit(nogil=True, cache=True)
def post(ctl: np.ndarray, seq: int, chunks: int, fields: np.ndarray) -> bool:
    """Post task ``seq`` (the last one must be done): its fields (``ctl[OBS:]``), then its chunks. Returns
    True if the helper is parked (the caller wakes it)."""
    for i in range(fields.size):
        ctl[OBS + i] = fields[i]
    ctl[ERR] = 0
    ctl[ERR_SLOT] = 0
    atomic_store(ctl, DONE, seq << SEQ_SHIFT)
    atomic_store(ctl, NEXT, (seq << SEQ_SHIFT) | (chunks << CHUNK_SHIFT))
    return atomic_load(ctl, PARKED) != 0


@nb.njit(nogil=True, cache=True)
def join(ctl: np.ndarray, seq: int, chunks: int) -> tuple[int, int]:
    """Finish task ``seq``: read the chunks nobody has claimed, wait for the others. Returns ``(error code,
    slot)``, the task's (0: none) while it is the latest task."""
    _work(ctl, seq)
    while True:
        d = atomic_load(ctl, DONE)
        if (d >> SEQ_SHIFT) != seq:
            return 0, 0  # a newer task was posted: this one was done
        if (d & LOW) >= chunks:
            break
        pause()
    return ctl[ERR], ctl[ERR_SLOT]


class Helper:
    """The helper thread of one reader, started at the first ``post`` (a daemon; ``close`` ends it) and
    again in a forked child (threads do not survive a fork). One task at a time: ``post`` then ``join``."""

    SPIN_SECONDS = 0.0005  # how long the helper watches for a task after its last chunk before it sleeps

    def __init__(self) -> None:
        _HELPERS.add(self)
        self.ctl = np.zeros(CTL_SIZE, np.int64)
        self._posting = threading.Lock()
        self._seq = 0
        self._thread: Any = None
        self._wake: Any = None
        self._spins = 0
        self._current: tuple[int, int] | None = None  # the last task posted, until joined by settle
        self._keep: Any = None

    def _start(self) -> None:
        if not self._spins:  # pauses per SPIN_SECONDS on this CPU (~10-150 cycles each): timed once
            serve(self.ctl, 1)  # (the first call loads the kernel)
            t = time.perf_counter()
            serve(self.ctl, 4000)
            per = max(1e-9, (time.perf_counter() - t) / 4000)
            self._spins = max(100, int(self.SPIN_SECONDS / per))
        self.ctl[STOP] = 0
        self.ctl[PARKED] = 1
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(self._wake,), daemon=True,
                                        name="mmreplay-handoff")
        self._thread.start()

    def _loop(self, wake: Any) -> None:
        ctl = self.ctl
        while not ctl[STOP]:
            serve(ctl, self._spins)
            # a post sets the event; the timeout is a safety net only (an idle helper costs a look a second)
            while not wake.wait(1.0) and (ctl[NEXT] & LOW) >= ((ctl[NEXT] >> CHUNK_SHIFT) & LOW):
                pass
            wake.clear()

    def forked(self) -> None:
        """In a forked child: the parent's thread is gone (with any task it was reading), start afresh."""
        self._posting = threading.Lock()
        self.ctl[:] = 0
        self._thread = None
        self._current = self._keep = None

    def post(self, fields: np.ndarray, rows: int, keep: Any) -> tuple[int, int]:
        """Start a task (``fields``: ``ctl[OBS:]``, after the last task was joined); returns its ``(seq,
        chunks)`` for ``join``. ``keep`` (what holds the arrays the fields point into) is referenced until
        the next post or ``settle``, so a caller that drops its task unjoined frees nothing in use."""
        with self._posting:  # (two threads posting through one reader: one after the other)
            if self._thread is None or not self._thread.is_alive():
                self._start()
            self.settle()
            self._seq = (self._seq + 1) % SEQ_WRAP
            chunk_rows = int(fields[CHUNK_ROWS - OBS])
            chunks = -(-rows // chunk_rows)
            task = self._current = (self._seq, chunks)
            self._keep = keep
            if post(self.ctl, self._seq, chunks, fields):
                self._wake.set()
            return task

    def settle(self) -> None:
        """Wait until the last task is read (whoever posted it)."""
        current = self._current
        if current is not None:
            join(self.ctl, *current)
            if self._current is current:
                self._current = self._keep = None

    def join(self, task: tuple[int, int]) -> tuple[int, int]:
        """Wait until task ``(seq, chunks)`` is read, reading what nobody has started; ``(error, slot)``."""
        err, slot = join(self.ctl, task[0], task[1])
        return int(err), int(slot)

    def close(self) -> None:
        self.settle()
        thread = self._thread
        if thread is not None:
            self.ctl[STOP] = 1
            self._wake.set()
            if thread.is_alive():
                thread.join()
            self._thread = None


_HELPERS: weakref.WeakSet[Helper] = weakref.WeakSet()


def _forked() -> None:
    for helper in list(_HELPERS):
        helper.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
