"""PyTorch integration: a store's sampled batches as an ``IterableDataset``.

Needs ``torch`` (``pip install 'mmreplay[torch]'``).

>>> from mmreplay.torch import ReplayDataset, replay_loader
>>> loader = replay_loader("replay", batch_size=32, num_workers=2, seed=0)   # a DataLoader
>>> for step, batch in zip(range(10_000), loader):
...     obs = batch["obs"].to(device).float() / 255   # uint8 stays uint8 until you convert it

Each iteration of the dataset opens its own read-only ``ReplayStore`` (``mode="r"``) and yields
``store.batches(batch_size)`` - endless, seeded, frames copied in a background thread. In a
``DataLoader`` worker ``w`` the store is opened with ``seed + w`` (separate readers must use
distinct seeds), so worker ``w``'s batches are exactly ``ReplayStore.open(path, "r", seed=seed + w)
.sample(batch_size)`` repeated; the DataLoader hands out the workers' batches in turn (batch ``j``
comes from worker ``j % num_workers``). Without workers the stream is that of ``seed``.

A reader sees the store as of the writer's last ``commit()`` when the iteration starts; with
``refresh_every=N`` it moves to the latest commit every N batches (``store.refresh()``; the sampling
RNG goes on, so the stream stays reproducible for the same sequence of commits). Every new
iteration (a new ``iter(loader)``) starts the same streams again: pass another ``seed`` for fresh ones.
The dataset yields whole batches, so give the ``DataLoader`` ``batch_size=None`` (``replay_loader`` does).

Sequences (recurrent and model-based learners): ``replay_loader(path, 32, sequence_length=80)`` yields
``store.sequence_batches(32, 80)`` as dicts of tensors, time axis second: ``obs`` ``(B, L+1, k, ...)``,
``action``/``reward``/``terminated``/``truncated``/``is_first``/``mask``/``ids`` ``(B, L, ...)``, ``index`` and
``weight`` ``(B,)``, ``extras`` ``(B, L, ...)``.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("mmreplay.torch needs PyTorch: pip install 'mmreplay[torch]'") from exc

from .reading.batch import Batch
from .reading.sequence_batch import SequenceBatch
from .store import ReplayStore

__all__ = ["CudaCopier", "DeviceBatches", "DeviceFeed", "ReplayDataset", "TensorBatch", "TensorSequenceBatch",
           "device_batches", "replay_loader", "to_tensors"]


@dataclass
class TensorBatch:
    """A ``Batch`` as CPU tensors (same fields, same dtypes: uint8 frames stay uint8)."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    discount: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    index: torch.Tensor
    weight: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def _map(self, fn: Any) -> TensorBatch:
        values = {f.name: fn(getattr(self, f.name)) for f in fields(self) if f.name != "extras"}
        return TensorBatch(**values, extras={k: fn(v) for k, v in self.extras.items()})

    def to(self, device: Any, non_blocking: bool = False) -> TensorBatch:
        """Every tensor moved to ``device`` (dtypes unchanged)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> TensorBatch:
        """Page-locked copies (what ``DataLoader(pin_memory=True)`` calls)."""
        return self._map(lambda t: t.pin_memory())


@dataclass
class TensorSequenceBatch:
    """A ``SequenceBatch`` as CPU tensors (same fields, same dtypes, time axis second)."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    is_first: torch.Tensor
    mask: torch.Tensor
    ids: torch.Tensor
    index: torch.Tensor
    weight: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def _map(self, fn: Any) -> TensorSequenceBatch:
        values = {f.name: fn(getattr(self, f.name)) for f in fields(self) if f.name != "extras"}
        return TensorSequenceBatch(**values, extras={k: fn(v) for k, v in self.extras.items()})

    def to(self, device: Any, non_blocking: bool = False) -> TensorSequenceBatch:
        """Every tensor moved to ``device`` (dtypes unchanged)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> TensorSequenceBatch:
        """Page-locked copies (what ``DataLoader(pin_memory=True)`` calls)."""
        return self._map(lambda t: t.pin_memory())


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a if a.flags.c_contiguous else np.ascontiguousarray(a))


_BATCH_FIELDS = ("obs", "action", "reward", "next_obs", "discount", "terminated", "truncated", "index", "weight")
_SEQUENCE_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "is_first", "mask", "ids", "index",
                    "weight")


def to_tensors(batch: Batch | SequenceBatch,
               as_dict: bool = True) -> dict[str, Any] | TensorBatch | TensorSequenceBatch:
    """A numpy ``Batch`` or ``SequenceBatch`` as tensors sharing its memory: a dict (``extras`` a nested
    dict) or a ``TensorBatch`` / ``TensorSequenceBatch``."""
    seq = isinstance(batch, SequenceBatch)
    values: dict[str, Any] = {name: _tensor(getattr(batch, name))
                              for name in (_SEQUENCE_FIELDS if seq else _BATCH_FIELDS)}
    values["extras"] = {k: _tensor(v) for k, v in batch.extras.items()}
    if as_dict:
        return values
    return TensorSequenceBatch(**values) if seq else TensorBatch(**values)


def _accelerator() -> bool:
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        return bool(acc.is_available())
    return bool(torch.cuda.is_available())


def _pin(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, dict):
        return {k: _pin(v) for k, v in value.items()}
    return value.pin_memory()


class ReplayDataset(IterableDataset[Any]):
    """Endless seeded batches of a store, as tensors; one reader per ``DataLoader`` worker.

    ``path``: the store directory. ``batch_size``: rows per batch. ``seed``: worker ``w`` opens the
    store with ``seed + w`` (``seed`` without workers). ``prefetch``: batches prepared ahead
    (``store.batches``). ``beta``: importance-weight exponent for prioritized stores (default: the
    store's). ``num_batches``: stop after this many per iteration (per worker); ``None`` = endless.
    ``as_dict``: yield ``dict``s (``extras`` nested) or ``TensorBatch`` objects. ``pin_memory``: pin
    each batch in this process - for ``num_workers=0``; with workers use ``DataLoader(pin_memory=True)``
    (pinning in a worker raises ``ValueError``); without an accelerator it warns and does not pin.
    ``read_threads``: frame-copy threads per reader (default 1 in a worker, else the store's default).
    ``refresh_every``: move to the writer's latest commit every this many batches (online training with
    a live writer); ``None`` keeps the commit seen at the start. ``sequence_length``: yield batches of
    sequences of this many steps (``store.sequence_batches``; time axis second) instead of transitions;
    ``strict``: with ``sequence_length``, only sequences with that many steps in their episode.
    ``device``: yield batches already on this device (``device_batches``: distinct frames through pinned
    buffers and a side stream, stacks gathered there; the same rows); without ``DataLoader`` workers only.
    """

    def __init__(self, path: str | os.PathLike[str], batch_size: int, seed: int = 0, prefetch: int = 2,
                 beta: float | None = None, num_batches: int | None = None, as_dict: bool = True,
                 pin_memory: bool = False, read_threads: int | None = None,
                 refresh_every: int | None = None, sequence_length: int | None = None,
                 strict: bool = False, device: Any = None) -> None:
        super().__init__()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if num_batches is not None and (not isinstance(num_batches, int) or num_batches < 0):
            raise ValueError(f"num_batches: expected an int >= 0 or None, got {num_batches!r}")
        if refresh_every is not None and (not isinstance(refresh_every, int) or refresh_every < 1):
            raise ValueError(f"refresh_every: expected an int >= 1 or None, got {refresh_every!r}")
        if sequence_length is not None and (isinstance(sequence_length, bool) or not isinstance(sequence_length, int)
                                            or sequence_length < 1):
            raise ValueError(f"sequence_length: expected an int >= 1 or None, got {sequence_length!r}")
        if not isinstance(strict, bool):
            raise TypeError(f"strict: expected True or False, got {strict!r}")
        if strict and sequence_length is None:
            raise ValueError("strict=True is for sequences: pass sequence_length= too")
        self.path = os.fspath(path)
        self.batch_size = batch_size
        self.seed = seed
        self.prefetch = prefetch
        self.beta = beta
        self.num_batches = num_batches
        self.as_dict = as_dict
        self.pin_memory = pin_memory
        self.read_threads = read_threads
        self.refresh_every = refresh_every
        self.sequence_length = sequence_length
        self.strict = strict
        self.device = device

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker = 0 if info is None else int(info.id)
        pin = self.pin_memory
        if self.device is not None and info is not None:
            raise ValueError("ReplayDataset(device=...) feeds a device from this process; use it without DataLoader"
                             " workers (num_workers=0): its reading runs in the store's prefetch thread")
        if pin and info is not None:
            raise ValueError("ReplayDataset(pin_memory=True) pins in this process only; with DataLoader workers"
                             " pass DataLoader(pin_memory=True) instead")
        if pin and not _accelerator():
            warnings.warn("ReplayDataset(pin_memory=True): no accelerator is available, batches are not pinned",
                          stacklevel=2)
            pin = False
        threads = self.read_threads if self.read_threads is not None or info is None else 1
        return self._stream(self.seed + worker, threads, pin)

    def _stream(self, seed: int, threads: int | None, pin: bool) -> Iterator[Any]:
        with ReplayStore.open(self.path, mode="r", seed=seed, read_threads=threads) as store:
            batches = self._batches(store)
            n = 0
            while self.num_batches is None or n < self.num_batches:
                if n and self.refresh_every and n % self.refresh_every == 0 and store.refresh():
                    if isinstance(batches, DeviceBatches):
                        batches.close()
                    batches = self._batches(store)
                batch = next(batches)
                if isinstance(batch, (TensorBatch, TensorSequenceBatch)):  # device=: already tensors
                    yield _as_dict(batch) if self.as_dict else batch
                else:
                    out = to_tensors(batch, self.as_dict)
                    yield _pin(out) if pin else out
                n += 1
            if isinstance(batches, DeviceBatches):
                batches.close()


    def _batches(self, store: ReplayStore) -> Iterator[Any]:
        if self.device is not None:
            return device_batches(store, self.batch_size, self.device, self.prefetch, beta=self.beta,
                                  sequence_length=self.sequence_length, strict=self.strict)
        if self.sequence_length is None:
            return store.batches(self.batch_size, prefetch=self.prefetch, beta=self.beta)
        return store.sequence_batches(self.batch_size, self.sequence_length, prefetch=self.prefetch,
                                      strict=self.strict, beta=self.beta)


def _as_dict(batch: TensorBatch | TensorSequenceBatch) -> dict[str, Any]:
    return {f.name: getattr(batch, f.name) for f in fields(batch)}


def replay_loader(path: str | os.PathLike[str], batch_size: int, num_workers: int = 0, seed: int = 0,
                  pin_memory: bool = False, **dataset_kwargs: Any) -> DataLoader[Any]:
    """A ``DataLoader`` over ``ReplayDataset(path, batch_size, seed, **dataset_kwargs)``.

    ``batch_size=None`` for the loader (the dataset yields whole batches); ``pin_memory`` is the
    loader's (pinned in its pinning thread, with or without workers).
    """
    ds = ReplayDataset(path, batch_size, seed=seed, **dataset_kwargs)
    return DataLoader(ds, batch_size=None, num_workers=num_workers, pin_memory=pin_memory)


# -- the device feed ---------------------------------------------------------------------------------------
#
# Batches reach the device in three steps, all but the last in the thread that assembles the batch (on
# warm data the learner's, in ``next()``: the reader's helper threads read the frames of batch i+1 while the
# learner steps, posted when batch i is handed out; else the store's prefetch thread while the learner is
# away, see reading/prefetch.py):
#   1. the batch's distinct frames are decoded by the native kernels straight into a page-locked host
#      buffer of a ring (``batches(frames="distinct", frame_buffer=...)``; a posted read takes its buffer
#      when posted), its small columns packed behind them (a few KB);
#   2. one non-blocking copy of that prefix goes to the device on a side stream, an event is recorded after
#      it (the buffer may be reused once it completed), the stacks are gathered from the frames on the
#      device (``frames[obs_index]``: bit-identical to ``sample()``'s arrays), a second event after that;
#   3. the learner's ``next()`` makes its current stream wait on the second event and tells the caching
#      allocator the tensors are used there (``record_stream``): a few calls, no copy, no wait.
# A buffer is taken again only after its copy event completed (waiting for it if every other buffer is
# held), so a copy never reads a buffer being refilled; the ring holds prefetch + 3 buffers: the
# ``prefetch + 1`` batches the iterator may hold assembled, plus copies in flight.


def _align(n: int, a: int = 64) -> int:
    return -(-n // a) * a


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    t = _TORCH_DTYPES.get(dtype)
    if t is None:
        t = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype)).dtype
    return t


class Copier:
    """How packed host bytes reach the device (one instance per feed). ``copy`` starts the copy of a 1-D
    uint8 host tensor and returns the device tensor and a handle that completes when the host bytes have
    been read; ``build(fn)`` runs ``fn`` (ops on the copied tensor) where they are ordered after the copy
    and returns a handle that completes after them; ``done``/``wait`` ask or wait for a handle;
    ``consume(handle, tensors)`` makes the consumer's work wait for it. ``CudaCopier`` is the real one;
    tests substitute one whose copies complete late."""

    device: torch.device
    pinned = False

    def copy(self, host: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def build(self, fn: Any) -> tuple[Any, Any]:
        return fn(), None

    def done(self, handle: Any) -> bool:
        return True

    def wait(self, handle: Any) -> None:
        return None

    def consume(self, handle: Any, tensors: list[torch.Tensor]) -> None:
        return None

    def send(self, host: torch.Tensor, fn: Any) -> tuple[Any, Any, Any]:
        """``copy(host)`` then ``build(lambda: fn(device_tensor))``: ``(fn's result, the copy's handle, the
        build's handle)``."""
        dev, copied = self.copy(host)
        out, ready = self.build(lambda: fn(dev))
        return out, copied, ready


def _event() -> Any:
    """An event the host may wait on: created blocking, so ``synchronize`` sleeps until the device reaches it
    (without the flag, CUDA busy-waits a CPU core for the whole wait)."""
    return torch.cuda.Event(blocking=True)


class CudaCopier(Copier):
    """Non-blocking copies on a side stream of ``device``; events mark their completion.

    The device's index is fixed when the copier is made (``"cuda"``: the current device then): PyTorch looks
    up the current device in Python for every stream call given a device without an index, and the copier's
    calls run on the learner's thread. The side stream is made current by ``torch.cuda.set_stream`` around
    the copier's own calls; the stream and the current device before are restored after them."""

    pinned = True

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"device: expected a CUDA device, got {device}")
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", self.index)
        self.stream = torch.cuda.Stream(self.device)

    def _on_side(self, fn: Any) -> Any:
        """``fn()`` with the side stream current (what it queues goes there); after it, the device's stream
        and the current device as they were (``set_stream`` also makes the stream's device current)."""
        device = torch.cuda.current_device()
        before = torch.cuda.current_stream(self.index)
        torch.cuda.set_stream(self.stream)
        try:
            return fn()
        finally:
            torch.cuda.set_stream(before)
            if device != self.index:
                torch.cuda.set_device(device)

    def copy(self, host: torch.Tensor) -> tuple[torch.Tensor, Any]:
        def start() -> tuple[torch.Tensor, Any]:
            dev = torch.empty(host.shape, dtype=host.dtype, device=self.device)
            dev.copy_(host, non_blocking=True)
            event = _event()
            event.record(self.stream)
            return dev, event

        return self._on_side(start)

    def build(self, fn: Any) -> tuple[Any, Any]:
        def run() -> tuple[Any, Any]:
            out = fn()
            event = _event()
            event.record(self.stream)
            return out, event

        return self._on_side(run)

    def send(self, host: torch.Tensor, fn: Any) -> tuple[Any, Any, Any]:
        # one stream switch and one event: the build is ordered after the copy on the side stream, so its
        # event also says the host bytes were read (the buffer is free a gather later, microseconds)
        def run() -> tuple[Any, Any, Any]:
            dev = torch.empty(host.shape, dtype=host.dtype, device=self.device)
            dev.copy_(host, non_blocking=True)
            out = fn(dev)
            event = _event()
            event.record(self.stream)
            return out, event, event

        return self._on_side(run)

    def done(self, handle: Any) -> bool:
        return bool(handle.query())

    def wait(self, handle: Any) -> None:
        handle.synchronize()  # (releases the GIL; sleeps: the events are blocking)

    def consume(self, handle: Any, tensors: list[torch.Tensor]) -> None:
        stream = torch.cuda.current_stream(self.index)
        stream.wait_event(handle)
        for t in tensors:  # allocated on the side stream, used on this one
            t.record_stream(stream)


class _Lent(np.ndarray):
    """A ring buffer's array lent to a batch. Views of it (a batch's two stacks) keep it alive, where views
    of a plain array would keep only the ring's array alive (numpy makes a view's base the first array up
    the chain of another type), so it dies, and a weak reference gives its buffer back, only with its batch."""


class _Slot:
    __slots__ = ("host", "array", "copied", "busy", "given")

    def __init__(self) -> None:
        self.host: torch.Tensor | None = None  # 1-D uint8, page-locked when the copier wants it
        self.array: np.ndarray = np.empty(0, np.uint8)  # the same memory
        self.copied: Any = None  # the handle of the last copy out of it
        self.busy = False  # held by a batch being assembled or not yet copied
        self.given = 0  # when it was last given back (HostRing's count): the oldest copy completes first


class HostRing:
    """Host buffers for a feed's batches, each taken again only after the copy out of it completed."""

    def __init__(self, copier: Copier, count: int) -> None:
        self.copier = copier
        self.slots = [_Slot() for _ in range(count)]
        self._lock = threading.Lock()
        self._given = 0
        self._dropped: deque[_Slot] = deque()  # given back by ``drop`` while the lock was held
        self.waits = 0  # times a take had to wait for a copy to complete (the ring was short)

    def take(self) -> _Slot:
        """A free buffer: one no copy reads from, else the one whose copy was started first, once that copy
        completed. Copies on one stream complete in the order they were started, so the oldest copy is the
        one to ask about (a query is a call into the device's driver) and, where it is still in flight, the
        one to wait for."""
        while True:
            with self._lock:
                self._free_dropped()
                oldest = None
                for slot in self.slots:
                    if slot.busy:
                        continue
                    if slot.copied is None:
                        slot.busy = True
                        return slot
                    if oldest is None or slot.given < oldest.given:
                        oldest = slot
                if oldest is None:  # every buffer held by an assembled batch: cannot happen with p + 2 or more
                    slot = _Slot()
                    slot.busy = True
                    self.slots.append(slot)
                    return slot
                if self.copier.done(oldest.copied):
                    oldest.copied = None
                    oldest.busy = True
                    return oldest
                handle = oldest.copied
            self.waits += 1
            self.copier.wait(handle)

    def give(self, slot: _Slot, copied: Any) -> None:
        """The copy out of ``slot`` started (``copied``: its handle): free once it completed."""
        with self._lock:
            self._free_dropped()
            self._free(slot, copied)

    def drop(self, slot: _Slot) -> None:
        """``give(slot, None)`` from a weak reference's callback, which runs wherever the array it watched
        died: at any allocation that starts a garbage collection, in any thread, also inside ``take`` or
        ``give`` holding the lock (which is not reentrant). Where the lock is held, the slot waits in a queue
        for the next ``take`` or ``give``."""
        if self._lock.acquire(blocking=False):
            try:
                self._free(slot, None)
            finally:
                self._lock.release()
        else:
            self._dropped.append(slot)

    def _free_dropped(self) -> None:
        while self._dropped:
            self._free(self._dropped.popleft(), None)

    def _free(self, slot: _Slot, copied: Any) -> None:
        slot.copied = copied
        slot.busy = False
        slot.given = self._given
        self._given += 1

    def reserve(self, slot: _Slot, nbytes: int, keep: int = 0) -> np.ndarray:
        """``slot``'s memory, at least ``nbytes`` (grown if needed, its first ``keep`` bytes kept)."""
        if slot.array.size < nbytes:
            size = _align(nbytes + nbytes // 8, 4096)
            host = torch.empty(size, dtype=torch.uint8, pin_memory=self.copier.pinned)
            array = host.numpy()
            if keep:
                array[:keep] = slot.array[:keep]
            slot.host, slot.array = host, array
        return slot.array


def _columns(batch: Any, names: tuple[str, ...]) -> list[tuple[str, np.ndarray]]:
    cols = [(name, getattr(batch, name)) for name in names]
    cols += [("x_" + k, v) for k, v in batch.extras.items()]
    return cols


_FEED_BATCH = ("action", "reward", "discount", "terminated", "truncated", "index", "weight")
_FEED_SEQUENCE = ("action", "reward", "terminated", "truncated", "is_first", "mask", "ids", "index", "weight")


class DeviceBatches(Iterator[Any]):
    """``device_batches``' iterator (see there); ``close()`` ends it and its store iterator."""

    def __init__(self, store: ReplayStore, batch_size: int, device: Any = None, prefetch: int = 2,
                 beta: float | None = None, host_stacks: bool | None = None, pin_memory: bool | None = None,
                 sequence_length: int | None = None, strict: bool = False, copier: Copier | None = None) -> None:
        if host_stacks is not None and not isinstance(host_stacks, bool):
            raise TypeError(f"host_stacks: expected True, False or None, got {host_stacks!r}")
        dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        if copier is None and dev.type == "cuda":
            copier = CudaCopier(dev)
        elif copier is None and dev.type != "cpu":
            raise ValueError(f"device: expected a CUDA device or 'cpu', got {dev}")
        self.device = copier.device if copier is not None else dev
        if host_stacks is None:
            # on the CPU the stacks are the output: reading them straight from the ring (batches()' own path,
            # the reader's helper thread included) costs less than distinct frames and a gather after
            host_stacks = copier is None
        self.copier = copier
        self.host_stacks = host_stacks
        self.sequences = sequence_length is not None
        self._pin = False
        if copier is None and pin_memory:
            self._pin = _accelerator()
            if not self._pin:
                warnings.warn("device_batches(pin_memory=True): no accelerator is available, batches are not"
                              " pinned", stacklevel=3)
        self.ring = HostRing(copier, int(prefetch) + 3) if copier is not None else None
        self._layouts: dict[Any, _Layout] = {}
        # frame buffers lent to batches being read or assembled, by the address of the array lent: (its slot, a
        # weak reference whose callback gives the slot back if the array dies unsent, its batch having failed;
        # once the batch's send begins the entry is dropped, and a callback that still runs finds none of its own)
        self._lent: dict[int, tuple[_Slot, weakref.ref[np.ndarray]]] = {}
        plain = host_stacks and self.ring is None  # the CPU's stacks: batches() itself, tensors made at hand-out
        # for a device, the distinct frames or (host stacks) the stacks are read straight into the ring buffers
        frame_buffer = self._frame_buffer if self.ring is not None else None
        frames = "stacks" if host_stacks else "distinct"
        transform = None if plain else self._transform
        if self.sequences:
            self._it: Any = store.sequence_batches(batch_size, sequence_length, prefetch=prefetch,  # type: ignore[arg-type]
                                                   strict=strict, beta=beta, frames=frames,
                                                   frame_buffer=frame_buffer, transform=transform)
        else:
            self._it = store.batches(batch_size, prefetch=prefetch, beta=beta, frames=frames,
                                     frame_buffer=frame_buffer, transform=transform)

    # the assembling thread ------------------------------------------------------------------------------
    def _frame_buffer(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A ring buffer for a batch's distinct frames, or its two stacks (read into it by the helper threads
        while the batch waits its turn, or by the thread assembling it); ``_transform`` sends the batch out of
        it."""
        assert self.ring is not None
        slot = self.ring.take()
        nbytes = math.prod(shape) * dtype.itemsize  # (math.prod: np.prod of a tuple takes microseconds)
        array = self.ring.reserve(slot, nbytes)[:nbytes].view(dtype).reshape(shape).view(_Lent)
        key, lent_out = array.ctypes.data, self._lent

        def dropped(ref: weakref.ref[np.ndarray]) -> None:
            # the array died before its batch was sent: its buffer goes back. Only while the entry is this
            # reference's: a batch that failed after its send began gave the buffer back itself, and the
            # buffer may be lent again, under the same address, before the failed batch's array dies.
            held = lent_out.get(key)
            if held is not None and held[1] is ref:
                del lent_out[key]
                ring.drop(slot)

        ring = self.ring
        lent_out[key] = (slot, weakref.ref(array, dropped))
        return array

    def _transform(self, batch: Any) -> Any:
        if self.ring is None:
            return self._on_cpu(batch)
        lent = batch.obs if self.host_stacks else batch.frames  # (its first stack, or its frames, start the lent array)
        held = self._lent.pop(lent.ctypes.data, None)
        slot = held[0] if held is not None else self.ring.take()
        try:
            return self._send(batch, slot, self.host_stacks and held is not None)
        except BaseException:
            self.ring.give(slot, None)
            raise

    def _on_cpu(self, batch: Any) -> Any:
        """``device="cpu"``: the stacks gathered from the frames (into pinned tensors when asked)."""
        if type(batch) is Batch and not self._pin:  # host_stacks: sample()'s arrays, as few calls as it takes
            t = _tensor
            return TensorBatch(t(batch.obs), t(batch.action), t(batch.reward), t(batch.next_obs), t(batch.discount),
                               t(batch.terminated), t(batch.truncated), t(batch.index), t(batch.weight),
                               {k: t(v) for k, v in batch.extras.items()} if batch.extras else {})
        if isinstance(batch, (Batch, SequenceBatch)):  # host_stacks: sample()'s arrays
            tensors = to_tensors(batch, as_dict=False)
            return _pin(tensors) if self._pin else tensors
        frames = torch.from_numpy(batch.frames)
        values = {name: _tensor(a) for name, a in _columns(batch, _FEED_SEQUENCE if self.sequences else _FEED_BATCH)}
        if self._pin:
            values = {k: v.pin_memory() for k, v in values.items()}
        stacks = {"obs": batch.obs_index} if self.sequences else {"obs": batch.obs_index, "next_obs": batch.next_index}
        for name, index in stacks.items():
            idx = torch.from_numpy(index).reshape(-1).long()
            out = torch.empty((idx.numel(),) + tuple(frames.shape[1:]), dtype=frames.dtype, pin_memory=self._pin)
            torch.index_select(frames, 0, idx, out=out)
            values[name] = out.view(tuple(index.shape) + tuple(frames.shape[1:]))
        return self._wrap(values)

    def _wrap(self, values: dict[str, torch.Tensor]) -> Any:
        extras = {k[2:]: values.pop(k) for k in [k for k in values if k.startswith("x_")]}
        return (TensorSequenceBatch if self.sequences else TensorBatch)(**values, extras=extras)

    def _send(self, batch: Any, slot: _Slot, in_place: bool = False) -> Any:
        """Pack ``batch`` in ``slot`` behind its distinct frames, or behind its stacks (host stacks:
        ``in_place``, read there already), copy it to the device, gather the stacks there (distinct)."""
        assert self.ring is not None and self.copier is not None
        cols = _columns(batch, _FEED_SEQUENCE if self.sequences else _FEED_BATCH)
        if self.host_stacks:  # a Batch's obs and next_obs (B, k, *frame), a SequenceBatch's obs (B, L+1, k, *frame)
            fr = batch.obs
            nd = 3 if self.sequences else 2
            fshape, ishape, index_dtype = fr.shape[nd:], fr.shape[:nd], None
        else:
            fr = batch.frames
            fshape, ishape, index_dtype = fr.shape[1:], batch.obs_index.shape, batch.obs_index.dtype
        # a feed's batches share a layout but for the number of distinct frames, which only moves its start
        key = (fshape, fr.dtype, ishape, tuple((name, a.dtype, a.shape) for name, a in cols))
        lay = self._layouts.get(key)
        if lay is None:
            if len(self._layouts) >= 64:  # (sequences: shapes vary with the draw)
                self._layouts.clear()
            lay = self._layouts[key] = _Layout(self.host_stacks, self.sequences, fshape, fr.dtype, ishape,
                                               index_dtype, cols)
        head = 0 if self.host_stacks else _align(fr.nbytes)
        array = self.ring.reserve(slot, head + lay.size, keep=lay.stack_bytes if in_place else head)
        if self.host_stacks:
            if not in_place:  # (read elsewhere: copied in)
                stacks = (batch.obs,) if self.sequences else (batch.obs, batch.next_obs)
                for (off, n), a in zip(lay.stacks, stacks, strict=True):
                    array[off:off + n] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        else:  # the frames are already at the buffer's start (frame_buffer); both stacks' positions, adjacent
            n = batch.obs_index.nbytes
            array[head:head + n] = batch.obs_index.reshape(-1).view(np.uint8)
            if not self.sequences:
                array[head + n:head + 2 * n] = batch.next_index.reshape(-1).view(np.uint8)
        packed = array[head:head + lay.size]
        for (_, a), (_, off, n, _, _, _) in zip(cols, lay.cols, strict=True):
            packed[off:off + n] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        assert slot.host is not None
        nframes = 0 if self.host_stacks else fr.shape[0]
        (values, keep), copied, ready = self.copier.send(slot.host[:head + lay.size],
                                                         lambda dev: lay.unpack(dev, head, nframes))
        self.ring.give(slot, copied)
        return _Sent(self._wrap(values), ready, keep)

    # the consumer's thread ------------------------------------------------------------------------------
    def __next__(self) -> Any:
        out = next(self._it)
        if type(out) is Batch:  # the CPU, host stacks (the usual case first)
            return self._on_cpu(out)
        if isinstance(out, _Sent):
            assert self.copier is not None
            self.copier.consume(out.ready, out.keep)
            return out.batch
        if isinstance(out, (Batch, SequenceBatch)):  # the CPU, host stacks: zero-copy tensors of the arrays
            return self._on_cpu(out)
        return out

    def __iter__(self) -> DeviceBatches:
        return self

    def close(self) -> None:
        self._it.close()


class _Layout:
    """A feed batch's packed layout, offsets from the end of its distinct frames (``head``, 64-byte aligned;
    0 for host stacks, which come first instead, one after the other): [stacks' positions (or the stacks)]
    [columns], each part 64-byte aligned. ``unpack(dev, head, nframes)`` makes the device tensors of a copied
    buffer. ``cols``: each column's (name, byte offset, bytes, torch dtype, item size, shape; None for 1-D)."""

    def __init__(self, host_stacks: bool, sequences: bool, frame_shape: tuple[int, ...], frame_dtype: np.dtype,
                 index_shape: tuple[int, ...], index_dtype: np.dtype | None, cols: list[tuple[str, np.ndarray]]) -> None:
        self.host_stacks = host_stacks
        self.names = ("obs",) if sequences else ("obs", "next_obs")
        self.fshape = tuple(frame_shape)
        self.fdtype = _torch_dtype(frame_dtype)
        self.frame_bytes = math.prod(self.fshape) * frame_dtype.itemsize
        self.index_shape = tuple(index_shape)
        self.stacks: list[tuple[int, int]] = []  # host stacks: (offset, bytes) of obs (and next_obs), adjacent
        self.stack_bytes = 0
        if host_stacks:
            nbytes = math.prod(self.index_shape) * self.frame_bytes
            self.stacks = [(i * nbytes, nbytes) for i in range(len(self.names))]
            self.stack_bytes = len(self.names) * nbytes
            end = _align(self.stack_bytes)
        else:
            assert index_dtype is not None
            self.index_dtype = _torch_dtype(index_dtype)
            self.index_itemsize = index_dtype.itemsize
            self.positions = math.prod(self.index_shape) * len(self.names)  # (in the index's items)
            end = _align(self.positions * self.index_itemsize)
        # each column: (name, byte offset, bytes, torch dtype, item size, shape or None for 1-D: no reshape)
        self.cols: list[tuple[str, int, int, torch.dtype, int, tuple[int, ...] | None]] = []
        for name, a in cols:
            self.cols.append((name, end, a.nbytes, _torch_dtype(a.dtype), a.dtype.itemsize,
                              tuple(a.shape) if a.ndim != 1 else None))
            end = _align(end + a.nbytes)
        self.size = end

    def unpack(self, dev: torch.Tensor, head: int, nframes: int
               ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        """The batch's device tensors (views of ``dev``, but the stacks, one gather from the frames) and the
        tensors whose memory they use (for the consumer's stream to keep alive).

        Every view is a dispatch on the feeding thread (the learner's, holding the GIL), so ``dev`` is viewed
        once per dtype and each column is a slice of that view: every part starts 64-byte aligned and
        ``dev`` is a whole number of 64 bytes, so each part is a whole number of items of its dtype."""
        typed: dict[torch.dtype, torch.Tensor] = {torch.uint8: dev}
        values: dict[str, torch.Tensor] = {}
        for name, off, n, dtype, size, shape in self.cols:
            t = typed.get(dtype)
            if t is None:
                t = typed[dtype] = dev.view(dtype)
            start = (head + off) // size
            col = t[start:start + n // size]
            values[name] = col if shape is None else col.view(shape)
        if self.host_stacks:  # (adjacent: one view of both)
            stacks = dev[:self.stack_bytes]
            if self.fdtype != torch.uint8:
                stacks = stacks.view(self.fdtype)
            stacks = stacks.view((len(self.names),) + self.index_shape + self.fshape)
            for name, stack in zip(self.names, stacks.unbind(0), strict=True):
                values[name] = stack
            return values, [dev]
        frames = dev[:nframes * self.frame_bytes]
        if self.fdtype != torch.uint8:
            frames = frames.view(self.fdtype)
        frames = frames.view((nframes,) + self.fshape)
        t = typed.get(self.index_dtype)
        if t is None:
            t = dev.view(self.index_dtype)
        start = head // self.index_itemsize
        index = t[start:start + self.positions]
        stacks = torch.index_select(frames, 0, index).view((len(self.names),) + self.index_shape + self.fshape)
        for name, stack in zip(self.names, stacks.unbind(0), strict=True):
            values[name] = stack
        return values, [dev, stacks]


class _Sent:
    """A batch on its way to the device: usable on the consumer's stream once ``ready`` completed."""

    __slots__ = ("batch", "ready", "keep")

    def __init__(self, batch: Any, ready: Any, keep: list[torch.Tensor]) -> None:
        self.batch, self.ready, self.keep = batch, ready, keep


def device_batches(store: ReplayStore, batch_size: int, device: Any = None, prefetch: int = 2,
                   beta: float | None = None, host_stacks: bool | None = None, pin_memory: bool | None = None,
                   sequence_length: int | None = None, strict: bool = False) -> DeviceBatches:
    """An endless iterator of ``TensorBatch``es already on ``device`` (default: CUDA when available, else
    the CPU; ``"cuda"`` without an index is the current CUDA device when the iterator is made), with the
    draws of ``store.batches(batch_size, prefetch)``: without priority updates the batches of repeated
    ``store.sample(batch_size)``, bit for bit; commits and resumes as ``batches()``.

    On a CUDA device each batch's distinct frames are decoded into page-locked host memory (by the reader's
    helper threads while the learner steps, or the store's prefetch thread), copied with the batch's small
    columns in one non-blocking copy on a side stream, and
    the stacks gathered from them on the device; ``next()`` only makes the current stream wait for that
    (so use the batch on the stream that was current at ``next()``). ``host_stacks=True`` copies both
    stacks instead, read by the reader straight into that memory (8 frames a row where the distinct frames
    are k + n or fewer, and no gather on the device: less work on the learner's thread, more bytes read and
    copied). On the CPU
    (``device="cpu"``) the batches are ``batches()``' own, as tensors (``host_stacks=False``: gathered
    from the distinct frames, as on a GPU); ``pin_memory=True`` pins them (needs an accelerator).
    ``sequence_length=L`` (and ``strict``) hands out ``TensorSequenceBatch``es of
    ``store.sequence_batches(batch_size, L)`` the same way. Close it (or the store) when done.
    """
    return DeviceBatches(store, batch_size, device, prefetch, beta, host_stacks, pin_memory, sequence_length, strict)


class DeviceFeed:
    """``sample(batch_size)`` for a learner on a device: ``feed.next(batch_size)`` is the next batch of
    ``device_batches(store, batch_size, device, prefetch)`` (a new iterator when the size changes; the
    old one is closed, its drawn batches dropped). For drop-ins whose API is ``sample(batch_size)``."""

    def __init__(self, store: ReplayStore, device: Any = None, prefetch: int = 2, **options: Any) -> None:
        self.store = store
        self.device = device
        self.prefetch = prefetch
        self.options = options
        self._size = 0
        self._it: DeviceBatches | None = None

    def next(self, batch_size: int) -> Any:
        if self._it is None or batch_size != self._size:
            self.close()
            self._it = device_batches(self.store, batch_size, self.device, self.prefetch, **self.options)
            self._size = batch_size
        return next(self._it)

    def close(self) -> None:
        if self._it is not None:
            self._it.close()
            self._it = None
