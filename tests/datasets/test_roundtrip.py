"""Store -> dataset -> store on the real Atari episodes: every row identical (zarr, Minari; D4RL where the
layout can say it), and every export read back with the plain libraries (zarr, h5py, minari)."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

import mmreplay as mr
from mmreplay.datasets import describe, export, import_dataset
from tests._support.atari_data import episodes
from tests._support.helpers import FIELDS, require

GAMES = ("pong", "breakout")


def _log_prob(t: int) -> np.float32:
    return np.float32(-0.01 * (t % 97))


@pytest.fixture(scope="module")
def atari(tmp_path_factory):
    """A committed store of real Atari episodes (stack 4, 3-step returns, one extra), nothing evicted."""
    path = str(tmp_path_factory.mktemp("atari") / "store")
    eps = [e for g in GAMES for e in episodes(g)]
    total = sum(len(e.actions) for e in eps)
    store = mr.ReplayStore.create(path, capacity=total, obs_shape=(84, 84), stack=4, n_step=3, gamma=0.99,
                                  action_dtype="int32", extras={"log_prob": ((), "float32")}, chunk_size=4096,
                                  metadata={"env_id": "ALE/mixed"})
    for e in eps:
        store.reset(e.frames[0])
        for t in range(len(e.actions)):
            store.step(e.actions[t], float(e.rewards[t]), e.frames[t + 1], bool(e.terminated[t]),
                       bool(e.truncated[t]), log_prob=_log_prob(t))
    store.close()
    return path


def assert_rows_equal(a: mr.Batch, b: mr.Batch, skip: tuple[str, ...] = ()) -> None:
    for name in FIELDS:
        if name not in skip:
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
            assert getattr(a, name).dtype == getattr(b, name).dtype, name
    assert a.extras.keys() == b.extras.keys()
    for name in a.extras:
        assert np.array_equal(a.extras[name], b.extras[name]), name


def all_rows(store: mr.ReplayStore) -> mr.Batch:
    """Every sampleable row, in id order (one unshuffled epoch)."""
    parts = list(store.iter_batches(4096, shuffle=False))
    cat = {name: np.concatenate([getattr(b, name) for b in parts]) for name in (*FIELDS, "weight")}
    extras = {k: np.concatenate([b.extras[k] for b in parts]) for k in parts[0].extras}
    out = mr.Batch(**cat, extras=extras)
    assert np.all(np.diff(out.index) > 0) and len(out) == len(store)
    return out


def test_zarr_round_trip_is_exact_and_plain_zarr_reads_it(atari, tmp_path):
    import zarr

    res = export(atari, tmp_path / "d.zarr", progress=False)
    with mr.ReplayStore.open(atari, mode="r") as orig:
        t = orig.episodes()
        assert res.episodes == len(t) and res.skipped == 0 and res.steps == orig.id_range[1]
        # plain zarr, no mmreplay
        g = zarr.open_group(str(tmp_path / "d.zarr"), mode="r")
        assert g.attrs["format"] == "mmreplay-dataset" and g.attrs["format_version"] == 1
        assert (g.attrs["stack"], g.attrs["n_step"], g.attrs["pad"], g.attrs["gamma"]) == (4, 3, "zeros", 0.99)
        assert g.attrs["metadata"] == {"env_id": "ALE/mixed"}
        obs, ep = g["observations"], g["episodes"]
        assert obs.shape == (res.frames, 84, 84) and obs.dtype == np.uint8
        assert obs.chunks == (32, 84, 84) and obs.shards is not None
        starts, sstarts, lengths = ep["obs_start"][:], ep["step_start"][:], ep["length"][:]
        assert lengths.tolist() == t.length.tolist()
        for i in range(len(t)):
            n = int(lengths[i])
            assert np.array_equal(obs[starts[i]:starts[i] + n + 1], orig.episode_frames(t, i))
            st = orig.episode_steps(t, i)
            sl = slice(int(sstarts[i]), int(sstarts[i]) + n)
            assert np.array_equal(g["actions"][sl], st.actions)
            assert np.array_equal(g["rewards"][sl], st.rewards)
            assert np.array_equal(g["terminations"][sl], st.terminated)
            assert np.array_equal(g["truncations"][sl], st.truncated)
            assert np.array_equal(g["extras/log_prob"][sl], st.extras["log_prob"])
        assert np.allclose(ep["return"][:], t.returns)
        files = sum(len(f) for _, _, f in os.walk(tmp_path / "d.zarr"))
        assert files < 40  # sharded: a handful of files, not one per chunk
        root = json.load(open(tmp_path / "d.zarr" / "zarr.json"))
        assert "consolidated_metadata" in root
        # back into a store: every row identical, ids from 0
        with import_dataset(tmp_path / "d.zarr", tmp_path / "back", progress=False) as back:
            assert back.id_range == orig.id_range and len(back) == len(orig)
            assert back.schema.stack == 4 and back.schema.n_step == 3 and back.schema.action_dtype == np.int32
            assert back.metadata["env_id"] == "ALE/mixed" and back.metadata["source"]["format"] == "zarr"
            assert_rows_equal(all_rows(orig), all_rows(back))
    assert any("episodes" in line for line in describe(tmp_path / "d.zarr"))


def test_minari_round_trip_and_minari_reads_it(atari, tmp_path, monkeypatch):
    res = export(atari, tmp_path / "root", format="minari", dataset_id="mmreplay/atari/mixed-v0", progress=False)
    data = tmp_path / "root" / "mmreplay" / "atari" / "mixed-v0" / "data"
    meta = json.load(open(data / "metadata.json"))
    assert meta["jpeg_encoding"] is False and meta["minari_version"] == "0.5.4"
    assert meta["total_episodes"] == res.episodes and meta["total_steps"] == res.steps
    # no action space recorded in the store: inferred from the actions (Pong's and Breakout's minimal sets)
    assert json.loads(meta["action_space"]) == {"type": "Discrete", "dtype": "int64", "start": 0, "n": 6}
    assert res.extra["action_space_inferred"] and meta["mmreplay"]["action_space_inferred"]
    with mr.ReplayStore.open(atari, mode="r") as orig, h5py.File(data / "main_data.hdf5", "r") as f:
        t = orig.episodes()
        assert len(f) == len(t) and f["episode_1"].attrs["total_steps"] == t.length[1]
        assert np.array_equal(f["episode_1/observations"][()], orig.episode_frames(t, 1))  # plain h5py: raw frames
        with import_dataset(data.parent, tmp_path / "back", progress=False) as back:
            assert back.id_range == orig.id_range
            assert_rows_equal(all_rows(orig), all_rows(back))
        with import_dataset(tmp_path / "root", tmp_path / "back2", format="minari",
                            dataset_id="mmreplay/atari/mixed-v0", progress=False) as back2:
            assert len(back2) == len(orig)
        minari = require("minari")
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "root"))
        ds = minari.load_dataset("mmreplay/atari/mixed-v0")
        assert ds.total_episodes == len(t) and ds.total_steps == res.steps
        assert "mmreplay/atari/mixed-v0" in minari.list_local_datasets()
        for i, ep in enumerate(ds.iterate_episodes()):
            st = orig.episode_steps(t, i)
            assert np.array_equal(ep.observations, orig.episode_frames(t, i))  # lossless frames
            assert np.array_equal(ep.actions, st.actions)
            assert np.array_equal(ep.rewards, st.rewards)
            assert np.array_equal(ep.terminations, st.terminated)
            assert np.array_equal(ep.truncations, st.truncated)
            assert np.array_equal(ep.infos["log_prob"][1:], st.extras["log_prob"])


@pytest.mark.parametrize("next_obs", [False, True])
def test_d4rl_round_trip_and_h5py_reads_it(atari, tmp_path, next_obs):
    out = tmp_path / "d.hdf5"
    res = export(atari, out, format="hdf5", next_observations=next_obs, progress=False)
    with mr.ReplayStore.open(atari, mode="r") as orig:
        t = orig.episodes()
        with h5py.File(out, "r") as f:
            for key in ("observations", "actions", "rewards", "terminals", "timeouts"):
                assert f[key].shape[0] == res.steps
            assert ("next_observations" in f) == next_obs and f["observations"].compression == "gzip"
            assert (f.attrs["stack"], f.attrs["pad"]) == (4, "zeros")
            assert int(f["terminals"][()].sum()) == int(t.terminated.sum())
            assert int(f["timeouts"][()].sum()) == int(t.truncated.sum())
            row = 0
            for i in range(len(t)):
                frames, n = orig.episode_frames(t, i), int(t.length[i])
                assert np.array_equal(f["observations"][row:row + n], frames[:-1])
                if next_obs:
                    assert np.array_equal(f["next_observations"][row:row + n], frames[1:])
                assert np.array_equal(f["infos/log_prob"][row:row + n], orig.episode_steps(t, i).extras["log_prob"])
                row += n
        with import_dataset(out, tmp_path / "back", progress=False) as back:
            a, b = all_rows(orig), all_rows(back)
            if next_obs:
                assert_rows_equal(a, b)
                return
            # Without next_observations the final observations are unknown: a terminated window gets a
            # zero next_obs (its discount is 0 either way), and rows bootstrapping from the final frame
            # of a truncated episode are not sampleable. Everything else is identical.
            lost = set(a.index.tolist()) - set(b.index.tolist())
            assert len(lost) == 3 * int(t.truncated.sum()) and not set(b.index.tolist()) - set(a.index.tolist())
            keep = np.isin(a.index, b.index)
            a = orig.gather(a.index[keep])
            assert_rows_equal(a, b, skip=("next_obs",))
            same = np.all(a.next_obs == b.next_obs, axis=(1, 2, 3))
            assert np.array_equal(~same, a.terminated)
            assert not b.next_obs[b.terminated].any()


def test_exports_skip_partial_and_running_episodes(tmp_path):
    rng = np.random.default_rng(0)
    s = mr.ReplayStore.create(tmp_path / "s", capacity=300, obs_shape=(3,), obs_dtype="float32", stack=3, n_step=2,
                              pad="first", chunk_size=128)
    lengths = []
    for _ in range(12):
        n = int(rng.integers(20, 60))
        s.reset(rng.random(3, dtype=np.float32))
        for t in range(n):
            s.step(int(rng.integers(0, 4)), float(rng.random()), rng.random(3, dtype=np.float32), t == n - 1, False)
        lengths.append(n)
    s.reset(rng.random(3, dtype=np.float32))
    for _ in range(5):
        s.step(1, 0.5, rng.random(3, dtype=np.float32), False, False)  # still running
    s.commit()
    t = s.episodes()
    assert not t.start_retained[0]  # the oldest episode's start was retired from the ring
    for fmt, out, kw in (("zarr", "d.zarr", {}), ("hdf5", "d.hdf5", {"next_observations": True}),
                         ("minari", "root", {"dataset_id": "t/partial-v1"})):
        res = export(s, tmp_path / out, format=fmt, progress=False, **kw)
        assert (res.skipped_partial, res.skipped_running, res.skipped_empty) == (1, 1, 0)
        assert res.episodes == int(t.complete.sum()) == len(t) - 2
        src = tmp_path / out / "t/partial-v1" if fmt == "minari" else tmp_path / out
        with import_dataset(src, tmp_path / f"back-{fmt}", progress=False) as back:
            bt = back.episodes()
            assert bt.length.tolist() == t.length[t.complete].tolist()
            assert back.schema.pad == "first" and back.schema.obs_dtype == np.float32
            for j, i in enumerate(np.flatnonzero(t.complete)):
                assert np.array_equal(back.episode_frames(bt, j), s.episode_frames(t, int(i)))
            ids = np.arange(*back.id_range)
            first = int(t.first_id[t.complete][0])
            assert_rows_equal(back.gather(ids[:50]), s.gather(ids[:50] + first), skip=("index",))
    s.close()


def test_export_of_a_live_store_is_its_last_commit(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=1000, obs_shape=(2,), obs_dtype="int32")
    for e in range(3):
        s.reset(np.array([e, 0], np.int32))
        for t in range(10):
            s.step(0, 1.0, np.array([e, t + 1], np.int32), t == 9, False)
    s.commit()
    gen = s.generation
    s.reset(np.array([9, 0], np.int32))
    for t in range(10):
        s.step(0, 1.0, np.array([9, t + 1], np.int32), t == 9, False)  # a fourth episode, not committed
    res = export(s, tmp_path / "d.zarr", progress=False)
    assert res.episodes == 3 and s.generation == gen  # the writer was not committed by the export
    s.commit()
    assert export(s, tmp_path / "d2.zarr", progress=False).episodes == 4
    s.close()


def test_failed_or_refused_export_leaves_nothing(atari, tmp_path, monkeypatch):
    import mmreplay.datasets.zarr_format as zf

    def boom(*a, **k):
        yield np.zeros((1, 84, 84), np.uint8)
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(zf, "frame_pieces", boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        export(atari, tmp_path / "d.zarr", progress=False)
    assert os.listdir(tmp_path) == []  # no output, no temporary directory
    monkeypatch.undo()
    export(atari, tmp_path / "d.zarr", progress=False)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export(atari, tmp_path / "d.zarr", progress=False)
    res = export(atari, tmp_path / "d.zarr", overwrite=True, compression=None, progress=False)
    assert res.extra["compression"] == "none" and sorted(os.listdir(tmp_path)) == ["d.zarr"]


@pytest.mark.parametrize("compression", ["blosc-lz4", "gzip"])
def test_zarr_compressions_read_back(tmp_path, compression):
    import zarr

    s = mr.ReplayStore.create(tmp_path / "s", capacity=500, obs_shape=(4, 4), obs_dtype="uint16",
                              action_shape=(2,), action_dtype="float32")
    rng = np.random.default_rng(1)
    for _ in range(4):
        s.reset(rng.integers(0, 999, (4, 4), dtype=np.uint16))
        for t in range(77):
            s.step(rng.random(2, dtype=np.float32), 1.0, rng.integers(0, 999, (4, 4), dtype=np.uint16), t == 76, False)
    s.commit()
    export(s, tmp_path / "d.zarr", compression=compression, chunk_frames=8, chunk_steps=16, shard_bytes=512,
           progress=False)
    g = zarr.open_group(str(tmp_path / "d.zarr"), mode="r")
    t = s.episodes()
    assert np.array_equal(g["observations"][:], np.concatenate([s.episode_frames(t, i) for i in range(len(t))]))
    assert np.array_equal(g["actions"][:], np.concatenate([s.episode_steps(t, i).actions for i in range(len(t))]))
    assert g["observations"].shards[0] > g["observations"].chunks[0]
    s.close()


def test_zarr_written_by_other_tools_imports(tmp_path):
    """The importer reads the format through zarr when the layout is not the one export_zarr writes
    (here: rewritten by plain zarr without shards, other chunks); a damaged shard index is an error."""
    import zarr

    s = mr.ReplayStore.create(tmp_path / "s", capacity=400, obs_shape=(5,), obs_dtype="int16", stack=2)
    rng = np.random.default_rng(2)
    for _ in range(5):
        s.reset(rng.integers(0, 99, 5, dtype=np.int16))
        for t in range(50):
            s.step(int(rng.integers(0, 3)), 1.0, rng.integers(0, 99, 5, dtype=np.int16), t == 49, False)
    s.commit()
    export(s, tmp_path / "d.zarr", progress=False, chunk_frames=8, shard_bytes=256)
    src = zarr.open_group(str(tmp_path / "d.zarr"), mode="r")
    dst = zarr.open_group(str(tmp_path / "plain.zarr"), mode="w")
    dst.attrs.update(dict(src.attrs))

    def copy(group_src, group_dst):
        for name, a in group_src.arrays():
            group_dst.create_array(name, data=a[:], chunks=(7,) + a.shape[1:])
        for name, sub in group_src.groups():
            copy(sub, group_dst.create_group(name))

    copy(src, dst)
    with import_dataset(tmp_path / "plain.zarr", tmp_path / "b1", progress=False) as b1, \
            import_dataset(tmp_path / "d.zarr", tmp_path / "b2", progress=False) as b2:
        assert_rows_equal(all_rows(b1), all_rows(b2))
        assert_rows_equal(all_rows(b1), all_rows(s))
    shard = tmp_path / "d.zarr" / "observations" / "c" / "1" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-6] ^= 0xFF  # inside the shard index
    shard.write_bytes(bytes(raw))
    with pytest.raises(mr.MMReplayError, match="checksum"):
        import_dataset(tmp_path / "d.zarr", tmp_path / "b3", progress=False)
    assert not (tmp_path / "b3").exists()
    s.close()


def test_a_store_without_complete_episodes_exports_empty_datasets(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=50, obs_shape=(2,), obs_dtype="float32")
    s.reset(np.zeros(2, np.float32))
    s.step(0, 1.0, np.ones(2, np.float32), False, False)  # running
    s.commit()
    for fmt, out, kw in (("zarr", "d.zarr", {}), ("hdf5", "d.hdf5", {}), ("minari", "root", {"dataset_id": "e/e-v0"})):
        res = export(s, tmp_path / out, format=fmt, progress=False, **kw)
        assert (res.episodes, res.steps, res.skipped_running) == (0, 0, 1)
        src = tmp_path / out / "e" / "e-v0" if fmt == "minari" else tmp_path / out
        assert "episodes    0" in describe(src)
        with import_dataset(src, tmp_path / f"b-{fmt}", progress=False) as b:
            assert b.id_range == (0, 0) and len(b.episodes()) == 0
    with import_dataset(tmp_path / "root", tmp_path / "b-id", dataset_id="e/e-v0", progress=False) as b:
        assert b.metadata["source"]["format"] == "minari"  # detected from dataset_id=
    s.close()
