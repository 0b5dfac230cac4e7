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

import mmreplay as mr
from mmreplay.datasets import DatasetError, DatasetNotFoundError, describe, export, import_dataset
from tests._support.helpers import require
from tests._support.hostile import run_limited


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


# -- hostile files (issue 12): sizes checked before allocating, nothing outside the file followed ---------
def _gzip_zeros_declaring(path, shape, dtype):
    """A gzip'd .npy whose header declares ``shape`` and whose stream inflates to that many zero bytes,
    built from one repeated full-flush deflate block (a 3 GB declaration costs ~3 MB and milliseconds)."""
    import zlib

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                               "shape": tuple(shape)})
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    total = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    with open(path, "wb") as f:
        f.write(co.compress(head.getvalue()) + co.flush(zlib.Z_FULL_FLUSH))
        mib = co.compress(b"\0" * (1 << 20)) + co.flush(zlib.Z_FULL_FLUSH)
        for _ in range(total >> 20):
            f.write(mib)
        f.write(co.flush())


def _dopamine_dir(d, slots=50):
    """A minimal Dopamine checkpoint 0 with slots rows (the files _scan reads before invalid_range)."""
    import gzip

    d.mkdir()
    arrays = {"$store$_observation": np.zeros((slots, 4), np.uint8), "$store$_action": np.zeros(slots, np.int32),
              "$store$_reward": np.zeros(slots, np.float32), "$store$_terminal": np.zeros(slots, np.uint8),
              "add_count": np.array(20, np.int64), "invalid_range": np.arange(17, 22, dtype=np.int64)}
    for name, arr in arrays.items():
        with gzip.open(d / f"{name}_ckpt.0.gz", "wb") as g:
            np.save(g, arr, allow_pickle=False)
    return d


def test_dqn_replay_invalid_range_bomb_is_refused_in_bounded_memory(tmp_path):
    """A 3 MB invalid_range whose header declares 3.2 GB was inflated in full before being rejected."""
    d = _dopamine_dir(tmp_path / "replay_logs")
    _gzip_zeros_declaring(d / "invalid_range_ckpt.0.gz", (400_000_000,), np.int64)
    assert os.path.getsize(d / "invalid_range_ckpt.0.gz") < 4 << 20
    r = run_limited(f"""
        import time
        from mmreplay.datasets import DatasetError, import_dataset
        t = time.perf_counter()
        try:
            import_dataset({str(d)!r}, {str(tmp_path / 's')!r}, format="dqn-replay", progress=False)
        except DatasetError as exc:
            print("REFUSED", time.perf_counter() - t, peak_kib(), exc)
    """)
    assert r.stdout.startswith("REFUSED"), (r.stdout, r.stderr[-2000:])
    _, seconds, maxrss_kib, message = r.stdout.split(" ", 3)
    assert int(maxrss_kib) < 500 * 1024, r.stdout  # bounded memory; bounded work: run_limited's CPU cap
    assert "invalid_range" in message and "400,000,000" in message and "at most 2,000" in message
    assert not (tmp_path / "s").exists()


def test_gzip_header_declaring_more_than_the_file_can_inflate_to(tmp_path):
    d = _dopamine_dir(tmp_path / "replay_logs")
    import gzip

    with gzip.open(d / "$store$_observation_ckpt.0.gz", "wb") as g:  # 7 GB of frames declared, none stored
        np.lib.format.write_array_header_1_0(g, {"descr": "|u1", "fortran_order": False,
                                                 "shape": (1_000_000, 84, 84)})
    refused(tmp_path, d, DatasetError, "$store$_observation", "7,056,000,000 bytes", "deflate", format="dqn-replay")


def test_dqn_replay_episode_end_indices_bomb(tmp_path):
    d = _dopamine_dir(tmp_path / "replay_logs")
    import zlib

    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(d / "episode_end_indices_ckpt.0.gz", "wb") as f:  # inflates to 1 GiB
        f.write(co.compress(b"\0" * (1 << 20)) + co.flush(zlib.Z_FULL_FLUSH))
        f.write((co.compress(b"\0" * (1 << 20)) + co.flush(zlib.Z_FULL_FLUSH)) * 1023 + co.flush())
    refused(tmp_path, d, DatasetError, "episode_end_indices", "inflates to more than", format="dqn-replay")


