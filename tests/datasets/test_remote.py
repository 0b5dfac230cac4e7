"""Datasets on object storage: export to and import from a real S3 protocol server on localhost (moto's
server mode), every format, exact rows after the round trip; DQN-replay files read from S3; nothing is
unpickled; ``memory://`` URLs without any server."""

from __future__ import annotations

import gzip
import os
import pickle
import socket

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.datasets import DatasetError, detect_format, export, import_dataset
from tests._support.dqn import Dopamine
from tests._support.helpers import FIELDS, require

BUCKET = "mmreplay-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """(storage_options, filesystem) of a moto S3 server on a free localhost port, with one bucket."""
    require("s3fs")
    server_mod = require("moto.server")
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "testing", "secret": "testing",
               "client_kwargs": {"region_name": "us-east-1"}, "use_listings_cache": False}
    import boto3  # moto's own dependency
    import s3fs

    boto3.client("s3", endpoint_url=options["endpoint_url"], aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    fs = s3fs.S3FileSystem(**options)
    yield options, fs
    server.stop()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A committed store: stacked frames, n-step rows, an extra, terminated and truncated episodes, one
    whose final observation is missing, one still running."""
    path = str(tmp_path_factory.mktemp("remote") / "store")
    rng = np.random.default_rng(0)
    s = mr.ReplayStore.create(path, capacity=10_000, obs_shape=(8, 8), stack=3, n_step=2, gamma=0.9,
                              extras={"lp": ((), "float32")}, chunk_size=256, metadata={"env_id": "Test-v0"})
    for e in range(12):
        n = int(rng.integers(5, 60))
        s.reset(rng.integers(0, 255, (8, 8), dtype=np.uint8))
        missing = e == 4
        frames = rng.integers(0, 255, (n - missing, 8, 8), dtype=np.uint8)
        term = np.zeros(n, bool)
        trunc = np.zeros(n, bool)
        if e < 11:
            (term if e % 2 else trunc)[-1] = True
        s.extend(rng.integers(0, 6, n), rng.standard_normal(n), frames, term, trunc, final_missing=missing,
                 lp=rng.standard_normal(n).astype(np.float32))
    s.close()
    return path


def rows(store: mr.ReplayStore) -> mr.Batch:
    return store.gather(store.sampleable_ids())


def assert_same_rows(a: mr.ReplayStore, b: mr.ReplayStore) -> None:
    """``b`` (imported from an export of ``a``) holds ``a``'s complete episodes, with the same ids and rows
    (the running episode, last, is not exported)."""
    ids = b.sampleable_ids()
    want = a.sampleable_ids()
    np.testing.assert_array_equal(ids, want[want < b.id_range[1]])
    assert ids.size > 0
    x, y = a.gather(ids), b.gather(ids)
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)
        assert getattr(x, name).dtype == getattr(y, name).dtype, name
    np.testing.assert_array_equal(x.extras["lp"], y.extras["lp"])


@pytest.mark.parametrize("fmt, out, kw", [
    ("zarr", "d.zarr", {}),
    ("hdf5", "d.hdf5", {"next_observations": True}),
    ("minari", "minari", {"dataset_id": "mmreplay/test-v0"}),
])
def test_export_to_s3_and_import_back_gives_the_same_rows(s3, store, tmp_path, fmt, out, kw):
    options, fs = s3
    url = f"s3://{BUCKET}/{fmt}/{out}"
    res = export(store, url, format=fmt, storage_options=options, progress=False, **kw)
    assert res.path.startswith("s3://") and res.bytes_on_disk > 0 and res.episodes == 11
    src = url + "/" + kw["dataset_id"] if fmt == "minari" else url
    assert detect_format(src, options) == ("hdf5" if fmt == "hdf5" else fmt)
    with pytest.raises(FileExistsError):
        export(store, url, format=fmt, storage_options=options, progress=False, **kw)
    back = import_dataset(src, tmp_path / "back", storage_options=options, progress=False)
    with mr.ReplayStore.open(store, mode="r") as orig:
        assert_same_rows(orig, back)
    assert back.metadata["source"]["path"].startswith("s3://")
    back.close()
    assert not os.path.exists(tmp_path / ".back")  # nothing staged locally is left behind


def test_a_zarr_export_streams_shards_and_writes_its_root_metadata_last(s3, store):
    options, fs = s3
    url = f"s3://{BUCKET}/order/d.zarr"
    export(store, url, storage_options=options, progress=False, shard_bytes=4096)
    shards = [p for p in fs.find(f"{BUCKET}/order/d.zarr") if "/c/" in p]
    assert len(shards) > 10  # one object per shard, written as the shards were encoded
    import zarr

    g = zarr.open_group(url, mode="r", storage_options=options)  # plain zarr reads it from S3
    assert g.attrs["format"] == "mmreplay-dataset" and g["observations"].shape[1:] == (8, 8)
    export(store, url, storage_options=options, progress=False, overwrite=True)  # replaced whole
    assert len([p for p in fs.find(f"{BUCKET}/order/d.zarr") if "/c/" in p]) < len(shards)


