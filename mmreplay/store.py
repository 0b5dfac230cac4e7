"""``ReplayStore``: the public face of a store directory, a facade over parts that own their state.

The parts (ARCHITECTURE.md has the map): the chunk log and its index
(``log``, ``index``: files, rows, ids, validity), the episode writer
(``writer``: reset/step rules), a sampler (``sampling``: uniform or
prioritized), the draw state (``drawing``: the RNG and prefetched batches), the
frame reader (``reader``) and durability (``durability``: commit, snapshot,
load, refresh). This module wires them together and checks arguments at the
boundary; it holds no rules of its own.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import numpy as np
from numba.core.compiler_lock import global_compiler_lock as _compiling

from . import _inputs
from .core.drawing import DrawState
from .core.durability import (
    CommittedParts,
    Durability,
    create_store,
    json_dict,
    load_snapshot,
    read_consistent,
    restore_validity,
)
from .core.episodes import EpisodeSteps, EpisodeTable, episode_frames, episode_steps
from .core.log import ChunkLog
from .core.plan import Plan
from .core.ratelimit import RateLimiter, StoreLimit, store_limiter
from .core.restore import open_log
from .core.sequences import SequencePlan
from .core.snapshot import SNAPSHOT_KEY
from .core.statefiles import StateDir
from .core.writer import EpisodeWriter
from .errors import (
    NotAStoreError,
    ReadOnlyStoreError,
    StoreClosedError,
)
from .native.warmup import start_background as start_warmup
from .options import Prioritized, RateLimit, Schema
from .reading.batch import (
    Batch,
    FrameBatch,
    FrameBuffer,
    PostedFrames,
    assemble,
    assemble_frames,
    buffer_for,
    planned_batch,
    post_frames,
)
from .reading.prefetch import BatchIterator, DrawnBatch
from .reading.reader import FrameReader, PostedStacks
from .reading.sequence_batch import (
    FrameSequenceBatch,
    SequenceBatch,
    assemble_sequence_frames,
    assemble_sequences,
    post_sequence_frames,
    post_sequences,
)
from .sampling import Priorities, make_sampler
from .sampling.prioritized import check_beta
from .storage.lock import release_lock, take_lock
from .storage.manifest import read_manifest
from .storage.ring import fault_checked

__all__ = ["ReplayStore"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _serialized(method: _F) -> _F:
    """The method runs holding the store's lock (``ReplayStore._lock``): calls from several threads are
    serialized (SEMANTICS.md "Threads and processes")."""

    @functools.wraps(method)
    def locked(self: ReplayStore, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(_F, locked)


def _whole(method: _F) -> _F:
    """A call that changes the store either completes or, interrupted half-way, leaves it unusable until
    reopened (``ReplayStore._interrupted``); see there."""
    name = f"{method.__name__}()"

    @functools.wraps(method)
    def whole(self: ReplayStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self._interrupted(exc, name)
            raise

    return cast(_F, whole)


class _RingEvents:
    """Forwards what the chunk log reports to the parts that care (see ``log.RingListener``), and the rate
    limit's calls to ``ReplayStore._update_validity``; holds the store weakly, so that it can be dropped unclosed."""

    def __init__(self, store: ReplayStore) -> None:
        self._store = weakref.ref(store)

    def update_validity(self) -> None:
        store = self._store()
        if store is not None:
            with store._lock:  # (the rate limit calls it from inside a locked call, or from batches()' hand-out)
                store._update_validity()

    def before_unmap(self) -> None:
        store = self._store()
        if store is not None:
            store._draw_state.drain()
            store._reader.settle()  # (a read posted by an iterator that was dropped unclosed)

    def slots_cleared(self, slots: np.ndarray) -> None:
        store = self._store()
        if store is not None:
            store._parts.sampler.slots_cleared(slots)

    def ring_resized(self, size: int, moves: list[tuple[slice, slice]]) -> None:
        store = self._store()
        if store is not None:
            store._parts.sampler.ring_resized(size, moves)
            store._reader.ring_resized(store._ring.arrays["obs"])


class _Resources:
    """What an open store holds outside Python's memory (mappings, threads, the lock): released by
    ``close()``, or when the store is dropped without it (then nothing is committed, as after a crash)."""

    def __init__(self) -> None:
        self.log: ChunkLog | None = None
        self.reader: FrameReader | None = None
        self.draw_state: DrawState | None = None
        self.limiter: RateLimiter | None = None
        self.lock_fd: int | None = None
        self.failed = False  # a disk error already turned the store read-only

    def release(self) -> None:
        """Each part is released whatever another's release raised (the first error is raised after)."""
        log, failed = self.log, self.failed
        parts = [p.close for p in (self.draw_state, self.reader) if p is not None]
        if log is not None:
            parts.append(lambda: log.close(failed=failed))
        if self.limiter is not None:
            parts.append(self.limiter.close)
        error: BaseException | None = None
        try:
            for close in parts:
                try:
                    close()
                except BaseException as exc:
                    error = error or exc
        finally:
            if self.lock_fd is not None:
                release_lock(self.lock_fd)
            self.log = self.reader = self.draw_state = self.limiter = None
            self.lock_fd = None
        if error is not None:
            raise error


