"""Gymnasium integration: stores shaped from an env's spaces, recorder wrappers, Atari frames.

Needs ``gymnasium`` (``pip install 'mmreplay[gym]'``); the Atari helpers also need ``ale-py``
(``pip install 'mmreplay[atari]'``).

- ``store_from_env(env, path, capacity, **create_kwargs)`` (also ``ReplayStore.from_env``): a store whose
  ``obs_shape``/``obs_dtype``, ``action_shape``/``action_dtype`` and ``num_envs`` come from the env.
- ``RecordToStore(env, store)``: a wrapper that writes every ``reset``/``step`` of a single env into the store.
- ``RecordVectorToStore(envs, store)``: the same for a vector env, in each of Gymnasium's autoreset modes:
  NEXT_STEP (the default: the step after an env's episode ended returns that env's reset observation;
  the store takes it as the new episode's first observation and records no transition for it),
  SAME_STEP (the final observation comes in ``infos["final_obs"]``; the step's observation is the new
  episode's first) and DISABLED (finished envs are reset with ``reset(options={"reset_mask": ...})``).
  ``store_from_env`` and a hand-written ``store.step()`` loop follow NEXT_STEP only and refuse the others.
- ``make_atari(env_id)``: an ALE game as 84x84 grayscale frames with frame skipping and max-pooling,
  without OpenCV (the area-averaging resize is a few numpy gathers and sums).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import gymnasium as gym
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("mmreplay.gym needs gymnasium: pip install 'mmreplay[gym]'") from exc
try:
    from gymnasium import spaces
    from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
except ImportError as exc:
    # gymnasium < 1.1 (CleanRL pins 0.29.1) has no AutoresetMode: its vector envs reset in the same
    # step, which a store fed as for NEXT_STEP would record wrongly; refuse by version, not by extra
    raise ImportError(f"mmreplay.gym needs gymnasium >= 1.1, found gymnasium {getattr(gym, '__version__', '?')}"
                      f" ({exc}); upgrade it: pip install -U 'gymnasium>=1.1'") from exc

from .spaces import space_json
from .store import ReplayStore

__all__ = ["store_from_env", "RecordToStore", "RecordVectorToStore", "make_atari", "AtariFrames",
           "area_resize", "AreaResize"]

ExtrasFn = Callable[[dict[str, Any]], dict[str, Any]]


# -- shaping a store from spaces ------------------------------------------------------------------------
def space_layout(space: Any, what: str) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)`` of one element of a Box or Discrete space; ``what`` names it in errors."""
    if isinstance(space, spaces.Box):
        return tuple(int(d) for d in space.shape), np.dtype(space.dtype)
    if isinstance(space, spaces.Discrete):
        return (), np.dtype(space.dtype)
    raise TypeError(f"{what}: mmreplay stores Box and Discrete spaces, got {type(space).__name__} ({space});"
                    f" {_unsupported_hint(space, what)}")


def _unsupported_hint(space: Any, what: str) -> str:
    """What to do about a space ``space_layout`` refuses: observation wrappers fit observations only."""
    if what != "action space":
        return "flatten it (e.g. gymnasium.wrappers.FlattenObservation) or create the store with ReplayStore.create()"
    loop = "in your own loop (from_env and the recorders take Box and Discrete action spaces)"
    if isinstance(space, (spaces.MultiDiscrete, spaces.MultiBinary)):
        shape, dtype = tuple(int(d) for d in space.shape), np.dtype(space.dtype).name
        return (f"store each action as one array: create the store with ReplayStore.create(path, capacity,"
                f" obs_shape=..., action_shape={shape}, action_dtype={dtype!r}) and call store.reset()/store.step()"
                f" {loop}")
    try:
        size = spaces.flatdim(space)
    except (NotImplementedError, ValueError, TypeError):
        return f"encode each action as one fixed-shape array for a store made with ReplayStore.create(), {loop}"
    return (f"store each action flattened: create the store with ReplayStore.create(path, capacity, obs_shape=...,"
            f" action_shape=({size},), action_dtype='float32') and pass gymnasium.spaces.flatten(space, action) to"
            f" store.step() {loop}")


