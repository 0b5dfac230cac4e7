"""The mmreplay zarr dataset (zarr v3): export a store's complete episodes, import them back, describe.

Layout (FORMAT.md, part 2, is the specification)::

    <out>/                   group; attributes: format, format_version, schema, sampling parameters
      observations           (F, *obs_shape)   every episode's T+1 observations, concatenated
      actions                (N, *action_shape)
      rewards                (N,) float32
      terminations           (N,) bool
      truncations            (N,) bool
      extras/<name>          (N, *shape)
      episodes/obs_start     (E,) int64  first observation of episode e in ``observations``
      episodes/step_start    (E,) int64  first step of episode e in the step arrays
      episodes/length        (E,) int64  steps T of episode e (it has T+1 observations)
      episodes/return        (E,) float64 sum of the episode's rewards
      episodes/final_missing (E,) bool   the final observation was never available (stored as zeros)

Every array is chunked along its first axis and sharded, so a 1M-frame export is a few
hundred files; arrays are written a whole shard at a time (a partial shard write would
rewrite the shard). Consolidated metadata is written last.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
import warnings
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..store import ReplayStore
from ._bounds import MAX_CHUNK_BYTES, check_row, nbytes, rows_per_piece
from ._common import (
    EpisodeStats,
    ExportResult,
    ProgressArg,
    atomic_output,
    check_declared_extras,
    frame_pieces,
    layout_attrs,
    open_reader,
    progress_bar,
    select_for_export,
    step_pieces,
    upload,
)
from ._importing import ReadAhead, Steps, StoreBuilder, feed_episode, sampling_params
from ._location import Location
from ._zarr_shards import check_objects, shard_reader
from .errors import DatasetError, DatasetNotFoundError

FORMAT = "mmreplay-dataset"
VERSION = 1
COMPRESSIONS = ("zstd", "blosc-zstd", "blosc-lz4", "gzip", "none")
STEP_ARRAYS = ("actions", "rewards", "terminations", "truncations")
EPISODE_ARRAYS = ("obs_start", "step_start", "length", "return", "final_missing")


def _compressor(compression: str | None, level: int | None) -> Any:
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    c = "none" if compression is None else str(compression).lower()
    if c == "none":
        return None
    if c == "zstd":
        return ZstdCodec(level=3 if level is None else int(level))
    if c == "gzip":
        return GzipCodec(level=5 if level is None else int(level))
    if c in ("blosc-zstd", "blosc-lz4"):
        cname: Any = c.split("-")[1]
        return BloscCodec(cname=cname, clevel=5 if level is None else int(level), shuffle="bitshuffle")
    raise ValueError(f"compression: expected one of {', '.join(COMPRESSIONS)} (or None), got {compression!r}")


def _grid(rows: int, row_bytes: int, chunk_rows: int, shard_bytes: int) -> tuple[int, int]:
    """(chunk, shard) lengths along the first axis: shards of about ``shard_bytes``, a power-of-two
    number of chunks each, never longer than the array needs."""
    chunk = max(1, min(chunk_rows, rows))
    per = max(1, shard_bytes // max(1, chunk * row_bytes))
    shard = chunk * 2 ** int(math.log2(per))
    return chunk, max(chunk, min(shard, -(-rows // chunk) * chunk))


class _Encoder:
    """Encodes one inner chunk as the array's codecs say (``bytes`` then the compressor)."""

    def __init__(self, compression: str | None, level: int | None) -> None:
        from numcodecs import GZip, Zstd
        from numcodecs.blosc import Blosc

        c = "none" if compression is None else str(compression).lower()
        self.codec: Any = None
        if c == "zstd":
            self.codec = Zstd(level=3 if level is None else int(level))
        elif c == "gzip":
            self.codec = GZip(level=5 if level is None else int(level))
        elif c in ("blosc-zstd", "blosc-lz4"):
            self.codec = Blosc(cname=c.split("-")[1], clevel=5 if level is None else int(level), shuffle=Blosc.BITSHUFFLE)

    def __call__(self, chunk: np.ndarray) -> bytes:
        raw = np.ascontiguousarray(chunk)
        return raw.tobytes() if self.codec is None else bytes(self.codec.encode(raw))


