"""Import Dopamine replay checkpoints (the DQN Replay Dataset) into a store, and describe them.

A checkpoint suffix ``N`` is a set of gzip'd ``.npy`` files in one directory:
``$store$_observation_ckpt.N.gz`` (C slots of frames), ``$store$_action``, ``$store$_reward``,
``$store$_terminal`` (C each), ``add_count`` (0-d) and ``invalid_range``; newer Dopamine adds a
pickled ``episode_end_indices`` (read without unpickling, see ``_pickled_ints``) and any
``$store$_<extra>``. Dopamine's conventions, which this module follows exactly:

- ``add()`` writes row ``(o_t, a_t, r_t, terminal_t)`` at slot ``add_count % C``; the next
  observation is the next row's frame. An episode's final observation is never stored.
- ``stack_size - 1`` padding rows (zero frame, action 0, reward 0, terminal 0) precede the first
  row of every episode and of the buffer.
- ``terminal`` marks every episode end in the public dataset, the time limit included; newer
  versions mark non-terminal ends in ``episode_end_indices``.
- ``invalid_range`` holds slots ``cursor - update_horizon .. cursor + stack_size - 1``, so it
  tells ``stack_size`` and ``update_horizon``; the cursor slot is stale (oldest in the ring).
- The logged buffer writes suffix ``N`` right after an add leaves ``add_count % C == C - 1``:
  suffix ``N`` then holds adds ``[add_count - C, add_count)`` and consecutive suffixes continue
  each other exactly. ``log_final_buffer`` writes ``add_count = cursor`` instead.

How rows become the store: rows are taken in add order (oldest first); suffixes given
together are joined by add index (overlapping rows are checked to agree and imported once;
a gap ends the open episode). A fresh ring whose start was overwritten begins with the row
after the cursor: unless that stale row ended an episode, its episode lost its start and is
written with ``reset(obs, head_lost=True)``. Each episode's steps go to the store in blocks
(``extend``); its last step has no final observation (``final_missing=True``: terminated, or
truncated for a non-terminal end). The episode still
running at the last row stays open: its last row has no next frame.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..store import ReplayStore
from ._bounds import nbytes, rows_per_piece
from ._common import ProgressArg, progress_bar, summary_lines
from ._dopamine_files import PREFIX, Checkpoint, check_overlap, column_specs, conform, scan
from ._gznpy import RowBlocks
from ._importing import StoreBuilder, sampling_params
from ._location import Location
from .errors import DatasetError

BLOCK = 1024  # frames per block handed over by the inflating thread
HEAD_AHEAD = 256  # a first slot run this short is inflated while the previous checkpoint imports


class _RowWriter:
    """Turns Dopamine rows (in add order) into ``reset``/``extend`` calls on the store.

    Row ``i`` of an episode holds ``(o_i, a_i, r_i, terminal_i)``: its transition's next observation is
    the next row's frame, so a row waits (``pending``) until that frame arrives. The transitions of a
    block of rows go to the store in one ``extend`` per episode piece.
    """

    def __init__(self, store: ReplayStore, stack_size: int) -> None:
        self.store = store
        self.pad = stack_size - 1
        self.pad_left = 0
        self.pending: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None = None  # open episode's last row
        self.head_lost_next = False
        self.at_buffer_start = False
        self.counts = {"episodes": 0, "terminated": 0, "truncated": 0, "head_lost": 0}

    def fresh(self, ended_before: bool | None) -> None:
        """A new stretch of rows that does not continue the previous one. ``ended_before``: the row
        before it ended an episode (True), did not (False), or there is none (None: a buffer start)."""
        self.pending = None  # the open episode ends at its last step (the next reset truncates it)
        self.pad_left = self.pad if ended_before is not False else 0
        self.head_lost_next = ended_before is False
        self.at_buffer_start = ended_before is None

    def rows(self, frames: np.ndarray, act: np.ndarray, rew: np.ndarray, term: np.ndarray, end: np.ndarray,
             extras: dict[str, np.ndarray], where: Any) -> None:
        store, n, j = self.store, len(frames), 0
        while j < n:
            if self.pad_left:
                k = min(self.pad_left, n - j)
                self._check_padding(frames, act, rew, term, end, j, j + k, where, self.at_buffer_start, self.pad)
                self.pad_left -= k
                j += k
                continue
            self.at_buffer_start = False
            if self.pending is None:  # row j starts an episode
                store.reset(frames[j], head_lost=self.head_lost_next)
                self.counts["episodes"] += 1
                self.counts["head_lost"] += int(self.head_lost_next)
                self.head_lost_next = False
                self.pending = (act[j:j + 1], rew[j:j + 1], {x: v[j:j + 1] for x, v in extras.items()})
                j = self._close(frames, act, rew, term, extras, j + 1, j) if end[j] else j + 1
                continue
            hits = np.flatnonzero(end[j:])
            if hits.size:
                j = self._close(frames, act, rew, term, extras, j, j + int(hits[0]))
            else:  # every row to the block's end continues the episode; the last one waits for its frame
                pa, pr, px = self.pending
                xs: dict[str, Any] = {x: np.concatenate([px[x], v[j:n - 1]]) for x, v in extras.items()}
                store.extend(np.concatenate([pa, act[j:n - 1]]), np.concatenate([pr, rew[j:n - 1]]), frames[j:n],
                             np.zeros(n - j, np.bool_), np.zeros(n - j, np.bool_), **xs)
                self.pending = (act[n - 1:n], rew[n - 1:n], {x: v[n - 1:n] for x, v in extras.items()})
                j = n

    def _close(self, frames: np.ndarray, act: np.ndarray, rew: np.ndarray, term: np.ndarray,
               extras: dict[str, np.ndarray], first: int, e: int) -> int:
        """The open episode ends at row ``e`` (its final observation is never stored). Its transitions: the
        pending row's (next frame: row ``first``), then those of rows ``first .. e``, each followed by the
        next row's frame, the last by none. Returns the row after ``e``."""
        assert self.pending is not None
        pa, pr, px = self.pending
        rows = slice(first, e + 1)
        acts = np.concatenate([pa, act[rows]])
        terminal = bool(term[e])
        last = np.zeros(acts.shape[0], np.bool_)
        last[-1] = True
        none = np.zeros_like(last)
        xs: dict[str, Any] = {x: np.concatenate([px[x], v[rows]]) for x, v in extras.items()}
        self.store.extend(acts, np.concatenate([pr, rew[rows]]), frames[rows], last if terminal else none,
                          none if terminal else last, final_missing=True, **xs)
        self.counts["terminated" if terminal else "truncated"] += 1
        self.pending = None
        self.pad_left = self.pad
        return e + 1

    @staticmethod
    def _check_padding(frames: np.ndarray, act: np.ndarray, rew: np.ndarray, term: np.ndarray, end: np.ndarray,
                       a: int, b: int, where: Any, at_buffer_start: bool = False, pad: int = 0) -> None:
        """Rows ``a .. b-1`` must be Dopamine's zero padding rows."""
        data = ((act[a:b].reshape(b - a, -1) != 0).any(axis=1) | (rew[a:b] != 0) | (term[a:b] != 0) | end[a:b]
                | frames[a:b].reshape(b - a, -1).any(axis=1))
        if data.any():
            j = a + int(np.flatnonzero(data)[0])
            hint = (" (a checkpoint written by log_final_buffer records its cursor as add_count: import"
                    " it together with the checkpoint logged before it)" if at_buffer_start else "")
            raise DatasetError(f"{where(j)}: expected a zero padding row ({pad} precede every episode"
                               f" in Dopamine's layout), found data{hint}")

