"""Validated, frozen option objects that round-trip through the manifest.

``Prioritized`` is public; ``Schema`` is what ``ReplayStore.create`` builds from
its keyword arguments and what every later ``open()`` reads back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Prioritized", "Schema", "ExtraSpec"]

PAGE_ROWS = 4096  # a chunk's stride in the ring is a multiple of this many rows (see FORMAT.md)
MAX_MAPPED_FILES = 30_000  # chunk files mapped at once: half of Linux's default vm.max_map_count
TARGET_CHUNK_BYTES = 16 * 2**20


def _check_real(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        lo_s = f"({lo}" if lo_open else f"[{lo}"
        raise ValueError(f"{name} must be in {lo_s}, {hi}], got {value!r}")
    return v


@dataclass(frozen=True)
class Prioritized:
    """Proportional prioritized replay (Schaul et al., 2015).

    A transition with raw priority ``p`` is drawn with probability
    ``(p + eps) ** alpha / sum_j (p_j + eps) ** alpha``. ``beta`` is the
    importance-weight exponent; anneal it with ``store.beta = value`` (the
    current value is saved by ``commit()``) or per call with
    ``store.sample(batch_size, beta=value)``.
    """

    alpha: float = 0.6
    beta: float = 0.4
    eps: float = 1e-6

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _check_real("Prioritized.alpha", self.alpha, 0.0, 1e6))
        object.__setattr__(self, "beta", _check_real("Prioritized.beta", self.beta, 0.0, 1e6))
        object.__setattr__(self, "eps", _check_real("Prioritized.eps", self.eps, 0.0, 1e6))

    def to_json(self) -> dict[str, float]:
        return {"alpha": self.alpha, "beta": self.beta, "eps": self.eps}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Prioritized:
        return cls(alpha=d["alpha"], beta=d["beta"], eps=d["eps"])


@dataclass(frozen=True)
class ExtraSpec:
    """One per-transition extra column (e.g. a behaviour policy's log-probability)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


def _shape(name: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value),)
    try:
        shp = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{name} must be a tuple of ints, got {value!r}") from None
    if any(v <= 0 for v in shp):
        raise ValueError(f"{name} must have positive sizes, got {shp}")
    return shp


def _dtype(name: str, value: Any) -> np.dtype:
    try:
        dt = np.dtype(value)
    except TypeError:
        raise TypeError(f"{name} must be a numpy dtype (e.g. 'uint8', 'float32'), got {value!r}") from None
    if dt.kind not in "biuf" or dt.itemsize > 8:
        raise ValueError(f"{name} must be a bool, integer or float dtype of at most 8 bytes, got {dt}")
    return dt.newbyteorder("<") if dt.byteorder == ">" else dt


def _int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    return int(value)


