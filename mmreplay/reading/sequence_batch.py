"""The ``SequenceBatch`` returned by ``sample_sequences``, how it is assembled, and R2D2's sequence priority."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.sequences import SequencePlan
from .batch import FrameBuffer, PostedFrames, buffer_for, distinct_frames, post_distinct
from .reader import FrameReader

__all__ = ["FrameSequenceBatch", "SequenceBatch", "sequence_priority"]


@dataclass
class SequenceBatch:
    """A batch of B sequences of L steps as numpy arrays (k = stack).

    - ``obs``: ``(B, L+1, k, *obs_shape)``, the stacked states s_t .. s_{t+L}: ``obs[:, j]`` is the state
      before step j, ``obs[:, m]`` (m unmasked steps) the state after the last one; later states are zeros.
    - ``action``: ``(B, L, *action_shape)``; ``reward``: ``(B, L)`` float32 one-step rewards.
    - ``terminated`` / ``truncated``: ``(B, L)`` bool, step j ended its episode that way.
    - ``is_first``: ``(B, L)`` bool, step j is its episode's first step.
    - ``mask``: ``(B, L)`` bool, step j exists (the sequence's episode, written so far, reaches it);
      masked steps are zeros in every field and -1 in ``ids``. ``mask[:, 0]`` is always True.
    - ``ids``: ``(B, L)`` int64 transition ids; ``index``: ``(B,)`` = ``ids[:, 0]``, the start ids (what
      ``update_priorities`` takes); ``weight``: ``(B,)`` float32 importance weights (1.0 for uniform).
    - ``extras``: dict of ``(B, L, *shape)`` arrays.
    """

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    is_first: np.ndarray
    mask: np.ndarray
    ids: np.ndarray
    index: np.ndarray
    weight: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    @property
    def length(self) -> int:
        """L, the steps per sequence."""
        return int(self.mask.shape[1])


def _masked(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``values`` (B, L, ...) with the masked steps zeroed (in place; ``values`` is a fresh gather)."""
    if not mask.all():
        values[~mask] = 0
    return values


def post_sequences(plan: SequencePlan, reader: FrameReader, frame_buffer: FrameBuffer | None = None) -> PostedFrames:
    """Start reading a planned batch of sequences' states (``assemble_sequences``' read) in the reader's helper
    threads, into ``frame_buffer``'s array when given; only where ``reader.may_post()`` just said so."""
    obs = buffer_for(frame_buffer, reader, plan.obs_slots.shape)
    if obs is None:
        obs = reader.buffer(plan.obs_slots.shape)
    flat = obs.reshape((-1,) + obs.shape[plan.obs_slots.ndim:])
    return PostedFrames(obs, None, reader.post_gather(plan.obs_slots.reshape(-1), flat))


def post_sequence_frames(plan: SequencePlan, reader: FrameReader, frame_buffer: FrameBuffer | None) -> PostedFrames:
    """``post_sequences`` for ``assemble_sequence_frames``: the distinct frames, into ``frame_buffer``'s array."""
    return post_distinct(reader, plan.obs_slots, _zeroed(plan), frame_buffer)


def _zeroed(plan: SequencePlan) -> np.ndarray:
    return plan.obs_pad | plan.obs_zero[..., None]


def assemble_sequences(plan: SequencePlan, arrays: dict[str, np.ndarray], extra_names: tuple[str, ...],
                       reader: FrameReader, weight: np.ndarray | None, posted: PostedFrames | None = None,
                       then: Callable[[], None] | None = None,
                       frame_buffer: FrameBuffer | None = None) -> SequenceBatch:
    """Copy a planned batch of sequences out of the ring arrays (frames through ``reader``; ``posted``: already
    being read, ``post_sequences``; ``then`` runs once they are read). States read here go into
    ``frame_buffer((B, L+1, k, *frame), dtype)``'s array when given."""
    if posted is None:
        obs = reader.gather(plan.obs_slots, buffer_for(frame_buffer, reader, plan.obs_slots.shape))
    else:
        obs = posted.join(reader)
    if then is not None:
        then()
    if plan.obs_pad.any():
        obs[plan.obs_pad] = 0
    if plan.obs_zero.any():
        obs[plan.obs_zero] = 0
    return SequenceBatch(obs=obs, **_columns(plan, arrays, extra_names, weight))


@dataclass
class FrameSequenceBatch:
    """A batch of sequences whose states are given as distinct frames and positions into them
    (``sequence_batches(frames="distinct")``): ``frames[obs_index]`` is bit-identical to the ``obs`` of the
    ``SequenceBatch`` the same draw gives. ``frames``: ``(F, *obs_shape)``, each distinct frame read once,
    ``frames[0]`` zeros when some state or stack position is; ``obs_index``: ``(B, L+1, k)`` int32 (consecutive
    states share ``k - 1`` frames: ``F`` is about ``(L + k) B`` where the states hold ``(L+1) k B``). The
    other fields are ``SequenceBatch``'s."""

    frames: np.ndarray
    obs_index: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    is_first: np.ndarray
    mask: np.ndarray
    ids: np.ndarray
    index: np.ndarray
    weight: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def to_batch(self) -> SequenceBatch:
        """The ``SequenceBatch`` (states gathered from ``frames``)."""
        return SequenceBatch(obs=self.frames[self.obs_index], action=self.action, reward=self.reward,
                             terminated=self.terminated, truncated=self.truncated, is_first=self.is_first,
                             mask=self.mask, ids=self.ids, index=self.index, weight=self.weight, extras=self.extras)


def assemble_sequence_frames(plan: SequencePlan, arrays: dict[str, np.ndarray], extra_names: tuple[str, ...],
                             reader: FrameReader, weight: np.ndarray | None,
                             frame_buffer: FrameBuffer | None = None, posted: PostedFrames | None = None,
                             then: Callable[[], None] | None = None) -> FrameSequenceBatch:
    """``assemble_sequences``' batch as a ``FrameSequenceBatch`` (distinct frames into ``frame_buffer``'s array;
    ``posted``: already being read, ``post_sequence_frames``)."""
    frames, positions = distinct_frames(reader, posted, then, lambda: (plan.obs_slots, _zeroed(plan)), frame_buffer)
    seq = _columns(plan, arrays, extra_names, weight)
    return FrameSequenceBatch(frames=frames, obs_index=positions, **seq)


def _columns(plan: SequencePlan, arrays: dict[str, np.ndarray], extra_names: tuple[str, ...],
             weight: np.ndarray | None) -> dict[str, Any]:
    mask, slots = plan.mask, plan.step_slots
    ids = plan.ids
    return dict(
        action=_masked(arrays["action"][slots], mask),
        reward=_masked(arrays["reward"][slots].astype(np.float32, copy=False), mask),
        terminated=plan.terminated,
        truncated=plan.truncated,
        is_first=plan.is_first,
        mask=mask,
        ids=ids,
        index=ids[:, 0].copy(),
        weight=np.ones(slots.shape[0], np.float32) if weight is None else weight.astype(np.float32, copy=True),
        extras={name: _masked(arrays["x_" + name][slots], mask) for name in extra_names},
    )


def sequence_priority(abs_td: Any, mask: Any, eta: float = 0.9) -> np.ndarray:
    """R2D2's priority of each sequence: ``eta * max + (1 - eta) * mean`` of ``abs_td`` over its unmasked steps.

    ``abs_td``: ``(B, L)`` absolute TD errors (numpy, or anything ``np.asarray`` takes: a CPU tensor
    after ``.detach().cpu()``); ``mask``: ``(B, L)`` bool, e.g. ``seq.mask``; ``eta`` in [0, 1].
    Masked entries are ignored (they may hold anything, NaN included). Returns ``(B,)`` float64, ready for
    ``store.update_priorities(seq.index, p)``. Raises ``ValueError`` for shapes that differ or are not
    2-D, a row without an unmasked step, NaN, infinite or negative unmasked values, or ``eta`` outside
    [0, 1]; ``TypeError`` for a non-boolean mask or non-numeric errors.
    """
    if isinstance(eta, bool) or not isinstance(eta, (int, float, np.integer, np.floating)) or not 0 <= eta <= 1:
        raise ValueError(f"eta: expected a number in [0, 1], got {eta!r}")
    td = np.asarray(abs_td)
    m = np.asarray(mask)
    if td.ndim != 2:
        raise ValueError(f"abs_td: expected a (batch, length) array, got shape {td.shape}")
    if m.shape != td.shape:
        raise ValueError(f"mask: expected shape {td.shape} (that of abs_td), got {m.shape}")
    if td.dtype.kind not in "biuf":
        raise TypeError(f"abs_td: expected real numbers, got dtype {td.dtype}")
    if m.dtype != np.bool_:
        raise TypeError(f"mask: expected a bool array (seq.mask), got dtype {m.dtype}")
    empty = ~m.any(axis=1)
    if empty.any():
        raise ValueError(f"mask[{int(np.flatnonzero(empty)[0])}] has no unmasked step: a sequence's first step"
                         " is always unmasked; pass seq.mask")
    td = td.astype(np.float64)
    bad = m & ~(np.isfinite(td) & (td >= 0))
    if bad.any():
        i, j = (int(x[0]) for x in np.nonzero(bad))
        raise ValueError(f"abs_td[{i}, {j}] = {td[i, j]!r}: expected finite absolute TD errors >= 0 on unmasked"
                         " steps")
    vals = np.where(m, td, 0.0)
    top = np.where(m, td, -np.inf).max(axis=1)
    mean = vals.sum(axis=1) / m.sum(axis=1)
    return eta * top + (1 - eta) * mean
