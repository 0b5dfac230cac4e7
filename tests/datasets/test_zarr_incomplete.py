"""A zarr export missing one object (an interrupted copy) is refused, never imported as zeros (the
same on the S3 test server: test_remote.py)."""

from __future__ import annotations

import os
import shutil
import threading
import time

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


class _Interrupted(Exception):
    pass


class _StopAfter:
    """A progress bar that interrupts the export once some frames were written (as Ctrl-C would)."""

    def __init__(self, total, desc):
        self.n = 0

    def update(self, n=1):
        self.n += n
        if self.n > 600:
            raise _Interrupted

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


@pytest.mark.parametrize("remote", [False, True])
def test_an_interrupted_export_leaves_nothing_once_it_returns(tmp_path, monkeypatch, remote):
    # shard writes slowed (a remote PUT): some are still queued when the export fails
    from mmreplay.datasets import zarr_format

    write = zarr_format._write_shard

    def slow(*args, **kwargs):
        time.sleep(0.02)
        return write(*args, **kwargs)

    monkeypatch.setattr(zarr_format, "_write_shard", slow)
    s = mr.ReplayStore.create(tmp_path / "s", capacity=5000, obs_shape=(8, 8), chunk_size=256)
    rng = np.random.default_rng(0)
    for _ in range(20):
        s.reset(rng.integers(0, 255, (8, 8), dtype=np.uint8))
        s.extend(rng.integers(0, 4, 100), rng.standard_normal(100), rng.integers(0, 255, (100, 8, 8), dtype=np.uint8),
                 np.arange(100) == 99, np.zeros(100, bool))
    s.close()
    out = f"memory://interrupted-{os.getpid()}/out.zarr" if remote else str(tmp_path / "out" / "d.zarr")
    if not remote:
        os.mkdir(tmp_path / "out")
    with pytest.raises(_Interrupted):
        export(str(tmp_path / "s"), out, progress=_StopAfter, shard_bytes=1024, compression=None)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("mmreplay-zarr")]
    time.sleep(0.2)  # (a write left running would land in this time)
    if remote:
        import fsspec

        left = [k for k in fsspec.filesystem("memory").store if f"/interrupted-{os.getpid()}/" in k]
    else:
        left = os.listdir(tmp_path / "out")
    assert left == []
    export(str(tmp_path / "s"), out, progress=False, shard_bytes=1024, compression=None)  # the rerun is not refused
