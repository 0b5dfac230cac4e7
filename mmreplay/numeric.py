"""Small numeric checks shared by the parts that take numbers from users (priorities, masses)."""

from __future__ import annotations

import numpy as np

# Bit patterns of finite, non-negative float64 values (read as uint64) are exactly those below the
# pattern of +inf: negative numbers carry the sign bit, inf/NaN the all-ones exponent. One
# comparison then validates a whole batch (after -0.0 is turned into 0.0, which the sign bit flags).
INF_BITS = np.uint64(0x7FF0000000000000)


def finite_nonnegative(values: np.ndarray, name: str, what: str = "finite and >= 0") -> np.ndarray:
    """``values`` (float64) as a new array with -0.0 made 0.0; ``ValueError`` naming the first value
    that is NaN, infinite or negative."""
    arr = values + 0.0
    if arr.size and np.count_nonzero(arr.view(np.uint64) >= INF_BITS):
        pos = int(np.flatnonzero(~((arr >= 0) & (arr < np.inf)))[0])
        raise ValueError(f"{name}[{pos}] = {float(arr[pos])!r}: expected {what}")
    return arr


def keep_last(idx: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop every occurrence of a repeated index but its last one (order of the survivors kept)."""
    if idx.size < 2:
        return idx, values
    order = idx.argsort(kind="stable")
    ordered = idx[order]
    repeated = ordered[1:] == ordered[:-1]
    if not np.count_nonzero(repeated):
        return idx, values
    # The sort is stable, so the last of each run of equal indices is the last occurrence.
    keep = np.sort(order[np.append(~repeated, True)])
    return idx[keep], values[keep]
