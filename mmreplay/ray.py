"""Replay on a Ray cluster: a store owned by an actor, writers anywhere, a learner drawing from several.

- ``ReplayActor``: a Ray actor that owns one ``ReplayStore`` on its node
  (``ReplayActor.remote(path, **create_kwargs)``; ``open=True`` resumes the store
  at ``path`` from its last commit). It commits on ``commit.remote()``, on
  ``close.remote()`` and when Ray shuts it down gracefully; a killed actor
  (``ray.kill``, a lost node) is a crash: its replacement opens the last commit, and so
  does the actor itself when Ray restarts it (``max_restarts``), whose ``create`` arguments
  then name the store it created.
  Calls run one at a time, in the order each caller sent them.
- ``RemoteWriter(actor, env=i, block=256)``: ``reset``/``step`` with the store's
  rules, checked where they are called; steps are shipped to the actor in blocks
  (``extend``), at an episode end, or on ``flush()``. At most ``in_flight`` blocks
  are on their way at once (the writer waits for the oldest, which also reports an
  error the actor raised).
- ``batches(actors, B, prefetch=4)``: an endless iterator of batches drawn across
  actors, in proportion to their sampleable transitions (prioritized stores: their
  total priority mass), in expectation over batches. ``prefetch`` batches are
  requested ahead. Each batch carries ``actor`` (which actor each row came from)
  and the iterator's ``update_priorities(batch, p)`` sends each actor its rows'
  new priorities.

``import mmreplay`` never imports Ray; this module needs it (``pip install mmreplay[ray]``).
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import ray

from ._inputs import Inputs
from .errors import EpisodeStateError, NotSampleableError
from .options import Schema
from .reading.batch import Batch
from .store import ReplayStore

__all__ = ["ReplayActor", "RemoteWriter", "RemoteBatch", "RemoteBatches", "batches"]


def _restarted() -> bool:
    """Whether this actor is a restart of one that died (Ray re-runs ``__init__`` with the same arguments)."""
    try:
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - outside an actor, or a Ray without the property: a first start
        return False


class _Replay:
    """The body of ``ReplayActor``: a store and the calls writers and learners make on it."""

    def __init__(self, path: str, open: bool = False, seed: int | None = None, **create_kwargs: Any) -> None:
        if not open and _restarted() and os.path.exists(os.path.join(path, "manifest.json")):
            # Ray restarted this actor (max_restarts) with its first arguments: the store its first life
            # created is resumed from the last commit, as ReplayActor.remote(path, open=True) would
            self.store = ReplayStore.open(path, mode="r+", seed=seed)
            return
        if open:
            if create_kwargs:
                raise TypeError(f"ReplayActor(open=True) resumes the store at {path}: it takes no create() arguments,"
                                f" got {sorted(create_kwargs)}")
            self.store = ReplayStore.open(path, mode="r+", seed=seed)
        else:
            self.store = ReplayStore.create(path, seed=0 if seed is None else seed, **create_kwargs)

    # -- writing ---------------------------------------------------------------------------------------
    def append(self, ops: list[tuple[Any, ...]]) -> int:
        """Apply a writer's operations in order: ``("reset", env, obs)`` and ``("extend", env, actions,
        rewards, next_obs, terminated, truncated, final_missing, extras)``. Returns the next id."""
        s = self.store
        for op in ops:
            if op[0] == "reset":
                s.reset(op[2], env=op[1])
            else:
                _, env, act, rew, nxt, term, trunc, missing, extras = op
                s.extend(act, rew, nxt, term, trunc, env=env, final_missing=missing, **extras)
        return s.id_range[1]

    def reset(self, obs: Any, env: int | None = None) -> None:
        self.store.reset(obs, env=env)

    def step(self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any, **extras: Any) -> None:
        self.store.step(action, reward, next_obs, terminated, truncated, **extras)

    def extend(self, actions: Any, rewards: Any, next_obs: Any, terminated: Any, truncated: Any, env: int = 0,
               final_missing: bool = False, **extras: Any) -> int:
        return self.store.extend(actions, rewards, next_obs, terminated, truncated, env=env,
                                 final_missing=final_missing, **extras)

    # -- reading ---------------------------------------------------------------------------------------
    def sample(self, batch_size: int, **kwargs: Any) -> Batch:
        return self.store.sample(batch_size, **kwargs)

    def sample_sequences(self, batch_size: int, length: int, **kwargs: Any) -> Any:
        fn = getattr(self.store, "sample_sequences", None)
        if fn is None:
            raise NotImplementedError("this mmreplay's ReplayStore has no sample_sequences()")
        return fn(batch_size, length, **kwargs)

    def draw(self, batch_size: int, length: int | None, beta: float | None) -> tuple[Any, dict[str, float]]:
        """A batch (or sequence batch) for ``batches()``, with this store's weight for the next draws."""
        s = self.store
        if length is None:
            out: Any = s.sample(batch_size, beta=beta)
        else:
            out = self.sample_sequences(batch_size, length, **({} if beta is None else {"beta": beta}))
        return out, self.stats()

    def stats(self) -> dict[str, Any]:
        """``n`` sampleable transitions; prioritized stores: ``mass`` (total) and ``min`` (smallest positive)."""
        s = self.store
        out: dict[str, Any] = {"n": len(s), "id_range": s.id_range}
        if s.schema.prioritized is not None:
            out["mass"], out["min"] = s.priority_mass()
            out["beta"] = s.beta
        return out

    def gather(self, ids: Any) -> Batch:
        return self.store.gather(ids)

    def update_priorities(self, ids: Any, priorities: Any) -> int:
        return self.store.update_priorities(ids, priorities)

    def schema(self) -> dict[str, Any]:
        return self.store.schema.to_json()

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Any other store method or property (``len``: ``call("__len__")``)."""
        attr = getattr(self.store, name)
        return attr(*args, **kwargs) if callable(attr) else attr

    # -- durability ------------------------------------------------------------------------------------
    def commit(self) -> int:
        self.store.commit()
        return self.store.generation

    def close(self) -> None:
        self.store.close()

    def __ray_shutdown__(self) -> None:
        """Ray shuts the actor down gracefully (its handles went out of scope): commit and close."""
        if not self.store.closed:
            self.store.close()


ReplayActor = ray.remote(_Replay)
"""``ReplayActor.remote(path, **create_kwargs)`` creates a store at ``path`` on the actor's node;
``ReplayActor.remote(path, open=True)`` resumes it. ``ReplayActor.options(...)`` sets Ray's resources."""


