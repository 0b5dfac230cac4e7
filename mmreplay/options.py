"""Validated, frozen option objects that round-trip through the manifest.

``Prioritized`` and ``RateLimit`` are public; ``Schema`` is what ``ReplayStore.create``
builds from its keyword arguments and what every later ``open()`` reads back.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import codecs

__all__ = ["Prioritized", "RateLimit", "Schema", "ExtraSpec"]

PAGE_ROWS = 4096  # a chunk's stride in the ring is a multiple of this many rows (see FORMAT.md)
MAX_MAPPED_FILES = 30_000  # chunk files mapped at once: half of Linux's default vm.max_map_count
TARGET_CHUNK_BYTES = 16 * 2**20
SMALL_CHUNK_BYTES = 2**20  # the least frame bytes of a small store's chunk (default_chunk_size)
# Resource bounds, checked before anything is allocated or created (see validate_limits).
MAX_STACK = 1_000  # frames per state: a batch gathers B x stack frames
MAX_N_STEP = 1_000  # n-step window: the index examines rows x n_step entries, a batch B x n_step
MAX_ROW_BYTES = 2**28  # one frame, action or extra value: 256 MiB
MAX_RESERVED_BYTES = 2**46  # address space the ring reserves (all columns): 64 TiB of x86-64's 128 TiB
INDEX_BYTES_PER_SLOT = 22  # in-RAM index per ring slot: flags 1, episode_pos 4, slot_id 8, valid 1, id2slot 8
PRIORITY_BYTES_PER_SLOT = 26  # prioritized stores add raw priority 8, sum tree ~17, dirty mask 1


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


# counts past this are never reached (a store appends well under 2**40 transitions a year); bounds beyond it
# are "no bound", where a float quotient no longer tells neighbouring integers apart
COUNT_LIMIT = 2**62


def floor_ratio(rhs: float, spi: float) -> int:
    """The largest integer ``a`` with ``spi * a <= rhs`` as the rate limit computes it (floats), or
    ``COUNT_LIMIT`` when that is larger (``rhs >= 0``, ``spi > 0``)."""
    q = rhs / spi
    if not q < 2**52:  # (also inf: a tiny spi)
        return COUNT_LIMIT
    a = math.floor(q)
    while spi * (a + 1) <= rhs:  # the division may round either way: settle it (a step or two)
        a += 1
    while a > 0 and spi * a > rhs:
        a -= 1
    return a


@dataclass(frozen=True)
class RateLimit:
    """Samples per insert (Reverb's ``SampleToInsertRatio``), held across every process of a store.

    Counts: ``inserted`` = transitions stored by ``step()``, ``sampled`` = rows handed out by
    ``sample()``/``batches()`` (a sequence counts its start). ``sample(B)`` may proceed when
    ``len(store) >= min_size`` and ``sampled + B <= samples_per_insert * inserted + error_buffer``;
    ``step()`` adding n transitions when ``samples_per_insert * (inserted + n) <= sampled + error_buffer
    + samples_per_insert * min_size``. A call that may not proceed waits up to ``timeout`` seconds
    (``None``: forever), then raises ``mr.RateLimitTimeout``.
    """

    samples_per_insert: float
    min_size: int
    error_buffer: float
    timeout: float | None = None

    def __post_init__(self) -> None:
        spi = _check_real("RateLimit.samples_per_insert", self.samples_per_insert, 0.0, 1e12, lo_open=True)
        object.__setattr__(self, "samples_per_insert", spi)
        object.__setattr__(self, "min_size", _int("RateLimit.min_size", self.min_size, 1))
        object.__setattr__(self, "error_buffer", _check_real("RateLimit.error_buffer", self.error_buffer, 0.0, 1e18))
        if self.timeout is not None:
            object.__setattr__(self, "timeout", _check_real("RateLimit.timeout", self.timeout, 0.0, 1e9))

    def to_json(self) -> dict[str, Any]:
        return {"samples_per_insert": self.samples_per_insert, "min_size": self.min_size,
                "error_buffer": self.error_buffer, "timeout": self.timeout}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RateLimit:
        return cls(samples_per_insert=d["samples_per_insert"], min_size=d["min_size"],
                   error_buffer=d["error_buffer"], timeout=d["timeout"])

    @property
    def most_inserted_at_once(self) -> int:
        """The longest block of transitions (``extend``) the limit can ever allow: the writer may store n
        when ``spi * (inserted + n) <= sampled + error_buffer + spi * min_size`` and readers keep ``sampled
        <= spi * inserted + error_buffer``, so ``spi * n <= 2 * error_buffer + spi * min_size``."""
        return floor_ratio(2 * self.error_buffer + self.samples_per_insert * self.min_size, self.samples_per_insert)

    def check_schema(self, capacity: int, n_step: int, num_envs: int) -> None:
        """Refuse limits a store could never meet (a writer and its readers would wait on each other)."""
        if self.min_size > capacity:
            raise ValueError(f"rate_limit: min_size={self.min_size:,} is more than capacity={capacity:,}, so sampling"
                             f" could never start; use min_size <= {capacity:,}")
        # Transitions near the write head wait for their n-step window: for len(store) to reach min_size the
        # writer must be allowed n_step * num_envs transitions past it before anything is sampled.
        need = self.samples_per_insert * n_step * num_envs
        if self.error_buffer < need:
            raise ValueError(
                f"rate_limit: error_buffer={self.error_buffer:g} is too small for n_step={n_step}, num_envs={num_envs}:"
                f" the writer must be able to run n_step * num_envs transitions past min_size before the first"
                f" sample (their n-step windows close later); use error_buffer >= {need:g}")


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
    if len(shp) > 32:
        raise ValueError(f"{name} must have at most 32 dimensions, got {len(shp)}")
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
    rate_limit: RateLimit | None = None
    quantize: bool = False
    compression: str | None = None  # codec of sealed chunks' frames ("lz4"), None = raw
    id_column: bool = False  # chunks record each row's transition id (stores with several env streams)

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
        rate_limit: Any = None,
        quantize: Any = False,
        compression: Any = "auto",
        id_column: Any = None,
        stored: bool = False,
    ) -> Schema:
        """Validate user-facing ``create()`` arguments and pick the defaults that depend on others.

        ``stored``: the schema is read back from a manifest (``from_json``), so the checks that only
        guard new stores (``chunk_size`` against ``capacity``) are skipped: existing stores stay openable.
        """
        capacity = _int("capacity", capacity, 1)
        obs_shape = _shape("obs_shape", obs_shape)
        obs_dtype = _dtype("obs_dtype", obs_dtype)
        _check_row_bytes("obs_shape", obs_shape, obs_dtype)
        stack = _int("stack", stack, 1)
        n_step = _int("n_step", n_step, 1)
        validate_window(stack, n_step)
        gamma = _check_real("gamma", gamma, 0.0, 1.0)
        action_shape = () if action_shape == () else _shape("action_shape", action_shape)
        action_dtype = _dtype("action_dtype", action_dtype)
        _check_row_bytes("action_shape", action_shape, action_dtype)
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
            spec_ = ExtraSpec(name, () if shp == () else _shape(f"extras[{name!r}] shape", shp),
                              _dtype(f"extras[{name!r}] dtype", dt))
            _check_row_bytes(f"extras[{name!r}] shape", spec_.shape, spec_.dtype)
            specs.append(spec_)
        frame_bytes = int(np.prod(obs_shape)) * obs_dtype.itemsize
        if chunk_size is None:
            chunk_size = default_chunk_size(capacity, frame_bytes, num_envs)
        else:
            chunk_size = _int("chunk_size", chunk_size, 1)
            if chunk_size % num_envs:
                raise ValueError(
                    f"chunk_size must be a multiple of num_envs={num_envs} (each env gets an equal share of"
                    f" every chunk), got {chunk_size}; use {chunk_size + num_envs - chunk_size % num_envs}")
            if not stored:
                _check_chunk_size(chunk_size, capacity, stack, num_envs)
        # Every chunk file is a memory mapping, and Linux allows ~65,000 per process (vm.max_map_count).
        files = (-(-capacity // chunk_size) + 2) * (4 + len(specs))
        if files > MAX_MAPPED_FILES:
            least = -(-capacity * (4 + len(specs)) // (MAX_MAPPED_FILES - 2 * (4 + len(specs))))
            raise ValueError(
                f"chunk_size={chunk_size} makes ~{files:,} chunk files for capacity={capacity:,}, each one memory"
                f" mapping (at most {MAX_MAPPED_FILES:,} are allowed); use chunk_size >= {least} or the default")
        if prioritized is not None and not isinstance(prioritized, Prioritized):
            raise TypeError(f"prioritized must be mr.Prioritized(...) or None, got {prioritized!r}")
        if rate_limit is not None:
            if not isinstance(rate_limit, RateLimit):
                raise TypeError(f"rate_limit must be mr.RateLimit(samples_per_insert, min_size, error_buffer) or None,"
                                f" got {rate_limit!r}")
            rate_limit.check_schema(capacity, n_step, num_envs)
        if not isinstance(quantize, (bool, np.bool_)):
            raise TypeError(f"quantize must be True or False, got {quantize!r}")
        if quantize and obs_dtype != np.uint8:
            raise ValueError(f"quantize=True stores frames in [0, 1] as uint8 (round(x * 255)): it needs"
                             f" obs_dtype='uint8', got obs_dtype={obs_dtype}; drop quantize or use uint8")
        if id_column is None:
            id_column = num_envs > 1  # new stores: streams may be written apart, so ids are recorded
        elif not isinstance(id_column, bool):
            raise TypeError(f"id_column must be a bool, got {id_column!r}")
        schema = cls(capacity, obs_shape, obs_dtype, stack, n_step, gamma, action_shape, action_dtype,
                     tuple(specs), num_envs, vector, pad, chunk_size, prioritized, rate_limit, bool(quantize),
                     resolve_compression(compression, obs_shape, obs_dtype), id_column)
        validate_ring(schema, initial_positions(schema))
        return schema

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
            "rate_limit": None if self.rate_limit is None else self.rate_limit.to_json(),
            "quantize": self.quantize,
            "compression": self.compression,
            "id_column": self.id_column,
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
            rate_limit=None if d.get("rate_limit") is None else RateLimit.from_json(d["rate_limit"]),
            quantize=d.get("quantize", False),
            compression=d.get("compression"),  # stores written before compression existed: raw frames
            id_column=d.get("id_column", False),  # absent in formats 1 and 2: streams in lockstep, no id column
            stored=True,
        )


# -- resource bounds ----------------------------------------------------------------------------------
def validate_window(stack: int, n_step: int) -> None:
    """``stack`` and ``n_step`` bound the work of every batch and of the index: refuse absurd values."""
    for name, value, most, why in (
            ("stack", stack, MAX_STACK, "every sampled row gathers 2 x stack frames"),
            ("n_step", n_step, MAX_N_STEP, "every sampled row reads n_step rewards, and deciding which rows are"
                                          " sampleable examines rows x n_step flags")):
        if value > most:
            raise ValueError(f"{name}={value:,} is too large: at most {most:,} is supported ({why}); use a"
                             f" smaller {name}")


def _check_row_bytes(name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no int64 overflow for absurd shapes
    if nbytes > MAX_ROW_BYTES:
        raise ValueError(f"{name}={shape} of {dtype} is {nbytes:,} bytes per row; at most {MAX_ROW_BYTES:,}"
                         f" ({MAX_ROW_BYTES >> 20} MiB) per frame, action or extra is supported")


def _chunk_unit(num_envs: int) -> int:
    return PAGE_ROWS * num_envs // math.gcd(PAGE_ROWS, num_envs)


def _check_chunk_size(chunk_size: int, capacity: int, stack: int, num_envs: int) -> None:
    """A chunk larger than the whole store needs only allocates space nobody uses (the ring keeps two
    or three chunks whatever their size)."""
    need = -(-(capacity + stack * num_envs) // num_envs) * num_envs
    most = max(_chunk_unit(num_envs), need)
    if chunk_size > most:
        raise ValueError(
            f"chunk_size={chunk_size:,} is more frame slots than this store can use: capacity={capacity:,}"
            f" transitions plus their stack history fit in {need:,} slots, and the ring keeps two or three"
            f" chunks; use chunk_size <= {most:,}, or None for the default")


def initial_positions(schema: Schema) -> int:
    """Ring positions a new store starts with: capacity transitions plus stack history, the retiring chunk
    and the open one."""
    need = schema.capacity + schema.stack * schema.num_envs
    return -(-need // schema.chunk_size) + 2


@functools.cache
def memory_limit() -> int:
    """Bytes of memory this process may use at most: physical RAM, or a smaller cgroup limit."""
    try:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        limit = 2**62
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limit = min(limit, int(text))
    return limit


def validate_ring(schema: Schema, positions: int) -> None:
    """Refuse a store whose ring of ``positions`` chunks cannot be held: the in-RAM index (and sum tree)
    must fit in this machine's memory, the reserved address space in the process's. Raises ValueError
    naming ``capacity``/``chunk_size`` (checked before anything is created or allocated)."""
    slots = positions * schema.rows_alloc
    per_slot = INDEX_BYTES_PER_SLOT + (PRIORITY_BYTES_PER_SLOT if schema.prioritized is not None else 0)
    ram, limit = slots * per_slot, memory_limit()
    if ram > limit:
        raise ValueError(
            f"capacity={schema.capacity:,} with chunk_size={schema.chunk_size:,} needs {slots:,} ring slots, an"
            f" in-RAM index of {ram / 2**30:,.1f} GiB; this machine allows {limit / 2**30:,.1f} GiB: use a"
            " smaller capacity or chunk_size")
    row = math.prod(schema.obs_shape) * schema.obs_dtype.itemsize + math.prod(schema.action_shape) * schema.action_dtype.itemsize + 5 + 8 * schema.id_column + sum(
        math.prod(e.shape) * e.dtype.itemsize for e in schema.extras)
    reserved = slots * row
    if reserved > MAX_RESERVED_BYTES:
        raise ValueError(
            f"capacity={schema.capacity:,} with chunk_size={schema.chunk_size:,} and {row:,} bytes per row needs"
            f" {reserved / 2**40:,.1f} TiB of address space for its ring (at most {MAX_RESERVED_BYTES >> 40} TiB):"
            " use a smaller capacity, chunk_size or observation")


CODECS = codecs.names()  # ("lz4",): the codecs are registered in codecs.py


def resolve_compression(value: Any, obs_shape: tuple[int, ...], obs_dtype: np.dtype) -> str | None:
    """``compression=`` of ``create()``: ``"auto"`` compresses image observations (uint8 with two or more
    dims) with LZ4 and keeps others raw; ``None`` keeps frames raw; a codec name picks that codec."""
    if value is None:
        return None
    if value == "auto":
        return codecs.AUTO if obs_dtype == np.uint8 and len(obs_shape) >= 2 else None
    if isinstance(value, str) and value in CODECS:
        return value
    raise ValueError(f"compression: expected 'auto', None or one of {CODECS}, got {value!r}")


_RESERVED = frozenset({"obs", "action", "reward", "flags", "next_obs", "discount", "terminated",
                       "truncated", "index", "weight", "env", "final_missing"})


EXTENTS_PER_SECTION = 16  # at most (FORMAT.md, "Rows, streams and the layout inside a chunk")


def extent_rows(rows_per_stream: int) -> int:
    """Slots per extent: a stream's home section cut into the most pieces (at most 16) that divide it evenly."""
    for m in range(min(EXTENTS_PER_SECTION, rows_per_stream), 0, -1):
        if rows_per_stream % m == 0:
            return rows_per_stream // m
    return rows_per_stream


def default_chunk_size(capacity: int, frame_bytes: int, num_envs: int) -> int:
    """Frame slots per chunk when ``chunk_size=None`` (FORMAT.md, "Chunk size").

    A store whose capacity is at least 8 x 4096 rows (the page-aligned unit, times ``num_envs`` when that
    does not divide 4096): ~16 MB of frames, a multiple of the unit, at least one unit and at most ~1/8
    of the capacity. Multiples of 4096 rows keep every column file page-aligned without padding; the
    1/8 cap bounds the slack (up to two chunks) a store carries.

    A smaller store: 1/16 of its capacity, at least ~1 MiB of frames, at most the unit, a multiple of
    ``num_envs`` (at least 16 rows per stream). A chunk of a whole unit there would be most of the
    store's disk: the open chunk's files are preallocated raw at their full size (so a full disk is an
    error, never a SIGBUS), while sealed chunks' frames shrink. Not smaller than 1/16: every chunk costs
    a roll (files created and mapped, the oldest retired) and a seal (fsyncs, deletions), per row the
    more often the smaller the chunk.
    """
    unit = _chunk_unit(num_envs)
    by_bytes = max(1, TARGET_CHUNK_BYTES // max(frame_bytes, 1))
    by_capacity = max(1, capacity // 8)
    if by_capacity >= unit:
        rows = min(by_bytes, by_capacity)
        return max(unit, (rows // unit) * unit)
    least = max(SMALL_CHUNK_BYTES // max(frame_bytes, 1), 16 * num_envs)
    rows = min(unit, max(min(by_bytes, capacity // 16), least))
    return -(-rows // num_envs) * num_envs
