"""The episodes a store holds: a table computed from the index, and reads of their frames and steps.

Used by exporters (which write complete episodes only), ``info``/``stats`` and users
who want whole trajectories. Reads copy out of the mapped chunks, a range at a time,
so memory stays bounded whatever the episode length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .layout import END, LOST, MISSING, START, TERMINATED, TRUNCATED

if TYPE_CHECKING:
    from .index import Index

__all__ = ["EpisodeTable", "EpisodeSteps"]


@dataclass(frozen=True)
class EpisodeTable:
    """One entry per episode with at least one retained frame, in (stream, first row) order.

    ``length`` counts the transitions stored (an episode has ``length + 1`` frames);
    ``complete`` episodes have their first observation retained (not head-lost) and have ended:
    those are what exports write.
    """

    stream: np.ndarray  # int64
    first_row: np.ndarray  # int64: row of the first retained frame
    length: np.ndarray  # int64: transitions from that frame on
    first_id: np.ndarray  # int64: id of the first transition, -1 if none
    start_retained: np.ndarray  # bool: the first retained frame is the episode's first observation
    head_lost: np.ndarray  # bool: its first stored frame (retained) is not its first observation (imports)
    ended: np.ndarray  # bool
    terminated: np.ndarray  # bool
    truncated: np.ndarray  # bool (ended, not terminated: a time limit, or reset() mid-episode)
    final_missing: np.ndarray  # bool: the final observation was not available (imports)
    returns: np.ndarray  # float64: sum of the stored rewards

    def __len__(self) -> int:
        return int(self.stream.size)

    @property
    def complete(self) -> np.ndarray:
        return self.start_retained & ~self.head_lost & self.ended


@dataclass
class EpisodeSteps:
    """Steps ``[t0, t1)`` of an episode: ``actions[i]``, ``rewards[i]`` ... belong to step ``t0 + i``."""

    actions: np.ndarray
    rewards: np.ndarray  # float32
    terminated: np.ndarray  # bool
    truncated: np.ndarray  # bool (the last step of an episode ended by reset() counts as truncated)
    extras: dict[str, np.ndarray]


def episode_table(flags: np.ndarray, rewards: np.ndarray, slot_id: np.ndarray,
                  slots_of: Callable[[int, np.ndarray], np.ndarray], num_envs: int, oldest_row: np.ndarray,
                  rows: np.ndarray) -> EpisodeTable:
    """Build the table from the index's RAM flags over each stream's retained rows ``[oldest_row, rows)``.

    ``slots_of(stream, row)`` maps rows to ring slots (broadcasting).
    """
    parts: list[list[np.ndarray]] = [[] for _ in range(11)]
    for s in range(num_envs):
        rr = np.arange(oldest_row[s], rows[s], dtype=np.int64)
        if rr.size == 0:
            continue
        sl = slots_of(s, rr)
        f = flags[sl]
        start = (f & START) != 0
        first = np.flatnonzero(start)
        if first.size == 0 or first[0] != 0:
            first = np.concatenate(([0], first))  # an episode whose first frame was retired
        last = np.concatenate((first[1:] - 1, [rr.size - 1]))
        lengths = last - first  # transitions = frames - 1
        fl_last = f[last]
        tx = ~start
        rew = np.where(tx, rewards[sl].astype(np.float64), 0.0)
        rew[first] = 0.0  # a retired episode start: the first retained frame's step is not stored whole
        sums = np.add.reduceat(rew, first) if rew.size else np.zeros(0)
        ids = np.where(lengths > 0, slot_id[sl[np.minimum(first + 1, rr.size - 1)]], -1)
        start_ret = start[first]
        ended = (fl_last & END) != 0
        values = [np.full(first.size, s, np.int64), rr[first], lengths, ids, start_ret,
                  start_ret & ((f[first] & LOST) != 0), ended, ended & ((fl_last & TERMINATED) != 0), ended & ((fl_last & TERMINATED) == 0),
                  (fl_last & MISSING) != 0, sums]
        for col, v in zip(parts, values, strict=True):
            col.append(v)
    cols = [np.concatenate(c) if c else np.zeros(0) for c in parts]
    dtypes = [np.int64] * 4 + [np.bool_] * 6 + [np.float64]
    cols = [c.astype(d) for c, d in zip(cols, dtypes, strict=True)]
    return EpisodeTable(*cols)


def step_flags(f: np.ndarray, last_step_ends: bool, terminated_end: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-step terminated/truncated from the disk flags of the steps' rows."""
    term = (f & TERMINATED) != 0
    trunc = (f & TRUNCATED) != 0
    if last_step_ends and term.size and not terminated_end:
        trunc[-1] = True  # ended by reset() mid-episode: a truncation recorded by the next START
    return term, trunc


def episode_frames(index: Index, take: Callable[[np.ndarray], np.ndarray], table: EpisodeTable, i: int, start: int,
                   stop: int | None) -> np.ndarray:
    """Observations ``start .. stop-1`` of episode ``i`` of ``table``, read by ``take(slots)`` (the frame
    reader: raw or compressed chunks); a copy."""
    n = int(table.length[i]) + 1
    stop = n if stop is None else stop
    if not 0 <= start <= stop <= n:
        raise ValueError(f"frames [{start}, {stop}) out of range for an episode of {n} frames")
    rows = int(table.first_row[i]) + np.arange(start, stop, dtype=np.int64)
    return take(index.row_slots(int(table.stream[i]), rows))


def episode_steps(index: Index, arrays: dict[str, np.ndarray], extra_names: tuple[str, ...], table: EpisodeTable,
                  i: int, start: int, stop: int | None) -> EpisodeSteps:
    """Steps ``start .. stop-1`` of episode ``i`` of ``table`` out of the ring (copies)."""
    n = int(table.length[i])
    stop = n if stop is None else stop
    if not 0 <= start <= stop <= n:
        raise ValueError(f"steps [{start}, {stop}) out of range for an episode of {n} steps")
    rows = int(table.first_row[i]) + 1 + np.arange(start, stop, dtype=np.int64)
    slots = index.row_slots(int(table.stream[i]), rows)
    term, trunc = step_flags(arrays["flags"][slots], bool(table.ended[i]) and stop == n, bool(table.terminated[i]))
    return EpisodeSteps(arrays["action"][slots], arrays["reward"][slots], term, trunc,
                        {name: arrays["x_" + name][slots] for name in extra_names})
