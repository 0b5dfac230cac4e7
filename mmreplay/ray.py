"""Replay on a Ray cluster: a store owned by an actor, writers anywhere, a learner drawing from several.

- ``ReplayActor``: a Ray actor that owns one ``ReplayStore`` on its node
  (``ReplayActor.remote(path, **create_kwargs)``; ``open=True`` resumes the store
  at ``path`` from its last commit). It commits on ``commit.remote()`` and on
  ``close.remote()``, and when Ray ends it gracefully (every handle gone out of scope,
  or ``__ray_terminate__``); the driver's ``ray.shutdown()`` does not: close the actor
  (``ray.get(actor.close.remote())``) before it. A killed actor (``ray.kill``, a lost
  node) is a crash: its replacement opens the last commit, and so does the actor itself
  when Ray restarts it (``max_restarts``), whose ``create`` arguments then name the
  store it created; the steps since that commit are lost, so each env stream's next
  write must be a reset (the episode it was writing ends at the commit).
  Calls run one at a time, in the order each caller sent them.
- ``RemoteWriter(actor, env=i, block=256)``: ``reset``/``step`` with the store's
  rules, checked where they are called; steps are shipped to the actor in blocks
  (``extend``), at an episode end, or on ``flush()``. At most ``in_flight`` blocks
  are on their way at once (the writer waits for the oldest, which also reports an
  error the actor raised). An error on a block ends the stream's episode there: the
  writer raises it once, drops the episode's steps not sent yet, and refuses
  ``step()`` until ``reset()``, so no stored transition joins states across lost steps.
- ``batches(actors, B, prefetch=4)``: an endless iterator of batches drawn across
  actors (all prioritized or all uniform), in proportion to their sampleable
  transitions (prioritized stores: their total priority mass), in expectation over
  batches. ``prefetch`` batches are requested ahead. Each batch carries ``actor``
  (which actor each row came from) and the iterator's ``update_priorities(batch, p)``
  sends each actor its rows' new priorities.

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
        # env streams whose episode ended at an error, with why: their extend ops are refused until a reset
        self._broken: dict[int, str] = {}
        if not open and _restarted() and os.path.exists(os.path.join(path, "manifest.json")):
            # Ray restarted this actor (max_restarts) with its first arguments: the store its first life
            # created is resumed from the last commit, as ReplayActor.remote(path, open=True) would. The
            # steps written since that commit are lost, so an episode a writer goes on with would join two
            # distant states: every stream must start a new episode before it writes again.
            self.store = ReplayStore.open(path, mode="r+", seed=seed)
            why = "the actor restarted from its last commit and the steps written since were lost"
            self._broken = dict.fromkeys(range(self.store.schema.num_envs), why)
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
        rewards, next_obs, terminated, truncated, final_missing, extras)``. Returns the next id.

        An op that raises ends its stream's episode there: the stream is marked broken, and its extend ops
        (here and in later calls) are refused until a reset op of that stream starts its next episode.
        The other ops are applied (a later episode is stored whole); then the first error is raised."""
        first: Exception | None = None
        for op in ops:
            env = op[1]
            try:
                if op[0] == "reset":
                    self.reset(op[2], env=env)
                else:
                    _, _, act, rew, nxt, term, trunc, missing, extras = op
                    self.extend(act, rew, nxt, term, trunc, env=env, final_missing=missing, **extras)
            except Exception as exc:  # noqa: BLE001 - raised below, once the other ops are applied
                # the store's reset and extend write nothing when they raise: the steps applied before stay
                # a consistent episode, which the stream's next reset ends as truncated
                self._broken.setdefault(env, f"an earlier block of this stream failed ({type(exc).__name__}: {exc})")
                first = first or exc
        if first is not None:
            raise first
        return self.store.id_range[1]

    def stream_broken(self, env: int) -> str | None:
        """Why env stream ``env``'s extend ops are refused until its next reset, or None if they are not."""
        return self._broken.get(env)

    def _check_stream(self, env: int) -> None:
        why = self._broken.get(env)
        if why is not None:
            raise EpisodeStateError(f"env stream {env}: {why}, so its episode ended there; its next call must be a"
                                    f" reset that starts a new episode (RemoteWriter.reset(obs), or"
                                    f" reset(obs, env={env}) on the actor), got more steps of the ended episode")

    def reset(self, obs: Any, env: int | None = None) -> None:
        self.store.reset(obs, env=env)
        if env is None:
            self._broken.clear()
        else:
            self._broken.pop(env, None)

    def step(self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any, **extras: Any) -> None:
        for env in sorted(self._broken):
            self._check_stream(env)
        self.store.step(action, reward, next_obs, terminated, truncated, **extras)

    def extend(self, actions: Any, rewards: Any, next_obs: Any, terminated: Any, truncated: Any, env: int = 0,
               final_missing: bool = False, **extras: Any) -> int:
        self._check_stream(env)
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

    def draw(self, batch_size: int, length: int | None, beta: float | None) -> tuple[Any, dict[str, Any]]:
        """A batch (or sequence batch) for ``batches()``, with this store's weight for the next draws; no
        batch (None) when nothing is sampleable (emptied since the learner last asked), so the learner
        learns the new weight and draws those rows elsewhere instead of failing on this actor."""
        s = self.store
        if len(s) == 0:
            return None, self.stats()
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
        """Ray ends the actor gracefully: commit and close. Ray calls this when every handle to the actor
        went out of scope or on ``actor.__ray_terminate__.remote()``; not on ``ray.kill`` (a crash) and not
        on the driver's ``ray.shutdown()``, which ends the actor without it: close the actor before."""
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
    actor wrote everything. A rate-limited store takes blocks of at most
    ``rate_limit.most_inserted_at_once`` steps: ``block`` is capped there. Not thread-safe: one writer per
    stream.

    An error the actor raises on a block (``RateLimitTimeout``, a restart that lost the steps since the
    last commit, ...) ends the stream's episode there: what the actor stored before stays, and the
    stream's next reset ends that episode as truncated (a stored transition never joins steps across
    the lost ones). The writer learns of it from the ``step()`` or ``flush()`` that waits for that block:
    it waits for its other blocks in flight, drops its steps of the ended episode not sent yet, raises the
    actor's error once, and then refuses ``step()`` until ``reset(obs)`` starts the next episode. The call
    that raises has done its own work (a step of the ended episode is dropped with it): do not repeat it.
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
        if self.schema.rate_limit is not None:
            # the store refuses a longer extend() block at once: the limit could never allow it
            block = min(block, self.schema.rate_limit.most_inserted_at_once)
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
        self._ended: str | None = None  # why the actor ended the open episode: step() is refused until reset()
        self.next_id = -1  # the store's next id after the last block the actor acknowledged

    def reset(self, obs: Any) -> None:
        """Start the stream's next episode with its observation ``obs`` (the open one ends as truncated)."""
        frame = self._inputs.obs(obs, "obs")
        self._close_block(False, False, False)
        self._ops.append(("reset", self.env, np.array(frame, copy=True)))
        self._open = True
        self._ended = None

    def step(self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any, **extras: Any) -> None:
        """One transition of the stream. ``next_obs=None`` on a step that ends the episode: its final
        observation is not available (it reads as zeros)."""
        if self._ended is not None:
            raise EpisodeStateError(f"RemoteWriter.step() on env stream {self.env}: the actor ended its episode"
                                    f" ({self._ended}); call reset(obs) to start the next episode")
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
        self._wait(0)
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
        self._wait(self.in_flight)

    def _wait(self, keep: int) -> None:
        """Wait until at most ``keep`` blocks are in flight; an error the actor raised ends the episode."""
        while len(self._refs) > keep:
            try:
                self.next_id = ray.get(self._refs.popleft())
            except Exception:
                self._end_broken_episode()
                raise

    def _end_broken_episode(self) -> None:
        """After an error on a block: the actor refuses the rest of the episode it ended (until a reset), so
        the blocks still in flight are waited for (their refusals were caused by that error), and the steps
        of that episode not sent yet are dropped."""
        while self._refs:
            try:
                self.next_id = ray.get(self._refs.popleft())
            except Exception:  # noqa: BLE001 - the first error is the one raised
                pass
        try:
            why = ray.get(self.actor.stream_broken.remote(self.env))
        except Exception as exc:  # noqa: BLE001 - the actor is gone: the blocks it had not committed are lost
            why = f"the actor failed ({type(exc).__name__})"
        if why is None:  # a reset sent after the error started an episode the actor holds whole
            return
        resets = [i for i, op in enumerate(self._ops) if op[0] == "reset"]
        self._ops = self._ops[resets[0]:] if resets else []
        self._op_steps = sum(len(op[2]) for op in self._ops if op[0] == "extend")
        if not resets and self._open:
            self._n = 0
            self._open = False
            self._ended = why


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
        # rows are split by priority mass or by count, and weighted for the mixture: one rule for all
        prioritized = [i for i, st in enumerate(self._stats) if "mass" in st]
        if prioritized and len(prioritized) < len(self.actors):
            uniform = [i for i in range(len(self.actors)) if i not in prioritized]
            raise ValueError(f"batches(): expected actors whose stores are all prioritized or all uniform, got"
                             f" prioritized ones at positions {prioritized} and uniform ones at {uniform}; draw"
                             f" from each kind with its own batches()")
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
        while True:
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
            if all(p is not None for p in parts):
                break
            # an actor had nothing sampleable any more (its new weight is 0): the batch is drawn again
            # across the others (a request made now splits by the weights just learned)
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
    several, all prioritized or all uniform): each batch splits its rows among the actors by a multinomial
    draw with probabilities proportional to their sampleable transitions (prioritized stores: their total
    priority mass), as of their last answers; a batch that found an actor emptied since is drawn again.
    ``prefetch`` batches are requested ahead. ``length``: sequence batches
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
