"""Chunk files and the ring that maps them: one array per column across every mapped chunk."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mmreplay.errors import CorruptStoreError
from mmreplay.options import Schema
from mmreplay.storage import npyfile
from mmreplay.storage.ring import ChunkRing, chunk_file, chunk_of_file, columns_for


def _ring(tmp_path, positions=3, writable=True) -> ChunkRing:
    os.makedirs(tmp_path / "chunks", exist_ok=True)
    schema = Schema.build(capacity=10, obs_shape=(3,), obs_dtype="uint8", chunk_size=4, extras={"x": ((), "float32")})
    return ChunkRing(str(tmp_path), schema, positions, writable)


def test_columns_and_file_names():
    schema = Schema.build(capacity=10, obs_shape=(3,), chunk_size=4, extras={"x": ((2,), "float32")})
    assert [c.name for c in columns_for(schema)] == ["obs", "action", "reward", "flags", "x_x"]
    assert chunk_file("/s", "000000000042", "obs") == "/s/chunks/000000000042.obs.npy"
    assert chunk_of_file("000000000042.x_x.npy") == "000000000042"


def test_a_chunk_maps_at_its_position_and_reads_like_numpy(tmp_path):
    ring = _ring(tmp_path)
    ring.create_chunk(4)  # position 4 % 3 == 1
    base = 1 * ring.rows_alloc
    ring.arrays["obs"][base:base + 4] = np.arange(12, dtype=np.uint8).reshape(4, 3)
    ring.sync_chunk(4)
    on_disk = np.load(chunk_file(str(tmp_path), "000000000004", "obs"), mmap_mode="r")
    np.testing.assert_array_equal(on_disk, np.arange(12).reshape(4, 3))
    ring.protect_chunk(4)
    crcs = ring.finish_seal(4)
    assert set(crcs) == {"obs", "action", "reward", "flags", "x_x"}
    ring.unmap_chunk(4)
    assert 4 not in ring.mapped
    ring.close()


def test_resize_remaps_chunks_at_their_new_positions(tmp_path):
    ring = _ring(tmp_path)
    ring.create_chunk(2)
    ring.arrays["reward"][2 * ring.rows_alloc] = 7.5
    ring.resize(5)
    assert ring.arrays["reward"][2 * ring.rows_alloc] == 7.5  # 2 % 5 == 2 % 3
    ring.create_chunk(4)
    assert set(ring.mapped) == {2, 4}
    ring.close()


def test_damaged_chunk_files_are_named(tmp_path):
    ring = _ring(tmp_path)
    ring.create_chunk(0)
    ring.unmap_chunk(0)
    path = chunk_file(str(tmp_path), "000000000000", "reward")
    with open(path, "r+b") as f:
        f.truncate(npyfile.HEADER_BYTES + 2)
    with pytest.raises(CorruptStoreError, match="reward.npy: file is .* bytes, expected"):
        ring.map_chunk(0, "000000000000", writable=False)
    os.unlink(path)
    with pytest.raises(CorruptStoreError, match="chunk file is missing"):
        ring.map_chunk(0, "000000000000", writable=False)
    ring.close()
