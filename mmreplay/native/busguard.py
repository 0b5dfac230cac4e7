# numba intrinsics take a typing context first, which mypy sees as an argument:
# mypy: disable-error-code="call-arg,return-value,var-annotated,index"
"""A SIGBUS from a store's mappings becomes a counted event instead of the end of the process.

Reading (or writing) a shared file mapping past the file's end raises SIGBUS; its default action kills the
process, and Python cannot catch it. A store's files are only ever shortened by someone else (another
process truncating one by mistake), but a ``sample()`` or ``step()`` between that and the next check of the
files' sizes would die. Checking every file a batch touches costs more than the batch, so instead:

- A SIGBUS handler (``sigaction`` with ``SA_SIGINFO``) looks at the fault's address. Inside a registered
  range (a ring's reserved address space, ``register``) it maps one anonymous zero page over the faulting
  page (``MAP_FIXED``; readable, and writable where the range is), appends the address to a log, adds one
  to the fault count and returns: the instruction runs again and reads zeros (a write lands in the private
  page). Anywhere else, for a SIGBUS that is not a missing page (``si_code`` other than ``BUS_ADRERR``:
  a memory error, one sent by a process) or where no page could be mapped, it hands the signal on to the
  handler it replaced (faulthandler's, when that was enabled first) or, where that was the default action,
  restores the default and lets the signal kill the process as it would have.
- Whoever reads through a registered range compares ``count()`` with the count it saw last after each read
  (one integer load on the normal path); when it moved, ``since()`` gives the addresses that faulted, and a
  read that touched its ranges is discarded and reported (``ChunkRing.check_faults``).

The handler is a numba ``cfunc`` (no compiler on the user's machine, cached like the kernels): it needs no
GIL, allocates nothing and calls only ``mmap``, ``__errno_location`` (it restores ``errno``), ``sigaction``,
``raise`` (through their addresses) and the handler it replaced, so it is safe in a signal handler, in any thread (the count and the log are process-wide:
the reader's helper threads fault for the caller). Its state (function addresses, the count, the log, the
ranges) is one int64 array; the handler finds it through a variable of its own compiled code, set by a call
with signal number 0, which the kernel never delivers.

Where this is not available, nothing is installed and a truncated file kills a reader as before:
``NUMBA_DISABLE_JIT=1`` (no cfunc), platforms other than Linux on x86-64 or aarch64 (where the layouts of
``siginfo_t`` and ``struct sigaction`` used here are known), ``MMREPLAY_SIGBUS_GUARD=0``. A SIGBUS handler
installed after the guard's (a later ``faulthandler.enable()``, a library's) gets the signal first; such a
handler usually hands it back through the action it replaced, so putting the guard in front again could
make the two call each other without end: the guard leaves it in place and registers no more ranges
(``register`` returns -1), and a truncated file kills the process as before. Where the default action was
put back (``faulthandler.disable()``), the next ``register`` installs the guard again.

Ranges: a slot is filled start first and end last, and emptied end first (the handler matches
``start <= address < end``), so a handler running meanwhile never sees half a range. A range is
unregistered before it is unmapped, so an address reused by another mapping is never patched.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import platform
import threading
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import jit_enabled

logger = logging.getLogger(__name__)

SIGBUS = 7  # Linux on x86-64 and aarch64 (and every other Linux but alpha, mips, parisc, sparc)
_BUS_ADRERR = 2  # si_code of an access to a page that has no backing (a mapping past its file's end)
_SA_SIGINFO = 4
_SA_ONSTACK = 0x08000000
_SIG_DFL, _SIG_IGN = 0, 1
_PROT_READ, _PROT_WRITE = 1, 2
_MAP_PRIVATE_ANON_FIXED = 0x02 | 0x20 | 0x10
PAGE = mmap.PAGESIZE

# the state array: fixed words, then the fault log, then the ranges (start, end, prot)
COUNT, RESERVED, F_MMAP, F_ERRNO, F_SIGACTION, F_RAISE, PREV, PREV_FLAGS, DFL_ACTION, PAGE_SIZE = range(10)
LOG_AT, LOG = 16, 256
RANGES_AT, SLOTS = 16 + 256, 1024
WORDS = RANGES_AT + 3 * SLOTS


class _SigAction(ctypes.Structure):
    """glibc's and musl's ``struct sigaction`` on 64-bit Linux (x86-64, aarch64)."""

    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


def supported() -> bool:
    """Whether the handler can be installed here (see the module docstring)."""
    return (platform.system() == "Linux" and platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64")
            and ctypes.sizeof(ctypes.c_void_p) == 8 and os.environ.get("MMREPLAY_SIGBUS_GUARD", "1") != "0"
            and jit_enabled())


_state = np.zeros(WORDS, np.int64)  # never freed: the handler may read it until the process ends
# ``counter[COUNT]`` is ``count()`` without a call: a Python int, read without a numpy scalar (hot paths)
counter = memoryview(_state.data).cast("B").cast("q")
_dfl = _SigAction()  # the default action, which the handler restores to hand a signal on to it
# reentrant: a store dropped unclosed unregisters its ranges from a GC finalizer, and a collection can start at
# any allocation, also one made while this thread holds the lock (a plain lock would then wait for itself)
_lock = threading.RLock()
_installed = False
_handler_address = 0
_failed = False


def _lock_after_fork() -> None:
    global _lock
    _lock = threading.RLock()  # a thread of the parent may have held it: the child has no such thread


os.register_at_fork(after_in_child=_lock_after_fork)


def count() -> int:
    """How many faults the handler has patched in this process (inherited across fork)."""
    return int(counter[COUNT])


def since(seen: int) -> tuple[int, list[int] | None]:
    """``(count, addresses)``: the count now and the addresses of the faults after the first ``seen``
    (None when the log no longer holds them all)."""
    now = count()
    if now - seen > LOG or seen > now:
        return now, None
    return now, [int(_state[LOG_AT + (i & (LOG - 1))]) for i in range(seen, now)]


def register(address: int, nbytes: int, writable: bool) -> int:
    """Let the handler patch faults in ``[address, address + nbytes)``; returns the slot to unregister, or
    -1 (not guarded: unsupported here, or every slot taken). Installs the handler on first use."""
    if not nbytes or not _install():
        return -1
    with _lock:
        free = np.flatnonzero(_state[RANGES_AT + 1::3] == 0)
        if free.size == 0:
            logger.warning("every SIGBUS guard slot is taken: a file truncated under this store kills the process")
            return -1
        slot = int(free[0])
        at = RANGES_AT + 3 * slot
        _state[at + 2] = _PROT_READ | (_PROT_WRITE if writable else 0)
        _state[at] = address
        _state[at + 1] = address + nbytes  # last: the range is live from here on
        return slot


def unregister(slot: int) -> None:
    """Forget a range (before it is unmapped)."""
    if slot < 0:
        return
    with _lock:
        at = RANGES_AT + 3 * slot
        _state[at + 1] = 0  # first: no fault matches it any more
        _state[at] = 0


def _install() -> bool:
    """Install the handler once per process (or again where someone restored the default action)."""
    global _installed, _handler_address, _failed
    if _failed:
        return False
    if _installed and _current_action().handler == _handler_address:
        return True
    with _lock:
        if _failed:
            return False
        try:
            if not supported():
                _failed = True
                return False
            if not _handler_address:
                _handler_address = _configure()
            return _take_signal()
        except Exception:  # pragma: no cover - a platform where numba or libc does not do what is expected
            logger.exception("the SIGBUS guard could not be installed: a file truncated under a store kills"
                             " the process")
            _failed = True
            return False


def _current_action() -> _SigAction:
    cur = _SigAction()
    _libc().sigaction(SIGBUS, None, ctypes.byref(cur))
    return cur


def _take_signal() -> bool:
    """Put the handler in place, remembering the action it replaces (to hand other signals on to)."""
    global _installed
    cur = _current_action()
    if cur.handler == _handler_address:
        _installed = True
        return True
    if _installed and cur.handler not in (None, _SIG_DFL, _SIG_IGN):
        # Someone replaced the handler after it was installed: theirs may hand signals back to it, so
        # putting it in front again could loop between the two. Leave theirs in place.
        return False
    new = _SigAction()
    new.handler = _handler_address
    new.flags = _SA_SIGINFO | _SA_ONSTACK
    old = _SigAction()
    # the previous action is recorded before the handler can run
    _state[PREV] = cur.handler or 0
    _state[PREV_FLAGS] = cur.flags
    if _libc().sigaction(SIGBUS, ctypes.byref(new), ctypes.byref(old)) != 0:
        raise OSError(ctypes.get_errno(), "sigaction(SIGBUS)")
    _state[PREV] = old.handler or 0
    _state[PREV_FLAGS] = old.flags
    _installed = True
    return True




@functools.cache
def _libc() -> Any:
    lib = ctypes.CDLL(None, use_errno=True)
    ptr = ctypes.POINTER(_SigAction)
    lib.sigaction.argtypes = [ctypes.c_int, ptr, ptr]
    lib.sigaction.restype = ctypes.c_int
    return lib


def _address(fn: Any) -> int:
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


def _configure() -> int:
    """Compile (or load from the cache) the handler, give it its state; returns its address."""
    from numba import cfunc

    lib = _libc()
    _state[F_MMAP] = _address(lib.mmap)
    _state[F_ERRNO] = _address(lib.__errno_location)
    _state[F_SIGACTION] = _address(lib.sigaction)
    _state[F_RAISE] = _address(getattr(lib, "raise"))
    _state[PAGE_SIZE] = PAGE
    _state[DFL_ACTION] = ctypes.addressof(_dfl)
    if not all(_state[[F_MMAP, F_ERRNO, F_SIGACTION, F_RAISE]]):
        raise OSError("libc lacks mmap, __errno_location, sigaction or raise")
    compiled = cfunc(types.void(types.int32, types.voidptr, types.voidptr), cache=True)(_handle)
    compiled.ctypes(0, _state.ctypes.data, None)  # signal 0: hand it the state's address
    return int(compiled.address or 0)


# -- the handler's primitives: loads, stores and calls at integer addresses ---------------------------------
_I64 = ir.IntType(64)
_I32 = ir.IntType(32)


def _global(builder: Any) -> Any:
    """The handler's one variable: the address of the state array."""
    module = builder.module
    name = "mmreplay_busguard_state"
    if name in module.globals:
        return module.globals[name]
    var = ir.GlobalVariable(module, _I64, name)
    var.linkage = "internal"
    var.initializer = ir.Constant(_I64, 0)
    return var