class ReplayStore:
    """A disk-backed replay store. Build one with ``create``, ``open``, ``load`` (or ``from_env``).

    Frames live in memory-mapped chunk files under ``path``; RAM holds the
    index (~22 bytes per slot) and, for prioritized stores, the sum tree.
    Writing: ``reset(obs)`` then ``step(action, reward, next_obs, terminated, truncated, **extras)``.
    Reading: ``sample``, ``batches``, ``gather``, ``iter_batches``, ``current_obs``, ``episodes``;
    sequences: ``sample_sequences``, ``sequence_batches``, ``gather_sequences``.
    Durability: ``commit()`` is the only resume point besides ``close()``; ``save``/``load`` snapshots.
    Threads: a store may be used from several threads; its calls are serialized (one lock). A forked child
    may sample from an inherited store; one opened for writing refuses writes there (reopen it).
    """

    # -- construction ----------------------------------------------------------------------------------
    def __init__(self, path: str, schema: Schema, manifest: dict[str, Any], mode: str,
                 seed: int | None, lock_fd: int | None, read_threads: int | None = None,
                 read_ahead: bool | str = "auto") -> None:
        # Held by every public call that reads or changes the ring, the index or the draw state (``_serialized``):
        # a call in one thread never sees a chunk another thread is retiring and unmapping. Re-entrant: the
        # rate limit's update_validity and the parts' callbacks come back into the store from inside a call.
        self._lock = threading.RLock()
        self._path = path
        self._schema = schema
        self._mode = mode
        self._closed = False
        self._closed_why = ""  # set when a forked child cannot use the store (``_forked``)
        self._broken = ""  # set when a call that changes the store was interrupted half-way (``_interrupted``)
        self._inputs = _inputs.Inputs(schema)
        self._discounts = np.array([schema.gamma ** i for i in range(schema.n_step + 1)], np.float32)
        self._extra_names = tuple(e.name for e in schema.extras)
        self._read_threads = read_threads
        self._read_ahead = read_ahead
        self._events = _RingEvents(self)
        self._durable = Durability(path, schema, manifest)
        self._draw_state = DrawState(manifest, seed)
        self._resources = _Resources()
        self._resources.draw_state, self._resources.lock_fd = self._draw_state, lock_fd
        self._release = weakref.finalize(self, self._resources.release)
        self._writer: EpisodeWriter | None = None
        try:
            self._limiter = self._resources.limiter = store_limiter(path, schema, manifest, mode == "r+")
            self._limit = StoreLimit(self._limiter, self._events.update_validity)
            self._attach(manifest)
        except BaseException:
            self._resources.lock_fd = None  # open() closes it
            self._release()
            raise
        if self._limiter is not None and mode == "r+":
            self._limiter.publish_size(self._index.n_valid)
        if mode == "r+":
            self._parts.log.remove_strays()
            # the kernels it calls compile while it fills (native/warmup.py), once per kind of store and process
            start_warmup(schema.compression is not None, schema.prioritized is not None)
        _LIVE.add(self)

    def _attach(self, manifest: dict[str, Any]) -> None:
        """Map the chunks a manifest lists and build every part from them (open and refresh)."""
        schema = self._schema
        log = open_log(self._path, schema, manifest, self._mode == "r+", self._events)
        try:
            restore_validity(self._path, manifest, log.index)  # invalidate()/clear() of the commit
            sampler = make_sampler(schema, log.index)
            sampler.restore(StateDir(self._path, int(manifest.get("generation", 0))), manifest.get("priorities"),
                            log.initial_valid[log.index.valid_at(log.initial_valid)])
        except BaseException:
            log.close()
            raise
        self._parts = CommittedParts(log, log.index, sampler, self._draw_state, self._limiter)
        # the log's index and ring, which the calls below read (both live as long as the log)
        self._index, self._ring = log.index, log.ring
        self._durable.adopt(manifest)
        self.metadata: dict[str, Any] = dict(manifest.get("metadata") or {})
        """Free-form JSON-serializable information about the store (e.g. its source); saved by ``commit()``."""
        self._reader = FrameReader(log.ring.arrays["obs"], self._read_threads, self._read_ahead, ring=log.ring)
        self._resources.log, self._resources.reader = log, self._reader
        if self._mode == "r+":
            self._writer = EpisodeWriter(schema, log, self._inputs)

    @classmethod
    def create(cls, path: str | os.PathLike[str], capacity: int, obs_shape: Any, obs_dtype: Any = "uint8",
               stack: int = 1, n_step: int = 1, gamma: float = 0.99, action_shape: Any = (),
               action_dtype: Any = "int64", extras: dict[str, Any] | None = None, num_envs: int = 1,
               pad: str = "zeros", seed: int = 0, chunk_size: int | None = None,
               prioritized: Prioritized | None = None, vector: bool | None = None,
               read_threads: int | None = None, metadata: dict[str, Any] | None = None,
               rate_limit: RateLimit | None = None, quantize: bool = False,
               compression: str | None = "auto") -> ReplayStore:
        """Create a new store in ``path`` (which must not exist or be empty) and open it for writing.

        ``capacity`` counts transitions: at least the ``capacity`` most recent ones stay sampleable.
        ``chunk_size`` counts frame slots per chunk file (all envs together); ``None`` picks ~16 MB of
        frames, less in stores of under 32,768 transitions (FORMAT.md, "Chunk size"). ``extras`` declares per-transition columns as ``{name: (shape, dtype)}``. ``metadata`` is
        any JSON-serializable dict kept with the store (``store.metadata``; saved by each commit).
        ``rate_limit=mr.RateLimit(...)`` holds the ratio of sampled rows to stored transitions across every
        process of the store (see ``RateLimit``). ``quantize=True`` (uint8 frames) lets ``reset``/``step``
        take floating frames in [0, 1], stored as ``round(x * 255)``.
        ``compression``: ``"auto"`` keeps the frames of sealed chunks LZ4-compressed on disk when the
        observations are images (uint8 with two or more dims), ``None`` keeps them raw, ``"lz4"`` always
        compresses; rows read back are the same either way (see ``store.compression``).
        Raises ``ValueError``/``TypeError`` for bad arguments and for a non-empty ``path``.
        """
        schema = Schema.build(capacity=capacity, obs_shape=obs_shape, obs_dtype=obs_dtype, stack=stack,
                              n_step=n_step, gamma=gamma, action_shape=action_shape, action_dtype=action_dtype,
                              extras=extras, num_envs=num_envs, vector=vector, pad=pad, chunk_size=chunk_size,
                              prioritized=prioritized, rate_limit=rate_limit, quantize=quantize,
                              compression=compression)
        seed = _inputs.seed_arg(seed)
        _inputs.read_threads_arg(read_threads)
        path = _inputs.local_path(path, "create()")
        create_store(path, schema, seed, json_dict(metadata))
        return cls.open(path, mode="r+", read_threads=read_threads)

    @classmethod
    def open(cls, path: str | os.PathLike[str], mode: str = "r+", seed: int | None = None,
             read_threads: int | None = None, read_ahead: bool | str = "auto") -> ReplayStore:
        """Open a store as of its last commit. ``mode="r+"`` takes the single-writer lock; ``"r"`` reads.

        ``seed=None`` continues the committed sampling RNG; an int reseeds it. ``read_threads``:
        threads that copy a batch's frames (default: up to 4, one per core). ``read_ahead``: whether a
        batch's frame ranges are requested from the disk all at once before they are copied (True),
        never (False), or only while copies keep waiting for the disk ("auto").
        Raises ``StoreNotFoundError``, ``NotAStoreError``, ``CorruptStoreError``, ``FormatVersionError``,
        ``StoreLockedError``.
        """
        if mode not in ("r", "r+"):
            raise ValueError(f"mode must be 'r' or 'r+', got {mode!r}")
        read_threads = _inputs.read_threads_arg(read_threads)
        if seed is not None:
            seed = _inputs.seed_arg(seed)
        path = os.fspath(path)
        doc = read_manifest(path)  # a clear error for a missing, foreign or damaged directory before anything else
        if mode == "r+" and SNAPSHOT_KEY in doc:  # (writing would turn it into a store: no longer loadable)
            raise ReadOnlyStoreError(f"{path} is a snapshot (made by save()): it opens read-only, with mode='r';"
                                     " to continue from it, ReplayStore.load(snapshot, new_path)")
        lock_fd = take_lock(path) if mode == "r+" else None

        def attach(manifest: dict[str, Any]) -> ReplayStore:
            try:
                schema = Schema.from_json(manifest["schema"])
            except (KeyError, TypeError, ValueError) as exc:
                raise NotAStoreError(f"{path}/manifest.json: unreadable schema ({exc})") from None
            return cls(path, schema, manifest, mode, seed, lock_fd, read_threads, read_ahead)

        try:
            return read_consistent(path, attach, writer=mode == "r+")
        except BaseException:
            if lock_fd is not None:
                release_lock(lock_fd)
            raise

    @classmethod
    def from_env(cls, env: Any, path: str | os.PathLike[str], capacity: int, **kwargs: Any) -> ReplayStore:
        """Create a store shaped for a Gymnasium env or vector env (obs/action spaces, ``num_envs``).

        Other keyword arguments are those of ``create`` (``stack``, ``n_step``, ...). Needs gymnasium
        (``pip install mmreplay[gym]``). See ``mmreplay.gym``.
        """
        from .gym import store_from_env

        return store_from_env(env, path, capacity=capacity, **kwargs)

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
    def compression(self) -> str | None:
        """The codec of sealed chunks' frames on disk (``"lz4"``), or None when they are kept raw."""
        return self._schema.compression

    @property
    @_serialized
    def id_range(self) -> tuple[int, int]:
        """``(oldest retained id, next id to be issued)``: ids below are evicted, ids at or above never issued."""
        self._check_open()
        idx = self._index
        return idx.oldest_id, idx.next_id

    @property
    def generation(self) -> int:
        """Number of the last commit (0 = the empty store written by ``create``)."""
        return self._durable.generation

    @property
    @_serialized
    def episode_open(self) -> np.ndarray:
        """Per env stream, whether an episode is open, i.e. a ``step()`` may follow (bool ``(num_envs,)``).

        False before the first ``reset()`` and after an episode ended (unbatched stores then need
        ``reset()``; vector stores auto-reset). Read-only stores report the last commit's state.
        """
        self._check_open()
        if self._writer is not None:
            return self._writer.episode_open
        return EpisodeWriter(self._schema, self._parts.log, self._inputs).episode_open

    @_serialized
    def __len__(self) -> int:
        """Number of transitions that can be sampled now."""
        self._check_open()
        self._update_validity()
        return self._index.n_valid

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"mode={self._mode!r}"
        return f"<ReplayStore {self._path!r} {state} capacity={self.capacity}>"

    @_serialized
    def inspect(self, ids: Any = None) -> dict[str, Any]:
        """Internal counters, for tests and debugging (keys may change between versions).

        Background seals are finished first, so the counts are settled. ``ring_positions`` (chunks
        the mapped ring has room for), ``chunks`` (retained chunks), ``compressed_chunks`` (sequence
        numbers of the chunks whose frames are read from compressed files),
        ``rows`` (frame rows written by each stream, a list), ``holes`` (slots of the retained sealed chunks
        left empty because their env streams advanced apart), ``rng`` (the sampling RNG's state now), and for
        prioritized stores ``priority_total`` (the sum tree's total mass), ``priority_slots``
        (slots carrying mass: the sampleable transitions when consistent), ``rate_limit`` (rate-limited
        stores: ``inserted``, ``sampled``, ``size`` and ``writer_pid`` read together), ``priority_state``
        (the last commit's priorities entry) and, given sampleable ``ids``, ``priority_masses``
        (their masses in the tree).
        """
        self._check_open()
        self._update_validity()
        return self._parts.counters(self._path, ids, settle=self._writer is not None and self._durable.failed is None)

    # -- writing ---------------------------------------------------------------------------------------
    @_serialized
    @_whole
    def reset(self, obs: Any, head_lost: bool = False, env: int | None = None) -> None:
        """Start new episode(s) with ``obs`` (batched ``(num_envs, *obs_shape)`` for vector stores).

        An episode still open is ended as truncated at its last recorded step. ``env=i`` starts env
        stream ``i``'s episode only: ``obs`` is then that env's single observation (what ``extend(...,
        env=i)`` continues). ``head_lost=True`` (unbatched stores; for importers) says the episode began
        earlier and its first frames are not available: only its rows with a full stack history become
        sampleable.
        """
        writer = self._check_writable()
        try:
            writer.reset(obs, bool(head_lost), env)
        except OSError as exc:
            raise self._durable.fail(exc, "writing a frame") from exc

    def extend(self, actions: Any, rewards: Any, next_obs: Any, terminated: Any, truncated: Any, env: int = 0,
               final_missing: bool = False, **extras: Any) -> int:
        """Append a block of ``L`` consecutive steps of env stream ``env`` (leading time axis on every array).

        ``actions (L, *action_shape)``, ``rewards (L,)``, ``next_obs (L, *obs_shape)``, ``terminated``/
        ``truncated (L,)``, extras ``(L, *shape)``: the same as ``L`` calls of ``step()`` on that stream,
        with the same ids (contiguous, in write order) and rows, written in bulk. The stream needs an open
        episode (``reset(obs)``, or ``reset(obs, env=i)`` in a vector store); an episode end may only be
        the block's last step: it closes the episode, and the stream's next call must be a reset. Streams
        may be written in any order; a rate-limited store counts a block as its ``L`` insertions (and
        waits, as ``L`` steps would). ``final_missing=True`` (importers; the block must end its episode):
        the final observation is not available, so ``next_obs`` holds the other ``L - 1`` frames; it reads
        as zeros and nothing bootstraps from it. A block that breaks a rule raises (``ValueError``,
        ``TypeError``, ``EpisodeStateError``) and appends nothing. Returns the id of the first transition.
        """
        limit = self._limit
        while True:
            with self._lock:
                writer = self._check_writable()
                s, blk = writer.check_extend(env, actions, rewards, next_obs, terminated, truncated, extras,
                                             final_missing)
                limit.check_block(blk.length)
                if limit.fits(blk.length):
                    try:
                        first = writer.write_extend(s, blk, bool(final_missing))
                        limit.inserted(blk.length)
                    except OSError as exc:
                        raise self._durable.fail(exc, "writing a block of steps") from exc
                    except BaseException as exc:
                        if not isinstance(exc, Exception):
                            self._interrupted(exc, "extend()")
                        raise
                    return first
            # a rate-limited store waits as for blk.length steps, without the lock (see step()); then checks again
            limit.inserting(blk.length)

    def step(self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
             **extras: Any) -> None:
        """Append one transition per env: the outcome of taking ``action`` in the current state.

        Unbatched (``num_envs=1``): needs an open episode (``reset()`` first; after an episode ends,
        ``reset()`` again). Vector stores: arrays with a leading ``num_envs`` axis; an env whose episode
        ended at its previous step is auto-reset (Gymnasium NEXT_STEP): its ``next_obs`` becomes the new
        episode's first observation and its action, reward, flags and extras are ignored.
        If both flags are set, ``terminated`` wins (the step is stored as a termination).
        ``next_obs=None`` (unbatched stores, on a step that ends the episode; for importers): the final
        observation is not available; it reads as zeros and nothing bootstraps from it.
        """
        limit = self._limit
        while True:
            with self._lock:
                writer = self._check_writable()
                # the transitions the limit counts (only a rate-limited store counts a vector step's open episodes)
                n = 0 if limit.limiter is None else writer.stored_by_next_step() if self._schema.vector else 1
                if limit.fits(n) or not writer.stored_by_next_step():  # (no wait for a step that will raise)
                    try:
                        writer.step(action, reward, next_obs, terminated, truncated, extras)
                        limit.inserted(n)
                    except OSError as exc:
                        raise self._durable.fail(exc, "writing a transition") from exc
                    except BaseException as exc:  # (no cost on the way through: the hot path)
                        if not isinstance(exc, Exception):
                            self._interrupted(exc, "step()")
                        raise
                    return
            # Wait for the readers' samples without the lock: another thread of this process may be the one
            # that samples (an actor thread stepping, a learner thread sampling). Then check again.
            limit.inserting(n)

    # -- reading ---------------------------------------------------------------------------------------
    @_serialized
    def sample(self, batch_size: int, replace: bool = True, beta: float | None = None) -> Batch:
        """A batch drawn (seeded) from the sampleable transitions.

        Uniform stores draw uniformly; ``replace=False`` gives distinct transitions. Prioritized stores
        draw proportionally to ``(p + eps) ** alpha`` with stratification (always with replacement) and
        set ``batch.weight`` to the normalised importance weights for ``beta`` (default ``store.beta``).
        Raises ``NotSampleableError`` (a ``ValueError``) when nothing is sampleable, or fewer than
        ``batch_size`` transitions with ``replace=False``. Rate-limited stores wait until the limit allows
        ``batch_size`` more rows, or raise ``RateLimitTimeout`` (see ``RateLimit``).
        """
        self._check_open()
        b = _inputs.batch_size_arg(batch_size, self._inputs.row_bytes)
        if self._limiter is None:  # (every sample's path: no closure, no DrawnBatch)
            self._update_validity()
            ids, weight, slots = self._draw_state.draw_now(self._parts.sampler, self._index, b, bool(replace), beta)
            return self._assemble(slots, ids, weight)
        d = self._limit.sample(b, lambda: self._draw(b, bool(replace), beta))
        assert d.slots is not None  # (DrawState.draw always finds them)
        return self._assemble(d.slots, d.ids, d.weight)

    @_serialized
    def batches(self, batch_size: int, prefetch: int = 2, beta: float | None = None, frames: str = "stacks",
                frame_buffer: FrameBuffer | None = None, transform: Callable[[Any], Any] | None = None) -> BatchIterator[Any]:
        """An endless iterator of ``sample(batch_size)`` batches whose frames are copied in the background.

        Batch ``i + prefetch`` is drawn when batch ``i`` is handed out, so a priority update made after
        receiving batch ``i`` first affects batch ``i + prefetch + 1``; without updates the batches are
        exactly those of repeated ``sample()`` calls. ``commit()``/``save()`` record the state as of the
        last batch handed out; after ``open()``/``load()`` the first ``batches()`` iterator hands out the
        batches that had been drawn but not handed out, then continues as the saved run would have.

        ``frames="distinct"`` hands out ``FrameBatch``es instead: each distinct frame of a batch's two
        stacks read once, into ``frame_buffer(shape, dtype)``'s array when given (e.g. pinned memory), and
        the stacks as positions into them (``frames[obs_index]`` is ``sample()``'s ``obs``, bit for bit).
        With the default ``frames="stacks"``, ``frame_buffer((2, B, k, *frame), dtype)``'s array, when
        given, is what both stacks are read into: ``obs`` and ``next_obs`` are its two halves.
        ``transform(batch)`` runs in the thread that assembled the batch (the prefetch thread when the
        caller is away) and its result is handed out instead (``mmreplay.torch.device_batches`` starts
        its copy to the GPU there).
        """
        self._check_open()
        b = _inputs.batch_size_arg(batch_size, self._inputs.row_bytes)
        p = _inputs.prefetch_arg(prefetch)
        beta = self._beta_arg(beta)
        distinct = _frames_arg(frames, frame_buffer, transform)
        assemble: Callable[..., Any] = self._assemble_draw
        post: Callable[[DrawnBatch], Any] = self._post_draw
        if distinct:
            assemble = functools.partial(self._assemble_frame_draw, frame_buffer=frame_buffer)
            post = functools.partial(self._post_frame_draw, frame_buffer=frame_buffer)
        elif frame_buffer is not None:
            assemble = functools.partial(self._assemble_draw, frame_buffer=frame_buffer)
            post = functools.partial(self._post_draw, frame_buffer=frame_buffer)
        if transform is not None:
            assemble = _then(assemble, transform)
        return self._draw_state.iterator(lambda: self._draw(b, True, beta, plan_now=True), assemble,
                                     self._index, (b, 0, False), p, self._limit.on_hand_out, post, guard=self._lock)

    # -- rate limiting ---------------------------------------------------------------------------------
    @_serialized
    def can_sample(self, batch_size: int) -> bool:
        """Whether ``sample(batch_size)`` returns now, without waiting or raising ``NotSampleableError``:
        something is sampleable (in a prioritized store, with priority mass), and the rate limit (if any)
        allows it: ``len(store)`` (of the writing store) >= ``min_size`` and
        ``sampled + batch_size <= samples_per_insert * inserted + error_buffer``.
        """
        self._check_open()
        b = _inputs.batch_size_arg(batch_size)
        self._update_validity()
        prio = self._parts.sampler.prioritized
        if self._index.n_valid == 0 or (prio is not None and not prio.total_mass() > 0):
            return False  # sample() would raise NotSampleableError
        return self._limiter is None or self._limiter.can_sample(b)

    @_serialized
    def can_insert(self) -> bool:
        """Whether the rate limit allows the next ``step()`` now, without waiting (True without a limit):
        ``samples_per_insert * (inserted + n) <= sampled + error_buffer + samples_per_insert * min_size``
        for the n transitions it would store."""
        writer = self._check_writable()
        return self._limiter is None or self._limiter.can_insert(writer.stored_by_next_step())

    # -- invalidation ------------------------------------------------------------------------------------
    @_serialized
    @_whole
    def invalidate(self, ids: Any) -> int:
        """Never sample, gather or start a sequence from these transitions again (at once; durable at
        the next ``commit()``). ``len(store)`` drops; episodes and exports keep them.

        Evicted ids are skipped; ids already invalidated count once. Returns how many were newly
        invalidated. Raises ``NotSampleableError`` naming the first id never issued (nothing changes).
        Batches a ``batches()`` iterator had drawn but not handed out are drawn again.
        """
        self._check_writable()
        ids = _inputs.ids_array(ids, "ids")
        self._update_validity()
        n, dropped = self._index.invalidate(ids)
        self._after_validity_change(dropped)
        return n

    @_serialized
    @_whole
    def clear(self) -> None:
        """Remove every transition stored so far (at once; durable at the next ``commit()``).

        Nothing written before is sampled, gathered, listed by ``episodes()``/``to_arrow()`` or exported
        again; ids keep counting up, and episodes still open go on (their next transitions are kept, their
        stacks still read the frames before). A rate limit's counts start again from zero.
        """
        self._check_writable()
        self._update_validity()
        self._after_validity_change(self._index.clear())
        if self._limiter is not None:
            self._limiter.reset(self._index.n_valid)

    def _after_validity_change(self, dropped: np.ndarray) -> None:
        self._parts.sampler.slots_cleared(dropped)
        self._draw_state.discard_pending()  # drawn rows may have just been invalidated
        if self._limiter is not None:
            self._limiter.publish_size(self._index.n_valid)

    # -- tables ------------------------------------------------------------------------------------------
    @_serialized
    @fault_checked
    def _table_columns(self) -> dict[str, np.ndarray]:
        from .reading.tables import transition_columns

        self._check_open()
        self._update_validity()
        prio = self._parts.sampler.prioritized
        return transition_columns(self._index, self._ring.arrays, self._schema, self.episodes(),
                                  None if prio is None else prio.priorities)

    def to_arrow(self) -> Any:
        """The store's transitions as a ``pyarrow.Table``: one row per retained transition with ``id``,
        ``episode`` (its row in ``episodes()``), ``step`` (t within the episode), ``env``, ``action``,
        ``reward``, ``terminated``, ``truncated``, ``sampleable``, ``priority`` (prioritized stores) and
        the scalar extras; no frames. Needs pyarrow (``pip install 'mmreplay[tables]'``)."""
        from .reading.tables import arrow_table

        return arrow_table(self._table_columns())

    def to_pandas(self) -> Any:
        """``to_arrow()``'s columns as a ``pandas.DataFrame`` (needs pandas, not pyarrow:
        ``pip install 'mmreplay[tables]'``)."""
        from .reading.tables import pandas_frame

        return pandas_frame(self._table_columns())

    def _draw(self, b: int, replace: bool, beta: float | None, plan_now: bool = False) -> DrawnBatch:
        self._check_open()  # (an iterator's next draw: none from a store an interrupt left unusable)
        self._update_validity()
        return self._draw_state.draw(self._parts.sampler, self._index, b, replace, beta, plan_now)

    @fault_checked
    def _assemble_draw(self, d: DrawnBatch, posted: PostedStacks | None = None, then: Callable[[], None] | None = None,
                       frame_buffer: FrameBuffer | None = None) -> Batch:
        """Copy a drawn batch's data (in the prefetch thread, or the caller's: ``posted``, its frames being
        read by the reader's helper, ``then`` run once they are). Its plan was made when it was drawn, so
        nothing here reads the index the writer keeps changing; the rows it reads are written once and
        stay mapped while a copy is in flight (the log drains iterators before unmapping). A read made
        here goes into ``frame_buffer``'s array when given (a posted one already does)."""
        if not isinstance(d.plan, Plan):
            raise RuntimeError("a prefetched draw has no plan")  # DrawState.draw(plan_now=True) always makes one
        return assemble(d.plan, self._ring.arrays, d.ids.copy(), self._discounts, self._extra_names,
                        self._reader, d.weight, posted, then, frame_buffer)

    @fault_checked
    def _assemble_frame_draw(self, d: DrawnBatch, posted: PostedFrames | None = None,
                             then: Callable[[], None] | None = None,
                             frame_buffer: FrameBuffer | None = None) -> FrameBatch:
        """``_assemble_draw`` for ``batches(frames="distinct")`` (``posted``: by ``_post_frame_draw``)."""
        if not isinstance(d.plan, Plan):
            raise RuntimeError("a prefetched draw has no plan")
        return assemble_frames(d.plan, self._ring.arrays, d.ids.copy(), self._discounts,
                               self._extra_names, self._reader, d.weight, frame_buffer, posted, then)

    def _post_frame_draw(self, d: DrawnBatch, frame_buffer: FrameBuffer | None = None) -> PostedFrames | None:
        """``_post_draw`` for ``batches(frames="distinct")``: its distinct frames, into ``frame_buffer``'s
        array (taken only if the read is posted)."""
        if not isinstance(d.plan, Plan) or not self._reader.may_post():
            return None
        return post_frames(d.plan, self._reader, frame_buffer)

    def _post_draw(self, d: DrawnBatch, frame_buffer: FrameBuffer | None = None) -> PostedStacks | None:
        """Start reading a drawn batch's frames in the reader's helper thread (None: not now, see
        ``FrameReader.post_stacks``), into ``frame_buffer``'s array when given (taken only if the read is
        posted)."""
        if not isinstance(d.plan, Plan):
            return None
        if frame_buffer is None:
            return self._reader.post_stacks(d.plan.obs_slots, d.plan.next_slots)
        if not self._reader.may_post():
            return None
        return self._reader.post_stacks(d.plan.obs_slots, d.plan.next_slots,
                                        buffer_for(frame_buffer, self._reader, (2,) + d.plan.obs_slots.shape))

    @_serialized
    def sample_sequences(self, batch_size: int, length: int, strict: bool = False,
                         beta: float | None = None) -> SequenceBatch:
        """A batch of sequences of ``length`` consecutive steps (``mr.SequenceBatch``), for recurrent and
        model-based learners.

        Starts are drawn as ``sample()`` draws transitions (uniformly, or by the start's priority with
        importance weights for ``beta``); the steps after a start need only be written, and a sequence
        stops at its episode's end or the newest step of its episode (the rest is masked, zeros).
        ``strict=True`` draws only starts with ``length`` steps in their episode (nothing masked;
        independent draws in proportion to priority in prioritized stores). Cost O(batch x length),
        whatever the capacity (a strict draw whose starts rarely fit also makes one pass over the index the
        first time, see SEMANTICS.md). Raises ``NotSampleableError`` when nothing is sampleable or, strict,
        no start has ``length`` steps (the RNG is then left as it was).
        """
        self._check_open()
        b, n, strict = _inputs.sequence_args(batch_size, length, strict, self._schema.stack * self._schema.frame_bytes,
                                             self._inputs.step_bytes)
        beta = self._beta_arg(beta)
        return self._assemble_sequence_draw(self._limit.sample(b, lambda: self._draw_sequences(b, n, strict, beta)))

    @_serialized
    def sequence_batches(self, batch_size: int, length: int, prefetch: int = 2, strict: bool = False,
                         beta: float | None = None, frames: str = "stacks", frame_buffer: FrameBuffer | None = None,
                         transform: Callable[[Any], Any] | None = None) -> BatchIterator[Any]:
        """An endless iterator of ``sample_sequences(batch_size, length, strict)`` batches whose frames are
        copied in the background, with the rules of ``batches()``: batch ``i + prefetch`` is drawn (and its
        steps fixed) when batch ``i`` is handed out; commits record the draws not yet handed out, and the
        first ``sequence_batches`` iterator of the same arguments after ``open()``/``load()`` hands them out.
        ``frames="distinct"``, ``frame_buffer``, ``transform``: as for ``batches()`` (``FrameSequenceBatch``es);
        with stacks, ``frame_buffer((B, L+1, k, *frame), dtype)``'s array is what the states are read into.
        """
        self._check_open()
        b, n, strict = _inputs.sequence_args(batch_size, length, strict, self._schema.stack * self._schema.frame_bytes,
                                             self._inputs.step_bytes)
        beta = self._beta_arg(beta)
        p = _inputs.prefetch_arg(prefetch)
        assemble: Callable[..., Any] = self._assemble_sequence_draw
        post: Callable[[DrawnBatch], Any] = functools.partial(self._post_sequence_draw, distinct=False)
        if _frames_arg(frames, frame_buffer, transform):
            assemble = functools.partial(self._assemble_sequence_frame_draw, frame_buffer=frame_buffer)
            post = functools.partial(self._post_sequence_draw, distinct=True, frame_buffer=frame_buffer)
        elif frame_buffer is not None:
            assemble = functools.partial(self._assemble_sequence_draw, frame_buffer=frame_buffer)
            post = functools.partial(self._post_sequence_draw, distinct=False, frame_buffer=frame_buffer)
        if transform is not None:
            assemble = _then(assemble, transform)
        return self._draw_state.iterator(lambda: self._draw_sequences(b, n, strict, beta),
                                     assemble, self._index, (b, n, strict),
                                     p, self._limit.on_hand_out, post, guard=self._lock)

    @fault_checked
    def _assemble_sequence_frame_draw(self, d: DrawnBatch, posted: PostedFrames | None = None,
                                      then: Callable[[], None] | None = None,
                                      frame_buffer: FrameBuffer | None = None) -> FrameSequenceBatch:
        """``_assemble_sequence_draw`` for ``sequence_batches(frames="distinct")``."""
        if not isinstance(d.plan, SequencePlan):
            raise RuntimeError("a drawn batch of sequences has no sequence plan")
        return assemble_sequence_frames(d.plan, self._ring.arrays, self._extra_names, self._reader,
                                        d.weight, frame_buffer, posted, then)

    def _post_sequence_draw(self, d: DrawnBatch, distinct: bool,
                            frame_buffer: FrameBuffer | None = None) -> PostedFrames | None:
        """``_post_draw`` for ``sequence_batches()``: the states' frames (``distinct``: each distinct frame once,
        into ``frame_buffer``'s array)."""
        if not isinstance(d.plan, SequencePlan) or not self._reader.may_post():
            return None
        if distinct:
            return post_sequence_frames(d.plan, self._reader, frame_buffer)
        return post_sequences(d.plan, self._reader, frame_buffer)

    @_serialized
    @fault_checked
    def gather_sequences(self, index: Any, length: int) -> SequenceBatch:
        """The sequences of ``length`` steps starting at the given transition ids (e.g. ``seq.index``), as
        ``sample_sequences`` builds them from the store as it is now (weights 1).

        Raises ``NotSampleableError`` naming the first id that is evicted, never issued, or not sampleable.
        """
        self._check_open()
        ids = _inputs.ids_array(index).copy()
        n = _inputs.length_arg(length)
        _inputs.sequences_fit(ids.size, n, self._schema.stack * self._schema.frame_bytes, self._inputs.step_bytes)
        self._update_validity()
        idx = self._index
        idx.check_ids(ids)
        plan = idx.sequence_plan(idx.slots_of(ids), n)
        return assemble_sequences(plan, self._ring.arrays, self._extra_names, self._reader, None)

    def _draw_sequences(self, b: int, n: int, strict: bool, beta: float | None) -> DrawnBatch:
        self._check_open()
        self._update_validity()
        return self._draw_state.draw_sequences(self._parts.sampler, self._index, b, n, strict, beta)

    @fault_checked
    def _assemble_sequence_draw(self, d: DrawnBatch, posted: PostedFrames | None = None,
                                then: Callable[[], None] | None = None,
                                frame_buffer: FrameBuffer | None = None) -> SequenceBatch:
        """Copy a drawn batch of sequences (possibly in the prefetch thread; see ``_assemble_draw``), its states
        read into ``frame_buffer``'s array when given."""
        if not isinstance(d.plan, SequencePlan):
            raise RuntimeError("a drawn batch of sequences has no sequence plan")  # draw_sequences makes one
        return assemble_sequences(d.plan, self._ring.arrays, self._extra_names, self._reader, d.weight, posted, then,
                                  frame_buffer)

    @_serialized
    def sampleable_ids(self) -> np.ndarray:
        """The ids of every transition that can be sampled now (sorted int64)."""
        self._check_open()
        self._update_validity()
        return self._index.valid_ids()

    @_serialized
    def gather(self, index: Any) -> Batch:
        """The rows of the given transition ids (e.g. ``batch.index``), exactly as ``sample`` returns them.

        Raises ``NotSampleableError`` naming the first id that is evicted, never issued, or not sampleable.
        """
        self._check_open()
        ids = _inputs.ids_array(index).copy()  # the batch owns its index array
        if ids.size:
            _inputs.batch_size_arg(ids.size, self._inputs.row_bytes)  # (as many rows as fit, as for sample())
        self._update_validity()
        idx = self._index
        idx.check_ids(ids)
        return self._assemble(idx.slots_of(ids), ids)

    @_serialized
    def iter_batches(self, batch_size: int, shuffle: bool = True, seed: int | None = None,
                     drop_last: bool = False) -> Iterator[Batch]:
        """One epoch over every transition sampleable now, in batches (the last may be smaller; with
        ``drop_last=True`` it is left out).

        The id set is fixed by this call; rows evicted before their batch is yielded are skipped.
        ``shuffle``: in a random order from its own generator (``seed``), never the sampling RNG; else in
        id order.
        """
        self._check_open()
        b = _inputs.batch_size_arg(batch_size, self._inputs.row_bytes)
        shuffle, drop_last = _inputs.flag_arg("shuffle", shuffle), _inputs.flag_arg("drop_last", drop_last)
        self._update_validity()
        ids = self._index.valid_ids()
        if shuffle:
            np.random.default_rng(seed).shuffle(ids)
        return self._epoch(ids, b, drop_last)

    def _epoch(self, ids: np.ndarray, b: int, drop_last: bool) -> Iterator[Batch]:
        for i in range(0, ids.size, b):
            part = ids[i:i + b]
            if drop_last and part.size < b:
                return
            with self._lock:  # each batch is a call of its own (not held while the caller has it)
                self._check_open()
                self._update_validity()
                idx = self._index
                part = part[idx.ids_valid(part)]
                batch = self._assemble(idx.slots_of(part), part) if part.size else None
            if batch is not None:
                yield batch

    @_serialized
    def current_obs(self) -> np.ndarray:
        """The stacked latest state: ``(k, *obs_shape)``, or ``(num_envs, k, *obs_shape)`` for vector stores."""
        self._check_open()
        slots, pad = self._index.latest_stacks()
        frames = self._reader.take(slots)
        frames[pad] = 0
        return frames if self._schema.vector else frames[0]

    # -- episodes --------------------------------------------------------------------------------------
    @_serialized
    @fault_checked
    def episodes(self) -> EpisodeTable:
        """The episodes with at least one retained frame (see ``EpisodeTable``); ``.complete`` marks
        the ones whose first observation is retained and that have ended."""
        self._check_open()
        return self._index.episodes(self._ring.arrays["reward"])

    @_serialized
    @fault_checked
    def episode_frames(self, table: EpisodeTable, i: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Observations ``start .. stop-1`` of episode ``i`` of ``table`` (positions 0..length; a copy).

        A missing final observation reads as zeros (``table.final_missing``)."""
        self._check_open()
        return episode_frames(self._index, self._reader.take, table, i, start, stop)

    @_serialized
    @fault_checked
    def episode_steps(self, table: EpisodeTable, i: int, start: int = 0, stop: int | None = None) -> EpisodeSteps:
        """Actions, rewards, flags and extras of steps ``start .. stop-1`` of episode ``i`` (copies)."""
        self._check_open()
        return episode_steps(self._index, self._ring.arrays, self._extra_names, table, i,
                             start, stop)

    # -- priorities ------------------------------------------------------------------------------------
    @_serialized
    @_whole
    def update_priorities(self, index: Any, priorities: Any) -> int:
        """Set the raw priorities ``p`` of transitions (e.g. ``batch.index`` and new |TD errors|).

        Vectorized; if an id repeats, its last priority wins. Ids evicted since they were sampled,
        or not sampleable (yet), are skipped and counted in ``priority_updates_skipped`` (an
        asynchronous learner races the writer). Returns how many were skipped.
        Raises ``ValueError`` for NaN, inf or negative priorities and length mismatches, naming the
        first bad position, and ``NotSampleableError`` for ids never issued; nothing changes then.
        """
        self._check_writable()
        prio = self._require_prio("update_priorities")
        ids = _inputs.ids_array(index)
        self._update_validity()  # transitions whose window closed before this update enter with the old maximum
        return prio.update(ids, priorities)

    @_serialized
    def priorities(self, index: Any) -> np.ndarray:
        """The raw priorities last set (float64) for sampleable ids; raises like ``gather`` otherwise."""
        self._check_open()
        prio = self._require_prio("priorities")
        ids = _inputs.ids_array(index)
        self._update_validity()
        self._index.check_ids(ids)
        return prio.priorities(ids)

    @property
    def beta(self) -> float:
        """Importance-weight exponent used by ``sample`` (prioritized stores). Assign to anneal it:
        ``store.beta = min(1.0, 0.4 + 0.6 * step / total_steps)``; ``commit()`` saves the value."""
        return self._require_prio("beta").beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._require_prio("beta").beta = check_beta(value)

    @_serialized
    def priority_mass(self) -> tuple[float, float]:
        """``(total, smallest positive)`` priority mass ``(p + eps) ** alpha`` of the sampleable transitions
        (prioritized stores): what a draw across several stores weighs them by, and normalises with. The
        smallest is 0.0 when no sampleable transition has a positive mass."""
        self._check_open()
        prio = self._require_prio("priority_mass")
        self._update_validity()
        return prio.total_mass(), prio.min_mass()

    @property
    def max_priority(self) -> float:
        """The largest raw priority ever given (1.0 at first): what new transitions enter with."""
        return self._require_prio("max_priority").max_priority

    @property
    def priority_updates_skipped(self) -> int:
        """How many ids ``update_priorities`` skipped (evicted or not sampleable) since the store was created."""
        prio = self._parts.sampler.prioritized
        return 0 if prio is None else prio.skipped_updates

    def _beta_arg(self, beta: Any) -> float | None:
        if beta is None:
            return None
        self._require_prio("beta=")
        return check_beta(beta)

    def _require_prio(self, what: str) -> Priorities:
        prio = self._parts.sampler.prioritized
        if prio is None:
            raise ValueError(f"{what} is for prioritized stores; create the store with"
                             " prioritized=mr.Prioritized(alpha=0.6, beta=0.4)")
        return prio

    # -- durability ------------------------------------------------------------------------------------
    @_serialized
    @_whole
    def commit(self) -> None:
        """Make the current state the durable resume point (in place).

        Costs the open chunk plus what changed since the last commit: priorities go out as a delta of the
        changed ids (rewritten in full once the deltas reach a quarter of the retained ids).

        After a crash, ``open()`` returns exactly this state: transitions, priorities, the sampling RNG
        (as of the last batch handed out) and ``metadata``.
        """
        self._check_writable()
        self._update_validity()  # the state written includes every transition whose window has closed
        self._durable.commit(self._parts, json_dict(self.metadata))

    @_serialized
    @_whole
    def save(self, snapshot_dir: str | os.PathLike[str], keep: int | None = None) -> str:
        """Write a consistent snapshot of the current state to ``snapshot_dir`` while training goes on.

        Sealed chunks are hard-linked (copied across filesystems), the open chunk and the state files
        copied, the manifest written last: O(one chunk + index), whatever the capacity. Saving into an
        existing snapshot replaces it atomically (the old one stays loadable until the new one is
        complete). ``keep=N`` then removes all but the N newest snapshots of this store named like
        ``snapshot_dir`` up to its trailing digits (``ckpt/replay-000300``: ``ckpt/replay-`` followed by
        digits only); ``ckpt/replay-best``, ``ckpt/baseline`` and other stores' snapshots are never touched.
        Resume with ``ReplayStore.load(snapshot_dir, path)``. Returns the snapshot path.
        """
        self._check_open()
        self._durable.check_can_save()
        keep = _inputs.keep_arg(keep)
        self._update_validity()
        return self._durable.save(self._parts, os.fspath(snapshot_dir), json_dict(self.metadata), keep,
                                  reader=self._writer is None)

    @classmethod
    def load(cls, snapshot_dir: str | os.PathLike[str], path: str | os.PathLike[str], mode: str = "r+",
             seed: int | None = None, read_threads: int | None = None,
             read_ahead: bool | str = "auto") -> ReplayStore:
        """Restore a snapshot into a new (or empty) working directory ``path`` and open it.

        Files are hard-linked where possible (copied across filesystems); the snapshot itself is never
        modified. Sampling, priorities and the RNG continue exactly as in the run that saved it.
        Raises ``NotAStoreError`` for a directory that is not a complete snapshot and ``ValueError`` for
        a non-empty ``path``.
        """
        load_snapshot(os.fspath(snapshot_dir), _inputs.local_path(path, "load()"))
        return cls.open(path, mode=mode, seed=seed, read_threads=read_threads, read_ahead=read_ahead)

    def verify(self) -> list[str]:
        """Check the last commit's files (checksums of every sealed chunk and of the open chunk's committed
        rows, sizes, counts, state files).

        Returns the problems found, each naming its file; an empty list means the store is intact.
        Reads every byte: O(data). Also ``mmreplay verify PATH``.
        """
        self._check_open()
        from .verify import verify_store

        return verify_store(self._path)

    @_serialized
    @_whole
    def refresh(self) -> bool:
        """Readers (``mode="r"``): move to the writer's latest commit. Returns whether it changed.

        Live ``batches()`` iterators of this reader end. The sampling RNG is kept (not reset).
        """
        self._check_open()
        if self._mode != "r":
            raise ValueError("refresh() is for stores opened with mode='r'; a writer always sees its own state")
        self._ring.check_intact()
        if int(read_manifest(self._path).get("generation", 0)) == self._durable.generation:
            return False
        old_log, old_reader = self._parts.log, self._reader
        self._draw_state.end_iterators()

        def attach(manifest: dict[str, Any]) -> bool:
            if int(manifest.get("generation", 0)) == self._durable.generation:
                return False
            self._attach(manifest)
            return True

        changed = read_consistent(self._path, attach, writer=False)
        if changed:
            old_reader.close()
            old_log.close()
        return changed

    @_serialized
    def close(self, commit: bool = True) -> None:
        """Commit (writable stores) and release files and the lock. Safe to call twice.

        ``commit=False`` discards what was written since the last commit, as a crash would: reopening
        gives the last commit.
        """
        if self._closed:
            return
        try:
            if commit and self._mode == "r+" and self._durable.failed is None:
                self.commit()
        finally:
            self._closed = True
            self._resources.failed = self._durable.failed is not None
            self._release()

    def __enter__(self) -> ReplayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------------
    def _forked(self, consistent: bool) -> None:
        """In a forked child (``os.register_at_fork``): the parent's threads are gone, so what they own is
        dropped, never joined or waited for: the prefetch pool and iterators' copies (``DrawState.forked``), the
        reader's pool and helper (``FrameReader.forked``), the sealer and its seals in flight
        (``ChunkLog.forked``). Sampling goes on through the inherited mappings. A store opened for writing
        turns read-only: the parent goes on writing, and the child's ``close()`` and exit commit nothing; its
        copy of the lock descriptor is closed (the parent keeps the lock). ``consistent``: the forking thread
        held the store's lock (no call of another thread was half-way); otherwise the child cannot use it."""
        self._lock = threading.RLock()  # (a parent's thread may have held the old one)
        self._draw_state.forked(self._lock)
        self._reader.forked()
        self._parts.log.forked()
        if self._mode == "r+":
            self._resources.lock_fd = None  # (closed already: ``storage/lock.py`` closes every lock's copy)
            self._durable.failed = ReadOnlyStoreError(
                f"the store {self._path} was opened for writing in the parent process, which goes on writing it:"
                " this forked child may sample from it but not write, commit or save; open the store in the"
                " child with ReplayStore.open(path, mode='r') to follow the parent's commits")
        if not consistent:
            self._draw_state.end_iterators()  # (as close() ends them; nothing of theirs is running here)
            self._closed = True
            self._closed_why = (
                f"the store {self._path} was in use by another thread of the parent process when it forked (for"
                f" more than {FORK_WAIT:g} s), so this child's copy of it may be half-changed and cannot be used;"
                " open the store again in the child with ReplayStore.open(path, mode='r')")

    def _update_validity(self) -> None:
        """Let the sampler know of transitions whose n-step window closed since the last call. (Reading calls
        make it too: interrupted between the index and the sampler, it leaves the store unusable, as an
        interrupted write does, see ``_interrupted``.)"""
        try:
            new = self._index.update_validity()
            if new.size:
                self._parts.sampler.added(new)
            if self._limiter is not None and self._limiter.writer:
                self._limiter.publish_size(self._index.n_valid)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self._interrupted(exc, "an update of the sampleable transitions (made by sample(), len() and"
                                  " other calls)")
            raise

    @fault_checked
    def _assemble(self, slots: np.ndarray, ids: np.ndarray, weight: np.ndarray | None = None) -> Batch:
        arrays = self._ring.arrays
        inputs = self._index.plan_inputs(slots)
        if inputs is None:
            return assemble(self._index.plan(slots), arrays, ids, self._discounts, self._extra_names, self._reader,
                            weight)
        # planned and read in one native call where the reader reads alone (at small batches each call from
        # Python costs a fair share of the copy itself)
        obs, next_obs, values, ends = self._reader.planned_stacks(inputs, arrays["reward"], self._discounts)
        return planned_batch(obs, next_obs, values, ends, slots, arrays, ids, self._extra_names, weight)

    def _interrupted(self, exc: BaseException, call: str) -> None:
        """``call`` was interrupted half-way by ``exc``, not an ``Exception``: a signal turned into one
        (``KeyboardInterrupt``, a SIGTERM handler's ``sys.exit()``). What the call had changed in RAM may not
        be whole (an index row counted before its id, a checksum extended twice), and committing that would
        damage the store: so nothing is committed any more (``close()``, leaving a ``with`` block) and every
        call but ``close()`` refuses, saying to reopen the store, which gives the last commit, as after a
        crash."""
        self._broken = (
            f"the store {self._path} was interrupted inside {call} ({type(exc).__name__}), which may have"
            " left what it changed half-done: nothing more is committed, and the store cannot be used until"
            " it is reopened (ReplayStore.open(path)); it reopens at its last commit, as after a crash")
        self._durable.failed = ReadOnlyStoreError(self._broken)

    def _check_open(self) -> None:
        if self._closed or self._broken:
            raise StoreClosedError(self._broken or self._closed_why or
                                   f"the store {self._path} is closed; open it again with ReplayStore.open()")

    def _check_writable(self) -> EpisodeWriter:
        self._check_open()
        if self._writer is None:
            raise ReadOnlyStoreError(f"the store {self._path} is open read-only (mode='r'); open it with mode='r+'")
        self._durable.check_not_failed()
        return self._writer


