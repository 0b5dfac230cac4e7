"""Offline-RL datasets: export a store's complete episodes, import the datasets people already have.

>>> import mmreplay as mr
>>> mr.export("replay", "pong.zarr")                                   # mmreplay zarr v3 dataset
>>> mr.export("replay", "pong.hdf5", format="hdf5")                    # D4RL layout
>>> mr.export("replay", "~/.minari/datasets", format="minari", dataset_id="mmreplay/pong/random-v0")
>>> store = mr.import_dataset("Pong/1/replay_logs", "pong-store", format="dqn-replay", suffixes=[1, 2])

Formats (one module each): ``zarr`` (``zarr_format``), ``hdf5``/``d4rl`` (``d4rl``), ``minari``
(``minari_format``), ``dqn-replay`` (``dqn_replay``, import only). ``describe(path)`` prints
any of them. Exports stream a piece at a time, read the store as of its last commit and write
under a temporary name renamed at the end; imports build the store in a temporary directory
renamed when complete. Errors: ``DatasetError`` (a ``ValueError``) and ``DatasetNotFoundError``
(a ``FileNotFoundError``), naming the file and key.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from . import _formats
from ._common import ExportResult, ProgressArg
from .errors import DatasetError, DatasetNotFoundError

if TYPE_CHECKING:
    from ..store import ReplayStore

__all__ = ["export", "import_dataset", "describe", "detect_format", "ExportResult", "DatasetError",
           "DatasetNotFoundError", "EXPORT_FORMATS", "IMPORT_FORMATS"]

EXPORT_FORMATS = _formats.export_names()  # ("zarr", "hdf5", "minari"): the formats are registered in _formats
IMPORT_FORMATS = _formats.import_names()  # ("dqn-replay", "d4rl", "hdf5", "minari", "zarr")
_ALIASES = _formats.aliases()


def _user(path: Any) -> Any:
    """``~`` expanded in local paths (URLs and store objects pass through)."""
    if isinstance(path, (str, os.PathLike)) and "://" not in os.fspath(path):
        return os.path.expanduser(os.fspath(path))
    return path


def _norm(fmt: str, allowed: tuple[str, ...], what: str) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"format: expected a string, got {type(fmt).__name__}")
    f = fmt.lower()
    canon = _ALIASES.get(f, f)
    if canon not in {_ALIASES.get(a, a) for a in allowed}:
        raise ValueError(f"format: {what} supports {', '.join(allowed)}; got {fmt!r}")
    return canon


def export(store_or_path: ReplayStore | str | os.PathLike[str], out: str | os.PathLike[str],
           format: str = "zarr", *, overwrite: bool = False, progress: ProgressArg = True,
           storage_options: dict[str, Any] | None = None, **options: Any) -> ExportResult:
    """Write the complete episodes of a store (as of its last commit) as a dataset; return what was written.

    ``format``:

    - ``"zarr"``: an mmreplay zarr v3 dataset directory at ``out``. Options: ``compression``
      (``"zstd"`` default, ``"blosc-zstd"``, ``"blosc-lz4"``, ``"gzip"``, ``None``), ``level``,
      ``chunk_frames`` (32), ``chunk_steps`` (16384), ``shard_bytes`` (32 MiB).
    - ``"hdf5"`` (alias ``"d4rl"``): one HDF5 file in the D4RL layout. Options: ``compression``
      (``"gzip"`` default, ``"lzf"``, ``None``), ``level`` (1), ``next_observations`` (False),
      ``chunk_frames`` (64).
    - ``"minari"``: ``out`` is a Minari datasets root; ``dataset_id="namespace/name-v0"`` is required.
      Options: ``compression``, ``level``, ``action_space`` (a Gymnasium space or its Minari JSON),
      ``minari_metadata`` (extra ``metadata.json`` fields such as ``author`` or ``algorithm_name``).

    ``out`` may be an fsspec URL (``s3://bucket/run1.zarr``, ``gs://...``, ``memory://...``; with
    ``storage_options`` for its filesystem). zarr streams there: each shard is one object, written as
    soon as it is encoded; the root ``zarr.json`` is written last, so a dataset whose root ``zarr.json``
    exists is complete. HDF5 and Minari files are written with seeks back into the file (HDF5's own
    layout), so they are written to a local temporary file first and then uploaded (with a progress bar of
    bytes). On object storage, ``overwrite=True`` removes the old output before writing the new one.

    Episodes whose first frames were retired from the ring, that are still running, or that have
    no step are skipped and counted in the result. ``progress``: a tqdm bar (True), none (False),
    or a ``(total, desc) -> bar`` factory. Raises ``FileExistsError`` if ``out`` exists (unless
    ``overwrite=True``); a failed export leaves nothing at ``out``.
    """
    fmt = _norm(format, EXPORT_FORMATS, "export")
    store_or_path, out = _user(store_or_path), _user(out)
    if storage_options is not None:
        options["storage_options"] = storage_options
    exporter = _formats.FORMATS[fmt].function(str(_formats.FORMATS[fmt].exporter))
    return _call(exporter, fmt, store_or_path, out, overwrite=overwrite, progress=progress, **options)


def import_dataset(src: str | os.PathLike[str], path: str | os.PathLike[str], format: str | None = None, *,
                   stack: int | None = None, n_step: int | None = None, gamma: float | None = None,
                   pad: str | None = None, capacity: int | None = None, chunk_size: int | None = None,
                   seed: int = 0, progress: ProgressArg = True, storage_options: dict[str, Any] | None = None,
                   **options: Any) -> ReplayStore:
    """Build a store at ``path`` from a dataset and return it opened (``mode="r+"``).

    ``src`` is a local path or an fsspec URL (``s3://``, ``gs://``, ``memory://``, ...; ``storage_options``
    configure its filesystem: credentials, ``endpoint_url``). Remote sources are streamed: read in blocks
    (gzip'd files front to back, HDF5 through a bounded block cache, zarr a shard at a time), never copied
    to local disk first, and checked like local files (sizes before allocation; nothing is unpickled).
    ``format``: ``"dqn-replay"`` (a directory of Dopamine replay checkpoints; option ``suffixes``),
    ``"d4rl"``/``"hdf5"``, ``"minari"`` (the dataset directory, or a datasets root with option
    ``dataset_id``), ``"zarr"``, or ``None`` to detect it.
    ``stack``/``n_step``/``gamma``/``pad`` default to what the source records, else to the store
    defaults; ``capacity`` to the source's transition count. Transition ids start at 0, in the
    source's episode order. The store is built in a temporary directory next to ``path`` and
    renamed when complete: a failed import leaves nothing at ``path``. Raises ``DatasetError``
    (a ``ValueError``) or ``DatasetNotFoundError`` (a ``FileNotFoundError``) naming the file and key.
    """
    src, path = _user(src), _user(path)
    if format is not None:
        fmt = _norm(format, IMPORT_FORMATS, "import")
    else:
        fmt = "minari" if options.get("dataset_id") is not None else detect_format(src, storage_options)
    kw: dict[str, Any] = dict(stack=stack, n_step=n_step, gamma=gamma, pad=pad, capacity=capacity,
                              chunk_size=chunk_size, seed=seed, progress=progress, **options)
    if storage_options is not None:
        kw["storage_options"] = storage_options
    importer = _formats.FORMATS[fmt].function(str(_formats.FORMATS[fmt].importer))
    return _call(importer, fmt, src, path, **kw)


def _call(fn: Any, fmt: str, *args: Any, **kwargs: Any) -> Any:
    import inspect

    accepted = inspect.signature(fn).parameters
    unknown = sorted(k for k in kwargs if k not in accepted)
    if unknown:
        known = sorted(k for k, p in accepted.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)
        raise TypeError(f"format {fmt!r} does not take option(s) {', '.join(unknown)}; it takes {', '.join(known)}")
    return fn(*args, **kwargs)


def detect_format(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> str:
    """The dataset format at ``path`` (a local path or an fsspec URL): ``"zarr"``, ``"minari"``,
    ``"dqn-replay"`` or ``"hdf5"`` (D4RL)."""
    from ._location import Location

    loc = Location.of(path, storage_options)
    if not loc.exists():
        raise DatasetNotFoundError(f"{loc}: no such file or directory")
    directory = loc.isdir()
    for fmt in _formats.FORMATS.values():
        if fmt.directory == directory and fmt.recognises(loc):
            return fmt.name
    if directory:
        if loc.join("manifest.json").exists():
            raise DatasetError(f"{loc}: is an mmreplay store, not a dataset (use ReplayStore.open)")
        raise DatasetError(f"{loc}: not a recognised dataset directory (expected {_formats.expected(True)})")
    raise DatasetError(f"{loc}: not a recognised dataset file (expected {_formats.expected(False)})")


def describe(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Lines describing the dataset at ``path`` (any supported format, local or an fsspec URL): episodes,
    steps, returns, shapes.

    Raises ``DatasetError``/``DatasetNotFoundError`` when ``path`` is not a dataset this module reads.
    """
    path = _user(path)
    fmt = detect_format(path, storage_options)
    entry = _formats.FORMATS[fmt]
    return entry.function(entry.describer)(path, storage_options)