@dataclass(frozen=True)
class Schema:
    """Everything fixed when a store is created. Validated on construction."""

    capacity: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype = field(default_factory=lambda: np.dtype("uint8"))
    stack: int = 1
    n_step: int = 1
    gamma: float = 0.99
    action_shape: tuple[int, ...] = ()
    action_dtype: np.dtype = field(default_factory=lambda: np.dtype("int64"))
    extras: tuple[ExtraSpec, ...] = ()
    num_envs: int = 1
    vector: bool = False
    pad: str = "zeros"
    chunk_size: int = 0
    prioritized: Prioritized | None = None
    compression: str | None = None  # codec of sealed chunks' frames ("lz4"), None = raw

    @classmethod
    def build(
        cls,
        capacity: Any,
        obs_shape: Any,
        obs_dtype: Any = "uint8",
        stack: Any = 1,
        n_step: Any = 1,
        gamma: Any = 0.99,
        action_shape: Any = (),
        action_dtype: Any = "int64",
        extras: Any = None,
        num_envs: Any = 1,
        vector: Any = None,
        pad: Any = "zeros",
        chunk_size: Any = None,
        prioritized: Any = None,
        compression: Any = "auto",
    ) -> Schema:
        """Validate user-facing ``create()`` arguments and pick the defaults that depend on others."""
        capacity = _int("capacity", capacity, 1)
        obs_shape = _shape("obs_shape", obs_shape)
        obs_dtype = _dtype("obs_dtype", obs_dtype)
        stack = _int("stack", stack, 1)
        n_step = _int("n_step", n_step, 1)
        gamma = _check_real("gamma", gamma, 0.0, 1.0)
        action_shape = () if action_shape == () else _shape("action_shape", action_shape)
        action_dtype = _dtype("action_dtype", action_dtype)
        num_envs = _int("num_envs", num_envs, 1)
        if vector is None:
            vector = num_envs > 1
        elif not isinstance(vector, bool):
            raise TypeError(f"vector must be True, False or None, got {vector!r}")
        elif not vector and num_envs > 1:
            raise ValueError(f"vector=False needs num_envs=1, got num_envs={num_envs}")
        if pad not in ("zeros", "first"):
            raise ValueError(f"pad must be 'zeros' or 'first', got {pad!r}")
        specs = []
        for name, spec in (extras or {}).items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"extras names must be Python identifiers, got {name!r}")
            if name in _RESERVED:
                raise ValueError(f"extras name {name!r} is reserved; choose another name")
            try:
                shp, dt = spec
            except (TypeError, ValueError):
                raise TypeError(f"extras[{name!r}] must be (shape, dtype), e.g. ((), 'float32'), got {spec!r}") from None
            specs.append(ExtraSpec(name, () if shp == () else _shape(f"extras[{name!r}] shape", shp),
                                   _dtype(f"extras[{name!r}] dtype", dt)))
        frame_bytes = int(np.prod(obs_shape)) * obs_dtype.itemsize
        if chunk_size is None:
            chunk_size = default_chunk_size(capacity, frame_bytes, num_envs)
        else:
            chunk_size = _int("chunk_size", chunk_size, 1)
            if chunk_size % num_envs:
                raise ValueError(
                    f"chunk_size must be a multiple of num_envs={num_envs} (each env gets an equal share of"
                    f" every chunk), got {chunk_size}; use {chunk_size + num_envs - chunk_size % num_envs}")
        # Every chunk file is a memory mapping, and Linux allows ~65,000 per process (vm.max_map_count).
        files = (-(-capacity // chunk_size) + 2) * (4 + len(specs))
        if files > MAX_MAPPED_FILES:
            least = -(-capacity * (4 + len(specs)) // (MAX_MAPPED_FILES - 2 * (4 + len(specs))))
            raise ValueError(
                f"chunk_size={chunk_size} makes ~{files:,} chunk files for capacity={capacity:,}, each one memory"
                f" mapping (at most {MAX_MAPPED_FILES:,} are allowed); use chunk_size >= {least} or the default")
        if prioritized is not None and not isinstance(prioritized, Prioritized):
            raise TypeError(f"prioritized must be mr.Prioritized(...) or None, got {prioritized!r}")
        return cls(capacity, obs_shape, obs_dtype, stack, n_step, gamma, action_shape, action_dtype,
                   tuple(specs), num_envs, vector, pad, chunk_size, prioritized,
                   resolve_compression(compression, obs_shape, obs_dtype))

    @property
    def frame_bytes(self) -> int:
        return int(np.prod(self.obs_shape)) * self.obs_dtype.itemsize

    @property
    def rows_per_stream(self) -> int:
        """Frame rows of one env stream in one chunk."""
        return self.chunk_size // self.num_envs

    @property
    def rows_alloc(self) -> int:
        """Rows allocated per chunk file: chunk_size rounded up so every column file is page-aligned."""
        return -(-self.chunk_size // PAGE_ROWS) * PAGE_ROWS

    def to_json(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "obs_shape": list(self.obs_shape),
            "obs_dtype": self.obs_dtype.str,
            "stack": self.stack,
            "n_step": self.n_step,
            "gamma": self.gamma,
            "action_shape": list(self.action_shape),
            "action_dtype": self.action_dtype.str,
            "extras": {e.name: [list(e.shape), e.dtype.str] for e in self.extras},
            "num_envs": self.num_envs,
            "vector": self.vector,
            "pad": self.pad,
            "chunk_size": self.chunk_size,
            "prioritized": None if self.prioritized is None else self.prioritized.to_json(),
            "compression": self.compression,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Schema:
        return cls.build(
            capacity=d["capacity"], obs_shape=tuple(d["obs_shape"]), obs_dtype=d["obs_dtype"],
            stack=d["stack"], n_step=d["n_step"], gamma=d["gamma"], action_shape=tuple(d["action_shape"]),
            action_dtype=d["action_dtype"],
            extras={k: (tuple(v[0]), v[1]) for k, v in d["extras"].items()},
            num_envs=d["num_envs"], vector=d["vector"], pad=d["pad"], chunk_size=d["chunk_size"],
            prioritized=None if d["prioritized"] is None else Prioritized.from_json(d["prioritized"]),
            compression=d.get("compression"),  # stores written before compression existed: raw frames
        )


CODECS = ("lz4",)


def resolve_compression(value: Any, obs_shape: tuple[int, ...], obs_dtype: np.dtype) -> str | None:
    """``compression=`` of ``create()``: ``"auto"`` compresses image observations (uint8 with two or more
    dims) with LZ4 and keeps others raw; ``None`` keeps frames raw; a codec name picks that codec."""
    if value is None:
        return None
    if value == "auto":
        return "lz4" if obs_dtype == np.uint8 and len(obs_shape) >= 2 else None
    if isinstance(value, str) and value in CODECS:
        return value
    raise ValueError(f"compression: expected 'auto', None or one of {CODECS}, got {value!r}")


_RESERVED = frozenset({"obs", "action", "reward", "flags", "next_obs", "discount", "terminated",
                       "truncated", "index", "weight"})


def default_chunk_size(capacity: int, frame_bytes: int, num_envs: int) -> int:
    """A chunk of ~16 MB of frames, a multiple of 4096 rows, and at most ~1/8 of the capacity.

    Multiples of 4096 rows keep every column file page-aligned without padding;
    the 1/8 cap bounds the slack (up to two chunks) a small store carries.
    """
    unit = PAGE_ROWS * num_envs // math.gcd(PAGE_ROWS, num_envs)
    by_bytes = max(1, TARGET_CHUNK_BYTES // max(frame_bytes, 1))
    by_capacity = max(1, capacity // 8)
    rows = min(by_bytes, by_capacity)
    return max(unit, (rows // unit) * unit)
