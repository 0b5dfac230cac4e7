"""What the exporters and importers share.

- Outputs are written under a hidden temporary name next to their final path
  and renamed into place only when complete (``atomic_output``), so a failed or
  interrupted export leaves nothing that looks finished.
- An export reads a store as of its last commit through a fresh read-only
  view (``open_reader``) and writes its complete episodes (``select_for_export``),
  a piece of at most ``PIECE`` frames or steps at a time.
(The import side is in ``_importing``.)
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.episodes import EpisodeSteps, EpisodeTable
from ..options import Schema
from ..storage import files as storage_files
from ..storage.files import remove_path, temp_sibling
from ..storage.manifest import fsync_dir
from ..store import ReplayStore
from ._location import Location
from .errors import DatasetError, DatasetNotFoundError

log = logging.getLogger(__name__)

PIECE = 2048  # frames or steps handled at a time: bounds the memory of every column
ProgressArg = bool | Callable[[int, str], Any] | None


# -- progress -----------------------------------------------------------------------------------------
class _NullBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NullBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def progress_bar(progress: ProgressArg, total: int, desc: str) -> Any:
    """A tqdm bar counting frames (``progress=True``), none (``False``), or ``progress(total, desc)``."""
    if not progress:
        return _NullBar()
    if callable(progress):
        return progress(total, desc)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="frame", unit_scale=True, leave=False, file=sys.stderr)


# -- results ------------------------------------------------------------------------------------------
@dataclass
class ExportResult:
    """What an export wrote (``path``) and what it left out.

    Exports write complete episodes only: ``skipped_partial`` episodes had lost their
    first frames (retired from the ring, or imported without them), ``skipped_running``
    had not ended at the commit exported, ``skipped_empty`` ended without a single step.
    """

    path: str
    format: str
    episodes: int
    steps: int
    frames: int
    skipped_partial: int
    skipped_running: int
    skipped_empty: int
    bytes_on_disk: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        return self.skipped_partial + self.skipped_running + self.skipped_empty

    def summary(self) -> str:
        skipped = (f"; skipped {self.skipped} episode(s): {self.skipped_partial} partial, "
                   f"{self.skipped_running} still running, {self.skipped_empty} empty") if self.skipped else ""
        return (f"{self.format}: {self.episodes:,} episodes, {self.steps:,} steps, {self.frames:,} frames"
                f" -> {self.path} ({self.bytes_on_disk / 2**20:,.1f} MiB){skipped}")


# -- reading a store for export -----------------------------------------------------------------------
@contextlib.contextmanager
def open_reader(store_or_path: ReplayStore | str | os.PathLike[str]) -> Iterator[ReplayStore]:
    """A read-only view of the store's last commit (never the uncommitted state of a live writer)."""
    if isinstance(store_or_path, ReplayStore):
        path = store_or_path.path
    elif isinstance(store_or_path, (str, os.PathLike)):
        path = os.fspath(store_or_path)
    else:
        raise TypeError(f"export(): expected a ReplayStore or the path of one, got {type(store_or_path).__name__}")
    store = ReplayStore.open(path, mode="r")
    try:
        yield store
    finally:
        store.close()


def check_output_apart(store: str, out: str, what: str = "export") -> None:
    """Refuse a local output ``out`` that is the store ``store`` being exported, holds it, or lies inside it:
    replacing such an output deletes the store (and whatever lies beside it), and a store directory holds its
    own files only. Real paths are compared, so a link or ``.`` does not hide the store."""
    real_store, real_out = os.path.realpath(store), os.path.realpath(out)
    common = os.path.commonpath([real_store, real_out])
    if common == real_store == real_out:
        why = "is the store it exports: replacing it would delete the store"
    elif common == real_out:
        why = "holds the store it exports: replacing it would delete the store and everything beside it"
    elif common == real_store:
        why = "lies inside the store it exports: a store directory holds its own files only"
    else:
        return
    raise ValueError(f"{what}: the output {out} {why} (the store: {store}); give an output path outside the store")


