"""Dopamine replay checkpoint files: which suffixes a directory holds, their counters and columns.

Each suffix ``N`` is read as a ``Checkpoint``: the observation file's header (never its frames:
``dqn_replay`` streams those), ``add_count``, ``invalid_range`` (which tells ``stack_size`` and
``update_horizon`` and must match the cursor), and on demand the per-slot columns (action,
reward, terminal, any ``$store$_<extra>``; episode ends from ``episode_end_indices``, read
without unpickling). ``scan`` also corrects the add count of a ``log_final_buffer`` file, which
records the cursor instead.
"""

from __future__ import annotations

import logging
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._inputs import cast_losses
from ..options import MAX_N_STEP, MAX_STACK
from ._common import require_path
from ._gznpy import GzNpy
from ._location import Location
from ._pickled_ints import read_int_set
from .errors import DatasetError, DatasetNotFoundError

log = logging.getLogger(__name__)

PREFIX = "$store$_"
COLUMNS = ("observation", "action", "reward", "terminal")
# invalid_range holds stack_size + update_horizon slots; a store supports at most MAX_STACK + MAX_N_STEP
MAX_INVALID_RANGE = MAX_STACK + MAX_N_STEP
RESERVED = ("obs", "action", "reward", "flags", "next_obs", "discount", "terminated", "truncated", "index", "weight")


def _file(d: Location, key: str, suffix: int) -> Location:
    return d.join(f"{key}_ckpt.{suffix}.gz")


