"""Minari datasets (HDF5 backend): export a store's complete episodes, import them, describe them.

A dataset ``<root>/<dataset_id>/data/`` holds ``metadata.json`` and ``main_data.hdf5`` with one
group ``episode_<i>`` per episode (attributes ``id``, ``total_steps``): ``observations`` (T+1
rows, the reset observation first), ``actions``, ``rewards``, ``terminations``, ``truncations``
(T rows) and, for our extras, ``infos/<name>`` (T+1 rows: Minari's infos start with the reset
info, so row t+1 belongs to step t and row 0 is zeros). ``minari.load_dataset(dataset_id)``
reads it when ``MINARI_DATASETS_PATH`` is the root; ``minari`` is not needed to write or read it.

Frames stay lossless: Minari >= 0.5.3 JPEG-encodes "image" spaces (uint8 Box, rank 2 or 3,
both leading sizes >= 32, bounds 0..255) unless ``metadata.json`` says ``"jpeg_encoding":
false``, which Minari honours from 0.5.4 on. Exports with such a space therefore record
``minari_version`` 0.5.4 (Minari 0.5.3 refuses the dataset instead of misreading it); others
record 0.5.3. Imports read raw arrays, decode JPEG-encoded frames with Pillow when it is
installed (the source was already lossy), and refuse otherwise.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..spaces import space_json
from ..store import ReplayStore
from ._bounds import check_row, h5_get, h5_names, nbytes, rows_per_piece
from ._common import (
    ExportResult,
    ProgressArg,
    disk_usage,
    frame_pieces,
    layout_attrs,
    open_reader,
    output,
    progress_bar,
    require_path,
    select_for_export,
    step_pieces,
    summary_lines,
)
from ._h5 import H5Column, dataset_options, exact, pool, read_rows, row_reader
from ._importing import ReadAhead, Steps, StoreBuilder, feed_episode, sampling_params
from ._location import Location
from .errors import DatasetError, DatasetNotFoundError

DATASET_ID = re.compile(r"^(?:[A-Za-z0-9_.\-]+/)*[A-Za-z0-9_.\-]+-v\d+$")
REQUIRED_METADATA = ("total_episodes", "data_format", "observation_space", "action_space")


# -- spaces (Minari's JSON serialization) --------------------------------------------------------------
def box_space(shape: tuple[int, ...], dtype: np.dtype) -> dict[str, Any]:
    """A Box covering every value of ``dtype`` (uint8: 0..255; floats: unbounded)."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return {"type": "MultiBinary", "n": list(shape) if len(shape) != 1 else shape[0]}
    lo, hi = (np.iinfo(dt).min, np.iinfo(dt).max) if dt.kind in "iu" else (-np.inf, np.inf)
    return {"type": "Box", "dtype": dt.name, "shape": list(shape), "low": np.full(shape, lo, dt).tolist(),
            "high": np.full(shape, hi, dt).tolist()}


def is_image_space(space: dict[str, Any]) -> bool:
    """Minari's rule for spaces it JPEG-encodes by default."""
    if space.get("type") != "Box" or space.get("dtype") != "uint8":
        return False
    shape = space.get("shape", [])
    return (len(shape) in (2, 3) and shape[0] >= 32 and shape[1] >= 32 and bool(np.all(np.asarray(space["low"]) == 0))
            and bool(np.all(np.asarray(space["high"]) == 255)))


