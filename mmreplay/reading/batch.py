"""The ``Batch`` returned by sampling, and how it is assembled from the ring arrays."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.plan import Plan
from ..native import jit_enabled
from ..native.plan import distinct_slots as native_distinct
from ..native.plan import nstep_returns
from .reader import FrameReader, PostedStacks

__all__ = ["Batch", "FrameBatch"]

FrameBuffer = Callable[[tuple[int, ...], np.dtype], np.ndarray]
"""``frame_buffer(shape, dtype)``: a C-contiguous array of that shape and dtype to read a batch's distinct
frames into (called in the thread that assembles the batch; the batch's ``frames`` is that array)."""

_NATIVE = jit_enabled()  # False under NUMBA_DISABLE_JIT=1: the numpy reference passes instead


@dataclass
class Batch:
    """A batch of transitions as numpy arrays (B = batch size, k = stack).

    - ``obs``, ``next_obs``: ``(B, k, *obs_shape)``, the store's obs dtype, oldest frame first.
    - ``action``: ``(B, *action_shape)``; ``reward``: float32 n-step return
      ``sum_{i<m} gamma**i r_{t+i}``; ``discount``: float32 ``gamma**m``, 0 after a termination.
    - ``terminated`` / ``truncated``: bool, the episode terminated / was truncated inside the row's window.
    - ``index``: int64 transition ids (stable across save/load), ``weight``: float32 importance weights
      (1.0 for uniform sampling), ``extras``: dict of ``(B, *shape)`` arrays.
    """

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    discount: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    index: np.ndarray
    weight: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.index.shape[0])


def planned_batch(obs: np.ndarray, next_obs: np.ndarray, values: np.ndarray, ends: np.ndarray, slots: np.ndarray,
                  arrays: dict[str, np.ndarray], ids: np.ndarray, extra_names: tuple[str, ...],
                  weight: np.ndarray | None = None) -> Batch:
    """The ``Batch`` of what ``FrameReader.planned_stacks`` read and summed (``values``: rewards, discounts and
    ones, ``ends``: terminated, truncated, next_missing) for the transition slots ``slots``; ``ids`` is used
    as the batch's ``index`` without a copy."""
    return Batch(obs, arrays["action"][slots], values[0], next_obs, values[1], ends[0], ends[1], ids,
                 values[2] if weight is None else _weights(weight, ids.size), _extras(arrays, slots, extra_names))


def _weights(weight: np.ndarray | None, n: int) -> np.ndarray:
    """A batch's float32 importance weights (ones for a uniform draw)."""
    return np.ones(n, np.float32) if weight is None else weight.astype(np.float32, copy=False)


def _extras(arrays: dict[str, np.ndarray], slots: np.ndarray, extra_names: tuple[str, ...]) -> dict[str, np.ndarray]:
    return {name: arrays["x_" + name][slots] for name in extra_names} if extra_names else {}


def buffer_for(frame_buffer: FrameBuffer | None, reader: FrameReader, slots_shape: tuple[int, ...]) -> np.ndarray | None:
    """``frame_buffer``'s array for the frames of slots of ``slots_shape`` (``slots_shape + frame``, the frames'
    dtype), or None without one (the reader's recycled buffers then)."""
    if frame_buffer is None:
        return None
    return frame_buffer(slots_shape + reader.frames.shape[1:], reader.frames.dtype)


def assemble(plan: Plan, arrays: dict[str, np.ndarray], ids: np.ndarray, discounts: np.ndarray,
             extra_names: tuple[str, ...], reader: FrameReader, weight: np.ndarray | None = None,
             posted: PostedStacks | None = None, then: Callable[[], None] | None = None,
             frame_buffer: FrameBuffer | None = None) -> Batch:
    """Copy a planned batch out of the ring arrays (the only place frames are read for sampling).

    ``ids`` is used as the batch's ``index`` without a copy: pass an array the caller owns. ``posted``:
    its frames, already being read (``FrameReader.post_stacks``); ``then`` runs once the frames are read.
    Frames read here go into ``frame_buffer((2, B, k, *frame), dtype)``'s array when given.
    """
    if posted is None:
        out = buffer_for(frame_buffer, reader, (2,) + plan.obs_slots.shape)
        obs, next_obs = reader.stacks(plan.obs_slots, plan.next_slots, out)
    else:
        obs, next_obs = reader.join_stacks(posted)
    if then is not None:
        then()
    if plan.zeros:  # (counted by the native plan: nearly always 0)
        if plan.obs_pad.any():
            obs[plan.obs_pad] = 0
        if plan.next_pad.any():
            next_obs[plan.next_pad] = 0
        if plan.next_missing.any():
            next_obs[plan.next_missing] = 0
    reward, discount = _returns(plan, arrays, discounts)
    return Batch(
        obs=obs,
        action=arrays["action"][plan.slots],
        reward=reward,
        next_obs=next_obs,
        discount=discount,
        terminated=plan.terminated,
        truncated=plan.truncated,
        index=ids,
        weight=_weights(weight, ids.size),
        extras=_extras(arrays, plan.slots, extra_names),
    )


