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
  termination otherwise.
- Frame stacks (``VecFrameStack`` channels first or last, Gymnasium's ``FrameStackObservation``) are
  stored one frame per step and rebuilt at sample time; every ``add`` checks the stack it was given
  equals the one the store will rebuild, and refuses one that does not (``frame_stack=1`` stores whole
  observations instead).
- Adds are checked when made and written to the store a block of steps per env at a time (one
  ``store.extend()``), before anything reads the store: ``sample``, ``buffer.store``, pickling and
  ``close`` see every add made before them.
- ``sample(batch_size, env=None)``: ``ReplayBufferSamples`` of tensors on the buffer's device, SB3's
  shapes and dtypes; ``discounts`` is ``gamma ** m`` (0 after a termination) when ``n_steps > 1``.
- Pickling (``save_replay_buffer``) commits the store and keeps only its location and this object's
  small state; unpickling (``load_replay_buffer``) reopens that commit (a buffer of this process that
  still holds the store is closed at its last commit first: the loaded one takes the store over).
- A signal turned into an exception (Ctrl-C's ``KeyboardInterrupt``, a SIGTERM handler's ``sys.exit()``)
  inside ``add`` or a write of its pending adds, or inside a call of the store that leaves the store
  refusing, leaves the buffer unusable: every call but ``close()`` (which commits nothing) refuses, saying
  to load the last pickle (``_Handle.interrupted``).
"""

from __future__ import annotations

import math
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

from .errors import StoreClosedError
from .options import default_chunk_size
from .reading.batch import Batch
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
# reentrant: a buffer's GC finalizer closes its handle, which takes this lock, and a collection can start at
# any allocation, also one made while this thread holds it (a plain lock would then wait for itself)
_OPEN_LOCK = threading.RLock()


class _Handle:
    """The store of one buffer and what closing it must do; shared with the buffer's GC finalizer."""

    def __init__(self, store: ReplayStore, temp_dir: str | None) -> None:
        self.store, self.temp_dir = store, temp_dir
        self.paired = False  # pickled at least once: its last commit is paired with a checkpoint
        self.added_since_pair = 0
        self.feed: Any = None  # mmreplay.torch.DeviceFeed, for a buffer on a GPU (made at the first sample)
        self.pending: _Pending | None = None  # adds not yet written to the store (set by the buffer)
        self.broken = ""  # why the buffer cannot be used any more (``interrupted``); "" while it can
        key, ref = os.path.realpath(store.path), weakref.ref(self)
        with _OPEN_LOCK:
            _OPEN[key] = ref

    def drop_feed(self) -> None:
        if self.feed is not None:
            self.feed.close()
            self.feed = None

    def interrupted(self, call: str) -> None:
        """``call`` was interrupted half-way by a signal turned into an exception that is not an ``Exception``
        (Ctrl-C's ``KeyboardInterrupt``, a SIGTERM handler's ``sys.exit()``). An add is recorded in several
        steps (the pending block and its count, each env's last stack, ``pos``) and a block is written in
        several more (the store's calls, then forgetting it): stopped between two, the record disagrees with
        itself or with the store, and written, committed or pickled it would store transitions that were never
        added or pair a pickle with a store that holds other ones. So the buffer refuses everything from then
        on but ``close()``, which commits nothing, as the store does after an interrupted call of its own."""
        self.broken = self.broken or (
            f"mmreplay.sb3.ReplayBuffer: {call} was interrupted half-way (Ctrl-C's KeyboardInterrupt, or a signal"
            " handler's sys.exit()), which may have left the buffer's record of its adds out of step with its"
            f" store {self.store.path}: the buffer cannot be used any more (add(), sample() and"
            " save_replay_buffer refuse) and close() commits nothing. To resume, load the last"
            " save_replay_buffer pickle together with the model checkpoint saved with it (Algorithm.load, then"
            " model.load_replay_buffer): the store reopens at the commit that pickle made. To stop at a signal"
            " with everything added so far, have the handler set a flag that the loop checks between steps")

    def check(self) -> None:
        """Raise if the buffer cannot be used any more (``interrupted``)."""
        if self.broken:
            raise StoreClosedError(self.broken)

    def refused(self, exc: StoreClosedError) -> None:
        """The store raised ``exc``. An open store raises it only when a call of its own was interrupted (it
        refuses until reopened): the buffer is broken with it, and says so in its own terms."""
        if not self.store.closed:
            self.interrupted("a call of its store")
            raise StoreClosedError(self.broken) from exc

    def failed(self, exc: BaseException, call: str) -> None:
        """``call`` raised ``exc`` (the caller raises it again): an interrupt breaks the buffer (``interrupted``),
        and the store's refusal after an interrupted call of its own is said in the buffer's terms (``refused``)."""
        if isinstance(exc, StoreClosedError):
            self.refused(exc)
        elif not isinstance(exc, Exception):
            self.interrupted(call)

    def flush(self) -> None:
        """Write the pending adds to the store (a closed one keeps none: close() wrote them or dropped them)."""
        self.check()
        if self.pending is not None and not self.store.closed:
            try:
                self.pending.flush(self.store)
            except BaseException as exc:
                self.failed(exc, "writing its pending adds to the store (which sample(), save_replay_buffer,"
                            " close() and buffer.store do first)")
                raise

    def close(self, commit: bool | None, warn: bool = True) -> None:
        store = self.store
        if store.closed:
            return
        self.drop_feed()
        if self.broken:
            commit = False  # (nothing of it can be kept: see interrupted)
        elif commit is None:
            commit = not self.paired and self.temp_dir is None
            if self.paired and self.added_since_pair and warn:
                warnings.warn(f"mmreplay.sb3.ReplayBuffer: closing {store.path} at the last save_replay_buffer;"
                              f" the {self.added_since_pair} add() calls since are not kept (no checkpoint is"
                              " paired with them). Call close(commit=True) to keep them.", stacklevel=3)
        try:
            if commit:  # (without a commit they would be dropped with the rest)
                self.flush()
        except StoreClosedError:
            if not self.broken:
                raise  # (the store was interrupted in a call of its own: it commits nothing, as it says)
        finally:
            try:
                store.close(commit=commit and not self.broken)
            finally:
                key = os.path.realpath(store.path)
                with _OPEN_LOCK:
                    if key in _OPEN and _OPEN[key]() is self:
                        del _OPEN[key]
                if self.temp_dir is not None:
                    shutil.rmtree(self.temp_dir, ignore_errors=True)


_TERM, _TRUNC = 1, 2  # how an added step ends its episode (0: it does not)


class _Pending:
    """Each env's last stack, and what ``add`` accepted but has not written to the store yet.

    ``last[i]``: the bytes of env ``i``'s last ``next_obs`` as frames, oldest first (None: its episode
    ended, the next add starts one). An add compares the bytes of the ``obs`` it is given with them, and
    the next add compares with the bytes of this one's ``next_obs``: each stack is copied out once, into
    an immutable object a caller cannot change afterwards.

    The steps not written yet: per env an optional episode start (``reset()`` with ``first[i]``) and a
    block of consecutive steps of one episode (``frames[i, :count[i]]``, the actions, rewards and ends
    beside them). One ``store.step()`` per add costs a call through the store's checks and a ``pwrite``
    of one frame each time; a block written by one ``store.extend()`` pays them once. Everything in here
    was checked by ``add`` (the store's ``extend`` cannot refuse it), and the buffer writes it before
    anything reads the store (``sample``, ``buffer.store``, pickling, ``close``), so an add is sampleable
    from the next call on.
    """

    BLOCK_BYTES = 1 << 20  # frame bytes of one env's block (at most BLOCK_ROWS rows, at least 1)
    BLOCK_ROWS = 256

    def __init__(self, n_envs: int, frame_shape: tuple[int, ...], obs_dtype: np.dtype, action_dtype: np.dtype,
                 action_dim: int, capacity: int) -> None:
        frame_bytes = max(1, int(np.prod(frame_shape)) * obs_dtype.itemsize)
        self.rows = max(1, min(self.BLOCK_ROWS, self.BLOCK_BYTES // frame_bytes))
        if n_envs > 1:
            # the envs' blocks are written one after the other, so a block's rows get ids after the other
            # envs' rows of the same steps, and the oldest ids go first: a round of blocks (one per env)
            # held to an eighth of the capacity keeps what each env retains within a block of the others
            self.rows = min(self.rows, max(1, capacity // (8 * n_envs)))
        self.vector = n_envs > 1
        self.action_dtype, self.action_dim = action_dtype, action_dim
        self.last: list[bytes | None] = [None] * n_envs
        self.frames = np.zeros((n_envs, self.rows, *frame_shape), obs_dtype)
        self.frames_mv = self.frames.reshape(-1).data.cast("B")  # the same memory, as bytes
        self.count = [0] * n_envs
        self.first = np.zeros((n_envs, *frame_shape), obs_dtype)
        self.started = [False] * n_envs  # env i's block starts an episode: reset() with first[i] before it
        self.actions: list[list[Any]] = [[] for _ in range(n_envs)]
        self.rewards: list[list[float]] = [[] for _ in range(n_envs)]
        self.ends: list[list[int]] = [[] for _ in range(n_envs)]

    def start(self, store: ReplayStore, i: int, frame: np.ndarray) -> None:
        """Env ``i`` starts an episode with ``frame``; what it has pending is written first."""
        if self.count[i] or self.started[i]:
            self.flush_env(store, i)
        self.first[i] = frame
        self.started[i] = True

    def flush(self, store: ReplayStore) -> None:
        for i in range(len(self.count)):
            if self.count[i] or self.started[i]:
                self.flush_env(store, i)

    def flush_env(self, store: ReplayStore, i: int) -> None:
        """Write env ``i``'s pending start and block, then forget them. (Forgotten also if the store refuses
        them: that is a disk error, after which the store is read-only; interrupted, the buffer is broken, see
        ``_Handle.interrupted``.)"""
        c = self.count[i]
        try:
            if self.started[i]:
                store.reset(self.first[i], env=i if self.vector else None)
            if c:
                e = np.array(self.ends[i], np.uint8)
                store.extend(np.array(self.actions[i], self.action_dtype).reshape(c, self.action_dim),
                             np.array(self.rewards[i], np.float32), self.frames[i, :c], e == _TERM, e == _TRUNC,
                             env=i)
        finally:
            self.count[i], self.started[i] = 0, False
            self.actions[i], self.rewards[i], self.ends[i] = [], [], []


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
    - ``compression``, ``chunk_size``, ``seed``, ``read_threads``: as in ``ReplayStore.create``; without a
      ``chunk_size`` the store's default is held to 1/16 of ``buffer_size`` (at least 256 rows), so the
      transitions it keeps beyond ``buffer_size`` (up to two chunks) stay few: SB3 samples the last
      ``buffer_size``.

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
        # add()'s short path (_add_step) serves one env whose frames are a reshape of its observation
        self._fast = self.n_envs == 1 and (self.layout.stack == 1 or self.layout.axis == "first")
        self._obs_dtype = np.dtype(observation_space.dtype)
        self._action_dtype = np.dtype(self._maybe_cast_dtype(action_space.dtype))
        self._pad = pad
        self._path = None if path is None else os.fspath(path)
        self._create: dict[str, Any] = dict(capacity=int(buffer_size), n_step=self.n_steps, gamma=self.gamma,
                            compression=compression, chunk_size=chunk_size, seed=seed)
        self._read_threads = read_threads
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
        self._handle.flush()  # what add() has not written yet (_Pending)
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
        chunk_size = c["chunk_size"]
        if chunk_size is None:
            frame_bytes = math.prod(self.layout.frame_shape) * self._obs_dtype.itemsize
            chunk_size = _chunk_size(c["capacity"], frame_bytes, self.n_envs)
        store = None
        try:
            store = ReplayStore.create(
                path, c["capacity"], obs_shape=self.layout.frame_shape, obs_dtype=self._obs_dtype,
                stack=self.layout.stack, n_step=c["n_step"], gamma=c["gamma"], action_shape=(self.action_dim,),
                action_dtype=self._action_dtype, num_envs=self.n_envs, vector=self.n_envs > 1, pad=pad,
                seed=c["seed"], chunk_size=chunk_size, compression=c["compression"],
                read_threads=self._read_threads, metadata={"sb3": {"buffer_size": c["capacity"],
                                                                   "n_envs": self.n_envs}})
            self._pad = pad
            self._attach(_Handle(store, temp))
        except BaseException:  # (interrupted before the buffer holds the store: nothing else would close it)
            if store is not None:
                self._handle = None
                store.close(commit=False)
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
            raise

    def _attach(self, handle: _Handle) -> None:
        handle.pending = _Pending(self.n_envs, self.layout.frame_shape, self._obs_dtype, self._action_dtype,
                                  self.action_dim, handle.store.capacity)
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
        if self._fast and self._add_step(obs, next_obs, action, reward, done, infos):
            return
        n, lay = self.n_envs, self.layout
        f_obs, f_next = self._frames_arg(obs, "obs"), self._frames_arg(next_obs, "next_obs")
        act = np.asarray(action)
        if act.size != n * self.action_dim:
            raise ValueError(f"add(): action has {act.size} values, expected n_envs * action_dim ="
                             f" {n} * {self.action_dim} (shape {act.shape})")
        rew = np.asarray(reward, np.float32).reshape(-1)
        dn = np.asarray(done).reshape(-1)
        if rew.size != n or dn.size != n:
            raise ValueError(f"add(): reward and done need one entry per env ({n}), got {rew.size} and {dn.size}")
        # infos is read only for timeouts, as SB3 reads it: CleanRL passes a Gymnasium vector env's infos
        # (one dict of arrays, whatever its length) with handle_timeout_termination=False
        if self.handle_timeout_termination and (isinstance(infos, dict) or len(infos) != n):
            raise ValueError(f"add(): handle_timeout_termination=True reads infos as SB3's VecEnv gives them,"
                             f" a list of one dict per env ({n}); got {type(infos).__name__} of {len(infos)}."
                             " With a Gymnasium vector env pass handle_timeout_termination=False (CleanRL does)")
        # per env in Python: a few envs (one, mostly) cost less as scalars than as numpy calls
        # (cast here to the stored dtype, as SB3 does: a value it cannot take is refused now, not when written)
        rewards, actions = rew.tolist(), act.reshape(n, self.action_dim).astype(self._action_dtype, copy=False).tolist()
        if not all(map(math.isfinite, rewards)):  # (checked here: the block is written later; see _Pending)
            at = [math.isfinite(r) for r in rewards].index(False)
            raise ValueError(f"add(): reward {reward!r} of env {at} is not a finite float32 ({rewards[at]}); the"
                             " store keeps finite rewards only")
        done_l = dn.tolist()
        if not any(done_l):
            ends = [0] * n
        elif self.handle_timeout_termination:  # a done with TimeLimit.truncated: the episode was cut
            assert not isinstance(infos, dict)  # (refused above: one dict per env is read)
            ends = [(_TRUNC if info.get("TimeLimit.truncated", False) else _TERM) if d else 0
                    for d, info in zip(done_l, infos, strict=True)]
        else:
            ends = [_TERM if d else 0 for d in done_l]
        # The stack checks compare bytes (NaN equals the same NaN, as the same observation should): obs
        # against the env's last next_obs (equal: the episode goes on), next_obs's older frames against obs's
        # newer ones (so the store, keeping one frame per step, rebuilds both stacks as given)
        obs_b, next_b = [f.tobytes() for f in f_obs], [f.tobytes() for f in f_next]
        handle = self._handle
        pend = handle.pending if handle is not None else None
        last = pend.last if pend is not None else [None] * n
        starts = [i for i in range(n) if obs_b[i] != last[i]]
        if handle is None:  # pad="auto": the first episode says how it pads
            self._pad = self._pad_of(f_obs[starts[0]]) if starts else "zeros"
        for i in starts:
            self._check_start(i, f_obs[i])
        new = f_next[:, -1]  # each env's frame to store
        if _TERM in ends:
            # A termination's next_obs may be the next episode's first observation: Gymnasium 0.29's vector
            # envs reset inside step() and keep the final one in infos["final_observation"], and CleanRL
            # passes next_obs unchanged on terminations (no target reads it: dones=1). The final frame is
            # taken from infos when they hold it, else next_obs's newest frame is stored as it is.
            for i in [i for i in range(n) if ends[i] == _TERM]:
                final = self._final_frames(infos, i)
                if final is not None and (lay.stack == 1 or final[:-1].tobytes() == f_obs[i, 1:].tobytes()):
                    new = new.copy() if new.base is not None else new  # (not the caller's next_obs)
                    new[i] = final[-1]
        if lay.stack > 1:
            older = len(obs_b[0]) // lay.stack  # bytes of one frame: obs's newer frames start there
            bad = [i for i in range(n) if ends[i] != _TERM and not next_b[i].startswith(memoryview(obs_b[i])[older:])]
            if bad:
                raise ValueError(
                    f"add(): env {bad[0]}'s next_obs is not its obs moved on by one frame (frames 1..{lay.stack - 1}"
                    f" of obs must be frames 0..{lay.stack - 2} of next_obs), so the stacks cannot be stored one"
                    f" frame per step. If the observations are not frame stacks (or the wrapper skips frames),"
                    f" pass frame_stack=1 (replay_buffer_kwargs=dict(frame_stack=1)) to store whole observations")
        # everything is checked: write (into the pending block; see _Pending)
        if handle is None:
            self._open_new(self._pad)
            handle = self._handle
        assert handle is not None and handle.pending is not None
        store, pend = handle.store, handle.pending
        if store.closed:
            raise StoreClosedError(f"add(): the buffer's store {store.path} is closed (close() was called)")
        handle.check()
        try:
            for i in starts:
                pend.start(store, i, f_obs[i, -1])
            count = pend.count
            c = count[0]
            if n == 1 or count.count(c) == n:  # every env's block as long: one copy of the new frames
                pend.frames[:, c] = new
                count[:] = [c + 1] * n
            else:
                for i in range(n):
                    pend.frames[i, count[i]] = new[i]
                    count[i] += 1
            for i in range(n):
                pend.actions[i].append(actions[i])
                pend.rewards[i].append(rewards[i])
                pend.ends[i].append(ends[i])
                pend.last[i] = None if ends[i] else next_b[i]
                if ends[i] or count[i] == pend.rows:  # a block ends where its episode does (as extend() wants)
                    pend.flush_env(store, i)
            self._added(handle)
        except BaseException as exc:  # (no cost on the way through)
            handle.failed(exc, "add()")
            raise

    def _added(self, handle: _Handle) -> None:
        """An add is kept: count it towards the next pairing, and move SB3's ``pos``/``full`` as SB3 does."""
        handle.added_since_pair += 1
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0

    def _add_step(self, obs: Any, next_obs: Any, action: Any, reward: Any, done: Any, infos: Any) -> bool:
        """``add`` of the common case, with fewer calls: one env (``_fast``) whose episode goes on (``obs``
        continues its last ``next_obs``, ``done`` false), numpy arrays of the stored dtypes, C-contiguous
        observations. False, having changed nothing, for anything else: ``add``'s general path then checks
        it (and says what is wrong).

        The checks are ``add``'s: obs's bytes equal the env's last next_obs (compared in place, not
        copied), next_obs's older frames equal obs's newer ones, the reward is finite; what is kept is the
        same (next_obs copied once, its newest frame into the pending block)."""
        handle = self._handle
        if (handle is None or type(obs) is not np.ndarray or type(next_obs) is not np.ndarray
                or type(action) is not np.ndarray or type(reward) is not np.ndarray or type(done) is not np.ndarray
                or done.size != 1 or done.item() or reward.size != 1 or action.size != self.action_dim
                or (self.handle_timeout_termination and (type(infos) is not list or len(infos) != 1))):
            return False
        pend = handle.pending
        last = pend.last[0] if pend is not None else None
        dtype = self._obs_dtype
        if (last is None or obs.dtype != dtype or next_obs.dtype != dtype or len(last) != obs.nbytes
                or next_obs.shape != obs.shape or not obs.flags.c_contiguous
                or obs.shape[obs.ndim - len(self.obs_shape):] != self.obs_shape):
            return False
        obs_b = obs.data.cast("B")
        if not last.startswith(obs_b):  # a new episode starts
            return False
        r = reward.astype(np.float32, copy=False).item()
        act = action.astype(self._action_dtype, copy=False).reshape(-1).tolist()  # (may raise: nothing changed yet)
        if not math.isfinite(r):
            return False
        next_b = next_obs.tobytes()
        frame = len(next_b) // self.layout.stack  # bytes of one frame: obs's newer frames start there
        if frame != len(next_b) and not next_b.startswith(obs_b[frame:]):
            return False
        store = handle.store
        if store.closed or handle.broken:
            return False
        assert pend is not None
        try:
            c = pend.count[0]
            pend.frames_mv[c * frame:(c + 1) * frame] = memoryview(next_b)[-frame:]  # the newest frame
            pend.count[0] = c + 1
            pend.actions[0].append(act)
            pend.rewards[0].append(r)
            pend.ends[0].append(0)
            pend.last[0] = next_b
            if c + 1 == pend.rows:
                pend.flush_env(store, 0)
            self._added(handle)
        except BaseException as exc:  # (no cost on the way through: the hot path)
            handle.failed(exc, "add()")
            raise
        return True

    def _frames_arg(self, value: Any, what: str) -> np.ndarray:
        """``obs``/``next_obs`` as frames ``(n_envs, stack, *frame_shape)`` of the observation dtype (a view when
        they come so)."""
        arr = value if type(value) is np.ndarray else np.asarray(value)
        # the observation's own axes last, as SB3's buffer takes them (it broadcasts into (n_envs, *shape));
        # Discrete observations are reshaped there, whatever their shape
        shape = self.obs_shape
        if arr.size != self.n_envs * self.layout.obs_size or (
                arr.shape[arr.ndim - len(shape):] != shape and not isinstance(self.observation_space, spaces.Discrete)):
            want = (self.n_envs, *self.obs_shape)
            raise ValueError(f"add(): {what} has shape {arr.shape}, expected {want} (n_envs, *observation shape)")
        if arr.dtype != self._obs_dtype:
            arr = arr.astype(self._obs_dtype)
        lay = self.layout
        if lay.stack == 1 or lay.axis == "first":  # (what lay.frames does with these, in one reshape)
            return arr.reshape(self.n_envs, lay.stack, *lay.frame_shape)
        return lay.frames(arr.reshape(self.n_envs, *self.obs_shape))

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
        try:
            if env is None and self.device.type == "cuda":
                return self._device_samples(self._device_feed().next(batch_size))
            return self._to_samples(self.store.sample(batch_size), env)
        except StoreClosedError as exc:
            if self._handle is not None:
                self._handle.refused(exc)
            raise

    def _device_feed(self) -> Any:
        handle = self._handle
        if handle is None:
            self.store  # noqa: B018 - raises the error that says why there is no store yet
        assert handle is not None
        handle.flush()
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
        # On the CPU the arrays are wrapped, not copied as SB3's to_torch does: each is this batch's own (the
        # store's reader reuses an output buffer only once nothing references it, a tensor included), so the
        # tensors are as independent of the buffer as copies, and the same dtypes and shapes.
        tensor = th.from_numpy if self.device.type == "cpu" else self.to_torch
        fields: list[Any] = [tensor(np.asarray(self._normalize_obs(obs, env))), tensor(batch.action),
                             tensor(np.asarray(self._normalize_obs(next_obs, env))), tensor(dones),
                             tensor(np.asarray(self._normalize_reward(rewards, env)))]
        if _HAS_DISCOUNTS:
            fields.append(None if discounts is None else tensor(discounts))
        return ReplayBufferSamples(*fields)

    def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> ReplayBufferSamples:
        raise NotImplementedError("mmreplay.sb3.ReplayBuffer samples by transition id: call sample()")

    def reset(self) -> None:
        """Empty the buffer (``store.clear()``): nothing added so far is sampled again. Episodes still open go
        on, as SB3's buffer lets them (the env keeps stepping): an add that continues one is part of it, its
        stack reading the frames before the clear; one that does not starts a new episode."""
        super().reset()
        if self._handle is not None:
            self._handle.drop_feed()  # (its drawn batches hold rows being cleared)
            self.store.clear()

    def _end_episodes(self) -> None:
        """The next add() of each env starts a new episode (the open one is truncated there)."""
        if self._handle is not None and self._handle.pending is not None:
            self._handle.pending.last = [None] * self.n_envs

    @property  # type: ignore[override]
    def dones(self) -> _EpisodeEnds:
        """Write-only: SB3's ``dones[pos] = True`` (before a new ``learn()``) ends every open episode."""
        return _EpisodeEnds(self)

    @dones.setter
    def dones(self, value: Any) -> None:
        raise AttributeError("mmreplay.sb3.ReplayBuffer keeps its flags in the store; dones is write-only by index")

    # -- pickling -----------------------------------------------------------------------------------------
    def __copy__(self) -> ReplayBuffer:
        raise TypeError("mmreplay.sb3.ReplayBuffer cannot be copied: its transitions live in one store, which one"
                        " buffer holds at a time (a copy made through pickling would close this one). Pickle it"
                        " (save_replay_buffer) and load that, or open the store itself with"
                        " mmreplay.ReplayStore.open(buffer.store.path, mode='r') to read it beside this buffer")

    def __deepcopy__(self, memo: dict[int, Any]) -> ReplayBuffer:
        return self.__copy__()

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_handle", "_finalizer")}
        h = self._handle
        state["_store_path"] = None
        state["_next"] = [None] * self.n_envs  # each env's last next_obs (None: the next add starts an episode)
        if h is not None:
            h.flush()
            try:
                h.store.commit()
            except StoreClosedError as exc:
                h.refused(exc)
                raise
            if h.temp_dir is not None:  # (only now: a pickling that failed leaves it to be removed at close)
                warnings.warn(f"mmreplay.sb3.ReplayBuffer: pickling keeps the temporary store {h.store.path}"
                              " (the pickle refers to it); pass replay_buffer_kwargs=dict(path=...) to choose"
                              " where it lives", stacklevel=2)
                h.temp_dir = None
            pend = h.pending
            assert pend is not None
            lay = self.layout
            state["_next"] = [None if b is None else lay.observations(np.frombuffer(b, self._obs_dtype).reshape(
                1, lay.stack, *lay.frame_shape))[0].copy() for b in pend.last]
            h.paired, h.added_since_pair = True, 0
            state["_store_path"] = os.path.realpath(h.store.path)
            state["_generation"] = h.store.generation
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        path = state.pop("_store_path")
        generation = state.pop("_generation", None)
        last = state.pop("_next")
        self.__dict__.update(state)
        self._fast = self.n_envs == 1 and (self.layout.stack == 1 or self.layout.axis == "first")
        self._handle = None
        if path is None:
            return
        with _OPEN_LOCK:
            ref = _OPEN.get(path)
        holder = ref() if ref is not None else None
        if holder is not None:  # this process still holds it (load_replay_buffer in the run that saved)
            if not holder.store.closed and holder.store.generation != generation:
                raise _stale(path, holder.store.generation, generation)  # (the live buffer goes on as it was)
            holder.close(commit=False, warn=False)
        store = ReplayStore.open(path, mode="r+", read_threads=self._read_threads)
        try:
            if store.generation != generation:
                raise _stale(path, store.generation, generation)
            handle = _Handle(store, None)
            handle.paired = True
            self._attach(handle)
            assert handle.pending is not None
            handle.pending.last = [None if obs is None else self.layout.frames(obs[None])[0].tobytes()
                                   for obs in last]
        except BaseException:  # (stale, or interrupted: the store must not stay open and locked, owned by nothing)
            self._handle = None
            store.close(commit=False)
            raise


def _stale(path: str, committed: int, pickled: Any) -> ValueError:
    return ValueError(
        f"the store at {path} was committed after this buffer was pickled (its commit {committed}, the"
        f" pickle's {pickled}): it no longer holds the state the paired model checkpoint expects. Load the"
        " pickle taken with the newest commit, or open the store as it is with mmreplay.ReplayStore.open(path)")


def _chunk_size(buffer_size: int, frame_bytes: int, n_envs: int) -> int:
    """The buffer's chunk when none is given: the store's default, but at most 1/16 of ``buffer_size`` (at
    least 256 rows, a multiple of ``n_envs``). The store keeps at least ``buffer_size`` transitions and up to
    two chunks more, and SB3's buffer samples from exactly the last ``buffer_size``: the store's default chunk
    of small frames (at least ~1 MiB of them) would make that window many times ``buffer_size`` in a small
    buffer. Not smaller than 256 rows: every chunk costs a roll and a seal."""
    rows = max(256, buffer_size // 16)
    rows = -(-rows // n_envs) * n_envs
    return min(default_chunk_size(buffer_size, frame_bytes, n_envs), rows)


class _EpisodeEnds:
    """``buffer.dones[pos] = True``: what SB3 writes to cut the last trajectory before a new ``learn()``."""

    def __init__(self, buf: ReplayBuffer) -> None:
        self._buf = buf

    def __setitem__(self, key: Any, value: Any) -> None:
        if np.any(value):  # the next add() of each env then starts a new episode; the open one is truncated
            self._buf._end_episodes()