def space_layout(space: dict[str, Any], where: str) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)`` of one element of a serialized Box/Discrete/MultiDiscrete/MultiBinary space."""
    kind = space.get("type")
    try:
        if kind == "Box":
            return tuple(int(v) for v in space["shape"]), np.dtype(space["dtype"])
        if kind == "Discrete":
            return (), np.dtype(space.get("dtype", "int64"))
        if kind == "MultiDiscrete":
            return tuple(np.shape(space["nvec"])), np.dtype(space.get("dtype", "int64"))
        if kind == "MultiBinary":
            n = space["n"]
            return (tuple(n) if isinstance(n, list) else (int(n),)), np.dtype(np.int8)
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"{where}: malformed {kind} space ({exc})") from None
    raise DatasetError(f"{where}: {kind} spaces are not supported (mmreplay stores Box, Discrete, MultiDiscrete and"
                       " MultiBinary); flatten the dataset first")


def _action_space(given: Any, store_meta: dict[str, Any], shape: tuple[int, ...], dtype: np.dtype,
                  lo: float, hi: float) -> tuple[dict[str, Any], bool]:
    """The action space to record, and whether it was inferred from the actions."""
    for value in (given, store_meta.get("action_space")):
        if value is None:
            continue
        if isinstance(value, str):
            return json.loads(value), False
        if isinstance(value, dict):
            return dict(value), False
        return space_json(value), False
    if dtype.kind in "iu" and shape == () and np.isfinite(lo):
        start = min(0, int(lo))
        return {"type": "Discrete", "dtype": "int64", "start": start, "n": int(hi) - start + 1}, True
    return box_space(shape, dtype), True


# -- export -------------------------------------------------------------------------------------------
def export_minari(store: ReplayStore | str | os.PathLike[str], out: str | os.PathLike[str], *,
                  dataset_id: str | None = None, compression: str | None = "gzip", level: int | None = None,
                  action_space: Any = None, minari_metadata: dict[str, Any] | None = None,
                  chunk_frames: int = 64, overwrite: bool = False, progress: ProgressArg = True,
                  storage_options: dict[str, Any] | None = None) -> ExportResult:
    """Write the store's complete episodes as the Minari dataset ``<out>/<dataset_id>`` (``out`` a local
    path, or an fsspec URL: the dataset is then written locally and uploaded, see ``_common.output``)."""
    import h5py

    if not isinstance(dataset_id, str) or not DATASET_ID.match(dataset_id) or ".." in dataset_id.split("/"):
        raise ValueError(f"dataset_id: expected 'namespace/name-v<N>' (Minari's grammar, e.g. 'mmreplay/pong/random-v0'),"
                         f" got {dataset_id!r}")
    comp = dataset_options(compression, level)
    extra_meta = dict(minari_metadata or {})
    root = Location.of(out, storage_options)
    final = root.join(dataset_id) if root.remote else Location(os.path.join(os.path.abspath(root.path), dataset_id))
    t0 = time.perf_counter()
    with open_reader(store) as s, output(final, overwrite, "export", progress, ("data/metadata.json",),
                                        source=s.path) as tmp:
        selection = select_for_export(s)
        t, order, sch = selection.table, selection.order, s.schema
        os.makedirs(os.path.join(tmp, "data"))
        obs_space = box_space(sch.obs_shape, sch.obs_dtype)
        lo, hi = np.inf, -np.inf
        with h5py.File(os.path.join(tmp, "data", "main_data.hdf5"), "w", track_order=True) as f, pool() as ex:
            def column(g: Any, name: str, rows: int, shape: tuple[int, ...], dtype: Any, chunk: int) -> H5Column:
                ds = g.create_dataset(name, shape=(rows, *shape), dtype=dtype,
                                      chunks=(max(1, min(chunk, rows)), *shape), **comp)
                return H5Column(ds, ex)

            with progress_bar(progress, selection.frames, "export minari") as bar:
                for k, i in enumerate(order.tolist()):
                    length = int(t.length[i])
                    g = f.create_group(f"episode_{k}")
                    g.attrs["id"] = np.int64(k)
                    g.attrs["total_steps"] = np.int64(length)
                    if t.final_missing[i]:
                        g.attrs["final_observation_missing"] = True
                    obs = column(g, "observations", length + 1, sch.obs_shape, sch.obs_dtype, chunk_frames)
                    for fr in frame_pieces(s, t, i):
                        obs.append(fr)
                        bar.update(len(fr))
                    obs.close()
                    act_dt = np.int64 if sch.action_dtype.kind in "iu" else sch.action_dtype
                    cols = {"actions": column(g, "actions", length, sch.action_shape, act_dt, 65536),
                            "rewards": column(g, "rewards", length, (), np.float32, 65536),
                            "terminations": column(g, "terminations", length, (), np.bool_, 65536),
                            "truncations": column(g, "truncations", length, (), np.bool_, 65536)}
                    infos = {e.name: column(g, f"infos/{e.name}", length + 1, e.shape, e.dtype, 65536)
                             for e in sch.extras}
                    for c in infos.values():
                        c.append(np.zeros((1, *c.ds.shape[1:]), c.ds.dtype))  # the reset step has no extras
                    for st in step_pieces(s, t, i):
                        if st.actions.size:
                            lo, hi = min(lo, float(st.actions.min())), max(hi, float(st.actions.max()))
                        cols["actions"].append(st.actions)
                        cols["rewards"].append(st.rewards)
                        cols["terminations"].append(st.terminated)
                        cols["truncations"].append(st.truncated & ~st.terminated)
                        for name, v in st.extras.items():
                            infos[name].append(v)
                    for c in [*cols.values(), *infos.values()]:
                        c.close()
        act_space, inferred = _action_space(action_space, s.metadata, sch.action_shape, sch.action_dtype, lo, hi)
        image = is_image_space(obs_space) or is_image_space(act_space)
        layout = layout_attrs(sch, s.metadata)
        layout["action_space_inferred"] = inferred
        meta = {**extra_meta, "dataset_id": dataset_id, "minari_version": "0.5.4" if image else "0.5.3",
                "total_episodes": int(order.size), "total_steps": selection.steps, "data_format": "hdf5",
                "jpeg_encoding": False, "observation_space": json.dumps(obs_space),
                "action_space": json.dumps(act_space),
                "dataset_size": round(disk_usage(os.path.join(tmp, "data")) / 1e6, 1), "mmreplay": layout}
        with open(os.path.join(tmp, "data", "metadata.json"), "w") as fh:
            json.dump(meta, fh)
    return selection.result(final, "minari", time.perf_counter() - t0,
                       {"dataset_id": dataset_id, "minari_version": meta["minari_version"],
                        "action_space_inferred": inferred})


# -- import -------------------------------------------------------------------------------------------
def _data_dir(src: Any, dataset_id: str | None, storage_options: dict[str, Any] | None = None) -> Location:
    p = require_path(src, "minari", storage_options)
    if dataset_id is not None:
        p = p.join(dataset_id)
        if not p.isdir():
            raise DatasetNotFoundError(f"minari: no dataset {dataset_id!r} under {src} ({p} does not exist)")
    data = p.join("data")
    return data if data.isdir() else p


MAX_METADATA_BYTES = 64 << 20  # metadata.json: spaces and descriptions, never this large


def read_metadata(data: Location | str) -> dict[str, Any]:
    loc = Location.of(data).join("metadata.json")
    where = str(loc)
    try:
        meta = json.loads(loc.read_bytes(MAX_METADATA_BYTES))
    except (FileNotFoundError, DatasetNotFoundError):
        raise DatasetNotFoundError(f"{where}: missing (Minari datasets keep their metadata there)") from None
    except ValueError as exc:
        raise DatasetError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise DatasetError(f"{where}: expected a JSON object")
    for key in REQUIRED_METADATA:
        if key not in meta:
            hint = (" (mmreplay does not build environments from env_spec; it needs the spaces)"
                    if key.endswith("_space") else "")
            raise DatasetError(f"{where}: missing key {key!r}{hint}")
    if meta["data_format"] != "hdf5":
        raise DatasetError(f"{where}: data_format {meta['data_format']!r} is not supported; mmreplay reads Minari's"
                           " 'hdf5' backend")
    for key in ("observation_space", "action_space"):
        if isinstance(meta[key], str):
            try:
                meta[key] = json.loads(meta[key])
            except ValueError as exc:
                raise DatasetError(f"{where}: key {key!r} is not a serialized space ({exc})") from None
    return meta


class _Frames:
    """Observations of one episode: raw rows, or JPEG rows decoded with Pillow."""

    def __init__(self, ds: Any, shape: tuple[int, ...], dtype: np.dtype, jpeg: bool, h5: str, e: int) -> None:
        self.ds, self.shape, self.dtype, self.h5, self.where = ds, shape, dtype, h5, f"{h5}: episode_{e}"
        self.raw = tuple(ds.shape[1:]) == shape and ds.dtype.kind in "biuf"
        self._read = row_reader(ds, h5) if self.raw else None
        if not self.raw:
            if not jpeg or ds.dtype.kind not in "uO":
                raise DatasetError(f"{self.where}: observations have shape {ds.shape} {ds.dtype}, the observation"
                                   f" space says {shape} {dtype}")
            try:
                from PIL import Image
            except ImportError:
                raise DatasetError(f"{self.where}: observations are JPEG-encoded (Minari's default for image"
                                   " spaces); install Pillow to decode them (the source is lossy)") from None
            self._image = Image

    def __call__(self, a: int, z: int) -> np.ndarray:
        if self._read is not None:
            return exact(np.asarray(self._read(a, z)), self.dtype, f"{self.where}: observations")
        rows = read_rows(self.ds, self.h5, slice(a, z))
        out = np.empty((z - a, *self.shape), self.dtype)
        for j, row in enumerate(rows):
            try:
                image = self._image.open(io.BytesIO(np.asarray(row, np.uint8).tobytes()))
                if (image.height, image.width) != self.shape[:2]:  # checked before decoding: no pixel bombs
                    raise DatasetError(f"{self.where}: observation {a + j} is a {image.width}x{image.height} image,"
                                       f" the observation space says {self.shape}")
                out[j] = np.asarray(image, self.dtype)
            except DatasetError:
                raise
            except (OSError, ValueError, self._image.DecompressionBombError) as exc:
                raise DatasetError(f"{self.where}: observation {a + j} is not a JPEG image of shape {self.shape}"
                                   f" ({exc})") from None
        return out


def import_minari(src: Any, path: str | os.PathLike[str], *, dataset_id: str | None = None,
                  stack: int | None = None, n_step: int | None = None, gamma: float | None = None,
                  pad: str | None = None, capacity: int | None = None, chunk_size: int | None = None,
                  seed: int = 0, progress: ProgressArg = True,
                  storage_options: dict[str, Any] | None = None) -> ReplayStore:
    data = _data_dir(src, dataset_id, storage_options)
    meta = read_metadata(data)
    where = str(data.join("metadata.json"))
    obs_shape, obs_dtype = space_layout(meta["observation_space"], f"{where}: observation_space")
    act_shape, act_dtype = space_layout(meta["action_space"], f"{where}: action_space")
    ours: dict[str, Any] = meta["mmreplay"] if isinstance(meta.get("mmreplay"), dict) else {}
    try:
        if ours.get("action_dtype"):
            act_dtype = np.dtype(ours["action_dtype"])
        extras = {k: (tuple(int(n) for n in v[0]), np.dtype(v[1])) for k, v in (ours.get("extras") or {}).items()}
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise DatasetError(f"{where}: malformed 'mmreplay' entry ({exc!r})") from None
    check_row(where, "observation_space", obs_shape, obs_dtype)
    check_row(where, "action_space", act_shape, act_dtype)
    for name, (shp, dt) in extras.items():
        check_row(where, f"extra {name!r}", shp, dt)
    jpeg = bool(meta.get("jpeg_encoding", True)) and is_image_space(meta["observation_space"])
    h5_loc = data.join("main_data.hdf5")
    h5 = str(h5_loc)
    if not h5_loc.exists():
        raise DatasetNotFoundError(f"{h5}: missing (the Minari HDF5 backend keeps the episodes there)")
    n_eps = _count(meta, "total_episodes", where)
    store_meta = dict(ours.get("metadata") or {})
    store_meta["source"] = {"format": "minari", "path": str(data) if data.remote else os.path.abspath(data.path),
                            "dataset_id": meta.get("dataset_id"), "episodes": n_eps, "steps": meta.get("total_steps"),
                            "jpeg_decoded": False}
    piece = rows_per_piece(nbytes(obs_shape, obs_dtype))
    with _h5_file(h5_loc) as f, StoreBuilder(path) as b:
        groups = [_episode(f, e, n_eps, h5, [f"infos/{n}" for n in extras]) for e in range(n_eps)]
        total = sum(int(g["rewards"].shape[0]) for g in groups)
        store = b.create(capacity=capacity or max(1, total), obs_shape=obs_shape, obs_dtype=obs_dtype,
                         action_shape=act_shape, action_dtype=act_dtype, extras=extras or None,
                         chunk_size=chunk_size, seed=seed, metadata=store_meta,
                         **sampling_params(ours, stack=stack, n_step=n_step, gamma=gamma, pad=pad))
        with progress_bar(progress, total + n_eps, "import minari") as bar:
            for e, g in enumerate(groups):
                length = int(g["rewards"].shape[0])
                frames = _Frames(g["observations"], obs_shape, obs_dtype, jpeg, h5, e)
                if g["observations"].shape[0] != length + 1 or any(
                        g[k].shape[0] != length for k in ("actions", "terminations", "truncations")):
                    raise DatasetError(f"{h5}: episode_{e} has {g['observations'].shape[0]} observations and"
                                       f" {length} rewards; expected T+1 observations and T of everything else")
                store_meta["source"]["jpeg_decoded"] |= not frames.raw
                infos = {n: g[f"infos/{n}"] for n in extras}  # (that they exist: _episode; their shapes: here)
                wrong = [(k, tuple(ds.shape), want) for k, ds, want in (
                    ("actions", g["actions"], (length, *act_shape)),
                    *((f"infos/{n}", infos[n], (length + 1, *extras[n][0])) for n in extras)) if tuple(ds.shape) != want]
                if wrong:
                    k, got, want = wrong[0]
                    raise DatasetError(f"{h5}: episode_{e}: {k} has shape {got}, expected {want} (the spaces in"
                                       " metadata.json, one row per step; infos also the reset's)")

                def steps(a: int, z: int, g: Any = g, infos: dict[str, Any] = infos, e: int = e) -> Steps:
                    # (integer actions are written as int64, the action space's dtype is recorded beside them)
                    sl = slice(a, z)
                    return Steps(exact(read_rows(g["actions"], h5, sl), act_dtype, f"{h5}: episode_{e}: actions"),
                                 read_rows(g["rewards"], h5, sl).astype(np.float64).reshape(-1),
                                 read_rows(g["terminations"], h5, sl), read_rows(g["truncations"], h5, sl),
                                 {n: read_rows(ds, h5, slice(a + 1, z + 1)) for n, ds in infos.items()})

                with ReadAhead(frames, length + 1, piece) as ahead:
                    feed_episode(store, length, ahead.read, steps,
                                 bool(g.attrs.get("final_observation_missing", False)), bar=bar, piece=piece)
        store.metadata = store_meta
        return b.finish()


EPISODE_DATASETS = ("observations", "actions", "rewards", "terminations", "truncations")


def _count(meta: dict[str, Any], key: str, where: str) -> int:
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DatasetError(f"{where}: {key} is {value!r}, expected a non-negative integer")
    return value


def _episode(f: Any, e: int, n_eps: int, h5: str, more: list[str]) -> Any:
    """Group ``episode_<e>`` with its datasets checked: inside the file (no external links, storage or
    virtual datasets) and declaring no more than they store. Returns the group."""
    import h5py

    key = f"episode_{e}"
    if e == 0 and n_eps > len(f):  # before anything is read for each of (maybe) billions of episodes
        names = set(h5_names(f))
        first = next(i for i in range(len(f) + 1) if f"episode_{i}" not in names)
        raise DatasetError(f"{h5}: missing group 'episode_{first}' (metadata.json says {n_eps:,} episodes, the file"
                           f" holds {len(f):,} groups)")
    g = h5_get(f, key, h5)
    if not isinstance(g, h5py.Group):
        raise DatasetError(f"{h5}: missing group {key!r} (metadata.json says {n_eps} episodes)")
    for name in (*EPISODE_DATASETS, *more):
        if not isinstance(h5_get(g, name, f"{h5}: {key}"), h5py.Dataset):
            raise DatasetError(f"{h5}: {key} has no dataset {name!r}")
    return g


@contextlib.contextmanager
def _h5_file(loc: Location) -> Iterator[Any]:
    """Minari's ``main_data.hdf5``: a local file, or a remote one read through a bounded block cache."""
    import h5py

    with contextlib.ExitStack() as stack:
        handle: Any = loc.path if not loc.remote else stack.enter_context(loc.open("rb", random_access=True))
        try:
            f = h5py.File(handle, "r")
        except OSError as exc:
            raise DatasetError(f"{loc}: not an HDF5 file ({exc})") from None
        with f:
            yield f