def env_layout(env: Any, any_autoreset: bool = False) -> dict[str, Any]:
    """The ``create()`` arguments an env (or vector env) implies: shapes, dtypes, ``num_envs``, ``vector``.

    A vector env must autoreset as NEXT_STEP, unless ``any_autoreset`` (the recorder handles every mode).
    """
    if isinstance(env, VectorEnv):
        if any_autoreset:
            autoreset_mode(env)
        else:
            check_autoreset(env)
        obs_space, act_space = env.single_observation_space, env.single_action_space
        num_envs, vector = int(env.num_envs), True
    elif isinstance(env, gym.Env):
        obs_space, act_space = env.observation_space, env.action_space
        num_envs, vector = 1, False
    else:
        raise TypeError(f"env: expected a gymnasium.Env or gymnasium.vector.VectorEnv, got {type(env).__name__}")
    obs_shape, obs_dtype = space_layout(obs_space, "observation space")
    action_shape, action_dtype = space_layout(act_space, "action space")
    return {"obs_shape": obs_shape, "obs_dtype": obs_dtype, "action_shape": action_shape,
            "action_dtype": action_dtype, "num_envs": num_envs, "vector": vector}


def autoreset_mode(env: Any) -> str:
    """The vector env's autoreset mode by name (``NEXT_STEP``, ``SAME_STEP``, ``DISABLED``)."""
    mode = getattr(env, "metadata", {}).get("autoreset_mode")
    if mode is None:
        warnings.warn(f"{env} declares no metadata['autoreset_mode']; assuming Gymnasium's default NEXT_STEP",
                      stacklevel=3)
        return "NEXT_STEP"
    try:
        return str(AutoresetMode(mode).name)
    except ValueError:
        raise ValueError(f"vector env autoreset mode {mode!r}: mmreplay knows NEXT_STEP, SAME_STEP and"
                         " DISABLED") from None


def check_autoreset(env: Any) -> None:
    """Accept vector envs with NEXT_STEP autoreset (what ``store.step()`` follows); refuse the other modes."""
    name = autoreset_mode(env)
    if name != "NEXT_STEP":
        raise ValueError(
            f"vector env autoreset mode {name}: store.step() records NEXT_STEP autoreset only (Gymnasium's"
            f" default); make the vector env with autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP,"
            f" or record it with mmreplay.gym.RecordVectorToStore.create(envs, path, capacity), which records"
            f" {name} exactly")


def store_from_env(env: Any, path: str | os.PathLike[str], capacity: int, _any_autoreset: bool = False,
                   **kwargs: Any) -> ReplayStore:
    """Create a store whose obs/action shapes and dtypes and ``num_envs`` come from ``env``.

    ``env`` is a ``gymnasium.Env`` or a ``gymnasium.vector.VectorEnv`` (then ``num_envs`` is its
    number of envs and the store takes batched input). Observation and action spaces must be Box or
    Discrete (``TypeError`` naming the space otherwise). ``kwargs`` are those of
    ``ReplayStore.create`` (``stack``, ``n_step``, ``gamma``, ``extras``, ``seed``, ...); an
    ``obs_dtype``/``action_dtype`` given there overrides the space's (``RecordToStore`` casts
    to it). ``metadata`` gains ``env_id`` when the env has a spec, and the action space (Minari's JSON
    form, used by dataset exports) when it is one those exports describe.
    """
    layout = env_layout(env, _any_autoreset)
    for key in ("obs_shape", "action_shape", "num_envs", "vector"):
        if key in kwargs and kwargs[key] != layout[key]:
            raise ValueError(f"{key}={kwargs[key]!r} conflicts with the env ({layout[key]!r}); leave it out"
                             " or use ReplayStore.create()")
        kwargs.pop(key, None)
    for key in ("obs_dtype", "action_dtype"):
        layout[key] = kwargs.pop(key, layout[key])
    metadata = dict(kwargs.pop("metadata", None) or {})
    spec = getattr(env, "spec", None)
    if spec is not None and getattr(spec, "id", None):
        metadata.setdefault("env_id", spec.id)
    try:
        metadata.setdefault("action_space", space_json(getattr(env, "single_action_space", env.action_space)))
    except TypeError:
        pass  # a space exports cannot describe: they infer one from the actions
    return ReplayStore.create(path, capacity, metadata=metadata, **layout, **kwargs)


