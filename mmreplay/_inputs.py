"""Validation of what users pass to ``reset()``/``step()``/``gather()`` and the store's other arguments.

Every check runs before anything is written, so a rejected call changes
nothing. Messages say what was expected, what came, and what to change.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .options import Schema

Casting = Literal["safe", "same_kind"]
_F32_MAX = float(np.finfo(np.float32).max)


def _array(name: str, value: Any, shape: tuple[int, ...], dtype: np.dtype, casting: Casting, hint: str) -> np.ndarray:
    arr = value if type(value) is np.ndarray else np.asarray(value)
    if arr.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}{hint}, got {arr.shape}")
    if arr.dtype != dtype and arr.size and not np.can_cast(arr.dtype, dtype, casting="safe"):
        _check_narrowing(name, arr, dtype, casting)
    return arr


def cast_losses(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Where a cast of ``values`` to ``dtype`` does not keep the value: an integer (or bool) outside an integer
    dtype's range (a cast would wrap 300 into int8's 44), a finite value that a float dtype turns infinite (1e10
    in float16), or any other value the cast changes (a fraction dropped). Rounding to a float is kept."""
    if values.dtype.kind in "biu" and dtype.kind in "iu":
        info = np.iinfo(dtype)
        return (values < info.min) | (values > info.max)
    with np.errstate(over="ignore", invalid="ignore"):
        out = values.astype(dtype)
        if dtype.kind == "f" and values.dtype.kind in "biuf":
            return np.isfinite(values) & ~np.isfinite(out)
        return out.astype(values.dtype) != values


def _check_narrowing(name: str, arr: np.ndarray, dtype: np.dtype, casting: Casting) -> None:
    """An array that the store's dtype cannot hold every value of: with ``same_kind`` (actions, extras)
    integers may go into any integer dtype and floats into a narrower float as long as every value fits
    (``cast_losses``); anything else is refused."""
    if casting == "same_kind" and arr.dtype.kind in "biu" and dtype.kind in "iu":
        bad = cast_losses(arr, dtype)
    elif np.can_cast(arr.dtype, dtype, casting=casting):
        if not (arr.dtype.kind in "biuf" and dtype.kind == "f"):
            return
        bad = cast_losses(arr, dtype)
    else:
        raise TypeError(
            f"{name}: expected dtype {dtype}, got {arr.dtype}; convert it (e.g. .astype(np.{dtype.name}))"
            f" or create the store with a matching dtype")
    if bad.any():
        at = np.unravel_index(int(np.flatnonzero(bad.ravel())[0]), arr.shape)
        where = f" at {tuple(int(i) for i in at)}" if arr.ndim else ""
        raise ValueError(f"{name}: {arr[at].item()!r}{where} does not fit the store's dtype {dtype}; give values it holds"
                         " or create the store with a wider dtype")


def quantized(name: str, arr: np.ndarray, shape: tuple[int, ...], hint: str) -> np.ndarray:
    """Floating frames in [0, 1] as uint8 ``round(x * 255)`` (computed in float64, halves to even as
    Python's ``round``). Raises ``ValueError`` naming the first value outside [0, 1] or NaN."""
    if arr.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}{hint}, got {arr.shape}")
    ok = (arr >= 0) & (arr <= 1)  # NaN compares false
    if not ok.all():
        at = np.unravel_index(int(np.flatnonzero(~ok.ravel())[0]), arr.shape)
        raise ValueError(f"{name}: quantize=True takes floating frames in [0, 1], got {arr[at]!r} at"
                         f" {tuple(int(i) for i in at)}; scale the frames to [0, 1] (or pass uint8 frames)")
    out = np.multiply(arr, 255.0, dtype=np.float64)
    np.rint(out, out=out)
    return out.astype(np.uint8)


@dataclass
class Block:
    """A validated ``extend()`` block of ``length`` steps (arrays with a leading time axis)."""

    length: int
    actions: np.ndarray
    rewards: np.ndarray  # float64, finite
    frames: np.ndarray  # the next observations (``length - 1`` of them when the final one is missing)
    terminated: np.ndarray  # bool
    truncated: np.ndarray  # bool, never together with terminated
    extras: dict[str, np.ndarray]