def _dopamine(d: str, newer: bool) -> Dopamine:
    buf = Dopamine(d, 300, newer=newer, horizon=2)
    buf.play(np.random.default_rng(3), lambda: buf.log_count == 3, time_limit=25 if newer else None)
    return buf


@pytest.mark.parametrize("newer", [False, True])
def test_dqn_replay_checkpoints_import_from_s3_as_from_disk(s3, tmp_path, monkeypatch, newer):
    options, fs = s3
    buf = _dopamine(str(tmp_path / "ckpt"), newer)
    prefix = f"{BUCKET}/dqn-{newer}/replay_logs"
    fs.put(buf.d + "/", prefix + "/", recursive=True)

    def no_unpickling(*a, **k):
        raise AssertionError("a dataset file was unpickled")

    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    url = "s3://" + prefix
    assert detect_format(url, options) == "dqn-replay"
    remote = import_dataset(url, tmp_path / "remote", storage_options=options, progress=False)
    local = import_dataset(buf.d, tmp_path / "local", progress=False)
    assert_same_rows_dqn(local, remote)
    assert remote.metadata["source"]["path"] == url
    local.close()
    remote.close()


def assert_same_rows_dqn(a: mr.ReplayStore, b: mr.ReplayStore) -> None:
    assert a.id_range == b.id_range and len(a) == len(b) > 0
    x, y = rows(a), rows(b)
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)


def test_a_remote_import_never_executes_a_pickle(s3, tmp_path):
    options, fs = s3
    buf = Dopamine(str(tmp_path / "ckpt"), 120, newer=True)
    buf.play(np.random.default_rng(1), lambda: buf.log_count == 1)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(marker),))

    with gzip.open(os.path.join(buf.d, "episode_end_indices_ckpt.0.gz"), "wb") as g:
        pickle.dump({1, 2, Evil()}, g)
    fs.put(buf.d + "/", f"{BUCKET}/evil-set/replay_logs/", recursive=True)
    with gzip.open(os.path.join(buf.d, "episode_end_indices_ckpt.0.gz"), "wb") as g:
        pickle.dump({1, 2}, g)
    with gzip.open(os.path.join(buf.d, "$store$_terminal_ckpt.0.gz"), "wb") as g:  # an object array
        np.save(g, np.array([Evil()] * 120, dtype=object), allow_pickle=True)
    fs.put(buf.d + "/", f"{BUCKET}/evil-npy/replay_logs/", recursive=True)
    with pytest.raises(DatasetError, match="refusing"):
        import_dataset(f"s3://{BUCKET}/evil-set/replay_logs", tmp_path / "s", storage_options=options, progress=False)
    with pytest.raises(DatasetError, match="unpickling"):
        import_dataset(f"s3://{BUCKET}/evil-npy/replay_logs", tmp_path / "s", storage_options=options, progress=False)
    assert not marker.exists() and not (tmp_path / "s").exists()


def test_memory_urls_need_no_server(store, tmp_path):
    require("fsspec")
    res = export(store, "memory://mmreplay-test/d.zarr", progress=False)
    assert res.path.startswith("memory://") and res.path.endswith("mmreplay-test/d.zarr")
    with import_dataset("memory://mmreplay-test/d.zarr", tmp_path / "back", progress=False) as back, \
            mr.ReplayStore.open(store, mode="r") as orig:
        assert_same_rows(orig, back)


def test_a_missing_protocol_names_the_extra(tmp_path):
    with pytest.raises(ValueError, match="storage_options are for remote URLs"):
        import_dataset(tmp_path, tmp_path / "s", storage_options={"key": "x"}, progress=False)
    with pytest.raises(ImportError, match=r"mmreplay\[gcs\]"):
        import_dataset("gs://bucket/x.zarr", tmp_path / "s", progress=False) if not _installed("gcsfs") else \
            (_ for _ in ()).throw(ImportError("mmreplay[gcs] is installed here"))


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("array", ["observations", "rewards", "actions", "episodes/final_missing"])
def test_a_zarr_export_missing_one_object_on_s3_is_refused_not_read_as_zeros(s3, store, tmp_path, array):
    """An interrupted copy (one shard object lost) must not import as zeros."""
    options, fs = s3
    url = f"s3://{BUCKET}/lost-{array.replace('/', '-')}/d.zarr"
    export(store, url, storage_options=options, progress=False, shard_bytes=4096)
    lost = sorted(p for p in fs.find(f"{BUCKET}/lost-{array.replace('/', '-')}/d.zarr/{array}/c/"))[-1]
    fs.rm(lost)
    with pytest.raises(DatasetError, match=f"array '{array}' lacks 1 of its"):
        import_dataset(url, tmp_path / "back", storage_options=options, progress=False)
    assert not (tmp_path / "back").exists()
