"""Compiling the kernels ahead of their first call: ``mmreplay warmup``, and a store's background warm-up.

numba compiles a kernel the first time it is called with new argument types and keeps the machine code
in its cache (``cache=True``), so the next process loads it instead. On a machine with an empty cache
the first ``sample()`` would pay for compiling the batch kernels. ``compile_all()`` compiles every
kernel for the argument types the package calls it with (``KERNELS``), without running any of them; a
writable store starts it once per process in a daemon thread (``start_background()``), so the kernels are
ready, or loaded from the cache, by the time the first batch is drawn.

Where the cache is: numba's, under ``NUMBA_CACHE_DIR`` when set, otherwise the ``__pycache__`` folder
beside the kernel modules (or a per-user folder where that is not writable); ``cache_dir()`` says which.

Rules:

- A kernel is compiled from the types of example arguments (``numba.typeof``, as a call would type
  them: read-only arrays, as the ring's frames are, are a type of their own), with ``Dispatcher.compile``:
  nothing runs, so no parallel launch happens here (``parallel.Cores`` keeps counting the launches).
- numba compiles under one process-wide lock, so a foreground call that needs a kernel while the
  warm-up compiles another waits for that one compile at most, then finds its own kernel compiled or
  compiles it; results never depend on who compiled.
- ``parallel`` is imported before anything compiles: it makes a fork take numba's compile lock first,
  so a fork while the warm-up compiles waits for that compile instead of leaving the child a lock held
  by a thread it does not have.
- ``MMREPLAY_WARMUP=0`` turns the background warm-up off (``mmreplay warmup`` still compiles).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# The kernels Python code calls (kernels only other kernels call are compiled inside them), in the order a
# first sample() needs them, then the seal's. Each with the argument lists it is called with: one list per
# combination of argument types (a read-only array is its own type).


def _ro(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def _i64(*shape: int) -> np.ndarray:
    return np.zeros(shape or (1,), np.int64)


def _f64(n: int = 1) -> np.ndarray:
    return np.zeros(n, np.float64)


def _u8(n: int = 8) -> np.ndarray:
    return np.zeros(n, np.uint8)


def _frames(compressed: bool) -> tuple[Any, ...]:
    """The ring's arrays as ``reader._kernel_args`` passes them: raw frames (mapped read-only), the
    compressed files (read-only) or a writable placeholder, per-position kind, table and end, then
    rows_alloc, cstride, frame_bytes."""
    comp = _ro(_u8()) if compressed else _u8()
    comp64 = comp.view(np.int64)
    return (_ro(_u8()), comp, comp64, np.zeros(1, np.int8), _i64(), _i64(), 1, 8, 8)


def _plan() -> list[tuple[Any, ...]]:
    return [(_i64(), _u8(), np.zeros(1, np.int32), _i64(), _i64(10), _f64())]


def _nstep() -> list[tuple[Any, ...]]:
    rest = (_i64(1, 1), np.zeros((1, 1), np.float64), np.zeros(1, np.float32), _i64(), np.zeros(1, np.bool_))
    reward = np.zeros(1, np.float32)
    return [(reward, *rest), (_ro(reward), *rest)]  # the reward column writable, or mapped read-only


def _lz4_pairs() -> list[tuple[Any, ...]]:
    return [(_i64(1, 1), _i64(1, 1), 0, 1, _u8(), *_frames(c)) for c in (True, False)]


def _lz4_gather() -> list[tuple[Any, ...]]:
    # the ring's frames (compressed or raw), and framefile.decode_native's one file
    return [(_i64(), _u8(), *_frames(c)) for c in (True, False)] + [
        (_i64(), _u8(), _u8(), _u8(), _u8().view(np.int64), np.zeros(1, np.int8), _i64(), _i64(), 1, 0, 8)]


def _par_pairs() -> list[tuple[Any, ...]]:
    return [(_i64(1, 1), _i64(1, 1), _i64(2), _u8(), *_frames(c)) for c in (True, False)]


def _par_gather() -> list[tuple[Any, ...]]:
    return [(_i64(), _i64(2), _u8(), *_frames(c)) for c in (True, False)]


def _tree(*rest: Any) -> list[tuple[Any, ...]]:
    return [(_i64(), _f64(), *rest)]


KERNELS: tuple[tuple[str, str, Callable[[], list[tuple[Any, ...]]]], ...] = (
    ("plan", "plan_batch", _plan),
    ("plan", "nstep_returns", _nstep),
    ("lz4", "gather_pairs", _lz4_pairs),
    ("parallel", "gather_pairs", _par_pairs),
    ("lz4", "gather", _lz4_gather),
    ("parallel", "gather", _par_gather),
    ("handoff", "serve", lambda: [(_i64(4), 1)]),
    ("handoff", "post", lambda: [(_i64(4), 1, 1, _i64(4))]),
    ("handoff", "join", lambda: [(_i64(4), 1, 1)]),
    ("sumtree", "tree_set", lambda: _tree(_i64(), _f64())),
    ("sumtree", "tree_set_with", lambda: _tree(_i64(), _f64(), _f64(), _f64(), np.zeros(1, np.bool_))),
    ("sumtree", "tree_flush", lambda: _tree()),
    ("sumtree", "tree_stratified", lambda: _tree(_f64(), _i64())),
    ("sumtree", "tree_stratified_normalised", lambda: _tree(_f64(), _i64(), _f64())),
    ("sumtree", "tree_proportional", lambda: _tree(_f64(), _i64())),
    ("sumtree", "tree_find", lambda: _tree(_f64(), _i64())),
    ("sumtree", "tree_load", lambda: _tree(_f64())),
    ("sumtree", "check_set", lambda: [(_i64(), _i64(), _f64())]),
    ("priorities", "priority_update", lambda: [(_i64(), _f64(), 0, 1, _i64(), np.zeros(1, np.bool_))]),
    ("lz4_encode", "encode_frames", lambda: [(_ro(_u8()), 1, 8, _u8(64), 0, _i64(1, 2), 8)]),
    ("lz4_encode", "check_frames", lambda: [(_ro(_u8()), 1, 8, _u8(64), _i64(1, 2), 1)]),
    ("crc32c", "crc32c", lambda: [(_u8(), 0, 8)]),
)


@dataclass(frozen=True)
class Compiled:
    """One kernel warmed: ``kernel`` (``module.name``), how many signatures, how many of those numba
    loaded from its cache rather than compiled, and the seconds it took."""

    kernel: str
    signatures: int
    from_cache: int
    seconds: float


def available() -> bool:
    """Whether numba can be imported (without it the package runs its numpy paths and nothing compiles)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def cache_dir() -> str:
    """The folder numba keeps the compiled kernels in, as numba resolves it: under ``NUMBA_CACHE_DIR``
    when set, otherwise ``__pycache__`` beside the kernel modules, or a per-user cache folder
    (``~/.cache/numba``) where that is not writable."""
    return str(dispatcher("plan", "plan_batch").stats.cache_path)