def _check_matches(env: Any, store: ReplayStore, any_autoreset: bool = False) -> None:
    layout = env_layout(env, any_autoreset)
    sch = store.schema
    mine = {"obs_shape": sch.obs_shape, "action_shape": sch.action_shape, "num_envs": sch.num_envs,
            "vector": sch.vector}
    for key, value in mine.items():
        if layout[key] != value:
            raise ValueError(f"the store's {key} is {value!r} but the env's is {layout[key]!r}; create the store"
                             " with ReplayStore.from_env(env, ...)")


# -- recorders -------------------------------------------------------------------------------------------
class _Recording:
    """What both recorders do: check the store fits the env, then pass each reset and step on to it."""

    env: Any
    store: ReplayStore

    def _bind(self, env: Any, store: ReplayStore, extras: ExtrasFn | None, info_name: str) -> None:
        _check_matches(env, store, any_autoreset=True)
        if store.schema.extras and extras is None:
            raise ValueError(f"the store declares extras {[e.name for e in store.schema.extras]}: pass"
                             f" extras=lambda {info_name}: {{...}} to compute them")
        self.store = store
        self._extras = extras
        # frames are cast to the store's dtype (an env's float64 into a float32 store), but a quantizing store
        # takes floating frames as they come: it stores round(x * 255) and refuses values outside [0, 1],
        # where a cast to uint8 first would truncate them (to 0 for most of [0, 1])
        self._dtype = None if store.schema.quantize else store.schema.obs_dtype

    def _record_reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.store.reset(np.asarray(obs, self._dtype))
        return obs, info

    def _record_step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        xs = self._extras(info) if self._extras is not None else {}
        self.store.step(action, reward, np.asarray(obs, self._dtype), terminated, truncated, **xs)
        return obs, reward, terminated, truncated, info


class RecordToStore(_Recording, gym.Wrapper[Any, Any, Any, Any]):
    """Records every transition of a single (non-vector) env into ``store``.

    ``reset()`` calls ``store.reset(obs)`` (ending an open episode as truncated); ``step()`` calls
    ``store.step(action, reward, obs, terminated, truncated)``. Observations are cast to the
    store's obs dtype. The env's outputs are returned unchanged. ``extras(info)`` returns the
    per-transition extras declared at ``create(extras=...)``, computed from the step's ``info``.
    The store stays the caller's: ``close()`` closes the env, not the store.
    """

    def __init__(self, env: gym.Env[Any, Any], store: ReplayStore, extras: ExtrasFn | None = None) -> None:
        if isinstance(env, VectorEnv):
            raise TypeError("RecordToStore wraps a single env; use RecordVectorToStore for a vector env")
        super().__init__(env)
        self._bind(env, store, extras, "info")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        return self._record_reset(seed, options)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        return self._record_step(action)