def _unwritten_h5(path, rows):
    """A D4RL file whose datasets declare ``rows`` rows, chunked and compressed, with nothing written."""
    with h5py.File(path, "w") as f:
        for key, shape, dtype in (("observations", (rows, 3), np.float32), ("actions", (rows, 2), np.float32),
                                  ("rewards", (rows,), np.float32), ("terminals", (rows,), bool)):
            f.create_dataset(key, shape=shape, dtype=dtype, chunks=(1 << 16, *shape[1:]), compression="gzip")


def test_hdf5_declaring_huge_shapes_is_refused_at_once(tmp_path):
    p = tmp_path / "x.hdf5"
    _unwritten_h5(p, 10**11)
    r = run_limited(f"""
        import time
        from mmreplay.datasets import DatasetError, import_dataset
        t = time.perf_counter()
        try:
            import_dataset({str(p)!r}, {str(tmp_path / 's')!r}, progress=False)
        except DatasetError as exc:
            print("REFUSED", time.perf_counter() - t, exc)
    """)
    assert r.stdout.startswith("REFUSED"), (r.stdout, r.stderr[-2000:])
    assert "'observations'" in r.stdout and "stored data" in r.stdout
    assert not (tmp_path / "s").exists()


def test_hdf5_frames_larger_than_a_store_holds(tmp_path):
    p = tmp_path / "x.hdf5"
    with h5py.File(p, "w") as f:
        f.create_dataset("observations", shape=(2, 20000, 20000), dtype=np.uint8, chunks=(1, 64, 64),
                         compression="gzip")
        f["actions"] = np.zeros(2, np.int64)
        f["rewards"] = np.zeros(2, np.float32)
        f["terminals"] = np.zeros(2, bool)
    refused(tmp_path, p, DatasetError, "'observations'", "bytes each", "at most")


def _minari_rewrite(minari_dir, change):
    path = minari_dir / "data" / "main_data.hdf5"
    with h5py.File(path, "a") as f:
        change(f)
    return path


def test_minari_episode_declaring_huge_shapes(tmp_path, minari_dir):
    def huge(f):
        del f["episode_1/rewards"]
        f["episode_1"].create_dataset("rewards", shape=(10**11,), dtype=np.float32, chunks=(1 << 16,),
                                      compression="gzip")

    _minari_rewrite(minari_dir, huge)
    r = run_limited(f"""
        from mmreplay.datasets import DatasetError, import_dataset
        try:
            import_dataset({str(minari_dir)!r}, {str(tmp_path / 's')!r}, progress=False)
        except DatasetError as exc:
            print("REFUSED", exc)
    """)
    assert r.stdout.startswith("REFUSED") and "'rewards'" in r.stdout, (r.stdout, r.stderr[-2000:])


def test_minari_total_episodes_beyond_the_file(tmp_path, minari_dir):
    p = minari_dir / "data" / "metadata.json"
    meta = json.load(open(p))
    for bad in (10**12, "3", -1, 2.5):
        meta["total_episodes"] = bad
        json.dump(meta, open(p, "w"))
        refused(tmp_path, minari_dir, DatasetError, "episode" if bad == 10**12 else "total_episodes", format="minari")


def _zarr_source(tmp_path):
    src = small_store(tmp_path / "src")
    export(src, tmp_path / "d.zarr", progress=False)
    return tmp_path / "d.zarr"


