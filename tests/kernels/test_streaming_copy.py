"""Large reads of raw frames are copied with non-temporal stores (``native.lz4.streams``): the same bytes as
a plain copy, for aligned and unaligned outputs, frame sizes that are and are not a multiple of 16, and
reads shared with the helper threads."""

from __future__ import annotations

import numpy as np
import pytest

from mmreplay.native import crew, jit_enabled, lz4
from mmreplay.native.codes import KIND_RAW
from mmreplay.reading.reader import FrameReader
from tests._support import internals
from tests._support.crew import atari_store

pytestmark = pytest.mark.skipif(not jit_enabled(), reason="the kernels run only compiled (NUMBA_DISABLE_JIT=1)")


def _ring(fb: int, rows: int, positions: int = 4) -> tuple:
    """Raw frames of ``positions`` chunks of ``rows`` rows (random bytes), as ``reader._kernel_args``."""
    raw = np.random.default_rng(fb).integers(0, 256, positions * rows * fb, dtype=np.uint8)
    comp = np.zeros(8, np.uint8)
    kind = np.full(positions, KIND_RAW, np.int8)
    zeros = np.zeros(positions, np.int64)
    return raw, (raw, comp, comp.view(np.int64), kind, zeros, zeros.copy(), rows, 8, fb)


def _out(nbytes: int, offset: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` starting ``offset`` bytes past a 64-byte boundary."""
    block = np.empty(nbytes + 128, np.uint8)
    start = (-block.ctypes.data) % 64 + offset
    return block[start:start + nbytes]


@pytest.mark.parametrize("fb", [7056, 7057])  # 84x84 frames (16-byte multiples), and frames that are not
@pytest.mark.parametrize("offset", [0, 8])  # an aligned output, and one no 16-byte store may start
def test_large_reads_equal_a_plain_copy(fb, offset):
    rows = 1200
    raw, args = _ring(fb, rows)
    frames = raw.reshape(-1, fb)
    rng = np.random.default_rng(offset)
    # obs stacks of 4 consecutive frames, next stacks 3 further on: 3 shared frames per row
    b = lz4.STREAM_BYTES // (8 * fb) + 7
    start = rng.integers(0, frames.shape[0] - 8, b)
    obs = start[:, None] + np.arange(4)
    nxt = obs + 3
    out = _out(2 * b * 4 * fb, offset)
    want_streaming = fb % 16 == 0 and offset % 16 == 0
    assert lz4.streams(out, fb) == want_streaming and out.size >= lz4.STREAM_BYTES
    assert lz4.gather_pairs(obs, nxt, 0, b, out, *args) == (0, 0)
    np.testing.assert_array_equal(out.reshape(2, b, 4, fb), np.stack([frames[obs], frames[nxt]]))
    flat = np.ascontiguousarray(obs.reshape(-1))
    out2 = _out(flat.size * fb, offset)
    assert lz4.gather(flat, out2, *args) == (0, 0)
    np.testing.assert_array_equal(out2.reshape(-1, fb), frames[flat])
    # a small read of the same frames stays plain, with the same bytes
    small = _out(2 * 4 * 4 * fb, offset)
    assert not lz4.streams(small, fb)
    assert lz4.gather_pairs(obs[:4], nxt[:4], 0, 4, small, *args) == (0, 0)
    np.testing.assert_array_equal(small.reshape(2, 4, 4, fb), np.stack([frames[obs[:4]], frames[nxt[:4]]]))


def test_an_unmapped_frame_in_a_large_read_is_reported():
    fb = 7056
    raw, args = _ring(fb, 1200)
    b = lz4.STREAM_BYTES // (8 * fb) + 1
    obs = np.tile(np.arange(4), (b, 1))
    nxt = obs + 3
    nxt[b // 2, 3] = 10**9  # past every mapped chunk
    out = _out(2 * b * 4 * fb, 0)
    err, slot = lz4.gather_pairs(obs, nxt, 0, b, out, *args)
    assert err != 0 and slot == 10**9


@pytest.mark.parametrize("threads", [1, 3])
def test_a_large_batch_of_stacks_shared_with_the_helpers_is_the_numpy_read(tmp_path, threads):
    store = atari_store(str(tmp_path / "s"), None)
    try:
        idx = internals.log(store).index
        ring = internals.log(store).ring
        b = lz4.STREAM_BYTES // (8 * ring.frame_bytes) + 9
        plan = idx.plan(idx.slots_of(np.random.default_rng(threads).choice(store.sampleable_ids(), b)))
        fast = FrameReader(ring.arrays["obs"], threads, False, ring=ring)
        fast.SHARE = True  # every read shared with the helpers (where there are any)
        one = FrameReader(ring.arrays["obs"], 1, False, ring=ring, native=False)
        try:
            for got, want in zip(fast.stacks(plan.obs_slots, plan.next_slots),
                                 one.stacks(plan.obs_slots, plan.next_slots), strict=True):
                assert lz4.streams(got.base.reshape(-1).view(np.uint8), ring.frame_bytes)
                np.testing.assert_array_equal(got, want)
            if threads > 1 and crew.SUPPORTED:
                assert fast._crew.threads == threads - 1  # the read was posted to the helpers
        finally:
            fast.close()
            one.close()
    finally:
        store.close()
