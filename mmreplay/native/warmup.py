"""Compiling the kernels ahead of their first call: ``mmreplay warmup``, and a store's background warm-up.

numba compiles a kernel the first time it is called with new argument types and keeps the machine code
in its cache (``cache=True``), so the next process loads it instead. On a machine with an empty cache
the first ``sample()`` would pay for compiling the batch kernels. ``compile_all()`` compiles every
kernel for the argument types the package calls it with (``KERNELS``), without running any of them; a
writable store starts it in a daemon thread (``start_background()``, once per kind of store and process),
so the kernels are ready, or loaded from the cache, by the time the first batch is drawn. A store warms
only the kernels and argument types a store of its kind calls (``Kernel.needs``, ``store_tags``), in the
order its first ``sample()`` calls them.

Where the cache is: numba's, under ``NUMBA_CACHE_DIR`` when set, otherwise the ``__pycache__`` folder
beside the kernel modules (or a per-user folder where that is not writable); ``cache_dir()`` says which.

Rules:

- A kernel is compiled from the types of example arguments (``numba.typeof``, as a call would type
  them: read-only arrays, as the ring's frames are, are a type of their own), with ``Dispatcher.compile``:
  nothing runs.
- numba compiles under one process-wide lock, so a foreground call that needs a kernel while the
  warm-up compiles another waits for that one compile, then finds its own kernel compiled or compiles
  it; results never depend on who compiled. The lock is not fair, so the warm-up sleeps a moment
  between two compiles, outside it: otherwise it would take the lock back after every compile and a
  waiting first ``sample()`` would wait for the whole warm-up.
- A fork while the warm-up compiles waits for that compile instead of leaving the child a lock held by a
  thread it does not have: the store's at-fork hook takes numba's compile lock (after the stores' own
  locks; ``store._before_fork``), and only a store starts a warm-up.
- ``MMREPLAY_WARMUP=0`` turns the background warm-up off (``mmreplay warmup`` still compiles).
- A kernel Python calls belongs in ``KERNELS``, with every combination of argument types it is called
  with: ``tests/kernels/test_warmup.py`` fills and samples stores of every kind after ``mmreplay warmup`` and
  fails on any kernel numba then had to compile.
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

from . import jit_enabled


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


Args = tuple[Any, ...]
Variants = list[tuple[frozenset[str], Args]]  # (what a store must be to call it so, the arguments)
COMPRESSED, RAW, PRIORITIZED, READER = frozenset({"compressed"}), frozenset({"raw"}), frozenset({"prioritized"}), \
    frozenset({"reader"})
EVERY: frozenset[str] = frozenset()


def _frames(compressed: bool) -> Args:
    """The ring's arrays as ``reader._kernel_args`` passes them: raw frames (mapped read-only), the
    compressed files (read-only) or a writable placeholder, per-position kind, table and end, then
    rows_alloc, cstride, frame_bytes."""
    comp = _ro(_u8()) if compressed else _u8()
    return (_ro(_u8()), comp, comp.view(np.int64), np.zeros(1, np.int8), _i64(), _i64(), 1, 8, 8)


def _both(head: Callable[[], Args]) -> Variants:
    """A frame kernel's variants: ``head()`` then the ring's arrays, for compressed and for raw frames."""
    return [(COMPRESSED, (*head(), *_frames(True))), (RAW, (*head(), *_frames(False)))]


def _nstep() -> Variants:
    rest = (_i64(1, 1), np.zeros((1, 1), np.float64), np.zeros(1, np.float32), _i64(), np.zeros(1, np.bool_))
    reward = np.zeros(1, np.float32)
    return [(EVERY, (reward, *rest)), (READER, (_ro(reward), *rest))]  # the reward column of a writer, a reader


def _plan_returns() -> Variants:
    head = (_i64(), _u8(), np.zeros(1, np.int32), _i64(), _i64(10), _f64())
    reward, discounts = np.zeros(1, np.float32), np.zeros(1, np.float32)
    return [(EVERY, (*head, reward, discounts)), (READER, (*head, _ro(reward), discounts))]  # a writer's, a reader's


def _plan_gather() -> Variants:
    """``plan_returns``' variants, each with the batch's outputs and the ring's arrays of compressed or raw
    frames."""
    outputs = (np.zeros((3, 1), np.float32), np.zeros((3, 1), np.bool_), _u8())
    return [(need | tags, (*head, *outputs, *_frames(compressed)))
            for need, head in _plan_returns() for tags, compressed in ((COMPRESSED, True), (RAW, False))]


def _decode_file() -> Variants:  # framefile.decode_native: one compressed file
    return [(COMPRESSED, (_i64(), _u8(), _u8(), _u8(), _u8().view(np.int64), np.zeros(1, np.int8), _i64(), _i64(),
                          1, 0, 8))]


def _tree(*rest: Any) -> Callable[[], Variants]:
    return lambda: [(EVERY, (_i64(), _f64(), *rest))]


def _every(*args: Any) -> Callable[[], Variants]:
    return lambda: [(EVERY, args)]


@dataclass(frozen=True)
class Kernel:
    """A kernel Python code calls (kernels only other kernels call are compiled inside them): its module and
    name, the stores that call it (``needs``: tags a store must have), and the argument lists it is called
    with, one per combination of argument types (a read-only array is a type of its own), each with the tags
    of the stores that call it so."""

    module: str
    name: str
    variants: Callable[[], Variants]
    needs: frozenset[str] = EVERY


# In the order a store's first sample() calls them (a prioritized store's sampler first: it takes the new
# slots and draws before the batch is planned and read), then batches(), the priority update and the seal.
KERNELS: tuple[Kernel, ...] = (
    Kernel("sumtree", "tree_set", _tree(_i64(), _f64()), PRIORITIZED),
    Kernel("sumtree", "tree_set_with", _tree(_i64(), _f64(), _f64(), _f64(), np.zeros(1, np.bool_)), PRIORITIZED),
    Kernel("sumtree", "tree_flush", _tree(), PRIORITIZED),
    Kernel("sumtree", "tree_stratified_normalised", _tree(_f64(), _i64(), _f64()), PRIORITIZED),
    Kernel("sumtree", "tree_stratified", _tree(_f64(), _i64()), PRIORITIZED),
    Kernel("rng", "integers", _every(np.zeros(4, np.uint64), np.zeros(2, np.uint32), 0, 1, _i64())),
    Kernel("rng", "draw_slots", _every(np.zeros(4, np.uint64), np.zeros(2, np.uint32), 0, 1, _i64(), _i64(), _i64(),
                                      np.zeros(1, np.bool_))),
    Kernel("sample", "plan_gather", _plan_gather),
    Kernel("plan", "plan_returns", _plan_returns),
    Kernel("plan", "plan_batch", _every(_i64(), _u8(), np.zeros(1, np.int32), _i64(), _i64(10), _f64())),
    Kernel("plan", "nstep_returns", _nstep),
    Kernel("lz4", "gather_pairs", lambda: _both(lambda: (_i64(1, 1), _i64(1, 1), 0, 1, _u8()))),
    Kernel("plan", "distinct_slots", _every(_i64(), 1, np.zeros(1, np.bool_), _i64(), np.zeros(1, np.int32))),
    Kernel("crew", "post", _every(_i64(4), 1, 1, _i64(4))),
    Kernel("crew", "join", _every(_i64(4), 1, 1)),
    Kernel("crew", "serve", _every(_i64(4))),
    Kernel("crew", "wake_all", _every(_i64(4))),
    Kernel("sumtree", "check_set", _every(_i64(), _i64(), _f64()), PRIORITIZED),
    Kernel("priorities", "priority_update", _every(_i64(), _f64(), 0, 1, _i64(), np.zeros(1, np.bool_)), PRIORITIZED),
    Kernel("sumtree", "tree_proportional", _tree(_f64(), _i64()), PRIORITIZED),
    Kernel("sumtree", "tree_find", _tree(_f64(), _i64()), PRIORITIZED),
    Kernel("sumtree", "tree_load", _tree(_f64()), PRIORITIZED),
    Kernel("lz4", "gather", lambda: _both(lambda: (_i64(), _u8())) + _decode_file()),
    Kernel("lz4_encode", "encode_frames", _every(_ro(_u8()), 1, 8, _u8(64), 0, _i64(1, 2), 8), COMPRESSED),
    Kernel("lz4_encode", "check_frames", _every(_ro(_u8()), 1, 8, _u8(64), _i64(1, 2), 1), COMPRESSED),
    Kernel("crc32c", "crc32c", _every(_u8(), 0, 8), COMPRESSED),
)


def store_tags(compressed: bool, prioritized: bool) -> frozenset[str]:
    """The tags of a writable store: which kernels (``Kernel.needs``) and variants it calls."""
    return frozenset({"compressed" if compressed else "raw"} | ({"prioritized"} if prioritized else set()))


@dataclass(frozen=True)
class Compiled:
    """One kernel warmed: ``kernel`` (``module.name``), how many signatures, how many of those numba
    loaded from its cache rather than compiled, and the seconds it took."""

    kernel: str
    signatures: int
    from_cache: int
    seconds: float


def available() -> bool:
    """Whether numba compiles here (without it, or under ``NUMBA_DISABLE_JIT=1``, the package runs its numpy
    paths and nothing compiles)."""
    return jit_enabled()


def cache_dir() -> str:
    """The folder numba keeps the compiled kernels in, as numba resolves it: under ``NUMBA_CACHE_DIR``
    when set, otherwise ``__pycache__`` beside the kernel modules, or a per-user cache folder
    (``~/.cache/numba``) where that is not writable."""
    return str(dispatcher("plan", "plan_batch").stats.cache_path)


def dispatcher(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def compile_kernel(kernel: Kernel, tags: frozenset[str] | None = None, pause: float = 0.0) -> Compiled:
    """Compile (or load from the cache) one kernel for each of its variants a store with ``tags`` calls
    (None: every variant), sleeping ``pause`` seconds after each."""
    from numba import typeof

    t = time.perf_counter()
    disp = dispatcher(kernel.module, kernel.name)
    hits = sum(disp.stats.cache_hits.values())
    variants = [args for need, args in kernel.variants() if tags is None or need <= tags]
    for args in variants:
        # a call types its arguments and puts Omitted(default) for each left out: so does this
        disp.compile(tuple(disp.fold_argument_types(tuple(typeof(a) for a in args), {})[1]))
        time.sleep(pause)
    loaded = sum(disp.stats.cache_hits.values()) - hits
    return Compiled(f"{kernel.module}.{kernel.name}", len(variants), loaded, time.perf_counter() - t)


def compile_all(each: Callable[[Compiled], None] | None = None, tags: frozenset[str] | None = None,
                pause: float = 0.0) -> list[Compiled]:
    """Compile every kernel of ``KERNELS`` (``tags``: only those and the variants a store with these tags
    calls); ``each`` is told of each as it is done."""
    done = []
    for kernel in KERNELS:
        if tags is None or kernel.needs <= tags:
            c = compile_kernel(kernel, tags, pause)
            done.append(c)
            if each is not None:
                each(c)
    return done


class Background:
    """The process's background warm-ups: one thread for each kind of store (``store_tags``) opened for
    writing in this process, at most."""

    PAUSE = 0.005  # seconds between two compiles, outside numba's lock: a foreground call waiting takes it

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.threads: dict[frozenset[str] | None, threading.Thread] = {}
        self.done: list[Compiled] = []
        self.error: BaseException | None = None

    @property
    def thread(self) -> threading.Thread | None:
        """The first warm-up thread started in this process (None: none yet)."""
        return next(iter(self.threads.values()), None)

    def start(self, tags: frozenset[str] | None = None) -> threading.Thread | None:
        """Start a warm-up thread for a store with ``tags`` (None: every kernel and variant) unless one was
        started for them in this process, numba is missing or ``MMREPLAY_WARMUP=0``; returns the thread
        (None when none was started now)."""
        if tags in self.threads or os.environ.get("MMREPLAY_WARMUP", "1").strip() == "0":
            return None
        with self._lock:
            if tags in self.threads or not available():
                return None
            thread = threading.Thread(target=self._run, args=(tags,), name="mmreplay-warmup", daemon=True)
            self.threads[tags] = thread
            thread.start()
            return thread

    def _run(self, tags: frozenset[str] | None) -> None:
        try:
            compile_all(self.done.append, tags, self.PAUSE)
        except BaseException as exc:  # a kernel that fails to compile fails again, in the foreground, at its call
            self.error = exc

    def forked(self) -> None:
        """In a forked child: the parent's threads are not there; a store the child opens may start one."""
        self.__init__()  # type: ignore[misc]


BACKGROUND = Background()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=BACKGROUND.forked)


def start_background(compressed: bool | None = None, prioritized: bool = False) -> threading.Thread | None:
    """Compile in a daemon thread the kernels a writable store calls (``compressed``: its frames; None:
    every kernel and variant), once per kind of store and process."""
    return BACKGROUND.start(None if compressed is None else store_tags(compressed, prioritized))
