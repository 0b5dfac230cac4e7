"""The ``Batch`` returned by sampling, and how it is assembled from the ring arrays."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .native import jit_enabled
from .native.plan import nstep_returns
from .plan import Plan
from .reader import FrameReader, PostedStacks

__all__ = ["Batch"]

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


def assemble(plan: Plan, arrays: dict[str, np.ndarray], ids: np.ndarray, discounts: np.ndarray,
             extra_names: tuple[str, ...], reader: FrameReader, weight: np.ndarray | None = None,
             posted: PostedStacks | None = None, then: Callable[[], None] | None = None) -> Batch:
    """Copy a planned batch out of the ring arrays (the only place frames are read for sampling).

    ``ids`` is used as the batch's ``index`` without a copy: pass an array the caller owns. ``posted``:
    its frames, already being read (``FrameReader.post_stacks``); ``then`` runs once the frames are read.
    """
    if posted is None:
        obs, next_obs = reader.stacks(plan.obs_slots, plan.next_slots)
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
    # n-step return: float64 terms summed strictly in increasing i, then float32 (native pass; its numpy
    # reference is ``nstep_returns_numpy``, which runs instead where numba does not compile)
    if _NATIVE:
        reward, discount = nstep_returns(arrays["reward"], plan.reward_slots, plan.reward_weights, discounts,
                                         plan.window, plan.terminated)
    else:
        reward, discount = nstep_returns_numpy(arrays["reward"], plan, discounts)
    return Batch(
        obs=obs,
        action=arrays["action"][plan.slots],
        reward=reward,
        next_obs=next_obs,
        discount=discount,
        terminated=plan.terminated,
        truncated=plan.truncated,
        index=ids,
        weight=np.ones(ids.size, np.float32) if weight is None else weight.astype(np.float32, copy=False),
        extras={name: arrays["x_" + name][plan.slots] for name in extra_names},
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