class Inputs:
    """Coerces and checks user input for one schema (batched = leading num_envs axis)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        # bytes of one sampled step's small columns: action and extras, plus 64 for reward, discount, flags, ids
        # and weight; of one sampled row: its obs and next_obs stacks besides
        self.step_bytes = 64 + sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in
                                   [(schema.action_shape, schema.action_dtype)]
                                   + [(e.shape, e.dtype) for e in schema.extras])
        self.row_bytes = 2 * schema.stack * schema.frame_bytes + self.step_bytes
        self.batched = schema.vector
        self.lead: tuple[int, ...] = (schema.num_envs,) if schema.vector else ()
        self.batch_hint = f" (num_envs={schema.num_envs} first)" if schema.vector else ""
        self.quantize = schema.quantize

    def obs(self, value: Any, name: str = "next_obs") -> np.ndarray:
        return self.frames(value, self.lead + self.schema.obs_shape, name, f" (obs_shape{self.batch_hint})")

    def frames(self, value: Any, shape: tuple[int, ...], name: str, hint: str) -> np.ndarray:
        """Frames of ``shape`` in the obs dtype (quantized first, for a ``quantize=True`` store given floats)."""
        if self.quantize:
            arr = value if type(value) is np.ndarray else np.asarray(value)
            if arr.dtype.kind == "f":
                return quantized(name, arr, shape, hint)
            value = arr
        return _array(name, value, shape, self.schema.obs_dtype, "safe", hint)

    def action(self, value: Any) -> np.ndarray:
        s = self.schema
        return _array("action", value, self.lead + s.action_shape, s.action_dtype, "same_kind",
                      f" (action_shape{self.batch_hint})")

    def reward(self, value: Any) -> np.ndarray | float:
        if not self.batched:
            if isinstance(value, (str, bytes)) or (isinstance(value, np.ndarray) and value.shape != ()):
                raise TypeError(f"reward: expected a real number, got {type(value).__name__} {value!r}")
            try:
                r = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"reward: expected a real number, got {type(value).__name__} {value!r}") from None
            if not math.isfinite(r):
                raise ValueError(f"reward: expected a finite number, got {r}")
            if abs(r) > _F32_MAX:
                raise ValueError(f"reward: {r!r} overflows float32 (rewards are stored as float32, |r| <= 3.4e38);"
                                 " scale the rewards down")
            return r
        arr = _array("reward", value, self.lead, np.dtype(np.float64), "same_kind", self.batch_hint)
        arr = arr.astype(np.float64)
        big = np.flatnonzero(np.abs(arr) > _F32_MAX)
        if big.size and np.isfinite(arr[big[0]]):
            raise ValueError(f"reward: {arr[big[0]]!r} for env {big[0]} overflows float32 (rewards are stored as"
                             " float32, |r| <= 3.4e38); scale the rewards down")
        return arr

    def flag(self, name: str, value: Any) -> np.ndarray | bool:
        if not self.batched:
            if isinstance(value, (bool, np.bool_)):
                return bool(value)
            if isinstance(value, np.ndarray) and value.shape != ():
                raise ValueError(f"{name}: expected one bool (this store has one env stream), got an array of shape"
                                 f" {value.shape}; create the store with num_envs=N for batched input")
            if isinstance(value, (int, np.integer, np.ndarray)) and not isinstance(value, str) and value in (0, 1):
                return bool(value)
            raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
        arr = np.asarray(value)
        if arr.shape != self.lead:
            raise ValueError(f"{name}: expected shape {self.lead}{self.batch_hint}, got {arr.shape}")
        if arr.dtype != np.bool_ and not (arr.dtype.kind in "iu" and np.isin(arr, (0, 1)).all()):
            raise TypeError(f"{name}: expected bools, got dtype {arr.dtype}")
        return arr.astype(np.bool_)

    def one_obs(self, value: Any, name: str = "obs") -> np.ndarray:
        """One env's observation (no env axis), as ``reset(obs, env=i)`` takes it."""
        return self.frames(value, self.schema.obs_shape, name, " (obs_shape: one env's observation)")

    def block(self, actions: Any, rewards: Any, next_obs: Any, terminated: Any, truncated: Any,
              extras: dict[str, Any], final_missing: bool) -> Block:
        """Check an ``extend()`` block: ``L`` steps of one stream, leading time axis on every array."""
        s = self.schema
        rew = np.asarray(rewards)
        if rew.ndim != 1:
            raise ValueError(f"rewards: expected a 1-D array of the block's L rewards, got shape {rew.shape}")
        if rew.size and rew.dtype.kind not in "biuf":
            raise TypeError(f"rewards: expected real numbers, got dtype {rew.dtype}")
        n = rew.shape[0]
        rew = rew.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(rew))
        if bad.size:
            raise ValueError(f"rewards: expected finite numbers, got {rew[bad[0]]} at step {bad[0]}")
        hint = f" (L={n} steps first, as rewards)"
        act = _array("actions", actions, (n, *s.action_shape), s.action_dtype, "same_kind", hint)
        flags = []
        for name, value in (("terminated", terminated), ("truncated", truncated)):
            arr = np.asarray(value)
            if arr.shape != (n,):
                raise ValueError(f"{name}: expected shape ({n},){hint}, got {arr.shape}")
            if arr.size and arr.dtype != np.bool_ and not (arr.dtype.kind in "iu" and np.isin(arr, (0, 1)).all()):
                raise TypeError(f"{name}: expected bools, got dtype {arr.dtype}")
            flags.append(arr.astype(np.bool_))
        term, trunc = flags[0], flags[1] & ~flags[0]
        ends = np.flatnonzero(term | trunc)
        if ends.size and ends[0] != n - 1:
            raise ValueError(
                f"extend(): step {ends[0]} of the {n}-step block ends its episode, but an episode end may only be"
                " the block's last step; split the block there and start the next episode with reset()")
        if final_missing and not (n and ends.size):
            raise ValueError("final_missing=True: the block's last step must end the episode (terminated or truncated)")
        n_frames = n - 1 if final_missing else n
        frames = self.frames(next_obs, (n_frames, *s.obs_shape), "next_obs",
                             f" (the block's {n_frames} next observations"
                             + (", the final one missing)" if final_missing else ")"))
        xs = self.extras(extras, lead=(n,), hint=hint) if (extras or s.extras) else {}
        return Block(n, act, rew, frames, term, trunc, xs)

    def extras(self, given: dict[str, Any], lead: tuple[int, ...] | None = None, hint: str | None = None
               ) -> dict[str, np.ndarray]:
        s = self.schema
        names = {e.name for e in s.extras}
        unknown = sorted(set(given) - names)
        if unknown:
            raise TypeError(f"step() got extras {unknown} not declared at create(); declared: {sorted(names)}")
        missing = sorted(names - set(given))
        if missing:
            raise TypeError(f"step() is missing extras {missing} declared at create()")
        lead = self.lead if lead is None else lead
        hint = self.batch_hint if hint is None else hint
        return {e.name: _array(f"extras[{e.name!r}]", given[e.name], lead + e.shape, e.dtype, "same_kind", hint)
                for e in s.extras}


