"""``ReplayStore``: the public face of a store directory.

A store is an append-only log of chunk files (see ``log`` and FORMAT.md) plus
an in-RAM index deciding what may be sampled. This module holds the episode
rules (reset/step, vector autoreset), sampling, and the commit protocol.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _inputs
from .batch import Batch, assemble
from .errors import (
    EpisodeStateError,
    NotAStoreError,
    NotSampleableError,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreIOError,
    StoreLockedError,
)
from .index import END, LOST, START, TERMINATED, TRUNCATED
from .log import ChunkLog
from .options import Prioritized, Schema
from .reader import FrameReader
from .sampling import uniform
from .storage.manifest import read_manifest, write_manifest

__all__ = ["ReplayStore"]

_LOCK = "lock"


class ReplayStore:
    """A disk-backed replay store. Build one with ``create``, ``open``, ``load`` (or ``from_env``).

    Frames live in memory-mapped chunk files under ``path``; RAM holds the
    index (~14 bytes per slot) and, for prioritized stores, the sum tree.
    Writing: ``reset(obs)`` then ``step(action, reward, next_obs, terminated, truncated, **extras)``.
    Reading: ``sample``, ``gather``, ``iter_batches``, ``current_obs``.
    Durability: ``commit()`` is the only resume point besides ``close()``.
    """

    # -- construction ----------------------------------------------------------------------------------
    def __init__(self, path: str, schema: Schema, manifest: dict[str, Any], mode: str,
                 seed: int | None, lock_fd: int | None, read_threads: int | None = None) -> None:
        self._path = path
        self._schema = schema
        self._mode = mode
        self._lock_fd = lock_fd
        self._closed = False
        self._failed: BaseException | None = None
        self._generation = int(manifest.get("generation", 0))
        self._committed_at = float(manifest.get("committed_at", 0.0))
        self._log = ChunkLog.from_manifest(path, schema, manifest, writable=mode == "r+")
        if mode == "r+":
            self._log.remove_strays()
        self._inputs = _inputs.Inputs(schema)
        self._rng = np.random.default_rng()
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        else:
            self._rng.bit_generator.state = manifest["rng"]
        self._gammas = np.array([schema.gamma ** i for i in range(schema.n_step + 1)], np.float64)
        self._discounts = self._gammas.astype(np.float32)
        self._extra_names = tuple(e.name for e in schema.extras)
        self._obs_dtype = schema.obs_dtype
        self._arrays: dict[str, np.ndarray] = self._log.ring.arrays
        self._ep_open = np.zeros(schema.num_envs, np.bool_)  # per stream: an episode is open
        self._epos = np.zeros(schema.num_envs, np.int32)  # per stream: episode position of the last row
        self._lost = np.zeros(schema.num_envs, np.uint8)  # per stream: LOST bit of the open episode
        self._started = False
        self._reader = FrameReader(self._log.ring.arrays["obs"], read_threads)
        self._load_stream_state()

    @classmethod
    def create(cls, path: str | os.PathLike[str], capacity: int, obs_shape: Any, obs_dtype: Any = "uint8",
               stack: int = 1, n_step: int = 1, gamma: float = 0.99, action_shape: Any = (),
               action_dtype: Any = "int64", extras: dict[str, Any] | None = None, num_envs: int = 1,
               pad: str = "zeros", seed: int = 0, chunk_size: int | None = None,
               prioritized: Prioritized | None = None, vector: bool | None = None,
               read_threads: int | None = None) -> ReplayStore:
        """Create a new store in ``path`` (which must not exist or be empty) and open it for writing.

        ``capacity`` counts transitions: at least the ``capacity`` most recent ones stay sampleable.
        ``chunk_size`` counts frame slots per chunk file (all envs together); ``None`` picks ~16 MB of
        frames. ``extras`` declares per-transition columns as ``{name: (shape, dtype)}``.
        Raises ``ValueError``/``TypeError`` for bad arguments and for a non-empty ``path``.
        """
        schema = Schema.build(capacity=capacity, obs_shape=obs_shape, obs_dtype=obs_dtype, stack=stack,
                              n_step=n_step, gamma=gamma, action_shape=action_shape, action_dtype=action_dtype,
                              extras=extras, num_envs=num_envs, vector=vector, pad=pad, chunk_size=chunk_size,
                              prioritized=prioritized)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        path = os.fspath(path)
        if os.path.exists(path):
            if not os.path.isdir(path):
                raise ValueError(f"create(): {path} is a file; give a new or empty directory")
            if os.listdir(path):
                raise ValueError(
                    f"create(): {path} is not empty; use ReplayStore.open({path!r}) to continue a store,"
                    " or give a new directory")
        os.makedirs(os.path.join(path, "chunks"), exist_ok=True)
        os.makedirs(os.path.join(path, "state"), exist_ok=True)
        body = {"generation": 0, "committed_at": time.time(), "schema": schema.to_json(), "rows": 0,
                "next_id": 0, "chunks": [], "rng": np.random.default_rng(seed).bit_generator.state}
        write_manifest(path, body)
        return cls.open(path, mode="r+", read_threads=read_threads)

    @classmethod
    def open(cls, path: str | os.PathLike[str], mode: str = "r+", seed: int | None = None,
             read_threads: int | None = None) -> ReplayStore:
        """Open a store as of its last commit. ``mode="r+"`` takes the single-writer lock; ``"r"`` reads.

        ``seed=None`` continues the committed sampling RNG; an int reseeds it. ``read_threads``:
        threads that copy a batch's frames (default: up to 4, one per core).
        Raises ``StoreNotFoundError``, ``NotAStoreError``, ``CorruptStoreError``, ``FormatVersionError``,
        ``StoreLockedError``.
        """
        if mode not in ("r", "r+"):
            raise ValueError(f"mode must be 'r' or 'r+', got {mode!r}")
        path = os.fspath(path)
        manifest = read_manifest(path)
        try:
            schema = Schema.from_json(manifest["schema"])
        except (KeyError, TypeError, ValueError) as exc:
            raise NotAStoreError(f"{path}/manifest.json: unreadable schema ({exc})") from None
        lock_fd = _take_lock(path) if mode == "r+" else None
        try:
            return cls(path, schema, manifest, mode, seed, lock_fd, read_threads)
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise

    # -- properties ------------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return self._path

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def schema(self) -> Schema:
        return self._schema

    @property
    def capacity(self) -> int:
        return self._schema.capacity

    @property
    def num_envs(self) -> int:
        return self._schema.num_envs

    @property
    def id_range(self) -> tuple[int, int]:
        """``(oldest retained id, next id to be issued)``: ids below are evicted, ids at or above never issued."""
        self._check_open()
        return self._log.oldest_id, self._log.next_id

    @property
    def generation(self) -> int:
        """Number of the last commit (0 = the empty store written by ``create``)."""
        return self._generation

    def __len__(self) -> int:
        """Number of transitions that can be sampled now."""
        self._check_open()
        self._sync()
        return self._log.index.n_valid

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"mode={self._mode!r}"
        return f"<ReplayStore {self._path!r} {state} capacity={self.capacity}>"

    # -- writing ---------------------------------------------------------------------------------------
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
        log = self._log
        slot = self._prepare_row()
        arrays = self._arrays
        log.write_frame(slot, frame if frame.dtype == self._obs_dtype and frame.flags.c_contiguous
                        else np.ascontiguousarray(frame, self._obs_dtype))
        arrays["action"][slot] = act
        arrays["reward"][slot] = rew
        f = TERMINATED if term else (TRUNCATED if trunc else 0)
        arrays["flags"][slot] = f
        for name, value in xs.items():
            arrays["x_" + name][slot] = value
        idx = log.index
        nid = log.next_id
        epos = int(self._epos[0]) + 1
        idx.flags[slot] = f | (END if f else 0) | int(self._lost[0])
        idx.epos[slot] = epos
        idx.slot_id[slot] = nid
        idx.id2slot[nid % idx.id2slot.size] = slot
        log.finish_row(1)
        self._epos[0] = epos
        if f:
            self._ep_open[0] = False

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

    # -- reading ---------------------------------------------------------------------------------------
    def sample(self, batch_size: int, replace: bool = True) -> Batch:
        """A batch drawn uniformly (seeded) from the sampleable transitions.

        ``replace=False`` gives distinct transitions. Raises ``NotSampleableError`` (a ``ValueError``)
        when nothing is sampleable, or fewer than ``batch_size`` transitions with ``replace=False``.
        """
        self._check_open()
        b = _inputs.batch_size_arg(batch_size)
        self._sync()
        log = self._log
        ids = uniform.draw(self._rng, log.oldest_id, log.next_id, log.index.n_valid, self._valid_in_range,
                           self._valid_ids, b, bool(replace))
        return self._assemble(self._slots_of(ids), ids)

    def gather(self, index: Any) -> Batch:
        """The rows of the given transition ids (e.g. ``batch.index``), exactly as ``sample`` returns them.

        Raises ``NotSampleableError`` naming the first id that is evicted, never issued, or not sampleable.
        """
        self._check_open()
        ids = _inputs.ids_array(index).copy()  # the batch owns its index array
        self._sync()
        self._check_ids(ids)
        return self._assemble(self._slots_of(ids), ids)

    def iter_batches(self, batch_size: int, shuffle: bool = True, seed: int | None = None,
                     drop_last: bool = False) -> Iterator[Batch]:
        """One epoch over every transition sampleable now, in batches (the last may be smaller).

        The id set is fixed by this call; rows evicted before their batch is yielded are skipped.
        Uses its own generator (``seed``), never the sampling RNG.
        """
        self._check_open()
        b = _inputs.batch_size_arg(batch_size)
        self._sync()
        ids = self._valid_ids()
        if shuffle:
            np.random.default_rng(seed).shuffle(ids)
        return self._epoch(ids, b, drop_last)

    def _epoch(self, ids: np.ndarray, b: int, drop_last: bool) -> Iterator[Batch]:
        for i in range(0, ids.size, b):
            part = ids[i:i + b]
            if drop_last and part.size < b:
                return
            self._check_open()
            self._sync()
            part = part[self._ids_valid(part)]
            if part.size:
                yield self._assemble(self._slots_of(part), part)

    def current_obs(self) -> np.ndarray:
        """The stacked latest state: ``(k, *obs_shape)``, or ``(num_envs, k, *obs_shape)`` for vector stores."""
        self._check_open()
        log = self._log
        if log.rows == 0 or log.rows - 1 < log.index.oldest_row:
            raise EpisodeStateError("current_obs() before the first reset(obs)")
        n = self._schema.num_envs
        s = np.arange(n, dtype=np.int64)
        last = np.full(n, log.rows - 1, np.int64)
        epos = log.index.epos[log.stream_slots(log.rows - 1)].astype(np.int64)
        slots, pad = log.index.stack_slots(s, last, epos)
        frames = self._arrays["obs"][slots]
        frames[pad] = 0
        return frames if self._schema.vector else frames[0]

    # -- durability ------------------------------------------------------------------------------------
    def commit(self) -> None:
        """Make the current state the durable resume point (in place). O(open chunk + in-RAM state)."""
        self._check_writable()
        try:
            self._log.sync_open_chunk()
            gen = self._generation + 1
            now = time.time()
            body = {"generation": gen, "committed_at": now, "schema": self._schema.to_json(),
                    "rng": self._rng.bit_generator.state, **self._log.manifest_body()}
            write_manifest(self._path, body)
        except OSError as exc:
            raise self._fail(exc, "committing") from exc
        self._generation, self._committed_at = gen, now
        self._log.after_commit()

    def close(self) -> None:
        """Commit (writable stores) and release files and the lock. Safe to call twice."""
        if self._closed:
            return
        try:
            if self._mode == "r+" and self._failed is None:
                self.commit()
        finally:
            self._closed = True
            self._reader.close()
            self._log.close()
            self._arrays = {}
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def __enter__(self) -> ReplayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------------
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

    def _sync(self) -> None:
        self._log.index.sync()

    def _slots_of(self, ids: np.ndarray) -> np.ndarray:
        idx = self._log.index
        return idx.id2slot[ids % idx.id2slot.size]

    def _valid_in_range(self, ids: np.ndarray) -> np.ndarray:
        """Sampleable mask of ids known to lie in the retained range."""
        idx = self._log.index
        return idx.valid[idx.id2slot[ids % idx.id2slot.size]]

    def _ids_valid(self, ids: np.ndarray) -> np.ndarray:
        log = self._log
        inside = (ids >= log.oldest_id) & (ids < log.next_id)
        ok = np.zeros(ids.shape, np.bool_)
        ok[inside] = log.index.valid[self._slots_of(ids[inside])]
        return ok

    def _valid_ids(self) -> np.ndarray:
        log = self._log
        ids = np.arange(log.oldest_id, log.next_id, dtype=np.int64)
        return ids[log.index.valid[self._slots_of(ids)]]

    def _check_ids(self, ids: np.ndarray) -> None:
        ok = self._ids_valid(ids)
        if ok.all():
            return
        bad = int(np.flatnonzero(~ok)[0])
        i = int(ids[bad])
        lo, hi = self._log.oldest_id, self._log.next_id
        if i < lo:
            why = f"was evicted (oldest retained id is {lo})"
        elif i >= hi:
            why = f"was never issued (next id is {hi})"
        else:
            why = "is not sampleable (its n-step window is still open, or its stack history was evicted)"
        raise NotSampleableError(f"index[{bad}] = {i} {why}")

    def _assemble(self, slots: np.ndarray, ids: np.ndarray, weight: np.ndarray | None = None) -> Batch:
        log = self._log
        plan = log.index.plan(slots, log.seq_of_pos, self._gammas)
        return assemble(plan, self._arrays, ids, self._discounts, self._extra_names, self._reader, weight)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store {self._path} is closed; open it again with ReplayStore.open()")

    def _check_writable(self) -> None:
        self._check_open()
        if self._mode != "r+":
            raise ReadOnlyStoreError(f"the store {self._path} is open read-only (mode='r'); open it with mode='r+'")
        if self._failed is not None:
            raise ReadOnlyStoreError(
                f"the store {self._path} turned read-only after a disk error ({self._failed}); free space or fix"
                " the disk, then reopen it: it reopens at its last commit")

    def _fail(self, exc: OSError, doing: str) -> StoreIOError:
        self._failed = exc
        return StoreIOError(exc.errno, f"{doing} in {self._path} failed: {exc.strerror or exc}; the store is now"
                            " read-only (sampling still works); free space or fix the disk, then reopen it")


def _take_lock(path: str) -> int:
    fd = os.open(os.path.join(path, _LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(
            f"{path} is already open for writing by another process (or another ReplayStore in this one);"
            " close it first, or open with mode='r' to read") from None
    return fd