# -- writers --------------------------------------------------------------------------------------------
class RemoteWriter:
    """``reset``/``step`` for env stream ``env`` of a ``ReplayActor``'s store, shipped in blocks of ``block`` steps.

    Arguments are checked here, against the store's schema, so a bad call raises where it is made. Steps
    wait in a local buffer until ``block`` of them are ready, the episode ends or ``flush()``; a block
    and the resets before it go to the actor in one call. ``flush()`` sends the rest and waits until the
    actor wrote everything (it raises an error the actor raised). Not thread-safe: one writer per stream.
    """

    def __init__(self, actor: Any, env: int = 0, block: int = 256, in_flight: int = 2) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block: expected an int >= 1, got {block!r}")
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
            raise ValueError(f"in_flight: expected an int >= 1, got {in_flight!r}")
        self.actor = actor
        self.schema = Schema.from_json(ray.get(actor.schema.remote()))
        n = self.schema.num_envs
        if isinstance(env, bool) or not isinstance(env, int) or not 0 <= env < n:
            raise ValueError(f"env: expected an env stream index in 0..{n - 1}, got {env!r}")
        self.env = env
        self.block = block
        self.in_flight = in_flight
        one = dataclasses.replace(self.schema, num_envs=1, vector=False)
        self._inputs = Inputs(one)
        self._names = tuple(e.name for e in one.extras)
        s = self.schema
        self._frames = np.zeros((block, *s.obs_shape), s.obs_dtype)
        self._actions = np.zeros((block, *s.action_shape), s.action_dtype)
        self._rewards = np.zeros(block, np.float64)
        self._extras = {e.name: np.zeros((block, *e.shape), e.dtype) for e in s.extras}
        self._n = 0  # steps buffered in the open block
        self._ops: list[tuple[Any, ...]] = []  # closed blocks and resets not sent yet
        self._op_steps = 0  # steps in them
        self._refs: deque[Any] = deque()
        self._open = False  # an episode is open (a step may follow)
        self.next_id = -1  # the store's next id after the last block the actor acknowledged

    def reset(self, obs: Any) -> None:
        """Start the stream's next episode with its observation ``obs`` (the open one ends as truncated)."""
        frame = self._inputs.obs(obs, "obs")
        self._close_block(False, False, False)
        self._ops.append(("reset", self.env, np.array(frame, copy=True)))
        self._open = True

    def step(self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any, **extras: Any) -> None:
        """One transition of the stream. ``next_obs=None`` on a step that ends the episode: its final
        observation is not available (it reads as zeros)."""
        if not self._open:
            raise EpisodeStateError("RemoteWriter.step() without an open episode: call reset(obs) first")
        inp = self._inputs
        act = inp.action(action)
        rew = inp.reward(reward)
        term = inp.flag("terminated", terminated)
        trunc = bool(inp.flag("truncated", truncated)) and not term
        if next_obs is None and not (term or trunc):
            raise ValueError("next_obs=None (final observation missing) is only allowed on a step that ends the"
                             " episode (terminated or truncated)")
        frame = None if next_obs is None else inp.obs(next_obs)
        xs = inp.extras(extras) if (extras or self._names) else {}
        i = self._n
        self._actions[i] = act
        self._rewards[i] = rew
        if frame is not None:
            self._frames[i] = frame
        for name, value in xs.items():
            self._extras[name][i] = value
        self._n = i + 1
        if term or trunc:
            self._close_block(bool(term), trunc, frame is None)
            self._open = False
        elif self._n == self.block:
            self._close_block(False, False, False)
        if self._op_steps >= self.block:
            self._ship()

    def flush(self) -> int:
        """Send every buffered step and wait until the actor wrote them all; returns the store's next id."""
        self._close_block(False, False, False)
        self._ship()
        while self._refs:
            self.next_id = ray.get(self._refs.popleft())
        return self.next_id

    def close(self) -> None:
        self.flush()

    def _close_block(self, terminated: bool, truncated: bool, missing: bool) -> None:
        n = self._n
        if n == 0:
            return
        term = np.zeros(n, np.bool_)
        trunc = np.zeros(n, np.bool_)
        term[-1], trunc[-1] = terminated, truncated
        frames = self._frames[: n - 1 if missing else n].copy()
        self._ops.append(("extend", self.env, self._actions[:n].copy(), self._rewards[:n].copy(), frames, term, trunc,
                          missing, {k: v[:n].copy() for k, v in self._extras.items()}))
        self._op_steps += n
        self._n = 0

    def _ship(self) -> None:
        if not self._ops:
            return
        self._refs.append(self.actor.append.remote(self._ops))
        self._ops, self._op_steps = [], 0
        while len(self._refs) > self.in_flight:
            self.next_id = ray.get(self._refs.popleft())