def ids_array(ids: Any, name: str = "index") -> np.ndarray:
    """A 1-D int64 array of transition ids."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of transition ids, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer transition ids, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        bad = int(np.flatnonzero(arr > np.iinfo(np.int64).max)[0])
        raise ValueError(f"{name}[{bad}] = {arr[bad]} is not a transition id (ids are int64 >= 0)")
    return arr.astype(np.int64, copy=False)


def batch_size_arg(batch_size: Any, row_bytes: int = 0) -> int:
    """A positive batch size whose rows (``row_bytes`` each) fit in half of this machine's memory, so an
    absurd size is refused before anything is drawn (the sampling RNG does not advance)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    if row_bytes and int(batch_size) * row_bytes > _memory_budget():
        raise ValueError(f"batch_size={batch_size} needs {int(batch_size) * row_bytes / 2**30:,.1f} GiB for its rows,"
                         f" more than half of this machine's memory ({2 * _memory_budget() / 2**30:,.1f} GiB);"
                         " ask for fewer rows")
    return int(batch_size)


def length_arg(length: Any) -> int:
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ValueError(f"length: expected a positive int (steps per sequence), got {length!r}")
    return int(length)


def sequence_args(batch_size: Any, length: Any, strict: Any, state_bytes: int, step_bytes: int
                  ) -> tuple[int, int, bool]:
    """``sample_sequences``' batch size, length and ``strict`` (``state_bytes``: one row's stacked frames,
    ``step_bytes`` its small columns)."""
    b = batch_size_arg(batch_size)
    n = length_arg(length)
    sequences_fit(b, n, state_bytes, step_bytes)
    return b, n, flag_arg("strict", strict)


def flag_arg(name: str, value: Any) -> bool:
    """A bool argument (a truthy string such as ``"False"`` is refused, not taken as True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return bool(value)


def prefetch_arg(prefetch: Any) -> int:
    if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or prefetch < 0:
        raise ValueError(f"prefetch: expected an int >= 0, got {prefetch!r}")
    return int(prefetch)


def read_threads_arg(read_threads: Any) -> int | None:
    if read_threads is None:
        return None
    if isinstance(read_threads, bool) or not isinstance(read_threads, (int, np.integer)) or read_threads < 1:
        raise ValueError(f"read_threads: expected None (one per usable core, at most 4) or an int >= 1, got"
                         f" {read_threads!r}; read_threads=1 keeps every read in the calling thread")
    return int(read_threads)


def local_path(path: Any, what: str) -> str:
    """A store's directory: a local path (``scheme://`` is an object-storage URL, which only dataset sources
    and exports take), refused before anything is created."""
    p = os.fspath(path)
    if isinstance(p, str) and re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", p):
        raise ValueError(f"{what}: {p!r} is a URL; a store is a local directory (datasets can be read from and"
                         " exported to URLs: mmreplay.datasets); give a local path")
    return str(os.fsdecode(p))


def keep_arg(keep: Any) -> int | None:
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep: expected an int >= 1 or None, got {keep!r}")
    return keep


def seed_arg(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if seed < 0:  # (NumPy's generators take none: said here, naming the argument)
        raise ValueError(f"seed must be an int >= 0, got {seed}")
    return int(seed)


def sequences_fit(count: int, length: int, state_bytes: int, step_bytes: int) -> None:
    """Refuse ``count`` sequences of ``length`` steps (states of ``state_bytes`` each, steps' small columns of
    ``step_bytes``) that would not fit in half of this machine's memory, before anything is drawn."""
    need = count * ((length + 1) * state_bytes + step_bytes * length)
    if need > _memory_budget():
        raise ValueError(f"{count} sequences of length={length} need {need / 2**30:,.1f} GiB, more than half of this"
                         f" machine's memory ({2 * _memory_budget() / 2**30:,.1f} GiB); ask for fewer or shorter"
                         " sequences")


@functools.cache  # (the machine's memory does not change; every sample() checks its batch size against it)
def _memory_budget() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 2**34