def dispatcher(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def compile_kernel(module: str, name: str, examples: Callable[[], list[tuple[Any, ...]]]) -> Compiled:
    """Compile (or load from the cache) one kernel for each of its example argument lists."""
    from numba import typeof

    t = time.perf_counter()
    disp = dispatcher(module, name)
    hits = sum(disp.stats.cache_hits.values())
    # a call types its arguments and puts Omitted(default) for each left out: so does this
    sigs = [tuple(disp.fold_argument_types(tuple(typeof(a) for a in args), {})[1]) for args in examples()]
    for sig in sigs:
        disp.compile(sig)  # a signature already compiled in this process returns at once
    loaded = sum(disp.stats.cache_hits.values()) - hits
    return Compiled(f"{module}.{name}", len(sigs), loaded, time.perf_counter() - t)


def compile_all(each: Callable[[Compiled], None] | None = None) -> list[Compiled]:
    """Compile every kernel of ``KERNELS`` (``each`` is told of each as it is done)."""
    importlib.import_module(f"{__package__}.parallel")  # its fork hook first (see the module's rules)
    done = []
    for module, name, examples in KERNELS:
        c = compile_kernel(module, name, examples)
        done.append(c)
        if each is not None:
            each(c)
    return done


class Background:
    """The process's background warm-up: at most one thread per process, started by ``start()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.done: list[Compiled] = []
        self.error: BaseException | None = None

    def start(self) -> threading.Thread | None:
        """Start the warm-up thread unless it was started in this process, numba is missing or
        ``MMREPLAY_WARMUP=0``; returns the thread (None when none was started now)."""
        if self.thread is not None or os.environ.get("MMREPLAY_WARMUP", "1").strip() == "0":
            return None
        with self._lock:
            if self.thread is not None or not available():
                return None
            self.thread = threading.Thread(target=self._run, name="mmreplay-warmup", daemon=True)
            self.thread.start()
            return self.thread

    def _run(self) -> None:
        try:
            compile_all(self.done.append)
        except BaseException as exc:  # a kernel that fails to compile fails again, in the foreground, at its call
            self.error = exc

    def forked(self) -> None:
        """In a forked child: the parent's thread is not there; a store the child opens may start one."""
        self.__init__()  # type: ignore[misc]


BACKGROUND = Background()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=BACKGROUND.forked)


def start_background() -> threading.Thread | None:
    """``BACKGROUND.start()``: compile every kernel in a daemon thread, once per process."""
    return BACKGROUND.start()