@dataclass(frozen=True)
class ExportSelection:
    """The episodes an export writes: complete, with at least one step, in write (first id) order."""

    table: EpisodeTable
    order: np.ndarray  # indices into ``table``
    skipped_partial: int
    skipped_running: int
    skipped_empty: int

    @property
    def steps(self) -> int:
        return int(self.table.length[self.order].sum())

    @property
    def frames(self) -> int:
        return self.steps + int(self.order.size)

    def result(self, path: str | Location, fmt: str, seconds: float, extra: dict[str, Any] | None = None) -> ExportResult:
        """What was written at ``path`` (a local path, or a ``Location``: its URL and stored bytes)."""
        if isinstance(path, Location) and path.remote:
            where, size = str(path), int(path.fs.du(path.path, total=True))
        else:
            where = os.path.abspath(os.fspath(path.path if isinstance(path, Location) else path))
            size = disk_usage(where)
        return ExportResult(where, fmt, int(self.order.size), self.steps, self.frames, self.skipped_partial,
                            self.skipped_running, self.skipped_empty, size, seconds, extra or {})


def select_for_export(store: ReplayStore) -> ExportSelection:
    t = store.episodes()
    started = t.start_retained & ~t.head_lost
    keep = t.complete & (t.length > 0)
    order = np.flatnonzero(keep)
    order = order[np.argsort(t.first_id[order], kind="stable")]
    return ExportSelection(t, order, int((~started).sum()), int((started & ~t.ended).sum()),
                      int((t.complete & (t.length == 0)).sum()))


def frame_pieces(store: ReplayStore, table: EpisodeTable, i: int, piece: int = PIECE) -> Iterator[np.ndarray]:
    """The episode's ``length + 1`` observations, ``piece`` frames at a time."""
    n = int(table.length[i]) + 1
    for a in range(0, n, piece):
        yield store.episode_frames(table, i, a, min(a + piece, n))


def step_pieces(store: ReplayStore, table: EpisodeTable, i: int, piece: int = PIECE) -> Iterator[EpisodeSteps]:
    n = int(table.length[i])
    for a in range(0, n, piece):
        yield store.episode_steps(table, i, a, min(a + piece, n))