def _write_shard(path: Location, data: np.ndarray, chunk_rows: int, chunks_per_shard: int, ndim: int,
                 encode: _Encoder) -> None:
    """One shard file as zarr's ``sharding_indexed`` codec lays it out: the encoded inner chunks in
    order, then the index (``(offset, nbytes)`` uint64 per chunk, little-endian, 2**64-1 for an
    absent chunk) followed by its CRC-32C."""
    import google_crc32c

    index = np.full((chunks_per_shard, 2), np.iinfo(np.uint64).max, np.uint64)
    parts, offset = [], 0
    for j in range(-(-len(data) // chunk_rows)):
        piece = data[j * chunk_rows:(j + 1) * chunk_rows]
        if len(piece) < chunk_rows:  # an edge chunk is stored whole, padded with the fill value (0)
            full = np.zeros((chunk_rows, *data.shape[1:]), data.dtype)
            full[:len(piece)] = piece
            piece = full
        blob = encode(piece)
        index[j] = (offset, len(blob))
        parts.append(blob)
        offset += len(blob)
    raw_index = index.reshape((chunks_per_shard,) + (1,) * (ndim - 1) + (2,)).astype("<u8").tobytes()
    parts += [raw_index, np.uint32(google_crc32c.value(raw_index)).astype("<u4").tobytes()]
    path.write_bytes(b"".join(parts))  # a file, or one object of a remote store


@contextlib.contextmanager
def _shard_writer() -> Iterator[ThreadPoolExecutor]:
    """The thread that writes an export's shards; on leaving, queued writes are cancelled and the running
    one waited for, whether the export completed or failed."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="mmreplay-zarr")
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _Column:
    """A sharded zarr array written front to back, a whole shard at a time, by a background thread.

    zarr's own write path spends Python time on every inner chunk (BENCHMARKS.md, "Figures behind the
    code"); the shard files are simple (see ``_write_shard``), so they are produced here and read back by zarr in tests.
    """

    def __init__(self, array: Any, directory: Location, chunk_rows: int, shard_rows: int, encode: _Encoder,
                 executor: ThreadPoolExecutor, inflight: int = 1) -> None:
        self.dir = directory
        self.size = int(array.shape[0])
        self.row_shape = tuple(array.shape[1:])
        self.dtype = np.dtype(array.dtype)
        self.chunk_rows, self.shard_rows = chunk_rows, shard_rows
        self.encode, self.executor, self.inflight = encode, executor, inflight
        self.base = 0  # first row of the buffered shard
        self.fill = 0
        self.buf: np.ndarray | None = None
        self.pending: deque[Future[None]] = deque()

    def append(self, values: np.ndarray) -> None:
        i = 0
        while i < len(values):
            if self.buf is None:
                self.buf = np.empty((min(self.shard_rows, self.size - self.base), *self.row_shape), self.dtype)
            take = min(len(values) - i, len(self.buf) - self.fill)
            self.buf[self.fill:self.fill + take] = values[i:i + take]
            self.fill += take
            i += take
            if self.fill == len(self.buf):
                self._submit()

    def _submit(self) -> None:
        assert self.buf is not None
        key = self.dir.join("c", str(self.base // self.shard_rows), *["0"] * len(self.row_shape))
        self.pending.append(self.executor.submit(_write_shard, key, self.buf[:self.fill], self.chunk_rows,
                                                 self.shard_rows // self.chunk_rows, 1 + len(self.row_shape),
                                                 self.encode))
        self.base += self.fill
        self.fill = 0
        self.buf = None  # the submitted buffer belongs to the writer now
        while len(self.pending) > self.inflight:
            self.pending.popleft().result()

    def close(self) -> None:
        if self.fill:
            self._submit()
        while self.pending:
            self.pending.popleft().result()


@contextlib.contextmanager
def _target(final: Location, overwrite: bool, progress: ProgressArg, source: str) -> Iterator[tuple[str, Location]]:
    """(local directory for zarr's metadata, where the shards go). Local ``final``: both are its temporary
    sibling, renamed into place at the end (kept apart from the store ``source`` being exported). Remote
    ``final``: shards are written straight to it, one object each, as they are encoded; the metadata (a few
    KB of ``zarr.json``) is built locally and uploaded last, the root group's ``zarr.json`` at the very end,
    so a reader that finds it finds a complete dataset."""
    if not final.remote:
        with atomic_output(final.path, overwrite, "export", source) as tmp:
            yield tmp, Location(tmp)
        return
    if final.exists():
        if not overwrite:
            raise FileExistsError(f"export: {final} already exists; remove it, choose another location or pass"
                                  " overwrite=True")
        final.remove()  # object stores have no atomic rename: the old dataset goes first
    import tempfile

    meta = tempfile.mkdtemp(prefix="mmreplay-zarr-meta-")
    try:
        yield meta, final
        upload(meta, final, False, ("zarr.json",))
    except BaseException:
        with contextlib.suppress(Exception):
            final.remove()
        raise
    finally:
        shutil.rmtree(meta, ignore_errors=True)


def export_zarr(store: ReplayStore | str | os.PathLike[str], out: Any, *,
                compression: str | None = "zstd", level: int | None = None, chunk_frames: int = 32,
                chunk_steps: int = 16384, shard_bytes: int = 32 * 2**20, overwrite: bool = False,
                progress: ProgressArg = True, storage_options: dict[str, Any] | None = None) -> ExportResult:
    """Write the store's complete episodes as an mmreplay zarr v3 dataset at ``out`` (a local directory, or an
    fsspec URL such as ``s3://bucket/run1.zarr``: shards are streamed there as they are encoded)."""
    import zarr

    codec = _compressor(compression, level)
    for key, size in (("chunk_frames", chunk_frames), ("chunk_steps", chunk_steps), ("shard_bytes", shard_bytes)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{key}: expected a positive int, got {size!r}")
    t0 = time.perf_counter()
    final = Location.of(out, storage_options)
    with (open_reader(store) as s, _target(final, overwrite, progress, s.path) as (tmp, data),
          contextlib.ExitStack() as stack):
        selection = select_for_export(s)
        t, order = selection.table, selection.order
        sch = s.schema
        n_steps, n_frames, n_eps = selection.steps, selection.frames, int(order.size)
        g = zarr.open_group(tmp, mode="w-", zarr_format=3)
        g.attrs.update({"format": FORMAT, "format_version": VERSION, **layout_attrs(sch, s.metadata),
                        "num_episodes": n_eps, "num_steps": n_steps, "num_frames": n_frames})

        encode = _Encoder(compression, level)
        # stopped (queued shards cancelled, the one being written waited for) before _target removes a failed
        # export: a write still queued would otherwise land after the cleanup and leave an object at ``out``
        writer = stack.enter_context(_shard_writer())

        def array(group: Any, name: str, rows: int, shape: tuple[int, ...], dtype: Any, chunk_rows: int,
                  axis: str) -> _Column:
            """Create the array's metadata with zarr; its shards are written by ``_Column``."""
            dt = np.dtype(dtype)
            chunk, shard = _grid(rows, int(np.prod(shape, dtype=np.int64)) * dt.itemsize, chunk_rows, shard_bytes)
            a = group.create_array(name, shape=(rows, *shape), dtype=dt, chunks=(chunk, *shape),
                                   shards=(shard, *shape), compressors=codec, fill_value=0,
                                   dimension_names=(axis,) + (None,) * len(shape))
            return _Column(a, data.join(*a.path.split("/")), chunk, shard, encode, writer)

        ep = g.create_group("episodes")
        lengths = t.length[order].astype(np.int64)
        values = {"length": lengths, "obs_start": np.cumsum(lengths + 1) - (lengths + 1),
                  "step_start": np.cumsum(lengths) - lengths, "return": t.returns[order].astype(np.float64),
                  "final_missing": t.final_missing[order].astype(np.bool_)}
        cols = {}
        for name in EPISODE_ARRAYS:
            cols["ep_" + name] = array(ep, name, n_eps, (), values[name].dtype, 65536, "episode")
            cols["ep_" + name].append(values[name])
        cols["observations"] = array(g, "observations", n_frames, sch.obs_shape, sch.obs_dtype, chunk_frames, "frame")
        step_specs = [("actions", sch.action_shape, sch.action_dtype), ("rewards", (), np.float32),
                      ("terminations", (), np.bool_), ("truncations", (), np.bool_)]
        xg = g.create_group("extras")
        for name, shape, dtype in step_specs:
            cols[name] = array(g, name, n_steps, shape, dtype, chunk_steps, "step")
        for e in sch.extras:
            cols["x_" + e.name] = array(xg, e.name, n_steps, e.shape, e.dtype, chunk_steps, "step")
        with progress_bar(progress, n_frames, "export zarr") as bar:
            for i in order.tolist():
                for fr in frame_pieces(s, t, i):
                    cols["observations"].append(fr)
                    bar.update(len(fr))
                for st in step_pieces(s, t, i):
                    cols["actions"].append(st.actions)
                    cols["rewards"].append(st.rewards)
                    cols["terminations"].append(st.terminated)
                    cols["truncations"].append(st.truncated)
                    for name, v in st.extras.items():
                        cols["x_" + name].append(v)
            for c in cols.values():
                c.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "consolidated metadata is not part of the v3 spec": we know
            zarr.consolidate_metadata(tmp)
        codec_name = "none" if codec is None else str(compression).lower()
    return selection.result(final, "zarr", time.perf_counter() - t0, {"compression": codec_name})


# -- reading ------------------------------------------------------------------------------------------
def open_dataset(src: Any, storage_options: dict[str, Any] | None = None) -> Any:
    """Open an mmreplay zarr dataset (a local path or an fsspec URL) and check its format attributes."""
    import zarr

    loc = Location.of(src, storage_options)
    where = str(loc)
    if not loc.exists():
        raise DatasetNotFoundError(f"zarr dataset: {where} does not exist")
    _check_metadata_files(loc)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = zarr.open_group(os.fspath(src) if loc.remote else loc.path, mode="r",
                                storage_options=storage_options if loc.remote else None)
    except (FileNotFoundError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{where}: not a zarr v3 group ({exc})") from None
    attrs = dict(g.attrs)
    if attrs.get("format") != FORMAT:
        raise DatasetError(f"{where}: not an mmreplay zarr dataset (group attribute format={attrs.get('format')!r},"
                           f" expected {FORMAT!r})")
    version = attrs.get("format_version")
    if not isinstance(version, int) or version > VERSION:
        raise DatasetError(f"{where}: format_version {version!r}; this mmreplay reads up to {VERSION}")
    for name in ("observations", *STEP_ARRAYS, *(f"episodes/{n}" for n in EPISODE_ARRAYS)):
        if name not in g:
            raise DatasetError(f"{where}: missing array {name!r}")
    return g


MAX_METADATA_BYTES = 64 << 20  # a zarr.json (the root's holds the consolidated metadata: a few KB)


def _check_metadata_files(loc: Location) -> None:
    """Every ``zarr.json`` zarr will read is a regular file (object) of sane size, checked before zarr reads
    it: one that is a FIFO or a device, or a huge sparse file, is refused instead of blocking or filling
    memory."""
    if loc.remote:
        names = [loc.join("zarr.json")]
    else:
        names = [Location(os.path.join(d, "zarr.json")) for d, _, files in os.walk(loc.path) if "zarr.json" in files]
        names = names or [loc.join("zarr.json")]
    for meta in names:
        if not loc.remote:
            try:
                os.close(meta._open_regular())
            except FileNotFoundError:
                raise DatasetError(f"{loc}: not a zarr v3 group (no zarr.json)") from None
        if meta.size() > MAX_METADATA_BYTES:
            raise DatasetError(f"{meta}: {meta.size():,} bytes, more than the {MAX_METADATA_BYTES:,} a zarr.json of"
                               " an mmreplay dataset can need; the dataset is damaged or not one: not reading it")


EPISODE_BLOCK = 1 << 16  # episodes read at a time: the episode tables are never held whole
MAX_OBJECTS = 10**7  # chunks or shards along an array's first axis (an export of 1M frames has ~250)


def _array_names(g: Any) -> list[str]:
    arrays = ["observations", *STEP_ARRAYS, *(f"episodes/{n}" for n in EPISODE_ARRAYS)]
    if "extras" in g:
        arrays += [f"extras/{n}" for n, _ in g["extras"].arrays()]
    return arrays


def _check_layout(g: Any, where: str) -> tuple[int, int, int]:
    """Declared shapes, before anything is read: consistent row counts, rows and chunks of sane size.
    Returns (episodes, frames, steps)."""
    n_frames, n_steps = int(g["observations"].shape[0]), int(g["actions"].shape[0])
    for name in [*STEP_ARRAYS[1:], *(f"extras/{n}" for n, _ in (g["extras"].arrays() if "extras" in g else []))]:
        if g[name].shape[0] != n_steps:
            raise DatasetError(f"{where}: array {name!r} has {g[name].shape[0]} rows, 'actions' has {n_steps}")
    shapes = {n: tuple(g[f"episodes/{n}"].shape) for n in EPISODE_ARRAYS}
    n_eps = shapes["length"][0] if len(shapes["length"]) == 1 else -1
    if n_eps < 0 or any(shp != (n_eps,) for shp in shapes.values()):
        raise DatasetError(f"{where}: the episodes/* arrays differ in length or are not 1-D ({shapes})")
    if n_eps > min(n_steps, n_frames):
        raise DatasetError(f"{where}: episodes/* declare {n_eps:,} episodes, more than the {n_steps:,} steps (every"
                           " episode has at least one)")
    for name in _array_names(g):
        a = g[name]
        check_row(where, f"array {name!r}", tuple(a.shape[1:]), a.dtype)
        if nbytes(a.chunks, a.dtype) > MAX_CHUNK_BYTES:
            raise DatasetError(f"{where}: array {name!r} has chunks of {a.chunks} {a.dtype}; at most"
                               f" {MAX_CHUNK_BYTES:,} bytes per chunk are supported")
        per_object = int((a.shards or a.chunks)[0])
        objects = -(-int(a.shape[0]) // per_object)
        if objects > MAX_OBJECTS:
            raise DatasetError(f"{where}: array {name!r} declares {int(a.shape[0]):,} rows in {objects:,} objects of"
                               f" {per_object:,} rows; at most {MAX_OBJECTS:,} objects per array are supported")
    return n_eps, n_frames, n_steps


def _episode_blocks(g: Any, where: str, n_eps: int, n_frames: int, n_steps: int) -> Iterator[dict[str, np.ndarray]]:
    """The episode tables ``EPISODE_BLOCK`` episodes at a time, each block checked as FORMAT.md says: every
    episode has at least one step, episodes are contiguous (``obs_start``/``step_start`` are the exclusive
    cumulative sums of ``length + 1``/``length``) and inside the frame and step arrays."""
    o_next = s_next = lo = 0
    block = 1024  # small first: a forged table is refused after reading little
    while lo < n_eps:
        hi = min(lo + block, n_eps)
        block = min(2 * block, EPISODE_BLOCK)
        ep = {n: np.asarray(g[f"episodes/{n}"][lo:hi]) for n in EPISODE_ARRAYS}
        ln = ep["length"].astype(np.int64)
        o_want = o_next + np.concatenate(([0], np.cumsum(ln + 1)[:-1]))
        s_want = s_next + np.concatenate(([0], np.cumsum(ln)[:-1]))
        bad = (ln < 1) | (ep["obs_start"] != o_want) | (ep["step_start"] != s_want)
        if bad.any():
            e = lo + int(np.flatnonzero(bad)[0])
            i = e - lo
            raise DatasetError(f"{where}: episode {e} has length {int(ln[i])}, obs_start {int(ep['obs_start'][i])},"
                               f" step_start {int(ep['step_start'][i])}; expected a length >= 1 and the episode to"
                               f" start where the one before it ends (obs_start {int(o_want[i])}, step_start"
                               f" {int(s_want[i])})")
        o_next, s_next = int(o_want[-1] + ln[-1] + 1), int(s_want[-1] + ln[-1])
        if o_next > n_frames or s_next > n_steps:
            raise DatasetError(f"{where}: episodes/* point past the end of 'observations' ({n_frames} frames)"
                               f" or the step arrays ({n_steps} steps)")
        ep["length"] = ln
        lo = hi
        yield ep


def _read_ahead(array: Any, block: int, root: Location) -> ReadAhead:
    """Rows of ``array`` read ahead by a thread: shards (files, or objects of a remote store) decoded
    directly when laid out as ``export_zarr`` writes them (``_zarr_shards``), else through zarr."""
    def through_zarr(a: int, z: int) -> np.ndarray:
        return np.asarray(array[a:z])

    fetch = shard_reader(array, root)
    return ReadAhead(fetch or through_zarr, int(array.shape[0]), block)


def import_zarr(src: Any, path: str | os.PathLike[str], *, stack: int | None = None,
                n_step: int | None = None, gamma: float | None = None, pad: str | None = None,
                capacity: int | None = None, chunk_size: int | None = None, seed: int = 0,
                progress: ProgressArg = True, storage_options: dict[str, Any] | None = None) -> ReplayStore:
    root = Location.of(src, storage_options)
    where = str(root)
    g = open_dataset(src, storage_options)
    attrs = dict(g.attrs)
    layout = _check_layout(g, where)
    for name in _array_names(g):
        check_objects(g[name], root, where)  # before anything is read: a lost object is not read as zeros
    n_eps = layout[0]
    n_steps = sum(int(ep["length"].sum()) for ep in _episode_blocks(g, where, *layout))  # checks every block
    obs, acts = g["observations"], g["actions"]
    x_arrays = dict(g["extras"].arrays()) if "extras" in g else {}
    extras = {name: (tuple(a.shape[1:]), a.dtype) for name, a in x_arrays.items()}
    check_declared_extras(attrs.get("extras"), extras, where, "attribute 'extras'", "array 'extras/{}'")
    meta = dict(attrs.get("metadata") or {})
    meta["source"] = {"format": "zarr", "path": where, "episodes": n_eps, "steps": n_steps}
    piece = rows_per_piece(nbytes(obs.shape[1:], obs.dtype))
    with StoreBuilder(path) as b:
        store = b.create(capacity=capacity or max(1, n_steps), obs_shape=tuple(obs.shape[1:]), obs_dtype=obs.dtype,
                         action_shape=tuple(acts.shape[1:]), action_dtype=acts.dtype, extras=extras or None,
                         chunk_size=chunk_size, seed=seed, metadata=meta,
                         **sampling_params(attrs, stack=stack, n_step=n_step, gamma=gamma, pad=pad))
        names = ["rewards", "terminations", "truncations"]
        steps_src = {"actions": acts, **{n: g[n] for n in names}, **{"x_" + n: a for n, a in x_arrays.items()}}
        readers = {k: _read_ahead(arr, 65536, root) for k, arr in steps_src.items()}
        frames_src = _read_ahead(obs, piece, root)
        episodes = ((ep, i) for ep in _episode_blocks(g, where, *layout) for i in range(ep["length"].size))
        try:
            with progress_bar(progress, int(obs.shape[0]), "import zarr") as bar:
                for ep, e in episodes:
                    o0, s0 = int(ep["obs_start"][e]), int(ep["step_start"][e])

                    def frames(a: int, z: int, o0: int = o0) -> np.ndarray:
                        return frames_src.read(o0 + a, o0 + z)

                    def steps(a: int, z: int, s0: int = s0) -> Steps:
                        r = {k: rd.read(s0 + a, s0 + z) for k, rd in readers.items()}
                        return Steps(r["actions"], r["rewards"], r["terminations"], r["truncations"],
                                     {n: r["x_" + n] for n in x_arrays})

                    feed_episode(store, int(ep["length"][e]), frames, steps, bool(ep["final_missing"][e]),
                                 bar=bar, piece=piece)
        finally:
            for rd in [frames_src, *readers.values()]:
                rd.close()
        return b.finish()


def describe_zarr(src: Any, storage_options: dict[str, Any] | None = None) -> list[str]:
    where = str(Location.of(src, storage_options))
    g = open_dataset(src, storage_options)
    attrs = dict(g.attrs)
    layout = _check_layout(g, where)
    stats = EpisodeStats()
    for ep in _episode_blocks(g, where, *layout):
        stats.add(ep["length"], ep["return"], ep["final_missing"])
    obs, acts = g["observations"], g["actions"]
    codecs = obs.metadata.to_dict().get("codecs", [])
    inner = codecs[0].get("configuration", {}).get("codecs", []) if codecs else []
    comp = ", ".join(c["name"] for c in inner if c.get("name") not in ("bytes",)) or "none"
    lines = [f"dataset     {where} (mmreplay zarr v{attrs.get('format_version')})",
             *stats.lines(tuple(obs.shape[1:]), obs.dtype, tuple(acts.shape[1:]), acts.dtype),
             f"sampling    stack {attrs.get('stack')}, n-step {attrs.get('n_step')}, gamma {attrs.get('gamma')},"
             f" pad {attrs.get('pad')!r}",
             f"storage     chunks of {obs.chunks[0]} frames in shards of {obs.shards[0] if obs.shards else '-'},"
             f" compression {comp}"]
    if stats.final_missing:
        lines.append(f"note        {stats.final_missing} episode(s) lack their final observation")
    if "extras" in g:
        lines.append("extras      " + (", ".join(f"{n} {tuple(a.shape[1:])} {a.dtype}" for n, a in g["extras"].arrays())
                                       or "-"))
    return lines
