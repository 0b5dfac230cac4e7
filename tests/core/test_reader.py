"""The frame reader on its own: stacks gathered from a frame array, however the copy is split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmreplay.reading.bufferpool import FramePool
from mmreplay.reading.reader import FrameReader


@settings(max_examples=40, deadline=None)
@given(n_frames=st.integers(1, 50), b=st.integers(1, 20), k=st.integers(1, 5), threads=st.integers(1, 4),
       read_ahead=st.sampled_from([True, False, "auto"]), seed=st.integers(0, 2**16))
def test_stacks_are_the_gather_of_the_slots(n_frames, b, k, threads, read_ahead, seed):
    """Whatever the thread count, split size and read-ahead, ``stacks`` is ``frames[slots]``."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 255, (n_frames, 3, 5), dtype=np.uint8)
    reader = FrameReader(frames, threads=threads, read_ahead=read_ahead)
    reader.MIN_SPLIT_BYTES = reader.MIN_SPLIT_RAW_BYTES = 1  # split even tiny batches between the threads
    obs_slots = rng.integers(0, n_frames, (b, k))
    next_slots = rng.integers(0, n_frames, (b, k))
    obs, nxt = reader.stacks(obs_slots, next_slots)
    np.testing.assert_array_equal(obs, frames[obs_slots])
    np.testing.assert_array_equal(nxt, frames[next_slots])
    reader.close()


def test_outputs_are_recycled_only_when_nobody_holds_them():
    pool = FramePool()
    a = pool.get((2, 3), np.dtype(np.uint8))
    b = pool.get((2, 3), np.dtype(np.uint8))
    assert a is not b  # a is still referenced here
    del a
    c = pool.get((2, 3), np.dtype(np.uint8))
    assert c is not b  # the freed buffer (not b, still held) is handed out again
    view = c[0]
    del c
    d = pool.get((2, 3), np.dtype(np.uint8))
    assert d.base is None and not np.shares_memory(d, view)  # a live view keeps its buffer out


def test_bad_read_ahead_is_refused():
    with pytest.raises(ValueError, match="read_ahead"):
        FrameReader(np.zeros((2, 2), np.uint8), read_ahead="sometimes")