def _zarr_resize(root, names, rows):
    """Declare ``rows`` rows for arrays ``names`` (metadata only: nothing more is stored)."""
    import warnings

    import zarr

    for name in names:
        meta_path = root / name / "zarr.json"
        meta = json.load(open(meta_path))
        meta["shape"][0] = rows
        json.dump(meta, open(meta_path, "w"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(root))


def test_zarr_declaring_more_episodes_than_steps(tmp_path):
    root = _zarr_source(tmp_path)
    _zarr_resize(root, [f"episodes/{n}" for n in ("obs_start", "step_start", "length", "return", "final_missing")],
                 10**11)
    refused(tmp_path, root, DatasetError, "100,000,000,000 episodes", "steps")


ZARR_ARRAYS = ["observations", "actions", "rewards", "terminations", "truncations",
               *(f"episodes/{n}" for n in ("obs_start", "step_start", "length", "return", "final_missing"))]


def test_zarr_declaring_huge_shapes_in_tiny_objects(tmp_path):
    root = _zarr_source(tmp_path)
    _zarr_resize(root, ZARR_ARRAYS, 10**11)
    refused(tmp_path, root, DatasetError, "declares 100,000,000,000 rows", "objects")


@pytest.mark.parametrize("rows", [10**6, 10**7])
def test_zarr_declaring_huge_shapes_is_refused_in_bounded_memory(tmp_path, rows):
    """Every array declares many more rows than it stores: the episode tables were read whole (from
    fill values), an import had to get through all of them before noticing."""
    root = _zarr_source(tmp_path)
    _zarr_resize(root, ZARR_ARRAYS, rows)
    r = run_limited(f"""
        import time
        from mmreplay.datasets import DatasetError, import_dataset
        t = time.perf_counter()
        try:
            import_dataset({str(root)!r}, {str(tmp_path / 's')!r}, progress=False)
        except DatasetError as exc:
            print("REFUSED", time.perf_counter() - t, peak_kib(), exc)
    """)
    assert r.stdout.startswith("REFUSED"), (r.stdout, r.stderr[-2000:])
    _, seconds, maxrss_kib, message = r.stdout.split(" ", 3)
    assert int(maxrss_kib) < 500 * 1024, r.stdout  # bounded memory; bounded work: run_limited's CPU cap
    # the declared rows have no shard objects: refused by the object check before any table is read
    assert "array 'observations' lacks" in message and "shard object" in message
    assert not (tmp_path / "s").exists()
    with pytest.raises(DatasetError, match="episode 3"):
        describe(root)


def _d4rl_with(path, obs):
    with h5py.File(path, "a") as f:
        f["actions"] = np.zeros((10, 2), np.float32)
        f["rewards"] = np.zeros(10, np.float32)
        f["terminals"] = np.zeros(10, bool)
        obs(f)


@pytest.mark.parametrize("kind", ["external link", "soft link through an external link", "external storage",
                                  "virtual dataset", "external infos"])
def test_hdf5_data_outside_the_file_is_refused_not_followed(tmp_path, kind):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["obs"] = np.ones((10, 3), np.float32)
        f["grp/obs"] = np.ones((10, 3), np.float32)
    raw = tmp_path / "raw.bin"
    raw.write_bytes(np.ones((10, 3), np.float32).tobytes())
    p = tmp_path / "x.hdf5"

    def obs(f):
        if kind == "external link":
            f["observations"] = h5py.ExternalLink(str(other), "/obs")
        elif kind == "soft link through an external link":
            f["ext"] = h5py.ExternalLink(str(other), "/grp")
            f["observations"] = h5py.SoftLink("/ext/obs")
        elif kind == "external storage":
            f.create_dataset("observations", shape=(10, 3), dtype=np.float32, external=[(str(raw), 0, 120)])
        elif kind == "virtual dataset":
            layout = h5py.VirtualLayout(shape=(10, 3), dtype=np.float32)
            layout[:] = h5py.VirtualSource(str(other), "obs", shape=(10, 3))
            f.create_virtual_dataset("observations", layout)
        else:
            f["observations"] = np.ones((10, 3), np.float32)
            f["infos/qpos"] = h5py.ExternalLink(str(other), "/obs")

    _d4rl_with(p, obs)
    words = {"external link": "external link", "soft link through an external link": "external link",
             "external storage": "external files", "virtual dataset": "virtual dataset",
             "external infos": "external link"}[kind]
    refused(tmp_path, p, DatasetError, str(p), words, "in the file itself")
    with pytest.raises(DatasetError, match=words):
        describe(p)


def test_hdf5_soft_links_inside_the_file_are_followed(tmp_path):
    p = tmp_path / "x.hdf5"

    def obs(f):
        f["data/obs"] = np.arange(30, dtype=np.float32).reshape(10, 3)
        f["observations"] = h5py.SoftLink("/data/obs")

    _d4rl_with(p, obs)
    with import_dataset(p, tmp_path / "s", progress=False) as s:
        assert np.array_equal(s.episode_frames(s.episodes(), 0)[:10], np.arange(30, dtype=np.float32).reshape(10, 3))


def test_minari_episode_behind_an_external_link(tmp_path, minari_dir):
    path = minari_dir / "data" / "main_data.hdf5"
    other = tmp_path / "other.h5"
    with h5py.File(path, "a") as f, h5py.File(other, "w") as o:
        f.copy(f["episode_2"], o, "episode_2")
        del f["episode_2"]
        f["episode_2"] = h5py.ExternalLink(str(other), "/episode_2")
    refused(tmp_path, minari_dir, DatasetError, "episode_2", "external link")


def test_minari_jpeg_frame_of_the_wrong_size(tmp_path):
    Image = require("PIL.Image")
    src = small_store(tmp_path / "src", obs_shape=(32, 32), dtype="uint8")
    export(src, tmp_path / "root", format="minari", dataset_id="t/jpeg-v0", progress=False)
    data = tmp_path / "root" / "t" / "jpeg-v0" / "data"
    meta = json.load(open(data / "metadata.json"))
    del meta["jpeg_encoding"]
    json.dump(meta, open(data / "metadata.json", "w"))
    with h5py.File(data / "main_data.hdf5", "a") as f:
        n = f["episode_0"]["observations"].shape[0]
        del f["episode_0"]["observations"]
        buf = io.BytesIO()
        Image.fromarray(np.zeros((4000, 4000), np.uint8)).save(buf, format="JPEG")
        ds = f["episode_0"].create_dataset("observations", (n,), dtype=h5py.vlen_dtype(np.uint8))
        for i in range(n):
            ds[i] = np.frombuffer(buf.getvalue(), np.uint8)
    refused(tmp_path, data.parent, DatasetError, "4000x4000", "(32, 32)")


# -- dtypes, shapes and extras checked against what the dataset declares ----------------------------------
def _store_with_extra(path):
    """Episodes with a (2,) float32 extra and uint8 actions (0..5)."""
    rng = np.random.default_rng(1)
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(4,), obs_dtype="uint8", stack=2, action_dtype="uint8",
                              extras={"x": ((2,), "float32")})
    for _ in range(3):
        s.reset(rng.integers(0, 255, 4, dtype=np.uint8))
        for t in range(6):
            s.step(np.uint8(rng.integers(0, 6)), 1.0, rng.integers(0, 255, 4, dtype=np.uint8), t == 5, False,
                   x=rng.random(2, dtype=np.float32))
    s.close()
    return str(path)


