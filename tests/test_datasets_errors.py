"""Bad datasets and bad arguments: clear errors naming the file and key, and no store left behind.
(DQN-replay files: see test_datasets_dqn.py.)"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys

import h5py
import numpy as np
import pytest
from helpers import require

import mmreplay as mr
from mmreplay.datasets import DatasetError, DatasetNotFoundError, describe, export, import_dataset


def small_store(path, obs_shape=(3,), episodes=3, length=6, dtype="float32"):
    rng = np.random.default_rng(0)
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=obs_shape, obs_dtype=dtype, stack=2)
    frame = (lambda: rng.integers(0, 255, obs_shape, dtype=np.uint8)) if dtype == "uint8" else \
        (lambda: rng.random(obs_shape, dtype=np.float32))
    for _ in range(episodes):
        s.reset(frame())
        for t in range(length):
            s.step(int(rng.integers(0, 3)), 1.0, frame(), t == length - 1, False)
    s.close()
    return str(path)


def refused(tmp_path, src, exc, *words, **kw):
    target = tmp_path / "new" / "store"
    with pytest.raises(exc) as info:
        import_dataset(src, target, progress=False, **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert not target.exists()
    assert not (target.parent.exists() and [p for p in os.listdir(target.parent) if p.startswith(".")])
    return info.value


# -- D4RL / HDF5 -----------------------------------------------------------------------------------------
def test_hdf5_without_required_keys(tmp_path):
    p = tmp_path / "x.hdf5"
    with h5py.File(p, "w") as f:
        f["observations"] = np.zeros((10, 3), np.float32)
        f["actions"] = np.zeros((10, 2), np.float32)
        f["terminals"] = np.zeros(10, bool)
    err = refused(tmp_path, p, DatasetError, str(p), "'rewards'")
    assert isinstance(err, ValueError)


def test_hdf5_with_mismatched_lengths(tmp_path):
    p = tmp_path / "x.hdf5"
    with h5py.File(p, "w") as f:
        f["observations"] = np.zeros((10, 3), np.float32)
        f["actions"] = np.zeros((10, 2), np.float32)
        f["rewards"] = np.zeros(9, np.float32)
        f["terminals"] = np.zeros(10, bool)
    refused(tmp_path, p, DatasetError, str(p), "'rewards'", "10 rows")


def test_not_an_hdf5_file(tmp_path):
    p = tmp_path / "x.hdf5"
    p.write_bytes(b"hello")
    refused(tmp_path, p, DatasetError, str(p), format="d4rl")


def test_plain_d4rl_file_imports(tmp_path):
    """A file as D4RL's generators write it: float terminals, (N,1) rewards, timeouts, infos; no attributes."""
    n = 25
    p = tmp_path / "hopper.hdf5"
    with h5py.File(p, "w") as f:
        f["observations"] = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        f["actions"] = np.ones((n, 2), np.float32)
        f["rewards"] = np.arange(n, dtype=np.float32).reshape(n, 1)
        term = np.zeros(n, np.float32)
        term[9] = 1.0
        f["terminals"] = term
        to = np.zeros(n, bool)
        to[19] = True
        f["timeouts"] = to
        f["infos/qpos"] = np.zeros((n, 4), np.float32)
    with import_dataset(p, tmp_path / "s", progress=False) as s:
        t = s.episodes()
        assert t.length.tolist() == [10, 10, 5]  # the file ends inside an episode: truncated there
        assert t.terminated.tolist() == [True, False, False] and t.final_missing.all()
        assert s.schema.obs_dtype == np.float32 and s.schema.action_shape == (2,)
        assert [e.name for e in s.schema.extras] == ["qpos"]
        st = s.episode_steps(t, 1)
        assert np.array_equal(st.rewards, np.arange(10, 20, dtype=np.float32))
    assert "episodes    3" in describe(p)


# -- Minari ----------------------------------------------------------------------------------------------
@pytest.fixture
def minari_dir(tmp_path):
    src = small_store(tmp_path / "src")
    export(src, tmp_path / "root", format="minari", dataset_id="t/small-v0", progress=False)
    return tmp_path / "root" / "t" / "small-v0"


def test_minari_without_metadata(tmp_path, minari_dir):
    os.unlink(minari_dir / "data" / "metadata.json")
    err = refused(tmp_path, minari_dir, DatasetNotFoundError, "metadata.json", format="minari")
    assert isinstance(err, FileNotFoundError)


@pytest.mark.parametrize("key", ["observation_space", "total_episodes", "data_format"])
def test_minari_metadata_missing_a_key(tmp_path, minari_dir, key):
    p = minari_dir / "data" / "metadata.json"
    meta = json.load(open(p))
    del meta[key]
    json.dump(meta, open(p, "w"))
    refused(tmp_path, minari_dir, DatasetError, str(p), repr(key), format="minari")


