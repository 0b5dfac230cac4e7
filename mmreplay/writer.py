"""The episode writer: the rules of ``reset()``/``step()``, for one env or a vector of envs.

It owns the open-episode state of every env stream (is an episode open, the
episode position of the stream's last frame, whether the episode lost its head)
and turns validated input into rows of the chunk log plus notes to the index.
Disk errors (``OSError``) propagate to the caller, which turns the store
read-only.

Episode rules (FORMAT.md and README):

- ``num_envs=1``: ``reset(obs)`` starts an episode; ``step()`` needs an open
  episode; after an episode ends (terminated or truncated) the next call must be
  ``reset()``; ``reset()`` while an episode is open ends it as truncated at its
  last recorded step (recorded by the new START row, never by rewriting a row).
- If both flags are set, ``terminated`` wins.
- Vector stores (Gymnasium's NEXT_STEP autoreset): after an env's episode ends,
  its next ``step()`` value is that env's reset observation; its action, reward,
  flags and extras are ignored and no transition is stored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._inputs import Inputs
from .errors import EpisodeStateError
from .layout import END, HEAD_LOST, LOST, MISSING, START, TERMINATED, TRUNCATED
from .log import ChunkLog
from .options import Schema


class EpisodeWriter:
    """``reset``/``step`` of one store's log."""

    def __init__(self, schema: Schema, log: ChunkLog, inputs: Inputs) -> None:
        self._schema = schema
        self._log = log
        self._inputs = inputs
        self._obs_dtype = schema.obs_dtype
        self._extra_names = tuple(e.name for e in schema.extras)
        self._arrays = log.ring.arrays
        n = schema.num_envs
        self._ep_open = np.zeros(n, np.bool_)  # per stream: an episode is open
        self._epos = np.zeros(n, np.int32)  # per stream: episode position of the last row
        self._lost = np.zeros(n, np.uint8)  # per stream: LOST bit of the open episode
        self._started = log.rows > 0
        if log.rows:  # resume from the last committed row of every stream
            ended, epos, lost = log.index.frame_state(log.stream_slots(log.rows - 1))
            self._ep_open[:] = ~ended
            self._epos[:] = epos
            self._lost[:] = np.where(lost, LOST, 0)

    def stored_by_next_step(self) -> int:
        """Transitions the next ``step()`` stores if it succeeds: one per stream with an open episode
        (an auto-reset stream stores none)."""
        return int(np.count_nonzero(self._ep_open)) if self._schema.vector else int(self._ep_open[0])

    @property
    def episode_open(self) -> np.ndarray:
        """Per env stream: whether an episode is open (a ``step()`` may follow). A copy, bool ``(num_envs,)``."""
        return self._ep_open.copy()

    # -- reset -----------------------------------------------------------------------------------------
    def reset(self, obs: Any, head_lost: bool = False) -> None:
        """Start new episode(s) with ``obs`` (batched ``(num_envs, *obs_shape)`` for vector stores).

        ``head_lost`` (unbatched stores, imports): the episode began earlier and its first frames were
        never stored; only its rows with a full stack history become sampleable.
        """
        frames = self._inputs.obs(obs, "obs")
        if head_lost and self._schema.vector:
            raise ValueError("reset(head_lost=True) is for stores with one env stream (vector=False)")
        n = self._schema.num_envs
        log = self._log
        if log.rows:
            prev = log.stream_slots(log.rows - 1)
            open_prev = prev[self._ep_open]
            if open_prev.size:
                log.index.mark_end(open_prev)
        slots = self._prepare_row() + np.arange(n, dtype=np.int64) * log.rows_per_stream
        flags = np.full(n, START | (HEAD_LOST if head_lost else 0), np.uint8)
        self._write(slots, frames.reshape((n,) + self._schema.obs_shape), None, None, flags, None)
        log.index.note_frames(slots, np.full(n, START, np.uint8), np.zeros(n, np.int32), np.full(n, -1, np.int64))
        if head_lost:
            log.index.mark_head_lost(int(slots[0]))
        log.finish_row(0)
        self._ep_open[:] = True
        self._epos[:] = 0
        self._lost[:] = LOST if head_lost else 0
        self._started = True

    # -- step ------------------------------------------------------------------------------------------
    def step(self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
             extras: dict[str, Any]) -> None:
        """Append one transition per env (see the module docstring for the rules).

        Unbatched stores take ``next_obs=None`` on a step that ends the episode when its final
        observation is not available (imports: Dopamine never stores it): the frame is stored as
        zeros and flagged missing; a terminated row then gets a zero ``next_obs``, and rows that
        would bootstrap from it are never sampleable.
        """
        if self._schema.vector:
            self._step_batched(action, reward, next_obs, terminated, truncated, extras)
            return
        if not self._ep_open[0]:
            raise EpisodeStateError(
                "step() without an open episode: call reset(obs) first" if not self._started else
                "step() after the episode ended (terminated or truncated): call reset(obs) to start the next one")
        inp = self._inputs
        act = inp.action(action)
        rew = inp.reward(reward)
        term = inp.flag("terminated", terminated)
        trunc = inp.flag("truncated", truncated) and not term
        if next_obs is None:
            if not (term or trunc):
                raise ValueError("next_obs=None (final observation missing) is only allowed on a step that"
                                 " ends the episode (terminated or truncated)")
            frame = np.zeros(self._schema.obs_shape, self._obs_dtype)
            missing = MISSING
        else:
            frame = inp.obs(next_obs)
            missing = 0
        xs = inp.extras(extras) if (extras or self._extra_names) else {}
        self._append_step(frame, act, rew, missing | (TERMINATED if term else (TRUNCATED if trunc else 0)), xs)

    def _append_step(self, frame: np.ndarray, act: Any, rew: Any, f: int, xs: dict[str, np.ndarray]) -> None:
        """Write one validated transition of the unbatched stream (``f``: its disk flag bits)."""
        log = self._log
        slot = self._prepare_row()
        arrays = self._arrays
        log.write_frame(slot, frame if frame.dtype == self._obs_dtype and frame.flags.c_contiguous
                        else np.ascontiguousarray(frame, self._obs_dtype))
        arrays["action"][slot] = act
        arrays["reward"][slot] = rew
        arrays["flags"][slot] = f
        for name, value in xs.items():
            arrays["x_" + name][slot] = value
        epos = int(self._epos[0]) + 1
        ends = f & (TERMINATED | TRUNCATED)
        log.index.note_frame(slot, f | (END if ends else 0) | int(self._lost[0]), epos, log.next_id)
        log.finish_row(1)
        self._epos[0] = epos
        if ends:
            self._ep_open[0] = False

    def _step_batched(self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
                      extras: dict[str, Any]) -> None:
        if not self._started:
            raise EpisodeStateError("step() before reset(): call reset(obs) with the first observations")
        if next_obs is None:
            raise ValueError("next_obs=None (final observation missing) is for stores with one env stream")
        inp = self._inputs
        frames = inp.obs(next_obs)
        act = inp.action(action)
        auto = ~self._ep_open
        rew = np.asarray(inp.reward(reward))
        term = np.asarray(inp.flag("terminated", terminated)) & ~auto
        trunc = np.asarray(inp.flag("truncated", truncated)) & ~term & ~auto
        bad = np.flatnonzero(~np.isfinite(rew) & ~auto)
        if bad.size:
            raise ValueError(f"reward: expected finite numbers, got {rew[bad[0]]} for env {bad[0]}")
        xs = inp.extras(extras)
        log = self._log
        n = self._schema.num_envs
        slots = self._prepare_row() + np.arange(n, dtype=np.int64) * log.rows_per_stream
        flags = np.where(auto, START, np.where(term, TERMINATED, np.where(trunc, TRUNCATED, 0))).astype(np.uint8)
        tx = ~auto
        self._write(slots, frames, act, rew, flags, xs, keep=tx)
        ids = np.where(tx, log.next_id + np.cumsum(tx) - 1, -1).astype(np.int64)
        epos = np.where(auto, 0, self._epos + 1).astype(np.int32)
        lost = np.where(auto, 0, self._lost).astype(np.uint8)
        ended = term | trunc
        log.index.note_frames(slots, flags | np.where(ended, END, 0).astype(np.uint8) | lost, epos, ids)
        log.finish_row(int(tx.sum()))
        self._epos[:] = epos
        self._lost[:] = lost
        self._ep_open[:] = ~ended

    def _write(self, slots: np.ndarray, frames: np.ndarray, act: np.ndarray | None, rew: np.ndarray | None,
               flags: np.ndarray, xs: dict[str, np.ndarray] | None, keep: np.ndarray | None = None) -> None:
        """Write one row of every stream; columns of rows not in ``keep`` (START frames) are zeroed."""
        a = self._arrays
        frames = np.ascontiguousarray(frames, self._obs_dtype)
        for i, slot in enumerate(slots.tolist()):
            self._log.write_frame(slot, frames[i])
        a["flags"][slots] = flags
        if keep is None or not keep.all():
            a["action"][slots] = 0
            a["reward"][slots] = 0
            for name in self._extra_names:
                a["x_" + name][slots] = 0
        if act is not None and keep is not None and keep.any():
            a["action"][slots[keep]] = act[keep]
            a["reward"][slots[keep]] = rew[keep] if rew is not None else 0
            for name, value in (xs or {}).items():
                a["x_" + name][slots[keep]] = value[keep]

    def _prepare_row(self) -> int:
        try:
            return self._log.prepare_row()
        finally:
            if self._arrays is not self._log.ring.arrays:  # the ring grew: new views
                self._arrays = self._log.ring.arrays