@intrinsic
def _get_state(typingctx: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.load_atomic(_global(builder), "seq_cst", 8)

    return types.int64(), codegen


@intrinsic
def _set_state(typingctx: Any, value: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        builder.store_atomic(args[0], _global(builder), "seq_cst", 8)

    return types.void(types.int64), codegen


@intrinsic
def _int(typingctx: Any, pointer: Any) -> Any:
    """A pointer as an integer."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.ptrtoint(args[0], _I64)

    return types.int64(types.voidptr), codegen


@intrinsic
def _load(typingctx: Any, address: Any) -> Any:
    """The int64 at ``address``."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.load_atomic(builder.inttoptr(args[0], _I64.as_pointer()), "monotonic", 8)

    return types.int64(types.int64), codegen


@intrinsic
def _store(typingctx: Any, address: Any, value: Any) -> Any:
    """``*address = value`` (int64)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        builder.store_atomic(args[1], builder.inttoptr(args[0], _I64.as_pointer()), "seq_cst", 8)

    return types.void(types.int64, types.int64), codegen


@intrinsic
def _load32(typingctx: Any, address: Any) -> Any:
    """The (signed) int at ``address``."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.sext(builder.load(builder.inttoptr(args[0], _I32.as_pointer())), _I64)

    return types.int64(types.int64), codegen


@intrinsic
def _store32(typingctx: Any, address: Any, value: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        builder.store(builder.trunc(args[1], _I32), builder.inttoptr(args[0], _I32.as_pointer()))

    return types.void(types.int64, types.int64), codegen


@intrinsic
def _fetch_add(typingctx: Any, address: Any, value: Any) -> Any:
    """Atomically add ``value`` to the int64 at ``address``; returns the value before."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.atomic_rmw("add", builder.inttoptr(args[0], _I64.as_pointer()), args[1], "seq_cst")

    return types.int64(types.int64, types.int64), codegen


def _call(arity: int) -> Any:
    """The codegen of a call of the C function at an integer address with ``arity`` integer or pointer
    arguments, its result read as a long (a narrower result's upper bits are not to be used)."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        fnty = ir.FunctionType(_I64, [_I64] * arity)
        return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))

    return codegen


def _sig(arity: int) -> Any:
    return types.int64(*[types.int64] * (arity + 1))


@intrinsic
def _call0(typingctx: Any, fn: Any) -> Any:
    return _sig(0), _call(0)


@intrinsic
def _call1(typingctx: Any, fn: Any, a: Any) -> Any:
    return _sig(1), _call(1)


@intrinsic
def _call3(typingctx: Any, fn: Any, a: Any, b: Any, c: Any) -> Any:
    return _sig(3), _call(3)


@intrinsic
def _call6(typingctx: Any, fn: Any, a: Any, b: Any, c: Any, d: Any, e: Any, f: Any) -> Any:
    return _sig(6), _call(6)


def _handle(sig: int, info: Any, context: Any) -> None:
    """The SIGBUS handler (compiled as a C function; see the module docstring)."""
    if sig == 0:  # never delivered by the kernel: the call that gives the handler its state
        _set_state(_int(info))
        return
    st = _get_state()
    signo = np.int64(sig)
    code = _load32(_int(info) + 8)  # siginfo_t: si_signo, si_errno, si_code, then (8-aligned) si_addr
    if st == 0:
        return
    if code == _BUS_ADRERR:
        address = _load(_int(info) + 16)
        page_size = _load(st + 8 * PAGE_SIZE)
        for i in range(SLOTS):
            at = st + 8 * (RANGES_AT + 3 * i)
            end = _load(at + 8)
            if end != 0 and _load(at) <= address < end:
                errno_at = _call0(_load(st + 8 * F_ERRNO))
                saved = _load32(errno_at)
                page = address - address % page_size
                got = _call6(_load(st + 8 * F_MMAP), page, page_size, _load(at + 16), _MAP_PRIVATE_ANON_FIXED,
                             np.int64(-1), np.int64(0))
                _store32(errno_at, saved)
                if got == page:
                    n = _fetch_add(st + 8 * RESERVED, 1)
                    _store(st + 8 * (LOG_AT + n % LOG), address)
                    _fetch_add(st + 8 * COUNT, 1)
                    return
                break  # no memory for the page: as if the range were not guarded
    previous = _load(st + 8 * PREV)
    if previous == _SIG_DFL or previous == _SIG_IGN:
        if previous == _SIG_IGN and code <= 0:
            return  # a SIGBUS sent by someone, which the process ignored
        # The default action again: a fault happens again when the instruction runs again, and a sent
        # signal (blocked while this handler runs) is delivered when it returns; either kills the process.
        _call3(_load(st + 8 * F_SIGACTION), signo, _load(st + 8 * DFL_ACTION), np.int64(0))
        if code <= 0:
            _call1(_load(st + 8 * F_RAISE), signo)
        return
    if _load(st + 8 * PREV_FLAGS) & _SA_SIGINFO:
        _call3(previous, signo, _int(info), _int(context))
    else:
        _call1(previous, signo)