class RecordVectorToStore(_Recording, VectorWrapper[Any, Any, Any, Any, Any]):
    """Records every transition of a vector env into a store made for it, in any autoreset mode.

    The store must have ``num_envs == envs.num_envs`` (``RecordVectorToStore.create(envs, path, capacity)``
    makes one). ``reset()`` resets every stream. ``step()`` records by the env's autoreset mode:

    - NEXT_STEP: the batched outputs go to ``store.step``, which treats the step after an env's episode
      ended as that env's reset (no transition stored).
    - SAME_STEP: an env whose episode ended in this step has its final observation in
      ``infos["final_obs"]``: the transition is stored with it, and the observation returned (the next
      episode's first) starts that env's new episode.
    - DISABLED: ``reset(options={"reset_mask": mask})`` starts new episodes for the masked envs; a
      ``step()`` while an env's episode has ended and it was not reset raises (nothing is stepped).

    Partial resets are refused in the other modes (they reset finished envs by themselves).
    ``extras(infos)`` returns batched extras, as for ``RecordToStore``.
    """

    def __init__(self, envs: VectorEnv[Any, Any, Any], store: ReplayStore, extras: ExtrasFn | None = None) -> None:
        super().__init__(envs)
        self._bind(envs, store, extras, "infos")
        self.mode = autoreset_mode(envs)
        self._ended = np.zeros(int(envs.num_envs), bool)

    @classmethod
    def create(cls, envs: VectorEnv[Any, Any, Any], path: str | os.PathLike[str], capacity: int,
               extras_fn: ExtrasFn | None = None, **kwargs: Any) -> RecordVectorToStore:
        """A store made for ``envs`` (``store_from_env``'s arguments, any autoreset mode) and its recorder.

        The store is the recorder's ``store`` attribute; close it when done.
        """
        store = store_from_env(envs, path, capacity, _any_autoreset=True, **kwargs)
        try:
            return cls(envs, store, extras_fn)
        except BaseException:
            store.close()
            raise

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if options and "reset_mask" in options:
            if self.mode != "DISABLED":
                raise ValueError(f"RecordVectorToStore: partial resets (reset_mask) belong to DISABLED autoreset;"
                                 f" this vector env autoresets as {self.mode} and resets finished envs by itself")
            mask = np.asarray(options["reset_mask"], bool).copy()
            obs, info = self.env.reset(seed=seed, options=options)
            arr = np.asarray(obs, self._dtype)
            for i in np.flatnonzero(mask):
                self.store.reset(arr[i], env=int(i))
            self._ended &= ~mask
            return obs, info
        obs, info = self._record_reset(seed, options)
        self._ended[:] = False
        return obs, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self.mode == "NEXT_STEP":
            return self._record_step(actions)
        if self.mode == "DISABLED" and self._ended.any():
            raise ValueError(f"RecordVectorToStore: envs {np.flatnonzero(self._ended).tolist()} ended and were not"
                             " reset; with DISABLED autoreset call reset(options={'reset_mask': mask}) first")
        obs, reward, terminated, truncated, infos = self.env.step(actions)
        ended = np.asarray(terminated, bool) | np.asarray(truncated, bool)
        arr = np.asarray(obs, self._dtype)
        nxt = arr
        if self.mode == "SAME_STEP" and ended.any():
            final = infos.get("final_obs")
            if final is None:
                raise ValueError("RecordVectorToStore: a SAME_STEP episode ended without infos['final_obs']; the"
                                 " transition cannot be recorded (use gymnasium's vector envs, which provide it)")
            nxt = arr.copy()
            for i in np.flatnonzero(ended):
                nxt[i] = np.asarray(final[i], self._dtype)
        xs = self._extras(infos) if self._extras is not None else {}
        if xs and self.mode == "SAME_STEP" and ended.any():
            xs = self._final_extras(xs, infos, ended)
        self.store.step(actions, reward, nxt, terminated, truncated, **xs)
        if self.mode == "SAME_STEP":
            for i in np.flatnonzero(ended):
                self.store.reset(arr[i], env=int(i))
        else:
            self._ended |= ended
        return obs, reward, terminated, truncated, infos

    def _final_extras(self, xs: dict[str, Any], infos: dict[str, Any], ended: np.ndarray) -> dict[str, Any]:
        """SAME_STEP: an ended env's info of this step is in ``infos["final_info"]`` (``infos`` holds its next
        episode's reset info there), so its extras are computed from that."""
        final = infos.get("final_info")
        if final is None:
            raise ValueError("RecordVectorToStore: a SAME_STEP episode ended without infos['final_info']; the extras"
                             " of its last transition cannot be computed (use gymnasium's vector envs, which provide it)")
        assert self._extras is not None
        at_end = self._extras(final)
        out = {}
        for name, value in xs.items():
            value = np.array(value, copy=True)
            value[ended] = np.asarray(at_end[name])[ended]
            out[name] = value
        return out


# -- Atari -----------------------------------------------------------------------------------------------
def _area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """``(n_out, n_in)`` weights: output pixel i averages the input interval it covers (box filter)."""
    scale = n_in / n_out
    edges = np.arange(n_out + 1) * scale
    lo, hi = edges[:-1, None], edges[1:, None]
    j = np.arange(n_in)[None, :]
    overlap = np.clip(np.minimum(hi, j + 1) - np.maximum(lo, j), 0.0, None)
    return (overlap / scale).astype(np.float32)


