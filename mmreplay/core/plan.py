"""The row arithmetic of a batch: which slots its frames, rewards and flags come from.

Pure functions of the index's arrays (passed in, never kept): the index calls
them with its own state, the native kernels are checked against them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import END, MISSING, TERMINATED, Geometry


@dataclass
class Plan:
    """Row arithmetic of a batch: ring slots to gather and masks to apply (all numpy, shape B first).

    ``stacks``/``pad`` hold both stacks, (2, B, k): ``[0]`` is ``obs_slots``/``obs_pad``, ``[1]``
    ``next_slots``/``next_pad`` (what a copy kernel takes in one piece).
    """

    slots: np.ndarray  # (B,) the transitions' own slots (action, extras, id)
    obs_slots: np.ndarray  # (B, k)
    obs_pad: np.ndarray  # (B, k) True where the frame is zero padding
    next_slots: np.ndarray  # (B, k)
    next_pad: np.ndarray  # (B, k)
    reward_slots: np.ndarray  # (B, n) clamped to written rows; weights are 0 where unused
    reward_weights: np.ndarray  # (B, n) float64 gamma**i for i < m, else 0
    window: np.ndarray  # (B,) n-step window length m (n, or fewer when the episode ends inside it)
    terminated: np.ndarray  # (B,) bool
    truncated: np.ndarray  # (B,) bool
    next_missing: np.ndarray  # (B,) bool: terminated onto a missing final frame -> next_obs is all zeros
    stacks: np.ndarray | None = None  # (2, B, k) int64: obs_slots and next_slots
    pad: np.ndarray | None = None  # (2, B, k) bool: obs_pad and next_pad
    zeros: int = -1  # how many entries of obs_pad, next_pad and next_missing are True (-1: not counted)


class RowMath:
    """Stacking and n-step arithmetic for one store's ``stack``, ``n_step``, ``pad`` and ``gamma``."""

    def __init__(self, stack: int, n_step: int, pad: str, gamma: float) -> None:
        self.k = stack
        self.n = n_step
        self.pad_first = pad == "first"
        self._back = np.arange(stack - 1, -1, -1, dtype=np.int64)  # k-1 .. 0: oldest frame first
        self._ar_n = np.arange(n_step, dtype=np.int64)
        self._ar_k = np.arange(stack, dtype=np.int64)
        self._span = np.arange(-stack, n_step, dtype=np.int64)
        self._last_col = self._ar_n == n_step - 1
        # gamma**i for i < n: a window of length m weighs its rewards by the first m of them (O(n), not O(n^2))
        self.gammas = np.array([gamma ** i for i in range(n_step)], np.float64)

    def stack_slots(self, geo: Geometry, s: np.ndarray, last: np.ndarray,
                    episode_pos_last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of the k-frame stacks ending at rows ``last`` (oldest first) and their zero-padding mask.

        ``episode_pos_last`` is the episode position of row ``last`` (rows since the episode's first stored
        frame). Works for any leading shape of ``s``/``last``/``episode_pos_last`` (broadcast together).
        """
        back = self._back
        pad = back > episode_pos_last[..., None]
        rows = last[..., None] - back
        if self.pad_first or pad.any():
            rows = np.where(pad, (last - episode_pos_last)[..., None], rows)  # the episode's first frame
            if self.pad_first:
                pad = np.zeros_like(pad)
        return geo.slots(s[..., None], rows), pad

    def plan(self, flags: np.ndarray, episode_pos: np.ndarray, geo: Geometry, slots: np.ndarray,
             oldest_row: np.ndarray, rows: np.ndarray, has_missing: bool) -> Plan:
        """Everything needed to build the rows of *valid* transition slots (vectorized, no frame access).

        ``flags``/``episode_pos`` are the index's per-slot RAM flags and episode positions; ``oldest_row`` and
        ``rows`` (per stream) bound the retained, written rows. Every frame a row needs lies in the span of
        rows ``stream_row-k .. stream_row+n-1`` of its stream (obs stack, n-step window, next stack), so one slot
        computation over that span serves all. Column ``c`` of the span is row ``stream_row + c - k``. When no
        row's span leaves its segment (all but a few rows per chunk), the span's slots are the row's
        slot plus offsets; otherwise they are computed row by row with the span clamped to retained,
        written rows. Either way a valid row's window never reaches past its first episode end before
        that end, and positions before its episode's first frame are padding: what such slots hold is
        never used.
        """
        k, n = self.k, self.n
        if geo.spans_inside(slots, k, n - 1) is not True:
            s, stream_row = geo.rows_of(slots)
            span = stream_row[:, None] + self._span
            np.maximum(span, oldest_row[s][:, None], out=span)
            np.minimum(span, rows[s][:, None] - 1, out=span)
            sl = geo.slots(s[:, None], span)  # (B, k+n)
        else:
            sl = slots[:, None] + self._span
        wslots = np.ascontiguousarray(sl[:, k:])  # (the reward slots the n-step kernel takes: C order, as warmed)
        fl = flags[wslots]  # the window's frames
        ends = (fl & END) != 0
        m = (ends | self._last_col).argmax(axis=1) + 1  # window length: up to and including the first end
        idx = np.arange(slots.size)
        last_f = fl[idx, m - 1]
        has_end = ends.any(axis=1)
        terminated = (last_f & TERMINATED) != 0
        # A span column c is before the episode's first stored frame iff c < k - episode_pos(stream_row).
        first_col = k - episode_pos[slots]
        obs_pad = self._ar_k < first_col[:, None]
        next_cols = m[:, None] + self._ar_k
        next_pad = next_cols < first_col[:, None]
        obs_slots = sl[:, :k]
        next_slots = sl[idx[:, None], next_cols]
        if self.pad_first:
            first = sl[idx, np.maximum(first_col, 0)][:, None]
            obs_slots = np.where(obs_pad, first, obs_slots)
            next_slots = np.where(next_pad, first, next_slots)
            obs_pad = next_pad = np.zeros_like(obs_pad)
        missing = terminated & ((last_f & MISSING) != 0) if has_missing else np.zeros_like(terminated)
        weights = np.where(self._ar_n < m[:, None], self.gammas, 0.0)
        return Plan(slots, obs_slots, obs_pad, next_slots, next_pad, wslots, weights, m, terminated,
                    has_end & ~terminated, missing, np.stack([obs_slots, next_slots]), np.stack([obs_pad, next_pad]))
