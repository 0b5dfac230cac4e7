"""HDF5 in the D4RL layout: export a store's complete episodes, import D4RL files, describe them.

One row per step, episodes contiguous: ``observations`` (o_t, single frames), ``actions``,
``rewards`` (float32), ``terminals`` and ``timeouts`` (bool, the step ended the episode by
termination / by truncation), optionally ``next_observations`` (o_{t+1}), and extras under
``infos/<name>``. Root attributes record ``stack``, ``pad``, ``n_step``, ``gamma`` and, as JSON
in ``mmreplay``, the rest of the store's layout and metadata.

What the layout cannot express without ``next_observations``: an episode's final observation.
An import then writes every episode's last step with ``next_obs=None``: a terminated
row gets a zero ``next_obs`` (the store would have returned the real final frame), and rows
whose n-step window would bootstrap from the final frame of a truncated episode are not
sampleable. With ``next_observations`` a round trip is exact.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..store import ReplayStore
from ._bounds import h5_get, h5_names, nbytes, rows_per_piece
from ._common import (
    ExportResult,
    ProgressArg,
    check_declared_extras,
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
from ._h5 import H5Column, dataset_options, pool, read_rows, row_reader
from ._importing import ReadAhead, Steps, StoreBuilder, feed_episode, sampling_params
from ._location import Location
from .errors import DatasetError

REQUIRED = ("observations", "actions", "rewards", "terminals")
OPTIONAL = ("timeouts", "next_observations")
RDCC = 64 * 2**20  # h5py chunk cache per dataset: whole chunks stay cached between reads


def export_hdf5(store: ReplayStore | str | os.PathLike[str], out: Any, *,
                compression: str | None = "gzip", level: int | None = None, next_observations: bool = False,
                chunk_frames: int = 64, overwrite: bool = False, progress: ProgressArg = True,
                storage_options: dict[str, Any] | None = None) -> ExportResult:
    """Write the store's complete episodes to one HDF5 file ``out`` in the D4RL layout (a local path, or an
    fsspec URL: the file is then written locally and uploaded, see ``_common.output``)."""
    import h5py

    comp = dataset_options(compression, level)
    if isinstance(chunk_frames, bool) or not isinstance(chunk_frames, int) or chunk_frames < 1:
        raise ValueError(f"chunk_frames: expected a positive int, got {chunk_frames!r}")
    t0 = time.perf_counter()
    final = Location.of(out, storage_options)
    with open_reader(store) as s, output(final, overwrite, "export", progress, source=s.path) as tmp:
        selection = select_for_export(s)
        t, order, sch = selection.table, selection.order, s.schema
        n = selection.steps
        with h5py.File(tmp, "w", libver="earliest") as f, pool() as ex:
            def column(name: str, shape: tuple[int, ...], dtype: Any, rows: int) -> H5Column:
                ds = f.create_dataset(name, shape=(n, *shape), dtype=dtype,
                                      chunks=(max(1, min(rows, n)), *shape) if n else None, **(comp if n else {}))
                return H5Column(ds, ex)

            obs = column("observations", sch.obs_shape, sch.obs_dtype, chunk_frames)
            nxt = column("next_observations", sch.obs_shape, sch.obs_dtype, chunk_frames) if next_observations else None
            cols = {"actions": column("actions", sch.action_shape, sch.action_dtype, 65536),
                    "rewards": column("rewards", (), np.float32, 65536),
                    "terminals": column("terminals", (), np.bool_, 65536),
                    "timeouts": column("timeouts", (), np.bool_, 65536)}
            xcols = {e.name: column(f"infos/{e.name}", e.shape, e.dtype, 65536) for e in sch.extras}
            missing = []
            with progress_bar(progress, selection.frames, "export hdf5") as bar:
                for k, i in enumerate(order.tolist()):
                    if t.final_missing[i]:
                        missing.append(k)
                    length = int(t.length[i])
                    a = 0
                    for fr in frame_pieces(s, t, i):
                        obs.append(fr[:max(0, min(a + len(fr), length) - a)])  # o_0 .. o_{T-1}
                        if nxt is not None:
                            nxt.append(fr[max(0, 1 - a):])  # o_1 .. o_T
                        a += len(fr)
                        bar.update(len(fr))
                    for st in step_pieces(s, t, i):
                        cols["actions"].append(st.actions)
                        cols["rewards"].append(st.rewards)
                        cols["terminals"].append(st.terminated)
                        cols["timeouts"].append(st.truncated & ~st.terminated)
                        for name, v in st.extras.items():
                            xcols[name].append(v)
            for c in [obs, *([nxt] if nxt is not None else []), *cols.values(), *xcols.values()]:
                c.close()
            layout = layout_attrs(sch, s.metadata)
            f.attrs.update({"format": "d4rl", "stack": sch.stack, "pad": sch.pad, "n_step": sch.n_step,
                            "gamma": sch.gamma, "mmreplay": json.dumps(layout),
                            "final_missing_episodes": np.asarray(missing, np.int64)})
    return selection.result(final, "hdf5", time.perf_counter() - t0, {"next_observations": bool(next_observations)})


# -- reading ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _open(src: Any, storage_options: dict[str, Any] | None = None) -> Iterator[tuple[Any, Location]]:
    """The HDF5 file at ``src`` (a local path, or a URL read through a bounded block cache) and where it is."""
    import h5py

    loc = require_path(src, "d4rl", storage_options)
    with contextlib.ExitStack() as stack:
        handle: Any = loc.path if not loc.remote else stack.enter_context(loc.open("rb", random_access=True))
        try:
            f = h5py.File(handle, "r", rdcc_nbytes=RDCC)
        except OSError as exc:
            raise DatasetError(f"{loc}: not an HDF5 file ({exc})") from None
        with f:
            yield f, loc


class _D4RL:
    """An open D4RL file: its keys checked (stored in the file, sizes it can hold), its episodes found."""

    def __init__(self, f: Any, where: str) -> None:
        import h5py

        self.f, self.where = f, where
        self.ds = {k: h5_get(f, k, where) for k in (*REQUIRED, *OPTIONAL)}
        for key in REQUIRED:
            if self.ds[key] is None:
                raise DatasetError(f"{where}: missing dataset {key!r} (D4RL files need {', '.join(REQUIRED)})")
        obs = self.ds["observations"]
        self.n = int(obs.shape[0]) if getattr(obs, "ndim", 0) else -1
        keys = [k for k in (*REQUIRED, *OPTIONAL) if self.ds[k] is not None]
        self.infos = {}
        group = h5_get(f, "infos", where)
        for name in h5_names(group) if isinstance(group, h5py.Group) else []:
            ds = h5_get(group, name, where)
            ok = getattr(ds, "ndim", 0) >= 1 and ds.shape[0] == self.n and ds.dtype.kind in "biuf"
            ident = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
            if ok and ident.isidentifier():
                self.infos[ident] = ds
        for key in keys:
            ds = self.ds[key]
            if not isinstance(ds, h5py.Dataset) or ds.ndim < 1 or ds.shape[0] != self.n:
                raise DatasetError(f"{where}: dataset {key!r} has shape {getattr(ds, 'shape', None)}, but"
                                   f" 'observations' has {self.n} rows; every key needs one row per step")
        nxt = self.ds["next_observations"]
        if nxt is not None and (nxt.shape[1:] != obs.shape[1:] or nxt.dtype != obs.dtype):
            raise DatasetError(f"{where}: dataset 'next_observations' has rows of shape {tuple(nxt.shape[1:])}"
                               f" {nxt.dtype}, 'observations' has {tuple(obs.shape[1:])} {obs.dtype}; they hold the"
                               " same observations one step apart")
        rew = self.ds["rewards"]
        if rew.ndim > 2 or (rew.ndim == 2 and rew.shape[1] != 1):
            raise DatasetError(f"{where}: dataset 'rewards' has shape {rew.shape}; expected (N,) or (N, 1)")
        self.terminals = self._flag("terminals")
        self.timeouts = self._flag("timeouts") if self.ds["timeouts"] is not None else np.zeros(self.n, np.bool_)
        ends = np.flatnonzero(self.terminals | self.timeouts)
        if self.n and (not ends.size or ends[-1] != self.n - 1):
            ends = np.append(ends, self.n - 1)  # the file ends inside an episode: it ends there, truncated
        self.last = ends
        self.first = np.concatenate(([0], ends[:-1] + 1)) if ends.size else ends
        self.attrs = dict(f.attrs)

    def _flag(self, key: str) -> np.ndarray:
        """A per-step flag of shape (N,) or (N, 1), any dtype, as bools."""
        v = read_rows(self.ds[key], self.where)
        return (v.reshape(self.n, -1)[:, 0] if v.size else np.zeros(self.n)) != 0

    def returns(self) -> np.ndarray:
        r = read_rows(self.ds["rewards"], self.where).astype(np.float64).reshape(-1)
        return np.add.reduceat(r, self.first) if self.first.size else np.zeros(0)


def import_d4rl(src: Any, path: str | os.PathLike[str], *, stack: int | None = None,
                n_step: int | None = None, gamma: float | None = None, pad: str | None = None,
                capacity: int | None = None, chunk_size: int | None = None, seed: int = 0,
                progress: ProgressArg = True, storage_options: dict[str, Any] | None = None) -> ReplayStore:
    with _open(src, storage_options) as (f, loc):
        where = str(loc)
        d = _D4RL(f, where)
        obs, acts, rews, nxt = (d.ds[k] for k in ("observations", "actions", "rewards", "next_observations"))
        attrs = d.attrs
        layout = _layout(attrs, where)
        recorded = {k: _plain(attrs[k]) for k in ("stack", "n_step", "gamma", "pad") if k in attrs}
        missing = set(np.asarray(attrs.get("final_missing_episodes", []), np.int64).tolist())
        meta = dict(layout.get("metadata") or {})
        meta["source"] = {"format": "d4rl", "path": where if loc.remote else os.path.abspath(where), "steps": d.n,
                          "episodes": int(d.first.size), "next_observations": nxt is not None}
        extras = {name: (tuple(ds.shape[1:]), ds.dtype) for name, ds in d.infos.items()}
        check_declared_extras(layout.get("extras"), extras, where, "its 'mmreplay' attribute", "'infos/{}'")
        with StoreBuilder(path) as b:
            store = b.create(capacity=capacity or max(1, d.n), obs_shape=tuple(obs.shape[1:]), obs_dtype=obs.dtype,
                             action_shape=tuple(acts.shape[1:]), action_dtype=acts.dtype, extras=extras or None,
                             chunk_size=chunk_size, seed=seed, metadata=meta,
                             **sampling_params(recorded, stack=stack, n_step=n_step, gamma=gamma, pad=pad))
            piece = rows_per_piece(nbytes(obs.shape[1:], obs.dtype))
            src_frames = ReadAhead(row_reader(obs, where), d.n, piece)
            with src_frames, progress_bar(progress, d.n + int(d.first.size), "import d4rl") as bar:
                for e, (s0, s1) in enumerate(zip(d.first.tolist(), d.last.tolist(), strict=True)):
                    length = s1 - s0 + 1
                    final_missing = nxt is None or e in missing

                    def frames(a: int, z: int, s0: int = s0, length: int = length) -> np.ndarray:
                        part = src_frames.read(s0 + a, s0 + min(z, length)) if a < length else obs[0:0]
                        if z > length and nxt is not None:  # o_T exists only as next_observations[last]
                            part = np.concatenate([part, np.asarray(nxt[s0 + length - 1:s0 + length])])
                        return part

                    def steps(a: int, z: int, s0: int = s0) -> Steps:
                        sl = slice(s0 + a, s0 + z)
                        return Steps(read_rows(acts, where, sl),
                                     read_rows(rews, where, sl).astype(np.float64).reshape(-1),
                                     d.terminals[sl], d.timeouts[sl] & ~d.terminals[sl],
                                     {n: read_rows(ds, where, sl) for n, ds in d.infos.items()})

                    feed_episode(store, length, frames, steps, final_missing, bar=bar, piece=piece)
            return b.finish()


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    return v.item() if isinstance(v, np.generic) else v


def _layout(attrs: dict[str, Any], where: str) -> dict[str, Any]:
    raw = attrs.get("mmreplay")
    if raw is None:
        return {}
    try:
        out = json.loads(_plain(raw))
    except (TypeError, ValueError) as exc:
        raise DatasetError(f"{where}: attribute 'mmreplay' is not valid JSON ({exc})") from None
    return out if isinstance(out, dict) else {}


def describe_d4rl(src: Any, storage_options: dict[str, Any] | None = None) -> list[str]:
    with _open(src, storage_options) as (f, loc):
        where = str(loc)
        d = _D4RL(f, where)
        obs, acts = d.ds["observations"], d.ds["actions"]
        lengths = d.last - d.first + 1
        a = d.attrs
        lines = [f"dataset     {where} (HDF5, D4RL layout)", *summary_lines(
            lengths, d.returns(), tuple(obs.shape[1:]), obs.dtype, tuple(acts.shape[1:]), acts.dtype)]
        lines.append(f"ends        {int(d.terminals.sum()):,} terminals, {int((d.timeouts & ~d.terminals).sum()):,}"
                     f" timeouts{'' if d.ds['timeouts'] is not None else ' (no timeouts key)'}; next_observations"
                     f" {'present' if d.ds['next_observations'] is not None else 'absent'}")
        if "stack" in a:
            lines.append(f"sampling    stack {_plain(a['stack'])}, n-step {_plain(a.get('n_step'))}, gamma"
                         f" {_plain(a.get('gamma'))}, pad {_plain(a.get('pad'))!r}")
        if d.infos:
            lines.append("extras      " + ", ".join(f"{n} {tuple(ds.shape[1:])} {ds.dtype}" for n, ds in d.infos.items()))
        comp = obs.compression or "none"
        lines.append(f"storage     chunks {obs.chunks}, compression {comp}")
    return lines