_LIVE: weakref.WeakSet[ReplayStore] = weakref.WeakSet()  # every store object not yet garbage (fork handling)
FORK_WAIT = 5.0  # seconds a fork waits for another thread's call on a store to end
_FORKING = threading.Lock()  # held from before a fork to after it: forks of two threads take turns
_HELD_AT_FORK: list[ReplayStore] = []  # stores whose lock the forking thread took
_TAKEN_AT_FORK = contextlib.ExitStack()  # releases, last taken first, what the forking thread took


def _before_fork() -> None:
    """Take every open store's lock, so that the child inherits each store between two calls, never half-way
    through one in another thread (an index half-updated, a chunk half-retired). A call that does not end
    within ``FORK_WAIT`` seconds (a rate-limited sample waiting for the writer) is not waited for further:
    the child then cannot use that store (``_forked``).

    Then numba's compile lock: a fork while another thread compiles (or loads from the cache) a kernel would
    leave the child's lock held by a thread the child does not have, and its first kernel call would wait
    for ever. It comes after the stores' locks because a store call loads its kernels holding its store's
    lock: a fork holding the compile lock would wait for that call, and the call for the fork.

    First ``_FORKING``: the list of what was taken is one for the process, so a fork in another thread
    waits for this one to end."""
    _FORKING.acquire()
    _TAKEN_AT_FORK.callback(_FORKING.release)
    for store in list(_LIVE):
        if not store._closed and store._lock.acquire(timeout=FORK_WAIT):
            _TAKEN_AT_FORK.callback(store._lock.release)
            _HELD_AT_FORK.append(store)
    _compiling.acquire()
    _TAKEN_AT_FORK.callback(_compiling.release)


