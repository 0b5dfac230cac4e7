"""Writing into a store: the episode rules of ``reset()``/``step()``, for one env or a vector of envs.

A mixin of ``ReplayStore`` (kept apart so each file holds one concern); it
relies on the store's ``_log``, ``_inputs``, ``_schema`` and checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import EpisodeStateError, StoreIOError
from .index import END, HEAD_LOST, LOST, MISSING, START, TERMINATED, TRUNCATED

if TYPE_CHECKING:
    from ._inputs import Inputs
    from .log import ChunkLog
    from .options import Schema
    from .reader import FrameReader


class WriterMixin:
    """``reset``/``step`` of ``ReplayStore``."""

    _log: ChunkLog
    _inputs: Inputs
    _schema: Schema
    _reader: FrameReader
    _arrays: dict[str, np.ndarray]
    _ep_open: np.ndarray  # per stream: an episode is open
    _epos: np.ndarray  # per stream: episode position of the last row
    _lost: np.ndarray  # per stream: LOST bit of the open episode
    _started: bool
    _extra_names: tuple[str, ...]
    _obs_dtype: np.dtype

    if TYPE_CHECKING:  # provided by ReplayStore

        def _check_writable(self) -> None: ...

        def _fail(self, exc: OSError, doing: str) -> StoreIOError: ...

    def reset(self, obs: Any) -> None:
        """Start new episode(s) with ``obs`` (batched ``(num_envs, *obs_shape)`` for vector stores).

        An episode still open is ended as truncated at its last recorded step.
        """
        self._check_writable()
        frames = self._inputs.obs(obs, "obs")
        n = self._schema.num_envs
        log = self._log
        if log.rows:
            prev = log.stream_slots(log.rows - 1)
            open_prev = prev[self._ep_open]
            if open_prev.size:
                log.index.mark_end(open_prev)
        slot0 = self._prepare_row()
        slots = slot0 + np.arange(n, dtype=np.int64) * log.rs
        zeros = np.zeros(n, np.int64)
        self._write(slots, frames.reshape((n,) + self._schema.obs_shape), None, None,
                    np.full(n, START, np.uint8), None)
        log.index.note_frames(slots, np.full(n, START, np.uint8), zeros.astype(np.int32), np.full(n, -1, np.int64))
        log.finish_row(0)
        self._ep_open[:] = True
        self._epos[:] = 0
        self._lost[:] = 0
        self._started = True

    def step(self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
             **extras: Any) -> None:
        """Append one transition per env: the outcome of taking ``action`` in the current state.

        Unbatched (``num_envs=1``): needs an open episode (``reset()`` first; after an episode ends,
        ``reset()`` again). Vector stores: arrays with a leading ``num_envs`` axis; an env whose episode
        ended at its previous step is auto-reset (Gymnasium NEXT_STEP): its ``next_obs`` becomes the new
        episode's first observation and its action, reward, flags and extras are ignored.
        If both flags are set, ``terminated`` wins.
        """
        self._check_writable()
        if self._schema.vector:
            self._step_batched(action, reward, next_obs, terminated, truncated, extras)
            return
        if not self._ep_open[0]:
            raise EpisodeStateError(
                "step() without an open episode: call reset(obs) first" if not self._started else
                "step() after the episode ended (terminated or truncated): call reset(obs) to start the next one")
        inp = self._inputs
        frame = inp.obs(next_obs)
        act = inp.action(action)
        rew = inp.reward(reward)
        term = inp.flag("terminated", terminated)
        trunc = inp.flag("truncated", truncated) and not term
        xs = inp.extras(extras) if (extras or self._extra_names) else {}
        self._append_step(frame, act, rew, TERMINATED if term else (TRUNCATED if trunc else 0), xs)

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
        idx = log.index
        nid = log.next_id
        epos = int(self._epos[0]) + 1
        ends = f & (TERMINATED | TRUNCATED)
        if f & MISSING:
            idx.has_missing = True
        idx.flags[slot] = f | (END if ends else 0) | int(self._lost[0])
        idx.epos[slot] = epos
        idx.slot_id[slot] = nid
        idx.id2slot[nid % idx.id2slot.size] = slot
        log.finish_row(1)
        self._epos[0] = epos
        if ends:
            self._ep_open[0] = False

    # -- importers -------------------------------------------------------------------------------------
    def _import_reset(self, obs: Any, head_lost: bool = False) -> None:
        """``reset`` for importers (unbatched stores): ``head_lost`` marks an episode whose first frames the
        source no longer had (e.g. the oldest episode of a wrapped ring); only its rows with a full
        stack history become sampleable."""
        self.reset(obs)
        if head_lost:
            slot = int(self._log.stream_slots(self._log.rows - 1)[0])
            self._arrays["flags"][slot] = START | HEAD_LOST
            self._log.index.flags[slot] |= HEAD_LOST | LOST
            self._lost[0] = LOST

    def _import_final_missing(self, action: Any, reward: Any, terminated: bool, truncated: bool,
                              **extras: Any) -> None:
        """The last step of an episode whose final observation the source lacks (Dopamine never stores
        the terminal frame; D4RL without next_observations). The frame is stored as zeros and flagged
        MISSING: terminated rows get a zero ``next_obs``; rows that would bootstrap from it are never
        sampleable."""
        self._check_writable()
        if self._schema.vector or not self._ep_open[0]:
            raise EpisodeStateError("_import_final_missing needs an unbatched store with an open episode")
        inp = self._inputs
        inp.flag("truncated", truncated)  # validated; the episode ends here as truncated unless terminated
        f = MISSING | (TERMINATED if inp.flag("terminated", terminated) else TRUNCATED)
        zero = np.zeros(self._schema.obs_shape, self._obs_dtype)
        self._append_step(zero, inp.action(action), inp.reward(reward), f,
                          inp.extras(extras) if (extras or self._extra_names) else {})

    def _step_batched(self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
                      extras: dict[str, Any]) -> None:
        if not self._started:
            raise EpisodeStateError("step() before reset(): call reset(obs) with the first observations")
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
        slot0 = self._prepare_row()
        slots = slot0 + np.arange(n, dtype=np.int64) * log.rs
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
        except OSError as exc:
            raise self._fail(exc, "opening a new chunk") from exc
        finally:
            if self._arrays is not self._log.ring.arrays:  # the ring grew: new views
                self._arrays = self._log.ring.arrays
                self._reader.frames = self._arrays["obs"]

    def _load_stream_state(self) -> None:
        """Per-stream episode state, derived from the last committed row."""
        log = self._log
        self._started = log.rows > 0
        if log.rows:
            slots = log.stream_slots(log.rows - 1)
            f = log.index.flags[slots]
            self._ep_open[:] = (f & END) == 0
            self._epos[:] = log.index.epos[slots]
            self._lost[:] = f & LOST
