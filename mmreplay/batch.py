"""The ``Batch`` returned by sampling, and how it is assembled from the ring arrays."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .index import Plan

__all__ = ["Batch"]


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


def _stack(frames: np.ndarray, slots: np.ndarray, pad: np.ndarray) -> np.ndarray:
    b, k = slots.shape
    out = np.empty((b, k) + frames.shape[1:], frames.dtype)
    np.take(frames, slots.reshape(-1), axis=0, out=out.reshape((b * k,) + frames.shape[1:]), mode="clip")
    if pad.any():
        out[pad] = 0
    return out


def assemble(plan: Plan, arrays: dict[str, np.ndarray], ids: np.ndarray, discounts: np.ndarray,
             extra_names: tuple[str, ...], weight: np.ndarray | None = None) -> Batch:
    """Copy a planned batch out of the ring arrays (the only place frames are read for sampling)."""
    frames = arrays["obs"]
    obs = _stack(frames, plan.obs_slots, plan.obs_pad)
    next_obs = _stack(frames, plan.next_slots, plan.next_pad)
    if plan.next_missing.any():
        next_obs[plan.next_missing] = 0
    rewards = arrays["reward"][plan.reward_slots]
    acc = np.zeros(plan.slots.size, np.float64)
    for i in range(rewards.shape[1]):  # increasing i, in float64: the documented summation order
        acc += plan.reward_weights[:, i] * rewards[:, i].astype(np.float64)
    discount = np.where(plan.terminated, np.float32(0.0), discounts[plan.m]).astype(np.float32)
    b = plan.slots.size
    return Batch(
        obs=obs,
        action=arrays["action"][plan.slots],
        reward=acc.astype(np.float32),
        next_obs=next_obs,
        discount=discount,
        terminated=plan.terminated.copy(),
        truncated=plan.truncated.copy(),
        index=ids.astype(np.int64, copy=True),
        weight=np.ones(b, np.float32) if weight is None else weight.astype(np.float32),
        extras={name: arrays["x_" + name][plan.slots] for name in extra_names},
    )
