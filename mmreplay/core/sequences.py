"""The row arithmetic of a batch of sequences: which slots its L steps and L + 1 stacked states come from.

Pure functions of the index's arrays (passed in, never kept), like ``plan``. A
sequence of length L starts at a sampleable transition (row ``stream_row0`` of stream
``s``, see ``layout``) and takes the transitions at rows ``stream_row0 .. stream_row0+L-1`` of
the same stream while they are written and belong to the start's episode. Its
states are the stacks ending at frame rows ``stream_row0-1 .. stream_row0+L-1``: state ``j``
is the state before step ``j``, state ``m`` (``m`` steps unmasked) the state
after the last step.

The *head* is the number of rows each stream had written when the sequence was
drawn (an array, one count per stream). Rows of a stream at or past its head do
not exist for the sequence, and the newest row's END bit counts only if
the step itself ended the episode (TERMINATED/TRUNCATED): an END that a later
``reset()`` adds to it (truncation by reset) was not there when it was drawn. So a
sequence re-planned from its start id and head - a resumed prefetching iterator -
is the sequence that was drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import END, LOST, MISSING, TERMINATED, TRUNCATED, Geometry
from .plan import RowMath

__all__ = ["SequencePlan", "sequence_plan", "sequence_fits"]


@dataclass
class SequencePlan:
    """Row arithmetic of a batch of B sequences of length L (numpy arrays, B first)."""

    step_slots: np.ndarray  # (B, L) slots of the steps (action, reward, extras); masked steps repeat a real row
    mask: np.ndarray  # (B, L) bool: the step exists
    ids: np.ndarray  # (B, L) int64 transition ids, -1 where masked
    terminated: np.ndarray  # (B, L) bool
    truncated: np.ndarray  # (B, L) bool
    is_first: np.ndarray  # (B, L) bool: the step is its episode's first
    obs_slots: np.ndarray  # (B, L+1, k) frames of every state (a real frame wherever the result is zero)
    obs_pad: np.ndarray  # (B, L+1, k) bool: the frame is zero padding (before the episode's first frame)
    obs_zero: np.ndarray  # (B, L+1) bool: the whole state is zeros (past the last step; a missing final frame)
    steps: np.ndarray  # (B,) int64: unmasked steps m (>= 1)
    head: np.ndarray  # (num_envs,) rows each stream had written when the sequences were drawn


def _step_rows(geo: Geometry, slots: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Stream (B,) and rows (B, length) of the steps of sequences starting at transition slots ``slots``."""
    s, stream_row0 = geo.rows_of(slots)
    return s, stream_row0[:, None] + np.arange(length, dtype=np.int64)


def sequence_plan(math: RowMath, flags: np.ndarray, episode_pos: np.ndarray, slot_id: np.ndarray, geo: Geometry,
                  slots: np.ndarray, length: int, head: np.ndarray) -> SequencePlan:
    """Everything needed to build sequences of ``length`` steps starting at *valid* transition slots ``slots``.

    ``flags``/``episode_pos``/``slot_id`` are the index's per-slot arrays; ``head`` the rows each stream had
    written when the sequences were drawn (at most its rows now). Step ``j`` exists when row ``stream_row0 + j``
    is below its stream's head and no step before it ended the episode; a START row always follows an episode's
    end, so a sequence never runs into the next episode, nor (rows are per stream) into another stream.
    """
    s, rows = _step_rows(geo, slots, length)
    hs = np.asarray(head, np.int64)[s][:, None]
    written = rows < hs
    step_slots = geo.slots(s[:, None], np.minimum(rows, hs - 1))  # masked steps read a real row
    fl = flags[step_slots]
    ended = (fl & (TERMINATED | TRUNCATED)) != 0
    ended |= ((fl & END) != 0) & (rows < hs - 1)  # an END from the next row's START counts if that row did
    ended &= written
    before = np.zeros_like(ended)
    if length > 1:
        before[:, 1:] = np.logical_or.accumulate(ended[:, :-1], axis=1)  # an earlier step ended the episode
    mask = written & ~before
    m = mask.sum(axis=1)
    terminated = mask & ((fl & TERMINATED) != 0)
    truncated = mask & ended & ~terminated
    is_first = mask & (episode_pos[step_slots] == 1) & ((fl & LOST) == 0)
    ids = np.where(mask, slot_id[step_slots], -1)
    # States: state j is the stack ending at frame row stream_row0 - 1 + j (j <= m); later ones are zeros.
    j = np.arange(length + 1, dtype=np.int64)
    jj = np.minimum(j[None, :], m[:, None])  # (B, L+1): real rows only
    stream_row0 = rows[:, 0]
    last = stream_row0[:, None] - 1 + jj
    episode_pos_last = episode_pos[slots].astype(np.int64)[:, None] - 1 + jj
    obs_slots, obs_pad = math.stack_slots(geo, np.broadcast_to(s[:, None], last.shape), last, episode_pos_last)
    obs_zero = j[None, :] > m[:, None]
    final = step_slots[np.arange(slots.size), m - 1]  # the frame after the last step
    missing = (flags[final] & MISSING) != 0
    if missing.any():
        obs_zero[np.flatnonzero(missing), m[missing]] = True
    return SequencePlan(step_slots, mask, ids, terminated, truncated, is_first, obs_slots, obs_pad, obs_zero,
                        m, head)


def sequence_fits(episode_pos: np.ndarray, geo: Geometry, slots: np.ndarray, length: int,
                  head: np.ndarray) -> np.ndarray:
    """Whether each transition slot in ``slots`` starts ``length`` steps of its episode (bool, ``slots``' shape).

    The step ``length - 1`` rows later must be written (below its stream's ``head``), and in the same episode: episode positions grow
    by one per row inside an episode and restart at a START row, and a START is the next row of a stream
    after every episode end (a reset, or a vector env's autoreset). If an episode ended between the two
    rows, a START was written before the later one, so comparing the two rows' positions decides it in
    O(1) per start.
    """
    s, stream_row0 = geo.rows_of(slots)
    hs = np.asarray(head, np.int64)[s]
    last = stream_row0 + (length - 1)
    ok = last < hs
    last_slots = geo.slots(s, np.minimum(last, hs - 1))
    ok &= episode_pos[last_slots].astype(np.int64) == episode_pos[slots].astype(np.int64) + (length - 1)
    return ok