def _all_rows(path):
    with mr.ReplayStore.open(path, mode="r") as s:
        return s.gather(s.sampleable_ids())


def test_minari_round_trip_keeps_unsigned_integer_actions(tmp_path):
    """Minari files hold integer actions as int64; the action dtype recorded beside them (uint8) comes back."""
    src = _store_with_extra(tmp_path / "src")
    export(src, tmp_path / "root", format="minari", dataset_id="t/u8-v0", progress=False)
    import_dataset(tmp_path / "root" / "t" / "u8-v0", tmp_path / "back", progress=False).close()
    a, b = _all_rows(src), _all_rows(tmp_path / "back")
    assert b.action.dtype == np.uint8 and np.array_equal(a.action, b.action)
    assert np.array_equal(a.extras["x"], b.extras["x"]) and np.array_equal(a.obs, b.obs)


def test_minari_values_that_do_not_fit_their_space_or_shape_are_refused(tmp_path):
    src = _store_with_extra(tmp_path / "src")
    export(src, tmp_path / "root", format="minari", dataset_id="t/u8-v0", progress=False)
    data = tmp_path / "root" / "t" / "u8-v0"
    kept = tmp_path / "kept.hdf5"
    shutil.copy(data / "data" / "main_data.hdf5", kept)

    def rewrite(key, values):
        shutil.copy(kept, data / "data" / "main_data.hdf5")
        with h5py.File(data / "data" / "main_data.hdf5", "a") as f:
            del f[key]
            f[key] = values

    obs = np.asarray(h5py.File(kept, "r")["episode_1/observations"])
    rewrite("episode_1/observations", obs.astype(np.int64) * 300)  # (would wrap modulo 256 as uint8)
    refused(tmp_path, data, DatasetError, "episode_1: observations", "int64", "uint8")
    rewrite("episode_1/observations", obs + 0.5)  # (would lose the fraction)
    refused(tmp_path, data, DatasetError, "episode_1: observations", "float64")
    acts = np.asarray(h5py.File(kept, "r")["episode_1/actions"])
    rewrite("episode_1/actions", acts + 300)
    refused(tmp_path, data, DatasetError, "episode_1: actions", "uint8")
    rewrite("episode_1/actions", acts[:, None])
    refused(tmp_path, data, DatasetError, "episode_1: actions has shape (6, 1), expected (6,)")
    x = np.asarray(h5py.File(kept, "r")["episode_1/infos/x"])
    rewrite("episode_1/infos/x", x[:-2])
    refused(tmp_path, data, DatasetError, "episode_1: infos/x has shape (5, 2), expected (7, 2)")