# -- learners -------------------------------------------------------------------------------------------
@dataclasses.dataclass
class RemoteBatch(Batch):
    """A ``Batch`` drawn across actors: ``actor[i]`` is the position (in the actors given to ``batches``)
    of the actor row ``i`` came from; ``index[i]`` is an id of that actor's store."""

    actor: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))


class RemoteBatches(Iterator[Any]):
    """The iterator ``batches()`` returns; also routes priority updates back to the actors."""

    def __init__(self, actors: Sequence[Any], batch_size: int, prefetch: int = 4, seed: int | None = None,
                 length: int | None = None, beta: float | None = None) -> None:
        if not actors:
            raise ValueError("batches(): expected at least one ReplayActor")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch: expected an int >= 0, got {prefetch!r}")
        self.actors = list(actors)
        self.batch_size = batch_size
        self.length = length
        self.beta = beta
        self.prefetch = prefetch
        self._rng = np.random.default_rng(seed)
        self._stats = ray.get([a.stats.remote() for a in self.actors])
        self._pending: deque[tuple[np.ndarray, list[Any], list[Any]]] = deque()
        self._updates: list[Any] = []

    def _weights(self) -> np.ndarray:
        key = "mass" if "mass" in self._stats[0] else "n"
        return np.array([float(st.get(key, 0.0)) for st in self._stats])

    def _request(self) -> None:
        w = self._weights()
        if w.sum() <= 0:
            self._stats = ray.get([a.stats.remote() for a in self.actors])
            w = self._weights()
            if w.sum() <= 0:
                raise NotSampleableError("batches(): no actor has sampleable transitions yet")
        counts = self._rng.multinomial(self.batch_size, w / w.sum())
        draws = [a.draw.remote(int(c), self.length, self.beta) if c else None for a, c in zip(self.actors, counts,
                                                                                               strict=True)]
        # actors that got no rows report their weight, so one that was empty is drawn from once it fills
        looks = [None if c else a.stats.remote() for a, c in zip(self.actors, counts, strict=True)]
        self._pending.append((counts, draws, looks))

    def __iter__(self) -> RemoteBatches:
        return self

    def __next__(self) -> Any:
        while len(self._pending) < self.prefetch + 1:
            self._request()
        counts, draws, looks = self._pending.popleft()
        got = ray.get([d for d in draws if d is not None])
        parts, who = [], []
        for i, (d, lk) in enumerate(zip(draws, looks, strict=True)):
            if d is not None:
                batch, self._stats[i] = got.pop(0)
                parts.append(batch)
                who.append(np.full(int(counts[i]), i, np.int64))
            else:
                self._stats[i] = ray.get(lk)
        sources = [i for i, d in enumerate(draws) if d is not None]
        out = _concat(parts)
        if "min" in self._stats[0] and len(parts) > 1:
            out.weight = self._mixture_weights(parts, sources)
        fields = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
        if isinstance(out, Batch):
            return RemoteBatch(**fields, actor=np.concatenate(who))
        out.actor = np.concatenate(who)  # a sequence batch: carries the rows' actors as an attribute
        return out

    def _mixture_weights(self, parts: list[Any], sources: list[int]) -> np.ndarray:
        """Importance weights of the mixture. Actor a's weights are (m_i / m_min_a) ** -beta (its own
        normaliser, m_min_a its smallest mass); the mixture draws row i with probability m_i / M over all
        actors, so its weights are normalised by the smallest mass of all: scale by (m_min / m_min_a) ** beta."""
        mins = [st["min"] for st in self._stats if st.get("min", 0.0) > 0]
        m_min = min(mins) if mins else 0.0
        scaled = []
        for part, i in zip(parts, sources, strict=True):
            st = self._stats[i]
            beta = self.beta if self.beta is not None else st["beta"]
            factor = (m_min / st["min"]) ** beta if st["min"] > 0 and m_min > 0 else 1.0
            scaled.append(np.asarray(part.weight, np.float64) * factor)
        return np.concatenate(scaled).astype(np.float32)

    def update_priorities(self, batch: Any, priorities: Any) -> None:
        """Send each actor the new priorities of its rows of ``batch`` (asynchronous: an actor applies them
        before any draw requested after this call; errors are raised by the next call or ``wait()``)."""
        p = np.asarray(priorities, np.float64).reshape(-1)
        if p.shape[0] != len(batch.index):
            raise ValueError(f"priorities: expected {len(batch.index)} values (one per row), got {p.shape[0]}")
        self._check_updates()
        for i in np.unique(batch.actor).tolist():
            rows = batch.actor == i
            self._updates.append(self.actors[i].update_priorities.remote(batch.index[rows], p[rows]))

    def _check_updates(self) -> None:
        if self._updates:
            done, self._updates = ray.wait(self._updates, num_returns=len(self._updates), timeout=0)
            ray.get(done)

    def wait(self) -> None:
        """Wait for every priority update sent so far (raises an actor's error)."""
        ray.get(self._updates)
        self._updates = []