def _slot_runs(start: int, stop: int, slots: int) -> list[tuple[int, int]]:
    """Slot ranges holding add indices ``[start, stop)``, in add order (at most two: the ring wraps)."""
    if stop <= start:
        return []
    s0 = start % slots
    n = stop - start
    return [(s0, s0 + n)] if s0 + n <= slots else [(s0, slots), (0, s0 + n - slots)]


def import_dqn_replay(src: Any, path: str | os.PathLike[str], *, suffixes: Any = None,
                      stack: int | None = None, n_step: int | None = None, gamma: float | None = None,
                      pad: str | None = None, capacity: int | None = None, chunk_size: int | None = None,
                      storage_options: dict[str, Any] | None = None,
                      seed: int = 0, progress: ProgressArg = True) -> ReplayStore:
    loc = Location.of(src, storage_options)
    ckpts = scan(loc, suffixes)
    # which add indices each checkpoint contributes, and whether it continues the previous one
    segments: list[tuple[Checkpoint, int, bool]] = []
    cur: int | None = None
    for c in ckpts:
        if c.hi == 0 or (cur is not None and c.hi <= cur):
            continue  # empty, or entirely rows already taken
        if cur is not None and c.lo <= cur:
            segments.append((c, cur, True))
        else:
            segments.append((c, c.lo + (1 if c.wrapped else 0), False))  # the cursor slot is stale
        cur = c.hi
    if not segments:
        raise DatasetError(f"{os.fspath(src)}: the checkpoints hold no rows (add_count 0)")
    total = sum(c.hi - start for c, start, _ in segments)
    first = segments[0][0]
    first.load()
    specs = column_specs(first)
    recorded = {"stack": first.stack_size, "n_step": first.update_horizon, "pad": "zeros"}
    extras = {k: (tuple(first.columns[k].shape[1:]), first.columns[k].dtype) for k in first.extras}
    meta: dict[str, Any] = {"source": {
        "format": "dqn-replay", "path": str(loc) if loc.remote else os.path.abspath(loc.path),
        "suffixes": [c.suffix for c, _, _ in segments], "stack_size": first.stack_size,
        "update_horizon": first.update_horizon,
        "terminal_marks_time_limit": not first.has_end_indices,
        "rewards_note": "Dopamine's Atari runner clips rewards to [-1, 1] before adding them; the rewards are"
                        " stored as found (unclipped returns are not recoverable)",
        "checkpoints": []}}
    src_meta = meta["source"]
    rmin, rmax = np.inf, -np.inf
    with StoreBuilder(path) as b:
        store = b.create(capacity=capacity or max(1, total), obs_shape=first.obs_shape, obs_dtype=first.obs_dtype,
                         action_shape=tuple(first.columns["action"].shape[1:]),
                         action_dtype=first.columns["action"].dtype, extras=extras or None, chunk_size=chunk_size,
                         seed=seed, metadata=meta,
                         **sampling_params(recorded, stack=stack, n_step=n_step, gamma=gamma, pad=pad))
        writer = _RowWriter(store, first.stack_size)
        prev: Checkpoint | None = None
        ahead: dict[int, RowBlocks] = {}
        with contextlib.ExitStack() as cleanup, progress_bar(progress, total, "import dqn-replay") as bar:
            cleanup.callback(_close_all, ahead)
            for k, (c, start, continues) in enumerate(segments):
                if not c.columns:
                    c.load()
                    conform(c, specs, first)
                cols = c.columns
                if continues and prev is not None:
                    check_overlap(prev, c, start)
                else:
                    ctx = None if not c.wrapped else bool(cols["end"][c.lo % c.slots])
                    writer.fresh(ctx)
                if prev is not None:
                    prev.columns = {}  # free the previous checkpoint's columns
                slots = np.arange(start, c.hi, dtype=np.int64) % c.slots
                act = cols["action"][slots]
                rew = cols["reward"][slots].astype(np.float64)
                _check_rewards(c, rew, slots)
                if rew.size:
                    rmin, rmax = min(rmin, float(rew.min())), max(rmax, float(rew.max()))
                term, end = cols["terminal"][slots] != 0, cols["end"][slots]
                xs = {name: cols[name][slots] for name in c.extras}
                done = 0
                obs_path = c.path(PREFIX + "observation")
                if k + 1 < len(segments):
                    _read_ahead(k + 1, segments[k + 1], ahead)
                for r, (lo, hi) in enumerate(_slot_runs(start, c.hi, c.slots)):
                    with _frames_of(obs_path, lo, hi, ahead.pop(k) if r == 0 and k in ahead else None,
                                    _block(c)) as blocks:
                        for frames in blocks:
                            n = len(frames)
                            sl = slice(done, done + n)
                            base_slot = int(slots[done])
                            a = act[sl]
                            try:
                                writer.rows(frames, a, rew[sl], term[sl], end[sl], {x: v[sl] for x, v in xs.items()},
                                            lambda j, s=base_slot, p=obs_path, m=c.slots: f"{p}: slot {(s + j) % m}")
                            except DatasetError:
                                raise
                            except (ValueError, TypeError) as exc:  # the store's checks name no file
                                raise DatasetError(f"{c.dir}: checkpoint {c.suffix}, slots {base_slot:,} .."
                                                   f" {base_slot + n - 1:,}: the store refused these rows: {exc}"
                                                   ) from None
                            done += n
                            bar.update(n)
                src_meta["checkpoints"].append({
                    "suffix": c.suffix, "slots": c.slots, "add_count": c.add_count, "cursor": c.cursor,
                    "final_buffer": c.true_add_count != c.add_count, "first_add": start, "rows": c.hi - start,
                    "episode_end_indices": "read" if c.has_end_indices else "absent"})
                prev = c
        src_meta.update(writer.counts, running=int(writer.pending is not None),
                        reward_range=[rmin, rmax] if np.isfinite(rmin) else None,
                        rewards_clipped=bool(not np.isfinite(rmin) or (rmin >= -1 and rmax <= 1)))
        store.metadata = meta
        return b.finish()


