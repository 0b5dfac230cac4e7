"""Copy a batch's frame stacks out of the ring into its output buffer, padding zeroed, in one pass.

``gather_stacks`` replaces ``np.take`` of the obs and next_obs slots followed by the three masked
assignments of ``batch.assemble`` (obs padding, next padding, rows whose next state is a missing
final frame). It works on a range of batch rows so that callers can split a batch between threads
(the kernel releases the GIL); each row's obs and next stacks are copied by the same call, so a
next-stack frame that the obs stack already holds (k - m of them per row) is copied from the output,
which the CPU cache still has, rather than from the ring.

Interface, kept to "slots in, output buffer out" so a decoding kernel for compressed frames can
sit beside it: ``frames`` is the ring's frame array seen as 2-D, ``(slots, frame_items)`` (any dtype;
``frames.reshape(len(frames), -1)``), ``out`` the (2, B, k, frame_items) output (C-contiguous;
``out[0]`` obs, ``out[1]`` next_obs), ``stacks``/``pad`` the (2, B, k) slots and padding of
``native.plan.plan_batch`` (or ``Index.plan``'s obs/next arrays stacked).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def gather_stacks(frames: np.ndarray, stacks: np.ndarray, pad: np.ndarray, next_missing: np.ndarray,
                  out: np.ndarray, row_start: int, row_stop: int) -> None:
    """Fill ``out[:, row_start:row_stop]``: frame ``frames[stacks[h, b, c]]`` at ``out[h, b, c]``, zeros
    where ``pad[h, b, c]``, and zeros in all of ``out[1, b]`` where ``next_missing[b]``."""
    k = stacks.shape[2]
    width = frames.shape[1]
    for b in range(row_start, row_stop):
        for c in range(k):
            dst = out[0, b, c]
            if pad[0, b, c]:
                dst[:] = 0
            else:
                src = frames[stacks[0, b, c]]
                for i in range(width):
                    dst[i] = src[i]
        for c in range(k):
            dst = out[1, b, c]
            if next_missing[b] or pad[1, b, c]:
                dst[:] = 0
                continue
            s = stacks[1, b, c]
            src = frames[s]
            for c2 in range(k):  # the same frame in this row's obs stack, just copied
                if stacks[0, b, c2] == s and not pad[0, b, c2]:
                    src = out[0, b, c2]
                    break
            for i in range(width):
                dst[i] = src[i]
