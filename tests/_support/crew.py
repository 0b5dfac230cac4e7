"""Helpers of the tests of reads shared with helper threads (``native.crew``): stores of real Atari frames,
a store with one damaged compressed frame, and waiting for the helpers to finish a task."""

from __future__ import annotations

import time

import numpy as np

import mmreplay as mr
from mmreplay.native import crew
from mmreplay.storage import framefile
from tests._support import internals
from tests._support.compression import atari_frames, compressed_chunk, drive, flip


def atari_store(path: str, compression: str | None, capacity: int = 600, game: str = "seaquest",
                truncate_every: int = 0) -> mr.ReplayStore:
    """700 real frames of ``game`` in episodes ending every 97 steps (and truncated every
    ``truncate_every`` steps), committed."""
    frames = atari_frames(game)[:700]
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=frames.shape[1:], stack=4, n_step=3, chunk_size=64,
                              compression=compression, seed=0)
    s.reset(frames[0])
    for t in range(1, len(frames)):
        end = t % 97 == 0
        cut = not end and truncate_every > 0 and t % truncate_every == 0
        s.step(t % 4, float(t % 3), frames[t], end, cut)
        if end or cut:
            s.reset(frames[t])
    s.commit()
    return s


def finished_by_helpers(c: crew.Crew, task: tuple[int, int]) -> bool:
    """Whether the helpers of ``c`` finish ``task`` (``(sequence, rows)``) within 120 s (a hang detector: a
    helper's first task may compile its kernel, which takes seconds on a loaded machine)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = int(c.ctl[crew.DONE])
        if done >> crew.SEQ_SHIFT == task[0] and done & crew.LOW == task[1]:
            return True
        time.sleep(0.001)
    return False


def damaged_store(path: str) -> tuple[str, int]:
    """A small store at ``path`` with one compressed frame damaged: its file and row."""
    with mr.ReplayStore.create(path, capacity=200, obs_shape=(8, 8), stack=2, n_step=2, chunk_size=32,
                               seed=0) as s:
        drive([s], 150, 2, ends=0.02)
    _, target = compressed_chunk(str(path))
    buf = framefile.read_file(target)
    records = framefile.read_records(target, buf, 32)
    row = int(np.flatnonzero((records["length"] < 64) & (records["length"] > 8))[0])
    flip(target, int(records[row]["offset"]) + 6)
    return target, row


def damaged_slots(s: mr.ReplayStore, target: str, row: int) -> tuple[int, np.ndarray]:
    """The damaged frame's slot, and slots of intact frames."""
    ring = internals.log(s).ring
    seq = next(q for q, name in ring.mapped.items() if target.endswith(f"{name}.obs.lz4"))
    bad = (seq % ring.positions) * ring.rows_alloc + row
    good = np.array([q * ring.rows_alloc + r for q in range(ring.positions) for r in range(20)
                     if ring.frame_kind[q] >= 0 and q * ring.rows_alloc + r != bad])
    return bad, good