def _check_rewards(c: Checkpoint, rew: np.ndarray, slots: np.ndarray) -> None:
    """Rewards are stored as float32: refuse one that is not finite there, naming its slot."""
    bad = np.flatnonzero(~(np.abs(rew) <= np.finfo(np.float32).max))
    if bad.size:
        j = int(bad[0])
        raise DatasetError(f"{c.path(PREFIX + 'reward')}: {PREFIX}reward holds {float(rew[j])} at slot"
                           f" {int(slots[j])}; expected finite rewards within float32's range (the store keeps"
                           " them as float32)")


def _read_ahead(index: int, entry: tuple[Checkpoint, int, bool], ahead: dict[int, RowBlocks]) -> None:
    """Start inflating the next checkpoint's first slot run when it is short: in a logged buffer it is the
    single stale row at the end of the file (slot C-1), which would otherwise cost a whole extra pass."""
    c, start, _ = entry
    runs = _slot_runs(start, c.hi, c.slots)
    if len(runs) == 2 and runs[0][1] - runs[0][0] <= HEAD_AHEAD:
        ahead[index] = RowBlocks(c.path(PREFIX + "observation"), PREFIX + "observation", *runs[0],
                                 block=min(HEAD_AHEAD, _block(c)))


def _close_all(ahead: dict[int, RowBlocks]) -> None:
    for rb in ahead.values():
        rb.close()


