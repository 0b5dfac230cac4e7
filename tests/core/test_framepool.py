"""Output buffers are recycled however many batches the caller keeps alive (FramePool)."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.reading.bufferpool import FramePool

U8 = np.dtype(np.uint8)


def test_a_buffer_is_reused_only_when_nothing_else_holds_it():
    pool = FramePool()
    a = pool.get((2, 3), U8)
    b = pool.get((2, 3), U8)
    assert a is not b
    view = a[0]
    del a
    c = pool.get((2, 3), U8)
    assert c is not view.base  # a view keeps its buffer out
    del view
    assert pool.get((2, 3), U8) is not None
    d = pool.get((4,), np.dtype(np.float32))
    assert d.shape == (4,) and d.dtype == np.float32


def test_as_many_buffers_as_are_alive_then_no_new_ones():
    pool = FramePool()
    live = [pool.get((2, 8, 4, 84, 84), U8) for _ in range(7)]  # e.g. batches(prefetch=4) + the caller's
    seen = {id(x) for x in live}
    for _ in range(50):
        live.pop(0)
        live.append(pool.get((2, 8, 4, 84, 84), U8))
        seen.add(id(live[-1]))
    assert len(seen) == 7


def test_free_buffers_beyond_the_byte_limit_are_let_go():
    pool = FramePool(max_free_bytes=10_000)
    big = [pool.get((6000,), U8) for _ in range(3)]
    refs = [weakref.ref(b) for b in big]
    del big
    pool.get((10,), U8)
    # at most 10,000 free bytes stay alive in the pool: one 6000-byte buffer (the newest), not three
    assert [r() is not None for r in refs] == [False, False, True]


@pytest.mark.parametrize("prefetch", [0, 2, 5])
def test_batches_recycle_their_buffers(tmp_path, prefetch):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=200, obs_shape=(4, 4), stack=2, n_step=2, seed=0)
    s.reset(np.zeros((4, 4), np.uint8))
    for t in range(250):
        s.step(0, 0.0, np.full((4, 4), t % 200, np.uint8), t % 50 == 49, False)
        if t % 50 == 49:
            s.reset(np.zeros((4, 4), np.uint8))
    it = s.batches(16, prefetch=prefetch)
    bases = set()
    for _ in range(60):
        b = next(it)
        bases.add(id(b.obs.base))
    # the queued batches, the one handed out, the one being filled, the caller's previous one
    assert len(bases) <= prefetch + 3
    it.close()
    s.close()