@dataclass
class FrameBatch:
    """A batch whose stacks are given as its distinct frames and positions into them
    (``batches(frames="distinct")``): ``frames[obs_index]`` and ``frames[next_index]`` are bit-identical to
    the ``obs`` and ``next_obs`` of the ``Batch`` the same draw gives.

    - ``frames``: ``(F, *obs_shape)``, every distinct frame of the batch's stacks read once (ring slot
      order); when some stack position is zero padding (or a missing final frame), ``frames[0]`` is zeros.
    - ``obs_index``, ``next_index``: ``(B, k)`` int32 positions into ``frames``.
    - The other fields are ``Batch``'s.

    A row's next stack shares ``k - m`` frames with its stack (m its n-step window), and rows drawn near
    each other share more: ``F`` is about ``(k + n) B`` or less where the stacks hold ``2 k B`` frames.
    """

    frames: np.ndarray
    obs_index: np.ndarray
    next_index: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    index: np.ndarray
    weight: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def to_batch(self) -> Batch:
        """The ``Batch`` (stacks gathered from ``frames``)."""
        return Batch(obs=self.frames[self.obs_index], action=self.action, reward=self.reward,
                     next_obs=self.frames[self.next_index], discount=self.discount, terminated=self.terminated,
                     truncated=self.truncated, index=self.index, weight=self.weight, extras=self.extras)


def distinct_slots(slots: np.ndarray, zero: np.ndarray | None) -> tuple[np.ndarray, bool, np.ndarray]:
    """The distinct ring slots of a slot array and where each entry is among them.

    ``zero``: a mask of ``slots``' shape (or None) of entries whose frame is zeros whatever the slot holds.
    Returns ``(read, zeroed, positions)``: the sorted distinct slots of the other entries; whether a zero
    frame leads (position 0, so ``read[i]`` lands at ``i + zeroed``); int32 positions of ``slots``' shape.
    """
    if _NATIVE:
        read = np.empty(slots.size, np.int64)
        positions = np.empty(slots.shape, np.int32)
        mask = _NO_ZERO if zero is None else np.ascontiguousarray(zero, np.bool_).reshape(-1)
        run = slots.shape[-1] if slots.ndim else 1  # (rows of a stack, or of a sequence's states: ascending runs)
        count, zeroed = native_distinct(np.ascontiguousarray(slots, np.int64).reshape(-1), run, mask, read,
                                        positions.reshape(-1))
        return read[:count], bool(zeroed), positions
    return distinct_slots_numpy(slots, zero)


_NO_ZERO = np.zeros(0, np.bool_)


def distinct_slots_numpy(slots: np.ndarray, zero: np.ndarray | None) -> tuple[np.ndarray, bool, np.ndarray]:
    """``distinct_slots`` in numpy (the reference of ``native.plan.distinct_slots``)."""
    flat = slots.reshape(-1)
    if zero is not None and zero.any():
        flat = np.where(zero.reshape(-1), -1, flat)  # -1 sorts first: the zero frame is position 0
    read, inv = np.unique(flat, return_inverse=True)
    zeroed = bool(read.size) and int(read[0]) == -1
    return (read[1:] if zeroed else read), zeroed, inv.astype(np.int32, copy=False).reshape(slots.shape)


def read_distinct(reader: FrameReader, slots: np.ndarray, zero: np.ndarray | None,
                  frame_buffer: FrameBuffer | None) -> tuple[np.ndarray, np.ndarray]:
    """``(frames, positions)``: the distinct frames of ``slots`` read once into ``frame_buffer``'s array (the
    reader's recycled buffers when None), a zero frame first where ``zero`` marks entries; ``frames[positions]``
    is ``frames_of_ring[slots]`` with the ``zero`` entries zeroed."""
    read, zeroed, positions = distinct_slots(slots, zero)
    frames = reader.gather(read) if frame_buffer is None and not zeroed else None
    if frames is None:
        frames = _distinct_array(reader, read.size, zeroed, frame_buffer)
        if read.size:
            reader.gather(read, out=frames[int(zeroed):])
    return frames, positions


def _distinct_array(reader: FrameReader, count: int, zeroed: bool, frame_buffer: FrameBuffer | None) -> np.ndarray:
    """The array a batch's ``count`` distinct frames are read into (``frame_buffer``'s, else a new one), behind
    a zero frame where ``zeroed``."""
    shape = (count + zeroed,) + reader.frames.shape[1:]
    dtype = reader.frames.dtype
    frames = np.empty(shape, dtype) if frame_buffer is None else frame_buffer(shape, dtype)
    if zeroed:
        frames[0] = 0
    return frames