def _block(c: Checkpoint) -> int:
    """Frames per block: ``BLOCK``, fewer for large frames (a block is a few tens of MB at most)."""
    return rows_per_piece(nbytes(c.obs_shape, c.obs_dtype), BLOCK)


@contextlib.contextmanager
def _frames_of(path: Location, lo: int, hi: int, ready: RowBlocks | None, block: int) -> Iterator[RowBlocks]:
    """Blocks of frame rows ``[lo, hi)``, streamed by a thread (started earlier when ``ready``)."""
    with ready if ready is not None else RowBlocks(path, PREFIX + "observation", lo, hi, block) as blocks:
        yield blocks


def describe_dqn_replay(src: Any, storage_options: dict[str, Any] | None = None) -> list[str]:
    loc = Location.of(src, storage_options)
    ckpts = scan(loc)
    lines = [f"dataset     {loc} (Dopamine replay checkpoints, {len(ckpts)} suffixes:"
             f" {', '.join(str(c.suffix) for c in ckpts[:12])}{' ...' if len(ckpts) > 12 else ''})"]
    first = ckpts[0]
    first.load()
    cols = first.columns
    n = first.hi - first.lo
    adds = (np.arange(first.lo, first.hi) % first.slots) if n else np.zeros(0, np.int64)
    end = cols["end"][adds]
    ends = np.flatnonzero(end)
    lengths = np.diff(ends) - first.stack_size + 1 if ends.size > 1 else np.zeros(0, np.int64)
    rew = cols["reward"][adds].astype(np.float64)
    cs = np.concatenate(([0.0], np.cumsum(rew)))
    returns = cs[ends[1:] + 1] - cs[ends[:-1] + 1] if ends.size > 1 else np.zeros(0)
    lines.append(f"checkpoint  {first.suffix}: {first.slots:,} slots, add_count {first.add_count:,}, cursor"
                 f" {first.cursor:,}, {'wrapped' if first.wrapped else 'not full'}; stack_size {first.stack_size},"
                 f" update_horizon {first.update_horizon}; {int(end.sum()):,} episode ends")
    lines.append(f"whole       {lengths.size:,} episodes between its first and last episode end:")
    lines += summary_lines(lengths, returns, first.obs_shape, first.obs_dtype, tuple(cols["action"].shape[1:]),
                           cols["action"].dtype)
    lines.append(f"rewards     min {rew.min() if rew.size else 0:.6g}, max {rew.max() if rew.size else 0:.6g}"
                 " (Dopamine clips them to [-1, 1] before adding)")
    if len(ckpts) > 1:
        lines.append(f"all         {sum(c.hi - c.lo for c in ckpts):,} rows in {len(ckpts)} checkpoints"
                     f" (add counts {ckpts[0].add_count:,} .. {ckpts[-1].add_count:,})")
    return lines