def find_suffixes(d: Location) -> list[int]:
    """The checkpoint suffixes with an observation file in ``d``, in increasing order."""
    out = []
    for p in d.glob(f"{PREFIX}observation_ckpt.*.gz"):
        m = re.fullmatch(r".*_ckpt\.(\d+)\.gz", p.name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


@dataclass
class Checkpoint:
    """One suffix: its counters (read at once) and its columns (``load()``, ~10 bytes per slot)."""

    dir: Location
    suffix: int
    slots: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    add_count: int  # as written
    stack_size: int
    update_horizon: int
    extras: list[str]
    has_end_indices: bool
    true_add_count: int = 0  # add_count corrected for a log_final_buffer file
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def cursor(self) -> int:
        return self.add_count % self.slots

    @property
    def wrapped(self) -> bool:
        return self.true_add_count >= self.slots

    @property
    def lo(self) -> int:
        return self.true_add_count - self.slots if self.wrapped else 0

    @property
    def hi(self) -> int:
        return self.true_add_count

    def path(self, key: str) -> Location:
        return _file(self.dir, key, self.suffix)

    def load(self) -> None:
        """Read the per-slot columns (everything but the frames) and check their lengths."""
        cols: dict[str, np.ndarray] = {}
        for key in ("action", "reward", "terminal", *self.extras):
            with GzNpy(self.path(PREFIX + key), PREFIX + key) as gz:
                if not gz.shape or gz.rows != self.slots:
                    raise DatasetError(f"{self.path(PREFIX + key)}: {PREFIX}{key} has shape {gz.shape}, but"
                                       f" {PREFIX}observation has {self.slots:,} rows; the arrays must match")
                if key in ("reward", "terminal") and gz.row_shape:
                    raise DatasetError(f"{gz.path}: {PREFIX}{key} has shape {gz.shape}; expected one value per"
                                       f" slot, shape ({self.slots},), as Dopamine writes")
                if key in ("reward", "terminal") and gz.dtype.kind not in "biuf":
                    raise DatasetError(f"{gz.path}: {PREFIX}{key} holds {gz.dtype} values; expected real numbers"
                                       " (bool, integer or float), as Dopamine writes")
                _check_row_bytes(gz)
                cols[key] = gz.read_all()
        end = cols["terminal"] != 0
        if self.has_end_indices:
            loc = self.path("episode_end_indices")
            where = str(loc)
            # a pickled set of slot numbers: a few bytes per slot, whatever the gzip stream claims (the
            # compressed file is read whole: refused first if far larger than that could need)
            most = 16 * self.slots + 4096
            raw = gunzip(loc.read_bytes(most + (64 << 20)), most, where, "episode_end_indices")
            try:
                idx = np.asarray(read_int_set(raw, where), np.int64)
            except ValueError as exc:
                raise DatasetError(str(exc)) from None
            if idx.size and (idx.min() < 0 or idx.max() >= self.slots):
                raise DatasetError(f"{where}: episode_end_indices holds slots outside 0..{self.slots - 1}")
            end[idx] = True
        cols["end"] = end
        self.columns = cols


def gunzip(data: bytes, most: int, where: str, key: str) -> bytes:
    """The content of a (possibly multi-member) gzip stream, refusing one that inflates past ``most`` bytes."""
    out = bytearray()
    while data:
        dz = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += dz.decompress(data, most + 1 - len(out))
        except zlib.error as exc:
            raise DatasetError(f"{where}: not a gzip file ({key}): {exc}") from None
        if len(out) > most:
            raise DatasetError(f"{where}: {key} inflates to more than {most:,} bytes, more than this checkpoint's"
                               " slots can need; the file is not what Dopamine writes")
        if not dz.eof:
            raise DatasetError(f"{where}: truncated gzip stream ({key})")
        data = dz.unused_data
    return bytes(out)


def _check_row_bytes(gz: GzNpy) -> None:
    """Rows of no bytes are refused: nothing would bound how many slots such a file declares."""
    if gz.row_bytes == 0:
        raise DatasetError(f"{gz.path}: {gz.key} has shape {gz.shape} {gz.dtype}, rows of no bytes; expected"
                           " rows of at least one value per slot, as Dopamine writes")


def _scan(d: Location, suffix: int) -> Checkpoint:
    """Check a suffix's files exist and read its header, counters and invalid range."""
    for key in [PREFIX + c for c in COLUMNS] + ["add_count", "invalid_range"]:
        if not _file(d, key, suffix).exists():
            raise DatasetNotFoundError(f"{_file(d, key, suffix)}: missing ({key} of checkpoint {suffix})")
    with GzNpy(_file(d, PREFIX + "observation", suffix), PREFIX + "observation") as gz:
        if len(gz.shape) < 1:
            raise DatasetError(f"{gz.path}: {PREFIX}observation is 0-d; expected (slots, *obs_shape)")
        _check_row_bytes(gz)
        slots, obs_shape, obs_dtype = gz.shape[0], gz.row_shape, gz.dtype
    with GzNpy(_file(d, "add_count", suffix), "add_count") as gz:
        ac = gz.read_value(most=1)
    if ac.size != 1 or ac.dtype.kind not in "iu" or int(ac.reshape(-1)[0]) < 0:
        raise DatasetError(f"{_file(d, 'add_count', suffix)}: add_count must be one non-negative integer,"
                           f" got {ac.dtype} {ac.shape}")
    add_count = int(ac.reshape(-1)[0])
    where = _file(d, "invalid_range", suffix)
    with GzNpy(where, "invalid_range") as gz:
        ir = gz.read_value(most=MAX_INVALID_RANGE).reshape(-1)
    if slots < 1 or ir.size < 2 or ir.dtype.kind not in "iuf":
        raise DatasetError(f"{where}: invalid_range must hold stack_size + update_horizon slot numbers,"
                           f" got {ir.dtype} {ir.shape}")
    ir = ir.astype(np.int64)
    cursor = add_count % slots
    # an empty buffer's invalid_range is np.zeros(stack_size): the horizon is unknown there
    horizon = (cursor - int(ir[0])) % slots if add_count else 0
    stack_size = ir.size - horizon
    expect = (cursor - horizon + np.arange(ir.size)) % slots
    if add_count and (horizon < 1 or stack_size < 1 or not np.array_equal(ir, expect)):
        raise DatasetError(f"{where}: invalid_range {ir.tolist()[:8]} does not match the cursor {cursor}"
                           f" (add_count {add_count}, {slots} slots): expected cursor - update_horizon .."
                           " cursor + stack_size - 1")
    extras = []
    for p in d.glob(f"{PREFIX}*_ckpt.{suffix}.gz"):
        key = p.name[len(PREFIX):-len(f"_ckpt.{suffix}.gz")]
        if key in COLUMNS:
            continue
        if key.isidentifier() and key not in RESERVED:
            extras.append(key)
        else:
            log.warning("%s: column %r is not a usable extra name; skipped", p, key)
    return Checkpoint(d, suffix, int(slots), tuple(obs_shape), obs_dtype, add_count, int(stack_size),
                      int(horizon), sorted(extras), _file(d, "episode_end_indices", suffix).exists())


def scan(src: Any, suffixes: Any = None, storage_options: dict[str, Any] | None = None) -> list[Checkpoint]:
    """The checkpoints to import, in suffix order, with true add ranges (log_final_buffer corrected)."""
    d = require_path(src, "dqn-replay", storage_options)
    if not d.isdir():
        raise DatasetError(f"dqn-replay: {d} is not a directory of Dopamine checkpoints")
    found = find_suffixes(d)
    if suffixes is None:
        if not found:
            raise DatasetNotFoundError(f"{d}: no Dopamine replay checkpoints ({PREFIX}observation_ckpt.N.gz)")
        chosen = found
    else:
        if isinstance(suffixes, (int, np.integer)):
            suffixes = [suffixes]
        try:
            chosen = sorted({int(s) for s in suffixes})
        except (TypeError, ValueError):
            raise TypeError(f"suffixes: expected checkpoint numbers (ints), got {suffixes!r}") from None
        if not chosen:
            raise ValueError("suffixes: expected at least one checkpoint number")
    ckpts = [_scan(d, s) for s in chosen]
    nonempty = [c for c in ckpts if c.add_count]  # an empty buffer contributes nothing
    first = nonempty[0] if nonempty else ckpts[0]
    for c in nonempty[1:]:
        if (c.obs_shape, c.obs_dtype, c.stack_size) != (first.obs_shape, first.obs_dtype, first.stack_size):
            raise DatasetError(f"{c.path(PREFIX + 'observation')}: checkpoint {c.suffix} has frames {c.obs_shape}"
                               f" {c.obs_dtype}, stack_size {c.stack_size}; checkpoint {first.suffix} has"
                               f" {first.obs_shape} {first.obs_dtype}, stack_size {first.stack_size}")
        if c.extras != first.extras:
            extra = sorted(set(c.extras) ^ set(first.extras))[0]
            has, lacks = (c, first) if extra in c.extras else (first, c)
            raise DatasetError(f"{has.path(PREFIX + extra)}: checkpoint {has.suffix} holds {PREFIX}{extra},"
                               f" checkpoint {lacks.suffix} does not; checkpoints imported together must hold the"
                               " same columns (import them into separate stores, or choose suffixes)")
    prev_hi: int | None = None
    for c in ckpts:
        a = c.add_count
        if prev_hi is not None and a < c.slots and a < prev_hi:
            a = prev_hi + (a - prev_hi) % c.slots  # log_final_buffer wrote the cursor as add_count
        c.true_add_count = a
        prev_hi = c.hi if prev_hi is None else max(prev_hi, c.hi)
    return ckpts


def check_overlap(prev: Checkpoint, c: Checkpoint, start: int) -> None:
    """Rows both checkpoints hold must agree: otherwise they are not from the same run."""
    lo = max(c.lo, prev.lo)
    if start <= lo:
        return
    adds = np.arange(lo, start, dtype=np.int64)
    for key in ("action", "reward", "terminal"):
        a = prev.columns[key][adds % prev.slots]
        b = c.columns[key][adds % c.slots]
        if not np.array_equal(a, b):
            raise DatasetError(f"{c.path(PREFIX + key)}: checkpoint {c.suffix} does not continue checkpoint"
                               f" {prev.suffix}: the {key} rows both hold differ; import them into separate stores")


Specs = dict[str, tuple[tuple[int, ...], np.dtype]]


def column_specs(c: Checkpoint) -> Specs:
    """The row shape and dtype of each per-slot column of a loaded checkpoint (the store is made from the
    first checkpoint's)."""
    return {k: (tuple(v.shape[1:]), v.dtype) for k, v in c.columns.items() if k != "end"}


def conform(c: Checkpoint, specs: Specs, first: Checkpoint) -> None:
    """A later checkpoint's columns, cast to the store's dtypes (``specs``, from ``first``): rows of the same
    shape, values the store's dtypes hold (an integer kept exactly, a float not overflowing to infinity).
    The store would cast them itself and wrap an int64 action past int32, silently."""
    for key, (shape, dtype) in specs.items():
        v = c.columns[key]
        where = c.path(PREFIX + key)
        if v.shape[1:] != shape or not np.can_cast(v.dtype, dtype, "same_kind"):
            raise DatasetError(f"{where}: checkpoint {c.suffix} has {PREFIX}{key} rows of {v.shape[1:]} {v.dtype},"
                               f" checkpoint {first.suffix} has {shape} {dtype}; checkpoints imported together must"
                               " hold the same columns (import them into separate stores)")
        if v.dtype == dtype:
            continue
        bad = np.flatnonzero(cast_losses(v, dtype).reshape(len(v), -1).any(axis=1))
        if bad.size:
            j = int(bad[0])
            raise DatasetError(f"{where}: {PREFIX}{key} holds {v[j].tolist()!r} at slot {j} ({v.dtype}), which the"
                               f" store's {dtype} (the dtype of checkpoint {first.suffix}) cannot hold; import the"
                               " checkpoints into separate stores")
        c.columns[key] = v.astype(dtype)
