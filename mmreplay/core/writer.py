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
- ``extend(env=s)`` appends a block of steps of one stream and ``reset(obs, env=s)``
  starts one stream's episode: streams may then advance apart (the log gives each
  its own rows). A block may end its episode only at its last step; the stream's
  next call must then be ``reset(obs, env=s)`` (or a batched ``step()``, whose
  autoreset applies). A block is validated whole before a row is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .._inputs import Block, Inputs
from ..errors import EpisodeStateError
from ..options import Schema
from ..storage.ring import fault_checked
from .layout import END, HEAD_LOST, LOST, MISSING, START, TERMINATED, TRUNCATED
from .log import ChunkLog

T = TypeVar("T")


class EpisodeWriter:
    """``reset``/``step`` of one store's log."""

    def __init__(self, schema: Schema, log: ChunkLog, inputs: Inputs) -> None:
        self._schema = schema
        self._log = log
        self._ring = log.ring  # (what fault_checked checks)
        self._inputs = inputs
        self._obs_dtype = schema.obs_dtype
        self._extra_names = tuple(e.name for e in schema.extras)
        self._arrays = log.ring.arrays
        n = schema.num_envs
        self._ep_open = np.zeros(n, np.bool_)  # per stream: an episode is open
        self._episode_pos = np.zeros(n, np.int32)  # per stream: episode position of the last row
        self._lost = np.zeros(n, np.uint8)  # per stream: LOST bit of the open episode
        self._started = log.rows > 0  # per stream: it wrote a frame
        self._ids = schema.id_column  # chunks record each row's transition id
        if self._started.any():  # resume from the last committed frame of every stream
            ended, episode_pos, lost = log.index.stream_state()
            self._ep_open[:] = ~ended
            self._episode_pos[:] = episode_pos
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
    @fault_checked
    def reset(self, obs: Any, head_lost: bool = False, env: int | None = None) -> None:
        """Start new episode(s) with ``obs`` (batched ``(num_envs, *obs_shape)`` for vector stores).

        ``env=s``: start stream ``s``'s episode only, with its single observation ``obs``.
        ``head_lost`` (streams of one, imports): the episode began earlier and its first frames were
        never stored; only its rows with a full stack history become sampleable.
        """
        if env is not None:
            s = self._stream(env, "reset")
            if self._schema.vector:
                frame = self._inputs.one_obs(obs, "obs")
                if head_lost:
                    raise ValueError("reset(head_lost=True) is for stores with one env stream (vector=False)")
                self._reset_stream(s, frame, False)
                return
        frames = self._inputs.obs(obs, "obs")
        if head_lost and self._schema.vector:
            raise ValueError("reset(head_lost=True) is for stores with one env stream (vector=False)")
        n = self._schema.num_envs
        if n == 1:
            self._reset_stream(0, frames.reshape(self._schema.obs_shape), head_lost)
            return
        log = self._log
        self._end_open(np.arange(n))
        slots = self._prepare(log.prepare_rows)
        flags = np.full(n, START, np.uint8)
        self._write(slots, frames.reshape((n,) + self._schema.obs_shape), None, None, flags, None)
        log.index.note_frames(slots, flags, np.zeros(n, np.int32), np.full(n, -1, np.int64))
        log.finish_row(0)
        self._ep_open[:] = True
        self._episode_pos[:] = 0
        self._lost[:] = 0
        self._started[:] = True

    def _reset_stream(self, s: int, frame: np.ndarray, head_lost: bool) -> None:
        """One START row of stream ``s`` (validated ``frame``)."""
        log = self._log
        self._end_open(np.array([s]))
        slot, _ = self._prepare(lambda: log.prepare_run(s))
        flags = START | (HEAD_LOST if head_lost else 0)
        log.write_frames(slot, self._contiguous(frame))
        a = self._arrays
        a["action"][slot] = 0
        a["reward"][slot] = 0
        a["flags"][slot] = flags
        for name in self._extra_names:
            a["x_" + name][slot] = 0
        if self._ids:
            a["id"][slot] = -1
        log.index.note_frames(np.array([slot]), np.array([START], np.uint8), np.zeros(1, np.int32),
                              np.full(1, -1, np.int64))
        if head_lost:
            log.index.mark_head_lost(slot)
        log.finish_run(s, 1, 0)
        self._ep_open[s] = True
        self._episode_pos[s] = 0
        self._lost[s] = LOST if head_lost else 0
        self._started[s] = True

    def _end_open(self, streams: np.ndarray) -> None:
        """A START is about to follow: the open episodes of ``streams`` end at their last (retained) frame."""
        streams = streams[self._ep_open[streams]]
        if streams.size:
            last = self._log.index.last_slots()[streams]
            last = last[last >= 0]
            if last.size:
                self._log.index.mark_end(last)

    def _stream(self, env: Any, what: str) -> int:
        n = self._schema.num_envs
        if isinstance(env, bool) or not isinstance(env, (int, np.integer)) or not 0 <= env < n:
            raise ValueError(f"{what}(env=...): expected an env stream index in 0..{n - 1}, got {env!r}")
        if n > 1 and not self._ids:
            raise ValueError(
                f"{what}(env={env}): this store was created by an older mmreplay (its chunks record no ids),"
                " which keeps its env streams in lockstep; write it with batched reset()/step(), or export it"
                " and import it into a new store")
        return int(env)

    # -- step ------------------------------------------------------------------------------------------
    @fault_checked
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
                "step() without an open episode: call reset(obs) first" if not self._started[0] else
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
        slot = log.prepare_row()
        if self._arrays is not log.ring.arrays:  # a roll grew the ring: new views
            self._arrays = log.ring.arrays
        arrays = self._arrays
        log.write_frame(slot, frame if frame.dtype == self._obs_dtype and frame.flags.c_contiguous
                        else np.ascontiguousarray(frame, self._obs_dtype))
        arrays["action"][slot] = act
        arrays["reward"][slot] = rew
        arrays["flags"][slot] = f
        for name, value in xs.items():
            arrays["x_" + name][slot] = value
        episode_pos = int(self._episode_pos[0]) + 1
        ends = f & (TERMINATED | TRUNCATED)
        log.index.note_frame(slot, f | (END if ends else 0) | int(self._lost[0]), episode_pos, log.next_id)
        log.finish_row(1)
        self._episode_pos[0] = episode_pos
        if ends:
            self._ep_open[0] = False

    def _step_batched(self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
                      extras: dict[str, Any]) -> None:
        if not self._started.all():
            which = "" if not self._started.any() else f" of env {int(np.flatnonzero(~self._started)[0])}"
            raise EpisodeStateError(f"step() before reset(){which}: call reset(obs) with the first observations")
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
        slots = self._prepare(log.prepare_rows)
        flags = np.where(auto, START, np.where(term, TERMINATED, np.where(trunc, TRUNCATED, 0))).astype(np.uint8)
        tx = ~auto
        ids = np.where(tx, log.next_id + np.cumsum(tx) - 1, -1).astype(np.int64)
        self._write(slots, frames, act, rew, flags, xs, keep=tx, ids=ids)
        episode_pos = np.where(auto, 0, self._episode_pos + 1).astype(np.int32)
        lost = np.where(auto, 0, self._lost).astype(np.uint8)
        ended = term | trunc
        log.index.note_frames(slots, flags | np.where(ended, END, 0).astype(np.uint8) | lost, episode_pos, ids)
        log.finish_row(int(tx.sum()))
        self._episode_pos[:] = episode_pos
        self._lost[:] = lost
        self._ep_open[:] = ~ended

    def _write(self, slots: np.ndarray, frames: np.ndarray, act: np.ndarray | None, rew: np.ndarray | None,
               flags: np.ndarray, xs: dict[str, np.ndarray] | None, keep: np.ndarray | None = None,
               ids: np.ndarray | None = None) -> None:
        """Write one row of every stream; columns of rows not in ``keep`` (START frames) are zeroed."""
        a = self._arrays
        frames = np.ascontiguousarray(frames, self._obs_dtype)
        for i, slot in enumerate(slots.tolist()):
            self._log.write_frame(slot, frames[i])
        a["flags"][slots] = flags
        if self._ids:
            a["id"][slots] = -1 if ids is None else ids
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

    # -- extend ----------------------------------------------------------------------------------------
    def extend(self, env: Any, actions: Any, rewards: Any, next_obs: Any, terminated: Any, truncated: Any,
               extras: dict[str, Any], final_missing: bool = False) -> int:
        """Append a block of consecutive steps of stream ``env`` (leading time axis on every array).

        The rules of ``step()``: the stream needs an open episode; an episode end (terminated or
        truncated; terminated wins) may only be the block's last step, and closes the episode.
        ``final_missing=True``: the block ends its episode and its final observation is not available
        (imports): ``next_obs`` then holds the other ``L - 1`` frames. Everything is validated before
        a row is written (``check_extend``); rows go into the stream's extents of the open chunk, a run of
        consecutive slots per write (one ``pwrite`` of the frames, slice stores for the small columns).
        Returns the id of the block's first transition.
        """
        s, blk = self.check_extend(env, actions, rewards, next_obs, terminated, truncated, extras, final_missing)
        return self.write_extend(s, blk, bool(final_missing))

    def check_extend(self, env: Any, actions: Any, rewards: Any, next_obs: Any, terminated: Any, truncated: Any,
                     extras: dict[str, Any], final_missing: bool = False) -> tuple[int, Block]:
        """Validate an ``extend()`` call without writing: (stream, block). Raises as ``extend()`` does."""
        s = self._stream(env, "extend")
        blk = self._inputs.block(actions, rewards, next_obs, terminated, truncated, extras, bool(final_missing))
        if not self._ep_open[s]:
            hint = f"reset(obs, env={s})" if self._schema.vector else "reset(obs)"
            raise EpisodeStateError(
                f"extend(env={s}) without an open episode: call {hint} first" if not self._started[s] else
                f"extend(env={s}) after the episode ended (terminated or truncated): call {hint} to start the next one")
        return s, blk

    @fault_checked
    def write_extend(self, s: int, blk: Block, final_missing: bool) -> int:
        """Write a block ``check_extend`` accepted for stream ``s``; returns its first id."""
        n = blk.length
        log = self._log
        first_id = log.next_id
        if n == 0:
            return first_id
        ends = blk.terminated | blk.truncated
        f = np.where(blk.terminated, TERMINATED, np.where(blk.truncated, TRUNCATED, 0)).astype(np.uint8)
        if final_missing:
            f[-1] |= MISSING
        ram = f | self._lost[s]
        if ends[-1]:
            ram[-1] |= END
        episode_pos = (int(self._episode_pos[s]) + 1 + np.arange(n)).astype(np.int32)
        ids = first_id + np.arange(n, dtype=np.int64)
        done = 0
        while done < n:
            slot, room = self._prepare(lambda: log.prepare_run(s))
            stop = done + min(room, n - done)
            self._write_run(slot, blk, done, stop, f, ids)
            log.index.note_frames(slot + np.arange(stop - done, dtype=np.int64), ram[done:stop], episode_pos[done:stop],
                                  ids[done:stop])
            log.finish_run(s, stop - done, stop - done)
            done = stop
        self._episode_pos[s] = episode_pos[-1]
        if ends[-1]:
            self._ep_open[s] = False
        return first_id

    def _write_run(self, slot: int, blk: Block, a: int, b: int, flags: np.ndarray, ids: np.ndarray) -> None:
        """Steps ``a .. b-1`` of a validated block into consecutive slots of one section."""
        log, arr = self._log, self._arrays
        real = min(b, blk.frames.shape[0])  # the block's missing final frame has no row in ``frames``
        if real > a:
            log.write_frames(slot, np.ascontiguousarray(blk.frames[a:real], self._obs_dtype))
        if real < b:
            log.write_frames(slot + real - a, np.zeros((b - real, *self._schema.obs_shape), self._obs_dtype))
        end = slot + (b - a)
        arr["action"][slot:end] = blk.actions[a:b]
        arr["reward"][slot:end] = blk.rewards[a:b]
        arr["flags"][slot:end] = flags[a:b]
        for name, value in blk.extras.items():
            arr["x_" + name][slot:end] = value[a:b]
        if self._ids:
            arr["id"][slot:end] = ids[a:b]

    # -- helpers ---------------------------------------------------------------------------------------
    def _contiguous(self, frame: np.ndarray) -> np.ndarray:
        if frame.dtype == self._obs_dtype and frame.flags.c_contiguous:
            return frame
        return np.ascontiguousarray(frame, self._obs_dtype)

    def _prepare(self, fn: Callable[[], T]) -> T:
        """Call a log ``prepare_*`` method; a roll may have grown the ring, giving new array views."""
        try:
            return fn()
        finally:
            if self._arrays is not self._log.ring.arrays:
                self._arrays = self._log.ring.arrays
