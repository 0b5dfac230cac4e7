"""Chunk files sized to the store (FORMAT.md, "Chunk size"): a small store takes about what its data needs,
larger stores (the 1M reference workload among them) keep the chunk size they always had."""

from __future__ import annotations

import math

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.bench import disk_bytes
from mmreplay.options import PAGE_ROWS, TARGET_CHUNK_BYTES, Schema, default_chunk_size

ATARI = 84 * 84


def _old_rule(capacity: int, frame_bytes: int, num_envs: int) -> int:
    """The rule every store had before small stores got small chunks (the oracle for large stores)."""
    unit = PAGE_ROWS * num_envs // math.gcd(PAGE_ROWS, num_envs)
    rows = min(max(1, TARGET_CHUNK_BYTES // max(frame_bytes, 1)), max(1, capacity // 8))
    return max(unit, (rows // unit) * unit)


@pytest.mark.parametrize("num_envs", [1, 8, 3])
def test_large_stores_keep_their_chunk_size(num_envs):
    unit = PAGE_ROWS * num_envs // math.gcd(PAGE_ROWS, num_envs)
    for capacity in (8 * unit, 8 * unit + 7, 100_000, 1_000_000, 10_000_000):
        for frame_bytes in (1, 16, ATARI, 3 * ATARI, 4 * ATARI):
            want = _old_rule(capacity, frame_bytes, num_envs)
            assert default_chunk_size(capacity, frame_bytes, num_envs) == want, (capacity, frame_bytes)


def test_the_reference_workload_is_unchanged():
    sch = Schema.build(capacity=1_000_000, obs_shape=(84, 84), stack=4, n_step=3)
    assert sch.chunk_size == 4096 and sch.rows_alloc == 4096
    assert Schema.build(capacity=100_000, obs_shape=(84, 84), stack=4, n_step=3).chunk_size == 4096


@pytest.mark.parametrize("capacity", [1, 10, 100, 1_000, 10_000, 30_000, 32_767])
@pytest.mark.parametrize("shape", [(84, 84), (4, 84, 84), (5,), (4,)])
@pytest.mark.parametrize("num_envs", [1, 8, 3])
def test_small_stores_get_small_chunks(capacity, shape, num_envs):
    frame_bytes = math.prod(shape)
    unit = PAGE_ROWS * num_envs // math.gcd(PAGE_ROWS, num_envs)
    chunk = default_chunk_size(capacity, frame_bytes, num_envs)
    assert chunk % num_envs == 0 and chunk // num_envs >= 16
    assert chunk <= unit  # never more than the large-store rule gave
    least = max(2**20 // frame_bytes, 16 * num_envs)
    assert chunk >= min(unit, least) or chunk >= capacity // 16
    if least < capacity // 16 <= unit and capacity // 16 <= TARGET_CHUNK_BYTES // frame_bytes:
        assert chunk - num_envs < capacity // 16 <= chunk  # 1/16 of the capacity, rounded up to num_envs
    Schema.build(capacity=capacity, obs_shape=shape, num_envs=num_envs)  # a layout the store accepts


def test_the_sb3_rates_store_rolls_every_sixteenth_of_its_capacity():
    """84x84 frames at capacity 20,000 (where SB3's own buffer fits): 1,250-row chunks, not 625."""
    assert default_chunk_size(20_000, ATARI, 1) == 1250
    assert default_chunk_size(32_767, ATARI, 1) == 2047  # the largest small store with one env stream
    assert default_chunk_size(32_767, ATARI, 3) == 2049  # rounded up to a multiple of num_envs
    assert default_chunk_size(2_000, ATARI, 1) == 2**20 // ATARI  # at least ~1 MiB of frames


def test_a_capacity_1000_store_takes_about_what_its_data_needs(tmp_path):
    """84x84 frames, filled to 1.1x capacity: the raw frames of 1,000 transitions are 6.7 MiB; with a
    4096-row chunk the preallocated open chunk alone took 28 MiB."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (64, 84, 84), dtype=np.uint8)  # incompressible: sealed chunks stay raw
    path = tmp_path / "s"
    with mr.ReplayStore.create(path, capacity=1000, obs_shape=(84, 84), stack=4, n_step=3) as s:
        assert s.schema.chunk_size == 148
        s.reset(frames[0])
        for t in range(1100):
            s.step(t % 4, 1.0, frames[(t + 1) % 64], t % 250 == 249, False)
            if t % 250 == 249:
                s.reset(frames[t % 64])
        lo, hi = s.id_range
        assert hi == 1100 and hi - lo >= 1000
        i = hi - 10  # mid-episode: its state ends with the frame step i-1 wrote, its next state 3 steps on
        got = s.gather(np.array([i]))
        assert np.array_equal(got.obs[0, -1], frames[i % 64]) and np.array_equal(got.next_obs[0, -1], frames[(i + 3) % 64])
    raw = 1000 * 84 * 84
    assert disk_bytes(str(path)) < 1.5 * raw  # the retained frames and two chunks of slack, no more
    with mr.ReplayStore.open(path, mode="r") as again:
        assert again.id_range == (lo, hi) and len(again) > 900
        assert again.sample(32).obs.shape == (32, 4, 84, 84)
    assert mr.verify_store(str(path)) == []