def describe_minari(src: Any, storage_options: dict[str, Any] | None = None) -> list[str]:
    data = _data_dir(src, None, storage_options)
    meta = read_metadata(data)
    where = str(data.join("metadata.json"))
    obs_shape, obs_dtype = space_layout(meta["observation_space"], f"{where}: observation_space")
    act_shape, act_dtype = space_layout(meta["action_space"], f"{where}: action_space")
    lengths, returns = [], []
    h5_loc = data.join("main_data.hdf5")
    with _h5_file(h5_loc) as f:
        n_eps = _count(meta, "total_episodes", where)
        for e in range(n_eps):
            r = read_rows(_episode(f, e, n_eps, str(h5_loc), [])["rewards"], str(h5_loc)).astype(np.float64)
            lengths.append(r.size)
            returns.append(float(r.sum()))
    lines = [f"dataset     {meta.get('dataset_id', data)} (Minari {meta.get('minari_version')}, {data})",
             *summary_lines(np.asarray(lengths, np.int64), np.asarray(returns), obs_shape, obs_dtype, act_shape,
                            act_dtype),
             f"spaces      observation {meta['observation_space'].get('type')}, action {meta['action_space'].get('type')}"
             f"{' ' + str(meta['action_space'].get('n')) if meta['action_space'].get('type') == 'Discrete' else ''};"
             f" jpeg_encoding {meta.get('jpeg_encoding', 'absent (Minari assumes true)')}"]
    ours = meta.get("mmreplay")
    if isinstance(ours, dict):
        lines.append(f"sampling    stack {ours.get('stack')}, n-step {ours.get('n_step')}, gamma {ours.get('gamma')},"
                     f" pad {ours.get('pad')!r}")
    return lines