def _area_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """The nonzero entries of ``_area_matrix`` as ``(n_out, taps)`` input indices and weights (0-padded)."""
    dense = _area_matrix(n_in, n_out)
    taps = int((dense > 0).sum(axis=1).max())
    idx = np.zeros((n_out, taps), np.intp)
    w = np.zeros((n_out, taps), np.float32)
    for i in range(n_out):
        nz = np.flatnonzero(dense[i])
        idx[i, :nz.size], w[i, :nz.size] = nz, dense[i, nz]
    return idx, w


class AreaResize:
    """Resize 2-D frames by area averaging (like OpenCV's INTER_AREA), rounding to uint8.

    Each output pixel is a weighted sum of the few input pixels it covers: a gather and a small
    sum per axis, no BLAS call (a matrix product is slower here when other processes load the cores).
    """

    def __init__(self, in_shape: tuple[int, int], out_shape: tuple[int, int]) -> None:
        self._ri, self._rw = _area_taps(in_shape[0], out_shape[0])
        self._ci, self._cw = _area_taps(in_shape[1], out_shape[1])
        self._rw3 = self._rw[:, :, None]

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        rows = (frame[self._ri].astype(np.float32) * self._rw3).sum(axis=1)  # (H', taps, W) -> (H', W)
        out = (rows[:, self._ci] * self._cw).sum(axis=2)  # (H', W', taps) -> (H', W')
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def area_resize(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize a 2-D uint8 frame to ``(height, width)`` by area averaging (see ``AreaResize``)."""
    return AreaResize((frame.shape[0], frame.shape[1]), (height, width))(frame)


class AtariFrames(gym.Wrapper[np.ndarray, Any, np.ndarray, Any]):
    """DQN-style frames from a grayscale ALE env made with ``frameskip=1``.

    Each step repeats the action ``frame_skip`` times, sums the rewards, and returns the pixel-wise
    max of the last two raw frames (Atari sprites flicker) resized to ``size x size`` uint8.
    ``reset()`` then takes a random number (0..``noop_max``) of no-op actions. Frame stacking is
    left to the store (``stack=4``): every frame is stored once.
    """

    def __init__(self, env: gym.Env[np.ndarray, Any], frame_skip: int = 4, size: int = 84,
                 noop_max: int = 30) -> None:
        super().__init__(env)
        shape = env.observation_space.shape
        if shape is None or len(shape) != 2:
            raise ValueError(f"AtariFrames needs 2-D grayscale frames (obs_type='grayscale'), got shape {shape}")
        if frame_skip < 1:
            raise ValueError(f"frame_skip must be >= 1, got {frame_skip}")
        self.frame_skip, self.noop_max = int(frame_skip), int(noop_max)
        self._resize = AreaResize((shape[0], shape[1]), (size, size))
        self.observation_space = spaces.Box(0, 255, (size, size), np.uint8)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        for _ in range(int(self.np_random.integers(0, self.noop_max + 1)) if self.noop_max else 0):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return self._resize(obs), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        cur, reward, terminated, truncated, info = self.env.step(action)
        total = float(reward)
        prev: np.ndarray | None = None
        for _ in range(self.frame_skip - 1):
            if terminated or truncated:
                break
            prev = cur
            cur, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
        raw = cur if prev is None else np.maximum(prev, cur)
        return self._resize(raw), total, terminated, truncated, info


def make_atari(env_id: str = "ALE/Pong-v5", frame_skip: int = 4, size: int = 84, noop_max: int = 30,
               **make_kwargs: Any) -> AtariFrames:
    """An ALE game as ``size x size`` uint8 frames (``AtariFrames`` over a grayscale ``frameskip=1`` env).

    ``make_kwargs`` go to ``gymnasium.make`` (e.g. ``repeat_action_probability=0.0``,
    ``max_episode_steps=...``). Needs ``ale-py`` (``pip install 'mmreplay[atari]'``).
    """
    try:
        import ale_py
    except ImportError as exc:
        raise ImportError("make_atari needs ale-py: pip install 'mmreplay[atari]'") from exc
    gym.register_envs(ale_py)
    env = gym.make(env_id, frameskip=1, obs_type="grayscale", **make_kwargs)
    return AtariFrames(env, frame_skip=frame_skip, size=size, noop_max=noop_max)
