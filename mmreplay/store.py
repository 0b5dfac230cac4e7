"""``ReplayStore``: the public face of a store directory.

A store is an append-only log of chunk files (see ``log`` and FORMAT.md) plus
an in-RAM index deciding what may be sampled. This module holds the episode
rules (reset/step, vector autoreset), sampling, and the commit protocol.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from . import _inputs, checkpoint, snapshot
from ._writing import WriterMixin
from .batch import Batch, assemble
from .episodes import EpisodeSteps, EpisodeTable, episode_table, step_flags
from .errors import (
    CorruptStoreError,
    EpisodeStateError,
    NotAStoreError,
    NotSampleableError,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreIOError,
    StoreLockedError,
)
from .index import Plan
from .log import ChunkLog
from .options import Prioritized, Schema
from .prefetch import BatchIterator, Draw
from .reader import FrameReader
from .sampling import uniform
from .sampling.prioritized import PrioritySampler
from .storage.manifest import read_manifest, write_manifest

__all__ = ["ReplayStore"]

_LOCK = "lock"


class ReplayStore(WriterMixin):
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
        self._inputs = _inputs.Inputs(schema)
        self._rng = np.random.default_rng(seed)
        if seed is None:
            self._rng.bit_generator.state = manifest["rng"]
        self._gammas = np.array([schema.gamma ** i for i in range(schema.n_step + 1)], np.float64)
        self._discounts = self._gammas.astype(np.float32)
        self._extra_names = tuple(e.name for e in schema.extras)
        self._obs_dtype = schema.obs_dtype
        self._ep_open = np.zeros(schema.num_envs, np.bool_)  # per stream: an episode is open
        self._epos = np.zeros(schema.num_envs, np.int32)  # per stream: episode position of the last row
        self._lost = np.zeros(schema.num_envs, np.uint8)  # per stream: LOST bit of the open episode
        self._started = False
        self._iterators: weakref.WeakSet[BatchIterator] = weakref.WeakSet()
        self._prefetch_pool: ThreadPoolExecutor | None = None
        self._draws = 0  # draws made by this object (orders the pending draws of several iterators)
        self._resume_draws, self._resume_rng = _pending_from_manifest(manifest) if seed is None else ([], {})
        self._read_threads = read_threads
        self._skipped_updates = 0
        self._prio_chain: dict[str, Any] | None = None  # the manifest's priorities entry this state builds on
        self._attach(manifest)
        if mode == "r+":
            self._log.remove_strays()
            _WRITERS.add(self)

    def _attach(self, manifest: dict[str, Any]) -> None:
        """Map the chunks a manifest lists and rebuild everything derived from them (open and refresh)."""
        schema = self._schema
        log = ChunkLog.from_manifest(self._path, schema, manifest, writable=self._mode == "r+")
        try:
            prio = PrioritySampler(schema.prioritized, log.index.flags.size) if schema.prioritized else None
            valid = log.initial_valid
            if prio is not None:
                self._restore_priorities(prio, manifest.get("priorities"), valid, log)
        except BaseException:
            log.close()
            raise
        self._log = log
        self._prio = prio
        self._generation = int(manifest.get("generation", 0))
        self._committed_at = float(manifest.get("committed_at", 0.0))
        self.metadata: dict[str, Any] = dict(manifest.get("metadata") or {})
        """Free-form JSON-serializable information about the store (e.g. its source); saved by ``commit()``."""
        self._snapshots: list[dict[str, Any]] = list(manifest.get("snapshots") or [])
        self._arrays: dict[str, np.ndarray] = log.ring.arrays
        self._reader = FrameReader(log.ring.arrays["obs"], self._read_threads, ring=log.ring)
        log.before_unmap = self._drain
        if prio is not None:
            log.on_cleared = prio.clear
            log.on_resize = prio.relayout
        self._load_stream_state()

    @classmethod
    def create(cls, path: str | os.PathLike[str], capacity: int, obs_shape: Any, obs_dtype: Any = "uint8",
               stack: int = 1, n_step: int = 1, gamma: float = 0.99, action_shape: Any = (),
               action_dtype: Any = "int64", extras: dict[str, Any] | None = None, num_envs: int = 1,
               pad: str = "zeros", seed: int = 0, chunk_size: int | None = None,
               prioritized: Prioritized | None = None, vector: bool | None = None,
               read_threads: int | None = None, metadata: dict[str, Any] | None = None,
               compression: str | None = "auto") -> ReplayStore:
        """Create a new store in ``path`` (which must not exist or be empty) and open it for writing.

        ``capacity`` counts transitions: at least the ``capacity`` most recent ones stay sampleable.
        ``chunk_size`` counts frame slots per chunk file (all envs together); ``None`` picks ~16 MB of
        frames. ``extras`` declares per-transition columns as ``{name: (shape, dtype)}``. ``metadata`` is
        any JSON-serializable dict kept with the store (``store.metadata``; saved by each commit).
        ``compression``: ``"auto"`` keeps the frames of sealed chunks LZ4-compressed on disk when the
        observations are images (uint8 with two or more dims), ``None`` keeps them raw, ``"lz4"`` always
        compresses; rows read back are the same either way (see ``store.compression``).
        Raises ``ValueError``/``TypeError`` for bad arguments and for a non-empty ``path``.
        """
        schema = Schema.build(capacity=capacity, obs_shape=obs_shape, obs_dtype=obs_dtype, stack=stack,
                              n_step=n_step, gamma=gamma, action_shape=action_shape, action_dtype=action_dtype,
                              extras=extras, num_envs=num_envs, vector=vector, pad=pad, chunk_size=chunk_size,
                              prioritized=prioritized, compression=compression)
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
        meta = _json_dict(metadata)
        body = {"generation": 0, "committed_at": time.time(), "schema": schema.to_json(), "rows": 0,
                "next_id": 0, "chunks": [], "rng": np.random.default_rng(seed).bit_generator.state,
                "metadata": meta}
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
        read_manifest(path)  # a clear error for a missing, foreign or damaged directory before anything else
        lock_fd = _take_lock(path) if mode == "r+" else None
        try:
            attempt = 0
            while True:
                manifest = read_manifest(path)
                try:
                    schema = Schema.from_json(manifest["schema"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise NotAStoreError(f"{path}/manifest.json: unreadable schema ({exc})") from None
                try:
                    return cls(path, schema, manifest, mode, seed, lock_fd, read_threads)
                except CorruptStoreError:
                    # A reader racing the writer: a newer commit may have retired a chunk this one lists.
                    attempt += 1
                    if mode == "r+" or attempt == 5 or read_manifest(path).get("generation") == manifest.get(
                            "generation"):
                        raise
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
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

    # -- reading ---------------------------------------------------------------------------------------
    def sample(self, batch_size: int, replace: bool = True, beta: float | None = None) -> Batch:
        """A batch drawn (seeded) from the sampleable transitions.

        Uniform stores draw uniformly; ``replace=False`` gives distinct transitions. Prioritized stores
        draw proportionally to ``(p + eps) ** alpha`` with stratification (always with replacement) and
        set ``batch.weight`` to the normalised importance weights for ``beta`` (default ``store.beta``).
        Raises ``NotSampleableError`` (a ``ValueError``) when nothing is sampleable, or fewer than
        ``batch_size`` transitions with ``replace=False``.
        """
        self._check_open()
        d = self._draw(_inputs.batch_size_arg(batch_size), bool(replace), beta)
        return self._assemble(self._slots_of(d.ids), d.ids, d.weight)

    def batches(self, batch_size: int, prefetch: int = 2, beta: float | None = None) -> BatchIterator:
        """An endless iterator of ``sample(batch_size)`` batches whose frames are copied in the background.

        Batch ``i + prefetch`` is drawn when batch ``i`` is handed out, so a priority update made after
        receiving batch ``i`` first affects batch ``i + prefetch + 1``; without updates the batches are
        exactly those of repeated ``sample()`` calls. ``commit()``/``save()`` record the state as of the
        last batch handed out; after ``open()``/``load()`` the first ``batches()`` iterator hands out the
        batches that had been drawn but not handed out, then continues as the saved run would have.
        """
        self._check_open()
        b = _inputs.batch_size_arg(batch_size)
        if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or prefetch < 0:
            raise ValueError(f"prefetch: expected an int >= 0, got {prefetch!r}")
        if beta is not None:
            self._require_prio("beta=")
            beta = _check_beta(beta)
        pending: list[Draw] = []
        if self._resume_draws and all(d.ids.size == b for d in self._resume_draws):
            pending = self._resume_draws  # hand out what the committed run had drawn, then go on from there
            self._rng.bit_generator.state = self._resume_rng
        self._resume_draws = []
        if self._prefetch_pool is None:
            self._prefetch_pool = ThreadPoolExecutor(1, thread_name_prefix="mmreplay-prefetch")
        for d in pending:
            d.plan = self._plan(d.ids)
        it = BatchIterator(lambda: self._draw(b, True, beta, plan=True), self._assemble_draw, self._prefetch_pool,
                           int(prefetch), pending)
        self._iterators.add(it)
        return it

    def _draw(self, b: int, replace: bool, beta: float | None, plan: bool = False) -> Draw:
        """Choose a batch's ids (and weights): the only consumer of the sampling RNG. With ``plan``, also
        its row arithmetic, fixed now (for a copy made later in another thread)."""
        self._sync()
        log = self._log
        before = dict(self._rng.bit_generator.state) if plan else {}  # iterators record it for commit()
        self._draws += 1
        if self._prio is not None:
            if not replace:
                raise ValueError("sample(replace=False) is for uniform stores: prioritized sampling is stratified"
                                 " and with replacement; use iter_batches() for an epoch without repeats")
            use_beta = self._prio.beta if beta is None else _check_beta(beta)
            if log.index.n_valid == 0:
                uniform.draw(self._rng, 0, 0, 0, self._valid_in_range, self._valid_ids, b, True)  # raises
            slots, weight = self._prio.sample(self._rng, b, use_beta)
            ids = log.index.slot_id[slots]
            return Draw(ids, weight, before, self._draws, self._plan(ids) if plan else None)
        if beta is not None:
            raise ValueError("beta= is for prioritized stores; this store samples uniformly")
        ids = uniform.draw(self._rng, log.oldest_id, log.next_id, log.index.n_valid, self._valid_in_range,
                           self._valid_ids, b, replace)
        return Draw(ids, None, before, self._draws, self._plan(ids) if plan else None)

    def _assemble_draw(self, d: Draw) -> Batch:
        """Copy a drawn batch's data (in the prefetch thread). Its plan was made when it was drawn, so
        nothing here reads the index the writer keeps changing; the rows it reads are written once and
        stay mapped while a copy is in flight (see ``_drain``)."""
        if d.plan is None:
            raise RuntimeError("a prefetched draw has no plan")  # _draw(plan=True) always makes one
        return assemble(d.plan, self._arrays, d.ids.copy(), self._discounts, self._extra_names, self._reader,
                        d.weight)

    def _sampling_state(self) -> dict[str, Any]:
        """The RNG as of the last batch handed out, plus batches drawn by live iterators but not handed
        out (with the RNG state after them), so a resumed ``batches()`` hands out the same batches."""
        pending = sorted((d for it in list(self._iterators) for d in it.pending()), key=lambda d: d.order)
        if not pending:
            return {"rng": self._rng.bit_generator.state, "pending_draws": None}
        if not self._ids_valid(np.concatenate([d.ids for d in pending])).all():
            # Rows drawn before a retirement evicted them cannot be handed out again after a resume:
            # record the rule's state only (the resumed run re-draws from the last batch handed out).
            return {"rng": pending[0].rng_before, "pending_draws": None}
        return {"rng": pending[0].rng_before, "pending_draws": {
            "rng_after": self._rng.bit_generator.state,
            "ids": [d.ids.tolist() for d in pending],
            "weights": None if pending[0].weight is None else [d.weight.tolist() for d in pending if d.weight is not None]}}

    def _drain(self) -> None:
        for it in list(self._iterators):
            it.drain()

    # -- priorities ------------------------------------------------------------------------------------
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
        p = np.asarray(priorities)
        if p.shape != ids.shape:
            raise ValueError(f"priorities: expected shape {ids.shape} (one per index), got {p.shape}")
        if p.size and p.dtype.kind not in "biuf":
            raise TypeError(f"priorities: expected real numbers, got dtype {p.dtype}")
        p = p.astype(np.float64)
        if not ids.size:
            return 0
        # Finite non-negative float64 values are exactly the bit patterns below +inf's: one comparison.
        if (p.view(np.uint64) >= _INF_BITS).any():
            bad = int(np.flatnonzero(~np.isfinite(p) | (p < 0))[0])
            raise ValueError(f"priorities[{bad}] = {p[bad]}: priorities must be finite and >= 0")
        lo, hi = int(ids.min()), int(ids.max())
        if hi >= self._log.next_id or lo < 0:
            never = int(np.flatnonzero((ids >= self._log.next_id) | (ids < 0))[0])
            raise NotSampleableError(f"index[{never}] = {ids[never]} was never issued (next id is"
                                     f" {self._log.next_id})")
        self._sync()  # transitions whose window closed before this update enter with the old maximum
        ok = self._valid_in_range(ids) if lo >= self._log.oldest_id else self._ids_valid(ids)
        n_ok = int(np.count_nonzero(ok))
        skipped = ids.size - n_ok
        if skipped:
            self._skipped_updates += skipped
            ids, p = ids[ok], p[ok]
        if len(set(ids.tolist())) < ids.size:  # repeated ids: the last occurrence wins
            _, last = np.unique(ids[::-1], return_index=True)
            keep = ids.size - 1 - last
            ids, p = ids[keep], p[keep]
        prio.update(self._slots_of(ids), p)
        return skipped

    def priorities(self, index: Any) -> np.ndarray:
        """The raw priorities last set (float64) for sampleable ids; raises like ``gather`` otherwise."""
        self._check_open()
        prio = self._require_prio("priorities")
        ids = _inputs.ids_array(index)
        self._sync()
        self._check_ids(ids)
        return prio.raw[self._slots_of(ids)].copy()

    @property
    def beta(self) -> float:
        """Importance-weight exponent used by ``sample`` (prioritized stores). Assign to anneal it:
        ``store.beta = min(1.0, 0.4 + 0.6 * step / total_steps)``; ``commit()`` saves the value."""
        return self._require_prio("beta").beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._require_prio("beta").beta = _check_beta(value)

    @property
    def max_priority(self) -> float:
        """The largest raw priority ever given (1.0 at first): what new transitions enter with."""
        return self._require_prio("max_priority").max_priority

    @property
    def priority_updates_skipped(self) -> int:
        """How many ids ``update_priorities`` skipped (evicted or not sampleable) since the store was created."""
        return self._skipped_updates

    def _require_prio(self, what: str) -> PrioritySampler:
        if self._prio is None:
            raise ValueError(f"{what} is for prioritized stores; create the store with"
                             " prioritized=mr.Prioritized(alpha=0.6, beta=0.4)")
        return self._prio

    def _priorities_state(self, generation: int, root: str, delta: bool) -> dict[str, Any] | None:
        """Write the priority state under ``root``; return the manifest entry.

        A full file holds the raw priority and tree mass of every retained id. With ``delta`` (a commit
        in place), when the last commit's files are there to build on and few slots changed since, only
        the changed ids are written, as a delta file listed after the previous ones: a commit then costs
        O(changes), not O(capacity). A full file replaces the chain once the deltas would add up to a
        quarter of the retained ids or number 64 files.
        """
        prio = self._prio
        if prio is None:
            return None
        log = self._log
        entry = {"max_priority": prio.max_priority, "beta": prio.beta, "skipped_updates": self._skipped_updates}
        chain = self._prio_chain
        if delta and chain is not None and not prio.dirty_all:
            slots = prio.dirty_slots()
            ids = log.index.slot_id[slots]
            keep = (ids >= log.oldest_id) & (ids < log.next_id)
            slots, ids = slots[keep], ids[keep]
            rows = int(chain.get("delta_rows", 0)) + ids.size
            if rows <= (log.next_id - log.oldest_id) // 4 and len(chain.get("deltas", [])) < 64:
                table = np.empty((3, ids.size))
                table[0] = ids
                self._priority_columns(slots, table[1:])
                rel = checkpoint.write_array(root, "priorities-delta", generation, table)
                return {**entry, "file": chain["file"], "first_id": chain["first_id"],
                        "deltas": [*chain.get("deltas", []), rel], "delta_rows": rows}
        slots = self._slots_of_range(log.oldest_id, log.next_id)
        table = np.empty((2, slots.size))
        self._priority_columns(slots, table)
        rel = checkpoint.write_array(root, "priorities", generation, table)
        return {**entry, "file": rel, "first_id": int(log.oldest_id), "deltas": [], "delta_rows": 0}

    def _priority_columns(self, slots: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (2, len(slots)) with the slots' raw priorities and tree masses; NaN where not sampleable."""
        prio = self._require_prio("priorities")
        prio.raw.take(slots, out=out[0])
        out[1] = prio.tree.get(slots)
        np.copyto(out, np.nan, where=~self._log.index.valid.take(slots))

    def _restore_priorities(self, prio: PrioritySampler, state: dict[str, Any] | None,
                            valid_slots: np.ndarray, log: ChunkLog) -> None:
        self._prio_chain = state
        if state is None:  # a store committed before anything was sampleable
            prio.add(valid_slots)
            return
        first, deltas = int(state["first_id"]), state.get("deltas", [])
        # The full file covers the ids issued at its commit; the deltas, in order, what changed since.
        table = checkpoint.read_table(self._path, state["file"], 2)
        issued = log.next_id - first
        if table.shape[1] > issued or (not deltas and table.shape[1] != issued):
            raise CorruptStoreError(f"{os.path.join(self._path, state['file'])}: covers {table.shape[1]} ids"
                                    f" from {first}; the commit issued {issued} from there")
        if table.shape[1] < issued:
            table = np.concatenate([table, np.full((2, issued - table.shape[1]), np.nan)], axis=1)
        for rel in deltas:  # later files win
            d = checkpoint.read_table(self._path, rel, 3)
            pos = d[0].astype(np.int64) - first
            inside = (pos >= 0) & (pos < issued)
            table[:, pos[inside]] = d[1:, inside]
        pos = log.index.slot_id[valid_slots] - first
        raw, mass = table[0, pos], table[1, pos]
        if np.isnan(raw).any():
            raise CorruptStoreError(f"{os.path.join(self._path, state['file'])}: no priority for sampleable"
                                    f" transition {int(log.index.slot_id[valid_slots[np.isnan(raw)][0]])}")
        prio.restore(valid_slots, raw, mass, float(state["max_priority"]))
        prio.beta = float(state["beta"])
        self._skipped_updates = int(state["skipped_updates"])

    def sampleable_ids(self) -> np.ndarray:
        """The ids of every transition that can be sampled now (sorted int64)."""
        self._check_open()
        self._sync()
        return self._valid_ids()

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
        frames = self._reader.take(slots)
        frames[pad] = 0
        return frames if self._schema.vector else frames[0]

    # -- episodes --------------------------------------------------------------------------------------
    def episodes(self) -> EpisodeTable:
        """The episodes with at least one retained frame (see ``EpisodeTable``); ``.complete`` marks
        the ones whose first observation is retained and that have ended."""
        self._check_open()
        log = self._log
        return episode_table(log.index.flags, self._arrays["reward"], log.index.slot_id, log.index.geo.slots,
                             self._schema.num_envs, log.index.oldest_row, log.rows)

    def episode_frames(self, table: EpisodeTable, i: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Observations ``start .. stop-1`` of episode ``i`` of ``table`` (positions 0..length; a copy).

        A missing final observation reads as zeros (``table.final_missing``)."""
        self._check_open()
        n = int(table.length[i]) + 1
        stop = n if stop is None else stop
        if not 0 <= start <= stop <= n:
            raise ValueError(f"frames [{start}, {stop}) out of range for an episode of {n} frames")
        rows = int(table.first_row[i]) + np.arange(start, stop, dtype=np.int64)
        self._check_rows_retained(rows)
        return self._reader.take(self._log.index.geo.slots(int(table.stream[i]), rows))

    def episode_steps(self, table: EpisodeTable, i: int, start: int = 0, stop: int | None = None) -> EpisodeSteps:
        """Actions, rewards, flags and extras of steps ``start .. stop-1`` of episode ``i`` (copies)."""
        self._check_open()
        n = int(table.length[i])
        stop = n if stop is None else stop
        if not 0 <= start <= stop <= n:
            raise ValueError(f"steps [{start}, {stop}) out of range for an episode of {n} steps")
        rows = int(table.first_row[i]) + 1 + np.arange(start, stop, dtype=np.int64)
        self._check_rows_retained(rows)
        slots = self._log.index.geo.slots(int(table.stream[i]), rows)
        a = self._arrays
        term, trunc = step_flags(a["flags"][slots], bool(table.ended[i]) and stop == n, bool(table.terminated[i]))
        return EpisodeSteps(a["action"][slots], a["reward"][slots], term, trunc,
                            {name: a["x_" + name][slots] for name in self._extra_names})

    def _check_rows_retained(self, rows: np.ndarray) -> None:
        log = self._log
        if rows.size and (rows[0] < log.index.oldest_row or rows[-1] >= log.rows):
            raise NotSampleableError(f"rows {rows[0]}..{rows[-1]} are not retained (the store holds rows"
                                     f" {log.index.oldest_row}..{log.rows - 1}); take a fresh episodes() table")

    # -- durability ------------------------------------------------------------------------------------
    def commit(self) -> None:
        """Make the current state the durable resume point (in place).

        Costs the open chunk plus what changed since the last commit: priorities go out as a delta of the
        changed ids (rewritten in full once the deltas reach a quarter of the retained ids).

        After a crash, ``open()`` returns exactly this state: transitions, priorities, the sampling RNG
        (as of the last batch handed out) and ``metadata``.
        """
        self._check_writable()
        try:
            self._log.sync_open_chunk()
            gen = self._generation + 1
            body = self._state_body(gen, self._path, delta=True)
            write_manifest(self._path, body)
        except OSError as exc:
            raise self._fail(exc, "committing") from exc
        self._generation, self._committed_at = gen, body["committed_at"]
        if self._prio is not None:
            self._prio_chain = body["priorities"]
            self._prio.clean()
        self._log.after_commit()
        checkpoint.remove_unreferenced(self._path, set(checkpoint.priority_files(body["priorities"])))

    def _state_body(self, generation: int, root: str, delta: bool = False) -> dict[str, Any]:
        """The manifest body describing the current state (state files written under ``root``)."""
        self._sync()  # the state written includes every transition whose window has closed
        return {"generation": generation, "committed_at": time.time(), "schema": self._schema.to_json(),
                "metadata": _json_dict(self.metadata), "snapshots": self._snapshots,
                "priorities": self._priorities_state(generation, root, delta), **self._sampling_state(),
                **self._log.manifest_body()}

    def save(self, snapshot_dir: str | os.PathLike[str], keep: int | None = None) -> str:
        """Write a consistent snapshot of the current state to ``snapshot_dir`` while training goes on.

        Sealed chunks are hard-linked (copied across filesystems), the open chunk and the state files
        copied, the manifest written last: O(one chunk + index), whatever the capacity. Saving into an
        existing snapshot replaces it atomically (the old one stays loadable until the new one is
        complete). ``keep=N`` then removes all but the N newest snapshots among ``snapshot_dir``'s
        siblings named like it up to its trailing digits (``ckpt/replay-000300`` -> ``ckpt/replay-*``).
        Resume with ``ReplayStore.load(snapshot_dir, path)``. Returns the snapshot path.
        """
        self._check_open()
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep: expected an int >= 1 or None, got {keep!r}")
        target = os.path.abspath(os.fspath(snapshot_dir))
        gen = snapshot.existing_generation(target) + 1
        self._log.wait_sealed()
        os.makedirs(os.path.join(target, checkpoint.STATE_DIR), exist_ok=True)
        body = self._state_body(gen, target)
        columns = [c.name for c in self._log.ring.columns]
        body["chunks"] = snapshot.write_snapshot_chunks(self._path, target, body["chunks"], columns, gen)
        saved_at = time.time()
        body[snapshot.SNAPSHOT_KEY] = {"path": os.path.abspath(self._path), "store_generation": self._generation,
                                       "saved_at": saved_at}
        write_manifest(target, body)
        snapshot.remove_unlisted(target, {c["name"] for c in body["chunks"]},
                                 set(checkpoint.priority_files(body["priorities"])))
        self._snapshots = [s for s in self._snapshots if s["path"] != target][-15:]
        self._snapshots.append({"path": target, "generation": gen, "saved_at": saved_at})
        if keep is not None:
            snapshot.prune_snapshots(snapshot.sibling_prefix(target), keep)
        return target

    @classmethod
    def load(cls, snapshot_dir: str | os.PathLike[str], path: str | os.PathLike[str], mode: str = "r+",
             seed: int | None = None, read_threads: int | None = None) -> ReplayStore:
        """Restore a snapshot into a new (or empty) working directory ``path`` and open it.

        Files are hard-linked where possible (copied across filesystems); the snapshot itself is never
        modified. Sampling, priorities and the RNG continue exactly as in the run that saved it.
        Raises ``NotAStoreError`` for a directory that is not a complete snapshot and ``ValueError`` for
        a non-empty ``path``.
        """
        src = os.fspath(snapshot_dir)
        doc = snapshot.read_snapshot(src)
        snapshot.materialize(src, doc, os.fspath(path))
        return cls.open(path, mode=mode, seed=seed, read_threads=read_threads)

    def verify(self) -> list[str]:
        """Check the last commit's files (checksums of every sealed chunk, sizes, counts, state files).

        Returns the problems found, each naming its file; an empty list means the store is intact.
        Reads every byte: O(data). Also ``mmreplay verify PATH``.
        """
        self._check_open()
        from .verify import verify_store

        return verify_store(self._path)

    def refresh(self) -> bool:
        """Readers (``mode="r"``): move to the writer's latest commit. Returns whether it changed.

        Live ``batches()`` iterators of this reader end. The sampling RNG is kept (not reset).
        """
        self._check_open()
        if self._mode != "r":
            raise ValueError("refresh() is for stores opened with mode='r'; a writer always sees its own state")
        for attempt in range(5):
            doc = read_manifest(self._path)
            if int(doc.get("generation", 0)) == self._generation:
                return False
            old_log, old_reader = self._log, self._reader
            for it in list(self._iterators):
                it.close()
            try:
                self._attach(doc)
            except CorruptStoreError:
                if attempt == 4:
                    raise
                continue  # the writer retired chunks of the commit we read: read the newer manifest
            old_reader.close()
            old_log.close()
            return True
        return False

    def close(self) -> None:
        """Commit (writable stores) and release files and the lock. Safe to call twice."""
        if self._closed:
            return
        try:
            if self._mode == "r+" and self._failed is None:
                self.commit()
        finally:
            self._closed = True
            for it in list(self._iterators):
                it.close()
            if self._prefetch_pool is not None:
                self._prefetch_pool.shutdown()
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
    def _sync(self) -> None:
        new = self._log.index.sync()
        if self._prio is not None and new.size:
            self._prio.add(new)

    def _slots_of(self, ids: np.ndarray) -> np.ndarray:
        idx = self._log.index
        return idx.id2slot[ids % idx.id2slot.size]

    def _slots_of_range(self, lo: int, hi: int) -> np.ndarray:
        """``_slots_of(np.arange(lo, hi))`` for retained ids, without the arithmetic: at most two slices."""
        table = self._log.index.id2slot
        a = lo % table.size
        b = a + (hi - lo)
        return table[a:b] if b <= table.size else np.concatenate([table[a:], table[: b - table.size]])

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

    def _plan(self, ids: np.ndarray) -> Plan:
        """Row arithmetic of valid ids, from the index as it is now (the caller's thread)."""
        log = self._log
        return log.index.plan(self._slots_of(ids), log.seq_of_pos)

    def _assemble(self, slots: np.ndarray, ids: np.ndarray, weight: np.ndarray | None = None) -> Batch:
        log = self._log
        plan = log.index.plan(slots, log.seq_of_pos)
        return assemble(plan, self._arrays, ids, self._discounts, self._extra_names, self._reader, weight)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store {self._path} is closed; open it again with ReplayStore.open()")

    def _check_writable(self) -> None:
        self._check_open()
        if self._mode != "r+":
            raise ReadOnlyStoreError(f"the store {self._path} is open read-only (mode='r'); open it with mode='r+'")
        if isinstance(self._failed, ReadOnlyStoreError):
            raise self._failed
        if self._failed is not None:
            raise ReadOnlyStoreError(
                f"the store {self._path} turned read-only after a disk error ({self._failed}); free space or fix"
                " the disk, then reopen it: it reopens at its last commit")

    def _fail(self, exc: OSError, doing: str) -> StoreIOError:
        self._failed = exc
        return StoreIOError(exc.errno, f"{doing} in {self._path} failed: {exc.strerror or exc}; the store is now"
                            " read-only (sampling still works); free space or fix the disk, then reopen it")


_INF_BITS = np.uint64(0x7FF0000000000000)
_WRITERS: weakref.WeakSet[ReplayStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child (e.g. a DataLoader worker) must not write through its parent's writer.

    Its copy of the lock descriptor is closed (the parent keeps the lock) and the store turns
    read-only in the child: sampling from the inherited mappings still works.
    """
    for store in list(_WRITERS):
        if store._lock_fd is not None:
            try:
                os.close(store._lock_fd)
            except OSError:
                pass
            store._lock_fd = None
        store._failed = ReadOnlyStoreError(
            "this store was opened for writing in the parent process; open it in the child with mode='r'")


os.register_at_fork(after_in_child=_after_fork_in_child)


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


def _check_beta(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not (
            np.isfinite(value) and value >= 0):
        raise ValueError(f"beta must be a finite number >= 0, got {value!r}")
    return float(value)


def _pending_from_manifest(manifest: dict[str, Any]) -> tuple[list[Draw], dict[str, Any]]:
    state = manifest.get("pending_draws")
    if not state:
        return [], {}
    weights = state["weights"] or [None] * len(state["ids"])
    draws = [Draw(np.asarray(ids, np.int64), None if w is None else np.asarray(w, np.float32), {}, i)
             for i, (ids, w) in enumerate(zip(state["ids"], weights, strict=True))]
    return draws, state["rng_after"]


def _json_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"metadata must be a dict, got {type(value).__name__}")
    try:
        return dict(json.loads(json.dumps(value)))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata must be JSON-serializable: {exc}") from None
