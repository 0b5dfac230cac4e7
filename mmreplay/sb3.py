"""Stable-Baselines3 and CleanRL: a drop-in ``ReplayBuffer`` backed by a store on disk.

Needs ``stable-baselines3`` (``pip install 'mmreplay[sb3]'``).

``ReplayBuffer`` subclasses SB3's ``stable_baselines3.common.buffers.ReplayBuffer`` and is constructed
as SB3 constructs buffers, so ``DQN(..., replay_buffer_class=mmreplay.sb3.ReplayBuffer)`` (also QR-DQN,
SAC, TD3) and CleanRL's scripts (which call the same constructor, ``add`` and ``sample``) use it
unchanged. mmreplay's own options come as keyword arguments (``replay_buffer_kwargs`` in SB3).

What it does with SB3's calls:

- ``add(obs, next_obs, action, reward, done, infos)``: one transition per env, each env its own
  stream. An ``obs`` that does not continue the env's previous ``next_obs`` starts a new episode (the
  previous one, if still open, ends truncated at its last step: CleanRL passes only terminations as
  ``done``). ``done`` with ``infos[i]["TimeLimit.truncated"]`` is a truncation when
  ``handle_timeout_termination`` (bootstrap from ``next_obs``, the real final observation), a
  termination otherwise. ``infos`` is read for nothing else (CleanRL passes a Gymnasium vector env's
  dict) but, on a termination whose ``next_obs`` is already the next episode's (Gymnasium 0.29 resets
  inside ``step``), its ``"final_observation"``: the final frame stored (else ``next_obs``'s; ``dones=1``).
- Frame stacks (``VecFrameStack`` channels first or last, Gymnasium's ``FrameStackObservation``) are
  stored one frame per step and rebuilt at sample time; every ``add`` checks the stack it was given
  equals the one the store will rebuild, and refuses one that does not (``frame_stack=1`` stores whole
  observations instead).
- ``sample(batch_size, env=None)``: ``ReplayBufferSamples`` of tensors on the buffer's device, SB3's
  shapes and dtypes; ``discounts`` is ``gamma ** m`` (0 after a termination) when ``n_steps > 1``.
- Pickling (``save_replay_buffer``) commits the store and keeps only its location and this object's
  small state; unpickling (``load_replay_buffer``) reopens that commit (a buffer of this process that
  still holds the store is closed at its last commit first: the loaded one takes the store over).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import warnings
import weakref
from typing import Any

import numpy as np

try:
    import torch as th
    from gymnasium import spaces
    from stable_baselines3.common.buffers import BaseBuffer
    from stable_baselines3.common.buffers import ReplayBuffer as _SB3ReplayBuffer
    from stable_baselines3.common.type_aliases import ReplayBufferSamples
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"mmreplay.sb3 needs stable-baselines3 ({exc}): pip install 'mmreplay[sb3]'") from exc

from .batch import Batch
from .store import ReplayStore

__all__ = ["ReplayBuffer", "FrameLayout"]

# SB3 before 2.7 has no n-step samples: its ReplayBufferSamples has no ``discounts`` field
_HAS_DISCOUNTS = "discounts" in ReplayBufferSamples._fields


# -- frames of an observation --------------------------------------------------------------------------
class FrameLayout:
    """How one observation splits into ``stack`` frames, and how stacked frames make an observation again.

    ``axis`` is ``"first"`` (the frames follow each other on the leading axis: ``VecFrameStack`` after
    ``VecTransposeImage``, Gymnasium's ``FrameStackObservation``) or ``"last"`` (channels-last
    ``VecFrameStack``: frames concatenated on the channel axis). ``stack == 1``: whole observations.
    """

    def __init__(self, obs_shape: tuple[int, ...], stack: int, axis: str) -> None:
        self.obs_shape, self.stack, self.axis = obs_shape, stack, axis
        self.obs_size = int(np.prod(obs_shape))
        if stack == 1:
            self.frame_shape: tuple[int, ...] = obs_shape
            return
        size = obs_shape[0] if axis == "first" else obs_shape[-1]
        if size % stack:
            raise ValueError(f"frame_stack={stack} does not divide the observation's stacking axis ({axis}:"
                             f" {size} in shape {obs_shape}); pass frame_stack=1 to store whole observations")
        per = size // stack  # channels per frame: 1 (the axis disappears from a frame) or more
        if axis == "first":
            self._split = (stack, per, *obs_shape[1:]) if per > 1 else (stack, *obs_shape[1:])
            self.frame_shape = self._split[1:]
        else:
            self._split = (*obs_shape[:-1], stack, per)
            self.frame_shape = (*obs_shape[:-1], per) if per > 1 else obs_shape[:-1]

    @classmethod
    def detect(cls, space: Any, frame_stack: int | str | None) -> FrameLayout:
        """The layout ``frame_stack`` asks for (``"auto"``: recognised from an image space's shape)."""
        shape = tuple(int(d) for d in space.shape)
        image = isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(shape) in (3, 4)
        if frame_stack in (None, 1):
            return cls(shape, 1, "first")
        if frame_stack == "auto":
            if not image:
                return cls(shape, 1, "first")
            if len(shape) == 4:  # FrameStackObservation over frames with a channel axis: (k, H, W, C)
                return cls(shape, shape[0], "first")
            axis = "first" if int(np.argmin(shape)) == 0 else "last"  # SB3's channels-first rule
            channels = shape[0] if axis == "first" else shape[-1]
            if channels in (1, 3):
                return cls(shape, 1, axis)  # one grayscale or RGB frame
            return cls(shape, channels // 3 if channels % 3 == 0 else channels, axis)
        if isinstance(frame_stack, (bool, np.bool_)) or not isinstance(frame_stack, (int, np.integer)) \
                or frame_stack < 1:
            raise ValueError(f"frame_stack must be 'auto', a positive int or None, got {frame_stack!r}")
        if len(shape) < 2:
            raise ValueError(f"frame_stack={frame_stack} needs an observation with a stacking axis, got shape"
                             f" {shape}; pass frame_stack=1")
        axis = "last" if len(shape) == 3 and int(np.argmin(shape)) != 0 else "first"
        return cls(shape, int(frame_stack), axis)

    def frames(self, obs: np.ndarray) -> np.ndarray:
        """``(n, *obs_shape)`` observations as ``(n, stack, *frame_shape)`` frames, oldest first."""
        n = obs.shape[0]
        if self.stack == 1:
            return obs.reshape(n, 1, *self.frame_shape)
        if self.axis == "first":
            return obs.reshape(n, self.stack, *self.frame_shape)
        split = obs.reshape(n, *self._split)  # (n, H, W, k, c)
        return np.moveaxis(split, -2, 1).reshape(n, self.stack, *self.frame_shape)

    def observations(self, stacked: np.ndarray) -> np.ndarray:
        """The inverse of ``frames``: ``(B, stack, *frame_shape)`` -> ``(B, *obs_shape)``."""
        b = stacked.shape[0]
        if self.stack == 1 or self.axis == "first":
            return stacked.reshape(b, *self.obs_shape)
        split = stacked.reshape(b, self.stack, *self._split[:-2], self._split[-1])  # (B, k, H, W, c)
        if isinstance(split, np.ndarray):
            return np.ascontiguousarray(np.moveaxis(split, 1, -2)).reshape(b, *self.obs_shape)
        return split.movedim(1, -2).reshape(b, *self.obs_shape)  # a tensor (on the device: the feed's)


# -- the store's lifetime -------------------------------------------------------------------------------
_OPEN: dict[str, weakref.ref[_Handle]] = {}  # store path -> the handle that holds it in this process
_OPEN_LOCK = threading.Lock()


class _Handle:
    """The store of one buffer and what closing it must do; shared with the buffer's GC finalizer."""

    def __init__(self, store: ReplayStore, temp_dir: str | None) -> None:
        self.store, self.temp_dir = store, temp_dir
        self.paired = False  # pickled at least once: its last commit is paired with a checkpoint
        self.added_since_pair = 0
        self.feed: Any = None  # mmreplay.torch.DeviceFeed, for a buffer on a GPU (made at the first sample)
        with _OPEN_LOCK:
            _OPEN[os.path.realpath(store.path)] = weakref.ref(self)

    def drop_feed(self) -> None:
        if self.feed is not None:
            self.feed.close()
            self.feed = None

    def close(self, commit: bool | None, warn: bool = True) -> None:
        store = self.store
        if store.closed:
            return
        self.drop_feed()
        if commit is None:
            commit = not self.paired and self.temp_dir is None
            if self.paired and self.added_since_pair and warn:
                warnings.warn(f"mmreplay.sb3.ReplayBuffer: closing {store.path} at the last save_replay_buffer;"
                              f" the {self.added_since_pair} add() calls since are not kept (no checkpoint is"
                              " paired with them). Call close(commit=True) to keep them.", stacklevel=3)
        try:
            store.close(commit=commit)
        finally:
            with _OPEN_LOCK:
                key = os.path.realpath(store.path)
                if key in _OPEN and _OPEN[key]() is self:
                    del _OPEN[key]
            if self.temp_dir is not None:
                shutil.rmtree(self.temp_dir, ignore_errors=True)


def _same(prev: np.ndarray | None, obs: np.ndarray) -> bool:
    """Whether ``obs`` continues an episode whose last ``next_obs`` was ``prev`` (None: it ended)."""
    return prev is not None and _equal(prev, obs)


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Byte equality of two arrays of one shape and dtype (a copy and a memcmp: ~5x ``np.array_equal``
    on a 4x84x84 stack; NaN equals the same NaN, as the same observation should)."""
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _finalize(handle: _Handle) -> None:
    """The buffer was garbage-collected (or the interpreter exits): close as ``close()`` would."""
    try:
        handle.close(None)
    except Exception as exc:  # at exit the store's threads may be gone: the store stays at its last commit
        if handle.temp_dir is not None:
            shutil.rmtree(handle.temp_dir, ignore_errors=True)
        else:
            warnings.warn(f"mmreplay.sb3.ReplayBuffer: {handle.store.path} could not be closed when the buffer"
                          f" was collected ({exc}); it stays at its last commit. Call close() before exiting.",
                          stacklevel=2)


# -- the buffer -----------------------------------------------------------------------------------------
class ReplayBuffer(_SB3ReplayBuffer):
    """SB3's ``ReplayBuffer`` on an mmreplay store (see the module docstring for what each call does).

    SB3's arguments: ``buffer_size`` counts transitions of all envs together (the store keeps at least
    that many); ``optimize_memory_usage`` is accepted and changes nothing (frames are stored once either
    way). mmreplay's options (``replay_buffer_kwargs``):

    - ``path``: the store directory (new or empty); ``None``: a temporary directory removed when the
      buffer is closed or garbage-collected (kept if the buffer is pickled: the pickle refers to it).
    - ``n_steps``, ``gamma``: n-step returns (``gamma`` must be the algorithm's); ``discounts`` in the
      samples when ``n_steps > 1``.
    - ``frame_stack``: ``"auto"`` recognises stacked uint8 image observations; an int says how many
      frames one observation holds; ``1`` (or ``None``) stores whole observations.
    - ``pad``: how stacks are padded at an episode's start: ``"zeros"`` (``VecFrameStack``), ``"first"``
      (copies of the reset frame: ``FrameStackObservation``), ``"auto"`` (read from the first episode).
    - ``compression``, ``chunk_size``, ``seed``, ``read_threads``: as in ``ReplayStore.create``.

    ``close(commit=None)`` releases the store; see its docstring for what it keeps.
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, path: str | os.PathLike[str] | None = None,
                 n_steps: int = 1, gamma: float = 0.99, frame_stack: int | str | None = "auto",
                 pad: str = "auto", compression: str | None = "auto", chunk_size: int | None = None,
                 seed: int = 0, read_threads: int | None = None) -> None:
        if not isinstance(observation_space, (spaces.Box, spaces.Discrete)):
            raise TypeError(f"mmreplay.sb3.ReplayBuffer stores Box and Discrete observation spaces, got"
                            f" {type(observation_space).__name__}; for Dict observations use SB3's"
                            " DictReplayBuffer, or flatten them (gymnasium.wrappers.FlattenObservation)")
        if pad not in ("auto", "zeros", "first"):
            raise ValueError(f"pad must be 'auto', 'zeros' or 'first', got {pad!r}")
        if int(n_envs) < 1 or int(buffer_size) < 1:
            raise ValueError(f"buffer_size and n_envs must be >= 1, got {buffer_size} and {n_envs}")
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(int(buffer_size) // self.n_envs, 1)  # per env, as SB3 counts pos
        self.optimize_memory_usage = bool(optimize_memory_usage)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.n_steps, self.gamma = int(n_steps), float(gamma)
        if self.n_steps > 1 and not _HAS_DISCOUNTS:
            raise ValueError("n_steps > 1 needs stable-baselines3 >= 2.7 (its samples carry discounts); upgrade it"
                             " or pass n_steps=1")
        self.layout = FrameLayout.detect(observation_space, frame_stack)
        self._obs_dtype = np.dtype(observation_space.dtype)
        self._action_dtype = np.dtype(self._maybe_cast_dtype(action_space.dtype))
        self._pad = pad
        self._path = None if path is None else os.fspath(path)
        self._create: dict[str, Any] = dict(capacity=int(buffer_size), n_step=self.n_steps, gamma=self.gamma,
                            compression=compression, chunk_size=chunk_size, seed=seed)
        self._read_threads = read_threads
        self._next: list[np.ndarray | None] = [None] * self.n_envs  # each env's last next_obs (None: ended)
        self._handle: _Handle | None = None
        held = self._path is not None and os.path.exists(os.path.join(self._path, "manifest.json"))
        # a path that holds a store: SB3's Algorithm.load() builds a buffer before load_replay_buffer()
        # replaces it, so the store is left alone until an add() (which refuses it)
        if (self._pad != "auto" or self.layout.stack == 1) and not held:
            self._open_new(self._pad if self._pad != "auto" else "zeros")

    # -- the store ----------------------------------------------------------------------------------------
    @property
    def store(self) -> ReplayStore:
        """The ``ReplayStore`` under the buffer (created at the first ``add`` when ``pad="auto"``)."""
        if self._handle is None:
            raise ValueError("the buffer's store is created at the first add() (pad='auto' reads the padding"
                             " from the first episode); add transitions first, or pass pad='zeros'/'first'")
        return self._handle.store

    def _open_new(self, pad: str) -> None:
        temp = None
        path = self._path
        if path is not None and os.path.exists(os.path.join(path, "manifest.json")):
            raise ValueError(f"add(): {path} already holds a store; resume it with model.load_replay_buffer(pickle)"
                             " (or pickle.load of the saved buffer), or give replay_buffer_kwargs a new path")
        if path is None:
            temp = tempfile.mkdtemp(prefix="mmreplay-sb3-")
            path = temp
        c = self._create
        try:
            store = ReplayStore.create(
                path, c["capacity"], obs_shape=self.layout.frame_shape, obs_dtype=self._obs_dtype,
                stack=self.layout.stack, n_step=c["n_step"], gamma=c["gamma"], action_shape=(self.action_dim,),
                action_dtype=self._action_dtype, num_envs=self.n_envs, vector=self.n_envs > 1, pad=pad,
                seed=c["seed"], chunk_size=c["chunk_size"], compression=c["compression"],
                read_threads=self._read_threads, metadata={"sb3": {"buffer_size": c["capacity"],
                                                                   "n_envs": self.n_envs}})
        except BaseException:
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
            raise
        self._pad = pad
        self._attach(_Handle(store, temp))

    def _attach(self, handle: _Handle) -> None:
        self._handle = handle
        self._finalizer = weakref.finalize(self, _finalize, handle)

    def close(self, commit: bool | None = None) -> None:
        """Release the store. Safe to call twice; the buffer cannot be used afterwards.

        ``commit=None``: a buffer never pickled commits what it holds (a temporary store is removed);
        a buffer pickled by ``save_replay_buffer`` stays at its last pickle, the commit a model checkpoint
        was paired with, so resuming from that checkpoint finds the store it expects (``add()`` calls
        since are dropped, with a warning). ``commit=True`` keeps them (a pickle taken earlier then no
        longer loads); ``commit=False`` never commits. The same happens when the buffer is garbage-collected.
        """
        if self._handle is not None:
            self._finalizer.detach()
            self._handle.close(commit)

    # -- SB3's calls --------------------------------------------------------------------------------------
    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]] | dict[str, Any]) -> None:
        n, lay = self.n_envs, self.layout
        obs_a = self._obs_arg(obs, "obs")
        next_a = self._obs_arg(next_obs, "next_obs")
        act = np.asarray(action)
        if act.size != n * self.action_dim:
            raise ValueError(f"add(): action has {act.size} values, expected n_envs * action_dim ="
                             f" {n} * {self.action_dim} (shape {act.shape})")
        act = act.reshape(n, self.action_dim).astype(self._action_dtype, copy=False)
        rew = np.asarray(reward, np.float32).reshape(-1)
        dn = np.asarray(done).reshape(-1).astype(bool)
        if rew.size != n or dn.size != n:
            raise ValueError(f"add(): reward and done need one entry per env ({n}), got {rew.size} and {dn.size}")
        timeouts = np.zeros(n, bool)
        # infos is read only for timeouts, as SB3 reads it: CleanRL passes a Gymnasium vector env's infos
        # (one dict of arrays, whatever its length) with handle_timeout_termination=False
        if self.handle_timeout_termination:
            if isinstance(infos, dict) or len(infos) != n:
                raise ValueError(f"add(): handle_timeout_termination=True reads infos as SB3's VecEnv gives them,"
                                 f" a list of one dict per env ({n}); got {type(infos).__name__} of {len(infos)}."
                                 " With a Gymnasium vector env pass handle_timeout_termination=False (CleanRL does)")
            timeouts = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])
        terminated, truncated = dn & ~timeouts, dn & timeouts
        f_obs, f_next = lay.frames(obs_a), lay.frames(next_a)
        starts = [i for i in range(n) if not _same(self._next[i], obs_a[i])]
        if self._handle is None:  # pad="auto": the first episode says how it pads
            self._pad = self._pad_of(f_obs[starts[0]]) if starts else "zeros"
        for i in starts:
            self._check_start(i, f_obs[i])
        new = f_next[:, -1]
        if terminated.any():
            # A termination's next_obs may be the next episode's first observation: Gymnasium 0.29's vector
            # envs reset inside step() and keep the final one in infos["final_observation"], and CleanRL
            # passes next_obs unchanged on terminations (no target reads it: dones=1). The final frame is
            # taken from infos when they hold it, else next_obs's newest frame is stored as it is.
            for i in np.flatnonzero(terminated).tolist():
                final = self._final_frames(infos, i)
                if final is not None and (lay.stack == 1 or _equal(final[:-1], f_obs[i, 1:])):
                    new = new.copy() if new.base is not None else new  # (not the caller's next_obs)
                    new[i] = final[-1]
        if lay.stack > 1:
            bad = [i for i in range(n) if not terminated[i] and not _equal(f_next[i, :-1], f_obs[i, 1:])]
            if bad:
                raise ValueError(
                    f"add(): env {bad[0]}'s next_obs is not its obs moved on by one frame (frames 1..{lay.stack - 1}"
                    f" of obs must be frames 0..{lay.stack - 2} of next_obs), so the stacks cannot be stored one"
                    f" frame per step. If the observations are not frame stacks (or the wrapper skips frames),"
                    f" pass frame_stack=1 (replay_buffer_kwargs=dict(frame_stack=1)) to store whole observations")
        # everything is checked: write
        if self._handle is None:
            self._open_new(self._pad)
        store = self.store
        if n == 1:
            if starts:
                store.reset(f_obs[0, -1])
            store.step(act[0], rew[0], new[0], bool(terminated[0]), bool(truncated[0]))
        else:
            for i in starts:
                store.reset(f_obs[i, -1], env=i)
            store.step(act, rew, new, terminated, truncated)
        for i in range(n):
            self._next[i] = None if dn[i] else next_a[i].copy()
        assert self._handle is not None
        self._handle.added_since_pair += 1
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0

    def _obs_arg(self, value: Any, what: str) -> np.ndarray:
        arr = np.asarray(value)
        want = (self.n_envs, *self.obs_shape)
        if arr.size != self.n_envs * self.layout.obs_size:
            raise ValueError(f"add(): {what} has shape {arr.shape}, expected {want} (n_envs, *observation shape)")
        return arr.reshape(want).astype(self._obs_dtype, copy=False)

    def _final_frames(self, infos: Any, i: int) -> np.ndarray | None:
        """Env ``i``'s final observation as frames, from a Gymnasium vector env's ``infos`` (None: not there)."""
        if not isinstance(infos, dict) or "final_observation" not in infos:
            return None
        mask = infos.get("_final_observation")
        if mask is not None and not bool(np.asarray(mask).reshape(-1)[i]):
            return None
        final = infos["final_observation"][i]
        if final is None:
            return None
        final = np.asarray(final)
        if final.size != self.layout.obs_size:
            return None
        return self.layout.frames(final.reshape(1, *self.obs_shape).astype(self._obs_dtype, copy=False))[0]

    def _pad_of(self, frames: np.ndarray) -> str:
        """The padding a new episode's stack shows: older frames equal to the newest ("first") or zero."""
        if self.layout.stack > 1 and frames[-1].any() and (frames[:-1] == frames[-1]).all():
            return "first"
        return "zeros"

    def _check_start(self, i: int, frames: np.ndarray) -> None:
        """A new episode's first stack must be its first frame padded as the store pads."""
        if self.layout.stack == 1:
            return
        older, first = frames[:-1], frames[-1]
        ok = not older.any() if self._pad == "zeros" else bool((older == first).all())
        if ok:
            return
        other = "first" if self._pad == "zeros" else "zeros"
        hint = (f" It is padded as pad={other!r} pads: create the buffer with pad={other!r}."
                if (self._pad_of(frames) == other or (other == "zeros" and not older.any())) else
                " Stacks must be consecutive frames of one episode; pass frame_stack=1 to store whole"
                " observations.")
        raise ValueError(f"add(): env {i}'s obs starts a new episode (it does not continue that env's previous"
                         f" next_obs), but its older frames are not the padding pad={self._pad!r} gives"
                         f" ({'zeros' if self._pad == 'zeros' else 'copies of the newest frame'}).{hint}")

    def sample(self, batch_size: int, env: Any = None) -> ReplayBufferSamples:
        """``batch_size`` transitions drawn uniformly (seeded) from the store, as SB3 tensors.

        On a CUDA device (and without ``VecNormalize``, which normalizes numpy arrays) the batches come
        through ``mmreplay.torch.DeviceFeed``: the next ones are read while the learner computes, sent to
        the device on a side stream and stacked there; the same rows as ``store.batches(batch_size)``
        (drawn two batches ahead, so a transition added meanwhile first appears a batch or two later)."""
        if env is None and self.device.type == "cuda":
            return self._device_samples(self._device_feed().next(batch_size))
        return self._to_samples(self.store.sample(batch_size), env)

    def _device_feed(self) -> Any:
        handle = self._handle
        if handle is None:
            self.store  # noqa: B018 - raises the error that says why there is no store yet
        assert handle is not None
        if handle.feed is None:
            from .torch import DeviceFeed

            handle.feed = DeviceFeed(handle.store, self.device, prefetch=2)
        return handle.feed

    def _device_samples(self, batch: Any) -> ReplayBufferSamples:
        """A ``TensorBatch`` already on the device as SB3's ``ReplayBufferSamples`` (the shapes and dtypes of
        ``_to_samples``)."""
        lay = self.layout
        obs, next_obs = lay.observations(batch.obs), lay.observations(batch.next_obs)
        if isinstance(self.observation_space, spaces.Discrete):
            obs, next_obs = obs.reshape(-1, *self.obs_shape), next_obs.reshape(-1, *self.obs_shape)
        fields: list[Any] = [obs, batch.action, next_obs, batch.terminated.to(th.float32).reshape(-1, 1),
                             batch.reward.reshape(-1, 1)]
        if _HAS_DISCOUNTS:
            fields.append(batch.discount.reshape(-1, 1) if self.n_steps > 1 else None)
        return ReplayBufferSamples(*fields)

    def _to_samples(self, batch: Batch, env: Any = None) -> ReplayBufferSamples:
        """A store ``Batch`` as SB3's ``ReplayBufferSamples`` on ``self.device`` (VecNormalize applied)."""
        lay = self.layout
        obs, next_obs = lay.observations(batch.obs), lay.observations(batch.next_obs)
        if isinstance(self.observation_space, spaces.Discrete):
            obs, next_obs = obs.reshape(-1, *self.obs_shape), next_obs.reshape(-1, *self.obs_shape)
        dones = batch.terminated.astype(np.float32).reshape(-1, 1)
        rewards = batch.reward.reshape(-1, 1)
        discounts = batch.discount.reshape(-1, 1) if self.n_steps > 1 else None
        fields: list[Any] = [self.to_torch(np.asarray(self._normalize_obs(obs, env))), self.to_torch(batch.action),
                             self.to_torch(np.asarray(self._normalize_obs(next_obs, env))), self.to_torch(dones),
                             self.to_torch(self._normalize_reward(rewards, env))]
        if _HAS_DISCOUNTS:
            fields.append(None if discounts is None else self.to_torch(discounts))
        return ReplayBufferSamples(*fields)

    def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> ReplayBufferSamples:
        raise NotImplementedError("mmreplay.sb3.ReplayBuffer samples by transition id: call sample()")

    def reset(self) -> None:
        """Empty the buffer (``store.clear()``): nothing added so far is sampled again."""
        super().reset()
        if self._handle is not None:
            self._handle.drop_feed()  # (its drawn batches hold rows being cleared)
            self.store.clear()
        self._next = [None] * self.n_envs

    @property  # type: ignore[override]
    def dones(self) -> _EpisodeEnds:
        """Write-only: SB3's ``dones[pos] = True`` (before a new ``learn()``) ends every open episode."""
        return _EpisodeEnds(self)

    @dones.setter
    def dones(self, value: Any) -> None:
        raise AttributeError("mmreplay.sb3.ReplayBuffer keeps its flags in the store; dones is write-only by index")

    # -- pickling -----------------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_handle", "_finalizer")}
        h = self._handle
        state["_store_path"] = None
        if h is not None:
            if h.temp_dir is not None:
                warnings.warn(f"mmreplay.sb3.ReplayBuffer: pickling keeps the temporary store {h.store.path}"
                              " (the pickle refers to it); pass replay_buffer_kwargs=dict(path=...) to choose"
                              " where it lives", stacklevel=2)
                h.temp_dir = None
            h.store.commit()
            h.paired, h.added_since_pair = True, 0
            state["_store_path"] = os.path.realpath(h.store.path)
            state["_generation"] = h.store.generation
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        path = state.pop("_store_path")
        generation = state.pop("_generation", None)
        self.__dict__.update(state)
        self._handle = None
        if path is None:
            return
        with _OPEN_LOCK:
            ref = _OPEN.get(path)
        holder = ref() if ref is not None else None
        if holder is not None:  # this process still holds it (load_replay_buffer in the run that saved)
            holder.close(commit=False, warn=False)
        store = ReplayStore.open(path, mode="r+", read_threads=self._read_threads)
        if store.generation != generation:
            store.close(commit=False)
            raise ValueError(
                f"the store at {path} was committed after this buffer was pickled (its commit {store.generation},"
                f" the pickle's {generation}): it no longer holds the state the paired model checkpoint expects."
                " Load the pickle taken with the newest commit, or open the store as it is with"
                " mmreplay.ReplayStore.open(path)")
        handle = _Handle(store, None)
        handle.paired = True
        self._attach(handle)


class _EpisodeEnds:
    """``buffer.dones[pos] = True``: what SB3 writes to cut the last trajectory before a new ``learn()``."""

    def __init__(self, buf: ReplayBuffer) -> None:
        self._buf = buf

    def __setitem__(self, key: Any, value: Any) -> None:
        if np.any(value):  # the next add() of each env then starts a new episode; the open one is truncated
            self._buf._next = [None] * self._buf.n_envs
