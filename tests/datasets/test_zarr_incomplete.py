"""A zarr export missing one object (an interrupted copy) is refused, never imported as zeros (the
same on the S3 test server: test_remote.py)."""

from __future__ import annotations

import os
import shutil

import google_crc32c
import numpy as np
import pytest

import mmreplay as mr
from mmreplay.datasets import DatasetError, export, import_dataset

zarr = pytest.importorskip("zarr")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("zarr")
    s = mr.ReplayStore.create(base / "s", capacity=2000, obs_shape=(6, 6), chunk_size=64,
                              extras={"lp": ((), "float32")})
    rng = np.random.default_rng(1)
    for _ in range(8):
        s.reset(rng.integers(1, 255, (6, 6), dtype=np.uint8))
        n = 40
        s.extend(rng.integers(1, 4, n), rng.standard_normal(n) + 5, rng.integers(1, 255, (n, 6, 6), dtype=np.uint8),
                 np.arange(n) == n - 1, np.zeros(n, bool), lp=np.ones(n, np.float32))
    s.close()
    export(str(base / "s"), str(base / "d.zarr"), progress=False, shard_bytes=2048, chunk_frames=8, chunk_steps=64)
    return base / "d.zarr"


@pytest.mark.parametrize("array", ["observations", "actions", "rewards", "terminations", "extras/lp",
                                   "episodes/length", "episodes/final_missing"])
def test_a_lost_shard_object_is_refused_before_anything_is_imported(exported, tmp_path, array):
    copy = tmp_path / "d.zarr"
    shutil.copytree(exported, copy)
    shards = sorted((copy / array / "c").iterdir(), key=lambda p: int(p.name))
    victim = shards[len(shards) // 2]
    (shutil.rmtree if victim.is_dir() else os.unlink)(victim)
    with pytest.raises(DatasetError, match=f"array '{array}' lacks 1 of its {len(shards)} shard object"):
        import_dataset(str(copy), str(tmp_path / "back"), progress=False)
    assert not (tmp_path / "back").exists()


def test_the_complete_export_imports_and_a_chunk_absent_from_its_shard_is_refused(exported, tmp_path):
    with import_dataset(str(exported), str(tmp_path / "ok"), progress=False) as b:
        assert len(b) > 0 and (b.gather(b.sampleable_ids()).obs != 0).any()
    copy = tmp_path / "d.zarr"
    shutil.copytree(exported, copy)
    a = zarr.open_group(str(copy), mode="r")["rewards"]
    n = a.shards[0] // a.chunks[0]  # chunks per shard
    shard = copy / "rewards" / "c" / "0"
    raw = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(raw[-16 * n - 4:-4]), "<u8").reshape(n, 2).copy()
    index[0] = np.iinfo(np.uint64).max  # chunk 0 marked absent, the index checksum recomputed
    raw[-16 * n - 4:-4] = index.tobytes()
    raw[-4:] = np.uint32(google_crc32c.value(index.tobytes())).astype("<u4").tobytes()
    shard.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="chunk 0 is absent from its shard"):
        import_dataset(str(copy), str(tmp_path / "back"), progress=False)
