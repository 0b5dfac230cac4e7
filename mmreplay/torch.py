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

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("mmreplay.torch needs PyTorch: pip install 'mmreplay[torch]'") from exc

from .batch import Batch
from .sequence_batch import SequenceBatch
from .store import ReplayStore

__all__ = ["ReplayDataset", "TensorBatch", "TensorSequenceBatch", "replay_loader", "to_tensors"]


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
    return torch.from_numpy(np.ascontiguousarray(a))


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
    """

    def __init__(self, path: str | os.PathLike[str], batch_size: int, seed: int = 0, prefetch: int = 2,
                 beta: float | None = None, num_batches: int | None = None, as_dict: bool = True,
                 pin_memory: bool = False, read_threads: int | None = None,
                 refresh_every: int | None = None, sequence_length: int | None = None,
                 strict: bool = False) -> None:
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

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker = 0 if info is None else int(info.id)
        pin = self.pin_memory
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
                    batches = self._batches(store)
                out = to_tensors(next(batches), self.as_dict)
                yield _pin(out) if pin else out
                n += 1


    def _batches(self, store: ReplayStore) -> Iterator[Batch | SequenceBatch]:
        if self.sequence_length is None:
            return store.batches(self.batch_size, prefetch=self.prefetch, beta=self.beta)
        return store.sequence_batches(self.batch_size, self.sequence_length, prefetch=self.prefetch,
                                      strict=self.strict, beta=self.beta)


def replay_loader(path: str | os.PathLike[str], batch_size: int, num_workers: int = 0, seed: int = 0,
                  pin_memory: bool = False, **dataset_kwargs: Any) -> DataLoader[Any]:
    """A ``DataLoader`` over ``ReplayDataset(path, batch_size, seed, **dataset_kwargs)``.

    ``batch_size=None`` for the loader (the dataset yields whole batches); ``pin_memory`` is the
    loader's (pinned in its pinning thread, with or without workers).
    """
    ds = ReplayDataset(path, batch_size, seed=seed, **dataset_kwargs)
    return DataLoader(ds, batch_size=None, num_workers=num_workers, pin_memory=pin_memory)