def test_minari_missing_episode_group_and_data_file(tmp_path, minari_dir):
    p = minari_dir / "data" / "metadata.json"
    meta = json.load(open(p))
    meta["total_episodes"] = 5
    json.dump(meta, open(p, "w"))
    refused(tmp_path, minari_dir, DatasetError, "main_data.hdf5", "'episode_3'")
    os.unlink(minari_dir / "data" / "main_data.hdf5")
    refused(tmp_path, minari_dir, DatasetNotFoundError, "main_data.hdf5")
    refused(tmp_path, tmp_path / "root", DatasetNotFoundError, "t/nothere-v0", format="minari",
            dataset_id="t/nothere-v0")


def test_minari_jpeg_frames_are_decoded_or_refused(tmp_path, monkeypatch):
    Image = require("PIL.Image")

    src = small_store(tmp_path / "src", obs_shape=(32, 32), dtype="uint8")
    export(src, tmp_path / "root", format="minari", dataset_id="t/jpeg-v0", progress=False)
    data = tmp_path / "root" / "t" / "jpeg-v0" / "data"
    meta = json.load(open(data / "metadata.json"))
    del meta["jpeg_encoding"]  # Minari's default: JPEG-encoded image spaces
    json.dump(meta, open(data / "metadata.json", "w"))
    with h5py.File(data / "main_data.hdf5", "a") as f:
        for name in f:
            frames = f[name]["observations"][()]
            del f[name]["observations"]
            blobs = []
            for fr in frames:
                buf = io.BytesIO()
                Image.fromarray(fr).save(buf, format="JPEG")
                blobs.append(np.frombuffer(buf.getvalue(), np.uint8))
            ds = f[name].create_dataset("observations", (len(blobs),), dtype=h5py.vlen_dtype(np.uint8))
            for i, b in enumerate(blobs):
                ds[i] = b
    with import_dataset(data.parent, tmp_path / "s", progress=False) as s:
        assert s.metadata["source"]["jpeg_decoded"] is True
        t = s.episodes()
        minari = require("minari")
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "root"))
        for i, ep in enumerate(minari.load_dataset("t/jpeg-v0").iterate_episodes()):
            assert np.array_equal(s.episode_frames(t, i), ep.observations)  # decoded as Minari decodes
    monkeypatch.setitem(sys.modules, "PIL", None)
    refused(tmp_path, data.parent, DatasetError, "JPEG", "Pillow")


# -- zarr ------------------------------------------------------------------------------------------------
def test_zarr_that_is_not_ours_or_is_incomplete(tmp_path):
    import zarr

    g = zarr.open_group(str(tmp_path / "other.zarr"), mode="w")
    g.create_array("x", shape=(3,), dtype="int8")
    refused(tmp_path, tmp_path / "other.zarr", DatasetError, "not an mmreplay zarr dataset")
    export(small_store(tmp_path / "src"), tmp_path / "d.zarr", progress=False)
    shutil.rmtree(tmp_path / "d.zarr" / "actions")
    os.unlink(tmp_path / "d.zarr" / "zarr.json")  # drop the consolidated metadata that still lists it
    zarr.open_group(str(tmp_path / "d.zarr"), mode="a").attrs.update({"format": "mmreplay-dataset",
                                                                     "format_version": 1})
    refused(tmp_path, tmp_path / "d.zarr", DatasetError, "'actions'", format="zarr")


# -- arguments -------------------------------------------------------------------------------------------
def test_bad_arguments(tmp_path):
    src = small_store(tmp_path / "src")
    with pytest.raises(ValueError, match="format"):
        export(src, tmp_path / "x", format="parquet")
    with pytest.raises(ValueError, match="dataset_id"):
        export(src, tmp_path / "root", format="minari")
    with pytest.raises(ValueError, match="dataset_id"):
        export(src, tmp_path / "root", format="minari", dataset_id="no-version")
    with pytest.raises(TypeError, match="next_observations"):
        export(src, tmp_path / "x.zarr", next_observations=True)
    with pytest.raises(ValueError, match="compression"):
        export(src, tmp_path / "x.zarr", compression="brotli", progress=False)
    assert not (tmp_path / "x.zarr").exists() and not (tmp_path / "root").exists()
    export(src, tmp_path / "d.zarr", progress=False)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(FileExistsError):
        import_dataset(tmp_path / "d.zarr", tmp_path / "busy", progress=False)
    assert os.listdir(tmp_path / "busy") == ["file"]
    (tmp_path / "empty").mkdir()
    import_dataset(tmp_path / "d.zarr", tmp_path / "empty", progress=False).close()  # an empty dir is fine
    with pytest.raises(DatasetNotFoundError):
        import_dataset(tmp_path / "nothing", tmp_path / "s", progress=False)
    with pytest.raises(DatasetError, match="is an mmreplay store"):
        describe(src)
    (tmp_path / "junk").mkdir()
    with pytest.raises(DatasetError, match="not a recognised dataset"):
        describe(tmp_path / "junk")