def layout_attrs(schema: Schema, metadata: dict[str, Any]) -> dict[str, Any]:
    """The store facts every export records (JSON): shapes, dtypes, sampling parameters, provenance."""
    return {
        "obs_shape": list(schema.obs_shape), "obs_dtype": schema.obs_dtype.name,
        "action_shape": list(schema.action_shape), "action_dtype": schema.action_dtype.name,
        "extras": {e.name: [list(e.shape), e.dtype.name] for e in schema.extras},
        "stack": schema.stack, "pad": schema.pad, "n_step": schema.n_step, "gamma": schema.gamma,
        "metadata": metadata, "created_by": f"mmreplay {_version()}",
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def check_declared_extras(declared: Any, extras: dict[str, tuple[tuple[int, ...], Any]], where: str, what: str,
                          array: str) -> None:
    """Every extra ``declared`` (``layout_attrs``' ``extras`` as an export wrote them, read back from ``what``)
    is among ``extras`` (name: (row shape, dtype), the dataset's arrays, stored as ``array.format(name)``) as
    declared: a lost or damaged array would import as a store without that extra."""
    declared = declared or {}
    if not isinstance(declared, dict):
        raise DatasetError(f"{where}: {what} holds extras {declared!r}, expected {{name: [shape, dtype]}}")
    for name, spec in declared.items():
        try:
            want = (tuple(int(n) for n in spec[0]), np.dtype(spec[1]))
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise DatasetError(f"{where}: {what} holds the extra {name!r} as {spec!r}, expected [shape, dtype]"
                               f" ({exc})") from None
        got = extras.get(name)
        if got is None or (got[0], np.dtype(got[1])) != want:
            found = "missing or not one row per step" if got is None else f"{got[0]} {got[1]}"
            raise DatasetError(f"{where}: {what} declares the extra {name!r} with rows {want[0]} {want[1]}, but"
                               f" {array.format(name)} is {found}; the dataset is damaged")


def _version() -> str:
    from ..version import __version__

    return __version__


# -- files --------------------------------------------------------------------------------------------
def disk_usage(path: str) -> int:
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


_TEMP_KINDS = ("partial", "importing", "old")


def remove_stale_siblings(final: str) -> list[str]:
    """Delete the temporary siblings of ``final`` (an import's store, an export's output) left by a process
    of this host that no longer runs (``storage.files.remove_stale_siblings``)."""
    return storage_files.remove_stale_siblings(final, _TEMP_KINDS, "imports or exports")


def _fsync_tree(path: str) -> None:
    """Make a finished output durable before it is renamed into place."""
    if os.path.isfile(path):
        files = [path]
    else:
        files = [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    if os.path.isdir(path):
        for r, dirs, _ in os.walk(path):
            for d in [r, *(os.path.join(r, x) for x in dirs)]:
                fsync_dir(d)


@contextlib.contextmanager
def atomic_output(final: str | os.PathLike[str], overwrite: bool = False, what: str = "out",
                  source: str | None = None) -> Iterator[str]:
    """Yield a temporary path next to ``final``; rename it to ``final`` when the block succeeds.

    Raises ``FileExistsError`` when ``final`` exists and ``overwrite`` is false, and ``ValueError`` when
    ``final`` is, holds or lies inside the store ``source`` an export reads (``check_output_apart``). On any
    exception (also KeyboardInterrupt) the temporary output is removed.
    """
    final = os.path.abspath(os.fspath(final))
    if source is not None:
        check_output_apart(source, final, what)
    if os.path.lexists(final) and not overwrite:
        raise FileExistsError(f"{what}: {final} already exists; remove it, choose another path or pass overwrite=True")
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    remove_stale_siblings(final)
    tmp = temp_sibling(final, "partial")
    try:
        yield tmp
        _fsync_tree(tmp)
        if os.path.lexists(final):
            old = temp_sibling(final, "old")
            os.rename(final, old)
            os.rename(tmp, final)
            remove_path(old)
        else:
            os.rename(tmp, final)
        fsync_dir(parent)
    except BaseException:
        remove_path(tmp)
        raise


@contextlib.contextmanager
def output(final: Location, overwrite: bool = False, what: str = "out", progress: ProgressArg = False,
           last: tuple[str, ...] = (), source: str | None = None) -> Iterator[str]:
    """A local path to write an output to, put at ``final`` when the block succeeds.

    Local ``final``: its hidden temporary sibling, renamed into place (``atomic_output``, kept apart from the
    store ``source`` an export reads). Remote ``final``
    (HDF5 files, which the HDF5 library writes with seeks back into the file): a local staging directory,
    uploaded to ``final`` afterwards (the files at the relative paths ``last`` at the end) with a progress bar of bytes and
    then deleted; an existing ``final`` is replaced only with ``overwrite`` (removed before the upload:
    object stores have no atomic rename). A failed upload removes what it wrote.
    """
    if not final.remote:
        with atomic_output(final.path, overwrite, what, source) as tmp:
            yield tmp
        return
    if final.exists() and not overwrite:
        raise FileExistsError(f"{what}: {final} already exists; remove it, choose another location or pass"
                              " overwrite=True")
    import tempfile

    stage = tempfile.mkdtemp(prefix="mmreplay-upload-")
    try:
        tmp = os.path.join(stage, final.name or "out")
        yield tmp
        if overwrite:
            final.remove()
        try:
            upload(tmp, final, progress, last)
        except BaseException:
            with contextlib.suppress(Exception):
                final.remove()
            raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


UPLOAD_BLOCK = 8 << 20


def upload(local: str, final: Location, progress: ProgressArg = False, last: tuple[str, ...] = ()) -> int:
    """Copy a local file, or a directory tree (the files at the relative paths ``last`` at the end, in that
    order: a reader that finds them finds the rest), to ``final``; returns the bytes copied."""
    if os.path.isdir(local):
        files = sorted((os.path.relpath(os.path.join(r, f), local).replace(os.sep, "/") for r, _, fs in os.walk(local)
                        for f in fs), key=lambda rel: (last.index(rel) if rel in last else -1, rel))
    else:
        files = [""]
    sizes = [os.path.getsize(os.path.join(local, rel) if rel else local) for rel in files]
    bar_factory = progress if callable(progress) else None
    with (bar_factory(sum(sizes), "upload") if bar_factory else _byte_bar(bool(progress), sum(sizes))) as bar:
        for rel in files:
            src = os.path.join(local, rel) if rel else local
            dst = final.join(*rel.split("/")) if rel else final
            with open(src, "rb") as fin, dst.open("wb") as fout:
                while block := fin.read(UPLOAD_BLOCK):
                    fout.write(block)
                    bar.update(len(block))
    return sum(sizes)


def _byte_bar(show: bool, total: int) -> Any:
    if not show:
        return _NullBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="upload", unit="B", unit_scale=True, leave=False, file=sys.stderr)


def require_path(path: Any, what: str, storage_options: dict[str, Any] | None = None) -> Location:
    """The dataset location ``path`` (a local path or an fsspec URL), which must exist."""
    loc = Location.of(path, storage_options)
    if not loc.exists():
        raise DatasetNotFoundError(f"{what}: {loc} does not exist")
    return loc


def summary_lines(lengths: np.ndarray, returns: np.ndarray, obs_shape: tuple[int, ...], obs_dtype: Any,
                  action_shape: tuple[int, ...], action_dtype: Any) -> list[str]:
    """The lines every ``describe`` prints: episodes, steps, returns, shapes."""
    stats = EpisodeStats()
    stats.add(lengths, returns)
    return stats.lines(obs_shape, obs_dtype, action_shape, action_dtype)


@dataclass
class EpisodeStats:
    """Episode counts, lengths and returns accumulated a block at a time (``describe`` of large datasets)."""

    episodes: int = 0
    steps: int = 0
    length_min: int = 0
    length_max: int = 0
    returns: int = 0
    return_sum: float = 0.0
    return_min: float = math.inf
    return_max: float = -math.inf
    final_missing: int = 0

    def add(self, lengths: Any, returns: Any, final_missing: Any = None) -> None:
        lengths = np.asarray(lengths, np.int64)
        returns = np.asarray(returns, np.float64)
        if lengths.size:
            lo, hi = int(lengths.min()), int(lengths.max())
            self.length_min = lo if not self.episodes else min(self.length_min, lo)
            self.length_max = hi if not self.episodes else max(self.length_max, hi)
            self.episodes += int(lengths.size)
            self.steps += int(lengths.sum())
        if returns.size:
            self.returns += int(returns.size)
            self.return_sum += float(returns.sum())
            self.return_min = min(self.return_min, float(returns.min()))
            self.return_max = max(self.return_max, float(returns.max()))
        if final_missing is not None:
            self.final_missing += int(np.count_nonzero(final_missing))

    def lines(self, obs_shape: tuple[int, ...], obs_dtype: Any, action_shape: tuple[int, ...],
              action_dtype: Any) -> list[str]:
        lines = [f"episodes    {self.episodes:,}", f"steps       {self.steps:,}"
                 + (f" (length min {self.length_min:,}, mean {self.steps / self.episodes:,.1f}, max"
                    f" {self.length_max:,})" if self.episodes else "")]
        if self.returns:
            lines.append(f"returns     min {self.return_min:.6g}, mean {self.return_sum / self.returns:.6g},"
                         f" max {self.return_max:.6g}")
        lines += [f"obs         {obs_shape} {np.dtype(obs_dtype)}",
                  f"action      {action_shape} {np.dtype(action_dtype)}"]
        return lines