def distinct_frames(reader: FrameReader, posted: PostedFrames | None, then: Callable[[], None] | None,
                    slots_and_zero: Callable[[], tuple[np.ndarray, np.ndarray | None]],
                    frame_buffer: FrameBuffer | None) -> tuple[np.ndarray, np.ndarray]:
    """A batch's ``(frames, positions)``: those ``posted`` (``post_distinct``) once read, else ``read_distinct``
    of ``slots_and_zero()`` now, into ``frame_buffer``'s array; ``then`` runs once they are read."""
    if posted is None:
        frames, positions = read_distinct(reader, *slots_and_zero(), frame_buffer)
    else:
        assert posted.positions is not None  # (a distinct read's)
        frames, positions = posted.join(reader), posted.positions
    if then is not None:
        then()
    return frames, positions


def _stack_slots(plan: Plan) -> tuple[np.ndarray, np.ndarray | None]:
    """A planned batch's slots of both stacks (2, B, k) and which of them read as zeros (None: none)."""
    both = plan.stacks if plan.stacks is not None else np.stack([plan.obs_slots, plan.next_slots])
    zero = None
    if plan.zeros:  # (-1: not counted; 0: nothing to zero)
        pad = plan.pad if plan.pad is not None else np.stack([plan.obs_pad, plan.next_pad])
        zero = pad.copy()
        zero[1] |= plan.next_missing[:, None]
    return both, zero


class PostedFrames:
    """Frames being read by the reader's helper threads: a ``FrameBatch``'s distinct frames and their
    positions (``post_frames``, ``post_distinct``), or a batch of sequences' states (``positions`` None)."""

    __slots__ = ("frames", "positions", "posted")

    def __init__(self, frames: np.ndarray, positions: np.ndarray | None, posted: PostedStacks | None) -> None:
        self.frames, self.positions, self.posted = frames, positions, posted

    def join(self, reader: FrameReader) -> np.ndarray:
        """The frames, once read (raises the read's error)."""
        if self.posted is not None:
            reader.join_gather(self.posted)
        return self.frames


def post_frames(plan: Plan, reader: FrameReader, frame_buffer: FrameBuffer | None) -> PostedFrames:
    """Start reading a planned batch's distinct frames (``assemble_frames``' read) into ``frame_buffer``'s
    array in the reader's helper threads; only where ``reader.may_post()`` just said so."""
    return post_distinct(reader, *_stack_slots(plan), frame_buffer)


def post_distinct(reader: FrameReader, slots: np.ndarray, zero: np.ndarray | None,
                  frame_buffer: FrameBuffer | None) -> PostedFrames:
    """``read_distinct``'s read, posted to the reader's helper threads (``PostedFrames.join`` gives its frames;
    its positions are known at once); only where ``reader.may_post()`` just said so."""
    read, zeroed, positions = distinct_slots(slots, zero)
    frames = _distinct_array(reader, read.size, zeroed, frame_buffer)
    posted = reader.post_gather(read, frames[int(zeroed):]) if read.size else None
    return PostedFrames(frames, positions, posted)


def _returns(plan: Plan, arrays: dict[str, np.ndarray], discounts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The batch's n-step rewards and discounts: float64 terms summed strictly in increasing i, then float32
    (native pass; its numpy reference ``nstep_returns_numpy`` runs instead where numba does not compile)."""
    if _NATIVE:
        return nstep_returns(arrays["reward"], plan.reward_slots, plan.reward_weights, discounts, plan.window,
                             plan.terminated)
    return nstep_returns_numpy(arrays["reward"], plan, discounts)


def assemble_frames(plan: Plan, arrays: dict[str, np.ndarray], ids: np.ndarray, discounts: np.ndarray,
                    extra_names: tuple[str, ...], reader: FrameReader, weight: np.ndarray | None = None,
                    frame_buffer: FrameBuffer | None = None, posted: PostedFrames | None = None,
                    then: Callable[[], None] | None = None) -> FrameBatch:
    """``assemble``'s batch as a ``FrameBatch``: the distinct frames of both stacks read once (into
    ``frame_buffer``'s array), the stacks as positions into them; everything else as ``assemble``.
    ``posted``: its frames, already being read (``post_frames``); ``then`` runs once they are read."""
    frames, positions = distinct_frames(reader, posted, then, lambda: _stack_slots(plan), frame_buffer)
    reward, discount = _returns(plan, arrays, discounts)
    return FrameBatch(
        frames=frames,
        obs_index=positions[0],
        next_index=positions[1],
        action=arrays["action"][plan.slots],
        reward=reward,
        discount=discount,
        terminated=plan.terminated,
        truncated=plan.truncated,
        index=ids,
        weight=_weights(weight, ids.size),
        extras=_extras(arrays, plan.slots, extra_names),
    )


def nstep_returns_numpy(rewards: np.ndarray, plan: Plan, discounts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The n-step rewards and discounts of a planned batch in numpy: the float64 terms
    ``reward * gamma**i`` summed strictly in increasing i (``accumulate`` is sequential), then float32;
    the discount ``gamma**m``, 0 after a termination. The reference of the native pass."""
    terms = rewards[plan.reward_slots] * plan.reward_weights
    reward = np.add.accumulate(terms, axis=1)[:, -1].astype(np.float32)
    discount = discounts[plan.window]
    discount[plan.terminated] = 0
    return reward, discount
