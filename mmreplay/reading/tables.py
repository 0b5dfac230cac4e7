"""A store's transitions as a table (``store.to_arrow()``, ``store.to_pandas()``): scalar columns, no frames.

One row per transition whose two frames are retained (ids from the oldest such one, or from the last
``clear()``, up to the newest), in id order, so that each is one of its episode's steps in ``episodes()``:

    id          int64    the transition id
    episode     int64    the episode's row in ``store.episodes()`` taken at the same moment
    step        int64    t within its episode: the transition from obs_t to obs_{t+1}
    env         int64    the env stream
    action      the action dtype (actions with a shape: a fixed-size list of the flattened action)
    reward      float32  the one-step reward r_t
    terminated  bool     the step ended its episode by termination
    truncated   bool     the step ended its episode otherwise (a time limit, or reset() mid-episode)
    sampleable  bool     it can be sampled now
    priority    float64  its raw priority (prioritized stores; NaN when not sampleable)
    <extra>     each extra with shape () under its name; one named like a column above is prefixed with
                ``extra_`` (again while that is another extra's name)

``step`` counts from the episode's first observation, also for an episode whose first observation was
retired (the manifest's ``head_epos`` carries its position across a reopen; a store written before
that field existed counts such an episode from its oldest retained frame).

pyarrow and pandas are optional (``pip install 'mmreplay[tables]'``); each is imported only here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.episodes import EpisodeTable
from ..core.index import END, TERMINATED, Index
from ..options import Schema

__all__ = ["transition_columns", "arrow_table", "pandas_frame"]

FIXED = ("id", "episode", "step", "env", "action", "reward", "terminated", "truncated", "sampleable", "priority")


def transition_columns(index: Index, arrays: dict[str, np.ndarray], schema: Schema, table: EpisodeTable,
                       priorities: Callable[[np.ndarray], np.ndarray] | None) -> dict[str, np.ndarray]:
    """The table's columns as numpy arrays (``priorities(ids)``: raw priorities of sampleable ids)."""
    t = index.transition_rows()
    slots, stream, row, flags = t["slot"], t["stream"], t["row"], t["flags"]
    # the table's episodes are in (stream, first row) order: one search finds each row's episode
    span = int(index.rows.max()) + 1
    episode = np.searchsorted(table.stream * span + table.first_row, stream * span + row, side="right") - 1
    terminated = (flags & TERMINATED) != 0
    cols: dict[str, np.ndarray] = {
        "id": t["id"], "episode": episode.astype(np.int64), "step": t["episode_pos"] - 1, "env": stream.astype(np.int64),
        "action": arrays["action"][slots], "reward": arrays["reward"][slots],
        "terminated": terminated, "truncated": ((flags & END) != 0) & ~terminated, "sampleable": t["valid"],
    }
    if priorities is not None:
        prio = np.full(slots.size, np.nan)
        prio[t["valid"]] = priorities(t["id"][t["valid"]])
        cols["priority"] = prio
    scalar = [spec.name for spec in schema.extras if spec.shape == ()]
    for name in [n for n in scalar if n not in FIXED] + [n for n in scalar if n in FIXED]:
        column = name
        while column in cols:  # a fixed column's name (extras "id" and "extra_id": extra_extra_id, extra_id)
            column = "extra_" + column
        cols[column] = arrays["x_" + name][slots]
    return cols


def _need(module: str, what: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs {module}: pip install 'mmreplay[{extra}]'") from exc


def arrow_table(cols: dict[str, np.ndarray]) -> Any:
    """A ``pyarrow.Table`` of the columns (a shaped action becomes a fixed-size list column)."""
    pa = _need("pyarrow", "to_arrow()", "tables")
    arrays = {}
    for name, col in cols.items():
        if col.ndim > 1:
            flat = np.ascontiguousarray(col).reshape(col.shape[0], math.prod(col.shape[1:]))  # (-1: not for 0 rows)
            arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])
        else:
            arrays[name] = pa.array(col)
    return pa.table(arrays)


def pandas_frame(cols: dict[str, np.ndarray]) -> Any:
    """A ``pandas.DataFrame`` of the columns (a shaped action becomes a column of flattened arrays)."""
    pd = _need("pandas", "to_pandas()", "tables")
    data = {}
    for name, col in cols.items():
        if col.ndim > 1:
            flat = np.ascontiguousarray(col).reshape(col.shape[0], math.prod(col.shape[1:]))  # (-1: not for 0 rows)
            data[name] = pd.Series(list(flat), dtype=object)
        else:
            data[name] = col
    return pd.DataFrame(data)