def _after_fork_in_parent() -> None:
    _HELD_AT_FORK.clear()
    _TAKEN_AT_FORK.close()


def _frames_arg(frames: Any, frame_buffer: Any, transform: Any) -> bool:
    """``batches(frames=...)``: True for "distinct"; checks that ``frame_buffer`` and ``transform`` are callables."""
    if frames not in ("stacks", "distinct"):
        raise ValueError(f"frames: expected 'stacks' or 'distinct', got {frames!r}")
    for name, fn in (("frame_buffer", frame_buffer), ("transform", transform)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name}: expected a callable or None, got {fn!r}")
    return bool(frames == "distinct")


def _then(assemble: Callable[..., Any], transform: Callable[[Any], Any]) -> Callable[..., Any]:
    """``assemble`` followed by ``transform`` on its batch, in the same thread."""
    def run(*args: Any, **kwargs: Any) -> Any:
        return transform(assemble(*args, **kwargs))
    return run


def _after_fork_in_child() -> None:
    held = {id(store) for store in _HELD_AT_FORK}
    _HELD_AT_FORK.clear()
    _TAKEN_AT_FORK.close()  # (each store then gets a lock of its own: ``_forked``)
    for store in list(_LIVE):
        if not store._closed:
            store._forked(id(store) in held)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