def batches(actors: Any, batch_size: int, prefetch: int = 4, seed: int | None = None, length: int | None = None,
            beta: float | None = None) -> RemoteBatches:
    """An endless iterator of batches of ``batch_size`` rows drawn across ``actors`` (one ``ReplayActor`` or
    several): each batch splits its rows among the actors by a multinomial draw with probabilities
    proportional to their sampleable transitions (prioritized stores: their total priority mass), as of
    their last answers. ``prefetch`` batches are requested ahead. ``length``: sequence batches
    (``sample_sequences``). Prioritized stores: importance weights are those of the mixture (normalised by
    the smallest mass over all actors) for ``beta`` (default: each store's). Rows come grouped by actor;
    ``batch.actor`` says which; ``it.update_priorities(batch, p)`` routes new priorities back.
    """
    if not isinstance(actors, (list, tuple)):
        actors = [actors]
    return RemoteBatches(actors, batch_size, prefetch, seed, length, beta)


def _concat(parts: list[Any]) -> Any:
    """Batches (or sequence batches) joined row-wise: every array field along its first axis, dicts by key."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(first):
        values = [getattr(p, f.name) for p in parts]
        if isinstance(values[0], dict):
            fields[f.name] = {k: np.concatenate([v[k] for v in values]) for k in values[0]}
        elif isinstance(values[0], np.ndarray):
            fields[f.name] = np.concatenate(values)
        else:
            fields[f.name] = values[0]
    return type(first)(**fields)