def test_zarr_extras_of_another_length_or_missing_are_refused(tmp_path):
    import warnings

    import zarr

    src = _store_with_extra(tmp_path / "src")
    export(src, tmp_path / "d.zarr", progress=False)
    root = tmp_path / "d.zarr"
    saved = tmp_path / "saved.zarr"
    shutil.copytree(root, saved)
    _zarr_resize(root, ["extras/x"], 5)
    refused(tmp_path, root, DatasetError, "array 'extras/x' has 5 rows, 'actions' has 18")
    shutil.rmtree(root)
    shutil.copytree(saved, root)
    shutil.rmtree(root / "extras" / "x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(root))
    refused(tmp_path, root, DatasetError, "declares the extra 'x'", "missing")


def test_hdf5_next_observations_and_recorded_extras_are_checked(tmp_path):
    src = _store_with_extra(tmp_path / "src")
    p = tmp_path / "d.hdf5"
    export(src, p, format="hdf5", next_observations=True, progress=False)
    kept = tmp_path / "kept.hdf5"
    shutil.copy(p, kept)
    with h5py.File(p, "a") as f:
        nxt = np.asarray(f["next_observations"])
        del f["next_observations"]
        f["next_observations"] = nxt.astype(np.int64)
    refused(tmp_path, p, DatasetError, "'next_observations'", "int64", "uint8")
    shutil.copy(kept, p)
    with h5py.File(p, "a") as f:
        del f["infos/x"]
    refused(tmp_path, p, DatasetError, "declares the extra 'x'", "'infos/x'", "missing")


@pytest.mark.parametrize("remote", [False, True])
@pytest.mark.parametrize("key", ["rewards", "observations"])
def test_hdf5_damaged_chunk_of_a_step_key_names_it(tmp_path, key, remote):
    """A chunk that does not decode (h5py's filter fails for ``rewards``; ``observations`` are inflated by
    mmreplay): the error names the file (its URL for a remote one) and the key."""
    import fsspec

    src = _store_with_extra(tmp_path / "src")
    p = tmp_path / "d.hdf5"
    export(src, p, format="hdf5", progress=False)
    with h5py.File(p, "r") as f:
        info = f[key].id.get_chunk_info(0)
    with open(p, "r+b") as f:
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    where = str(p)
    if remote:
        where = f"memory://damaged-{os.getpid()}/d.hdf5"
        fsspec.filesystem("memory").put(str(p), where)
    try:
        what = "corrupt chunk" if key == "observations" else "damaged"
        err = refused(tmp_path, where, DatasetError, f"'/{key}'", what)
    finally:
        if remote:
            fsspec.filesystem("memory").rm(where)
    named = str(err).split(f": dataset '/{key}'")[0]  # the file's URL, not h5py's repr of a file object
    assert (named.startswith("memory://") and named.endswith(where[9:])) if remote else named == str(p), str(err)
