"""A batch of ``sample()`` read by the calling thread alone in one compiled call: the plan and the n-step
returns (``plan.plan_returns``), the frames of both stacks (``lz4.gather_pairs``) and the zeroing of padding.

Every call from Python pays for typing its arguments and boxing what it returns, a few microseconds a
call, which at small batches is a fair share of the copy itself. So the outputs are passed in (``values``,
``ends``, ``out``) rather than returned, and the arrays only the kernel needs (the plan's stacks, padding,
windows) never reach Python. Equal, byte for byte, to ``plan_returns`` then ``gather_pairs`` then the
zeroing ``reading.batch.assemble`` does (the tests compare them).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .lz4 import gather_pairs
from .plan import C_STACK, plan_returns_into


@njit(cache=True, nogil=True)
def plan_gather(slots: np.ndarray, flags: np.ndarray, episode_pos: np.ndarray, seq_of_pos: np.ndarray,
                config: np.ndarray, gammas: np.ndarray, reward: np.ndarray, discounts: np.ndarray,
                values: np.ndarray, ends: np.ndarray, out: np.ndarray, raw: np.ndarray, comp: np.ndarray,
                comp64: np.ndarray, kind: np.ndarray, table: np.ndarray, data_end: np.ndarray, rows_alloc: int,
                cstride: int, fb: int) -> tuple[int, int]:
    """Plan the valid transition slots ``slots`` (B,) and read their stacks.

    Writes ``values`` float32 (3, B) (the n-step rewards, discounts, 1.0), ``ends`` bool (3, B)
    (terminated, truncated, next_missing) and ``out`` (the uint8 bytes of a (2, B, k, frame) array: the
    stacks, then the next stacks, padding and missing final frames zeroed). The first six arguments are
    ``plan.plan_batch``'s, the last nine ``lz4.gather_pairs``'s ring arrays. Returns ``(0, 0)`` or
    ``(error code, slot)`` of a frame that could not be read (the outputs are then incomplete)."""
    b_count = slots.shape[0]
    k = config[C_STACK]
    ends[:] = False
    stacks, pad, zeros = plan_returns_into(slots, flags, episode_pos, seq_of_pos, config, gammas, reward, discounts,
                                           values, ends)
    err, slot = gather_pairs(stacks[0], stacks[1], 0, b_count, out, raw, comp, comp64, kind, table, data_end,
                             rows_alloc, cstride, fb)
    if err == 0 and zeros:
        for half in range(2):
            for b in range(b_count):
                missing = half == 1 and ends[2, b]
                for c in range(k):
                    if missing or pad[half, b, c]:
                        start = ((half * b_count + b) * k + c) * fb
                        out[start:start + fb] = 0
    return err, slot
