"""Compressed sealed chunks: rows bit-identical to a raw store's everywhere, files kept and dropped by the
commit rule, damage reported by verify and raised on read, a full disk during compression."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from mmreplay.storage import framefile
from mmreplay.storage.vmem import memory_budget
from tests._support import internals
from tests._support.compression import (
    assert_batches_equal,
    assert_same_rows,
    atari_npz,
    compressed_chunk,
    drive,
    flip,
    pair,
)


def test_auto_compresses_image_observations_only(tmp_path):
    cases = [((84, 84), "uint8", None, "lz4"), ((4, 4, 3), "uint8", None, "lz4"), ((6,), "uint8", None, None),
             ((4, 4), "float32", None, None), ((4, 4), "float32", "lz4", "lz4"), ((84, 84), "uint8", "none", None)]
    for i, (shape, dtype, given_, want) in enumerate(cases):
        kw = {} if given_ is None else {"compression": None if given_ == "none" else given_}
        with mr.ReplayStore.create(tmp_path / str(i), capacity=10, obs_shape=shape, obs_dtype=dtype, **kw) as s:
            assert s.compression == want
        with open(tmp_path / str(i) / "manifest.json") as f:
            doc = json.load(f)
        assert doc["schema"]["compression"] == want
        assert doc["format_version"] == (2 if want else 1)  # raw stores stay readable by older versions
        with mr.ReplayStore.open(tmp_path / str(i), mode="r") as s:
            assert s.compression == want
    for bad in ("zstd", 1, "LZ4"):
        with pytest.raises(ValueError, match="compression: expected 'auto', None or one of"):
            mr.ReplayStore.create(tmp_path / "bad", capacity=10, obs_shape=(4, 4), compression=bad)


@given(st.integers(0, 10**6), st.sampled_from([1, 3]), st.booleans(), st.sampled_from(["zeros", "first"]),
       st.sampled_from([8, 16]), st.integers(30, 160))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_rows_are_bit_identical_to_a_raw_store(tmp_path_factory, seed, num_envs, prioritized, pad, chunk, steps):
    tmp = tmp_path_factory.mktemp("pair")
    kw = dict(capacity=40, obs_shape=(5, 6), stack=3, n_step=2, gamma=0.9, pad=pad, chunk_size=chunk * num_envs,
              num_envs=num_envs, seed=seed, prioritized=mr.Prioritized() if prioritized else None)
    c, r = pair(tmp, **kw)
    drive([c, r], steps, seed, num_envs)
    if prioritized and len(r):
        b = r.sample(8)
        assert_batches_equal(c.sample(8), b)  # (and both RNGs move on alike)
        p = np.arange(8) + 0.5
        c.update_priorities(b.index, p)
        r.update_priorities(b.index, p)
    assert_same_rows(c, r, seed)  # some chunks compressed, the newest sealed ones perhaps not yet
    c.commit()  # waits for every seal: every sealed chunk is compressed now (or kept raw: mostly noise)
    with open(tmp / "lz4" / "manifest.json") as f:
        sealed = [e for e in json.load(f)["chunks"] if e["sealed"]]
    assert all(e.get("frames") or e["crc32"]["obs"] is not None for e in sealed)
    compressed = c.inspect()["compressed_chunks"]
    assert len(compressed) == sum(1 for e in sealed if e.get("frames"))
    assert compressed or len(sealed) < 3
    assert_same_rows(c, r, seed)
    c.close()
    r.close()
    with mr.ReplayStore.open(tmp / "lz4") as c, mr.ReplayStore.open(tmp / "raw") as r:
        assert_same_rows(c, r, seed)  # reopened: compressed chunks now mapped from their files
        drive([c, r], 40, seed + 7, num_envs)  # and writing goes on
        assert_same_rows(c, r, seed)
    assert mr.verify_store(str(tmp / "lz4")) == []


def test_real_atari_frames(tmp_path):
    d = atari_npz("breakout")
    frames, starts = d["frames"][:4000], d["episode_starts"]
    kw = dict(capacity=2500, obs_shape=(84, 84), stack=4, n_step=3, chunk_size=512, action_dtype="int32", seed=3)
    c, r = pair(tmp_path, **kw)
    step = 0
    for e, start in enumerate(starts):
        end = min(starts[e + 1] if e + 1 < len(starts) else len(frames), len(frames))
        if end - start < 2:
            break
        for s in (c, r):
            s.reset(frames[start])
        for t in range(start + 1, end):
            for s in (c, r):
                s.step(int(d["actions"][step]), float(d["rewards"][step]), frames[t],
                       bool(d["terminated"][step]), bool(d["truncated"][step]))
            step += 1
    assert c.id_range[0] > 0  # the ring wrapped
    assert_same_rows(c, r)
    c.close()
    r.close()
    size = {name: sum(os.path.getsize(os.path.join(tmp_path, name, "chunks", f))
                      for f in os.listdir(os.path.join(tmp_path, name, "chunks")) if ".obs." in f)
            for name in ("lz4", "raw")}
    assert size["lz4"] * 4 < size["raw"]  # breakout frames shrink ~17x; the open chunk stays raw
    assert mr.verify_store(str(tmp_path / "lz4")) == []


def _files(path) -> set[str]:  # noqa: ANN001
    return set(os.listdir(os.path.join(path, "chunks")))


def test_raw_frame_files_go_when_no_commit_lists_them(tmp_path):
    path = tmp_path / "s"
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(8, 8), chunk_size=16, seed=0)
    drive([s], 40, 0, ends=0)  # chunks 0 and 1 sealed, 2 open; none committed yet
    s.inspect()  # finishes the background seals
    files = _files(path)
    assert {"000000000000.obs.lz4", "000000000001.obs.lz4", "000000000002.obs.npy"} <= files
    assert "000000000000.obs.npy" not in files and "000000000001.obs.npy" not in files
    s.commit()  # lists chunk 2 open: its raw frames
    with mr.ReplayStore.open(path, mode="r", seed=1) as reader:
        before = reader.gather(reader.sampleable_ids())
        drive([s], 20, 1, ends=0, reset=False)  # chunk 2 seals and is compressed; the commit lists it raw
        s.inspect()  # finishes the background seals
        assert {"000000000002.obs.lz4", "000000000002.obs.npy"} <= _files(path)
        s.commit()  # lists chunk 2 compressed: its raw file goes
        assert "000000000002.obs.npy" not in _files(path)
        assert_batches_equal(reader.gather(before.index), before)  # the reader keeps its mapping
        assert reader.refresh()
        assert_batches_equal(reader.gather(before.index), before)  # now read from the compressed file
        assert 2 in reader.inspect()["compressed_chunks"]
    s.close()


def test_reader_of_an_old_commit_retries_when_raw_frames_vanished(tmp_path, monkeypatch):
    path = tmp_path / "s"
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(8, 8), chunk_size=16, seed=0)
    drive([s], 20, 0, ends=0)
    s.commit()  # chunk 1 open, raw
    old = json.loads((path / "manifest.json").read_text())
    drive([s], 20, 1, ends=0)
    s.commit()  # chunk 1 compressed; its raw frame file deleted
    calls = []
    real = mr.store.read_manifest

    def stale_first(p, *a, **kw):  # noqa: ANN001, ANN202
        calls.append(p)
        doc = real(p, *a, **kw)
        return _without_checksum(old) if len(calls) <= 2 else doc

    monkeypatch.setattr(mr.store, "read_manifest", stale_first)
    monkeypatch.setattr(mr.core.durability, "read_manifest", stale_first)  # the readers' retry loop
    with mr.ReplayStore.open(path, mode="r") as r:
        assert r.generation == s.generation and len(calls) > 2  # the stale commit failed, the newer one opened
    s.close()


def _without_checksum(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "checksum"}


def test_snapshots_link_compressed_files(tmp_path):
    c, r = pair(tmp_path, capacity=60, obs_shape=(6, 6), stack=2, n_step=2, chunk_size=16, seed=5)
    drive([c, r], 100, 5)
    snap_c, snap_r = c.save(tmp_path / "snap-c"), r.save(tmp_path / "snap-r")
    lz4_files = [f for f in _files(snap_c) if f.endswith(".obs.lz4")]
    assert lz4_files and not [f for f in _files(snap_c) if f.endswith(".obs.npy") and "g" not in f]
    for f in lz4_files:  # hard links, not copies
        assert os.path.samefile(os.path.join(snap_c, "chunks", f), os.path.join(c.path, "chunks", f))
    drive([c, r], 30, 6)
    c.close()
    r.close()
    with mr.ReplayStore.load(snap_c, tmp_path / "lc") as lc, mr.ReplayStore.load(snap_r, tmp_path / "lr") as lr:
        assert lc.compression == "lz4"
        assert_same_rows(lc, lr)
    assert mr.verify_store(snap_c) == []


@pytest.fixture
def damaged_base(tmp_path):  # noqa: ANN201
    path = tmp_path / "s"
    with mr.ReplayStore.create(path, capacity=200, obs_shape=(8, 8), stack=2, n_step=2, chunk_size=32,
                               seed=0) as s:
        drive([s], 150, 2, ends=0.02)
        rows = s.gather(s.sampleable_ids())
    return str(path), rows


@pytest.mark.parametrize("where", ["entry", "record", "trailer"])
def test_flipped_byte_is_reported_and_never_read_as_a_frame(damaged_base, where):
    path, rows = damaged_base
    entry, target = compressed_chunk(path)
    buf = framefile.read_file(target)
    records = framefile.read_records(target, buf, 32)
    compressed = int(np.flatnonzero((records["length"] < 64) & (records["length"] > 8))[0])  # an LZ4 block
    offset = {"entry": int(records[compressed]["offset"]) + 6,
              "record": 16 * compressed + int.from_bytes(buf[8:12].tobytes(), "little") + 1,
              "trailer": buf.size - 2}[where]
    flip(target, offset)
    problems = mr.verify_store(path)
    assert problems and all(target in p for p in problems), problems
    with mr.ReplayStore.open(path, mode="r") as s:
        if where == "trailer":  # no frame is damaged: rows are still right
            assert_batches_equal(s.gather(rows.index), rows)
            return
        with pytest.raises(mr.CorruptStoreError, match=f"{target}: frame {compressed} is damaged"):
            s.gather(rows.index)
        ok = 0
        for i in rows.index:  # rows not using the damaged frame are served, and right
            try:
                b = s.gather(np.array([i]))
            except mr.CorruptStoreError:
                continue
            j = int(np.flatnonzero(rows.index == i)[0])
            assert np.array_equal(b.obs[0], rows.obs[j]) and np.array_equal(b.next_obs[0], rows.next_obs[j])
            ok += 1
        assert 0 < ok < len(rows.index)


@pytest.mark.parametrize("damage", ["truncate", "header", "missing"])
def test_unusable_compressed_file_refuses_open_naming_it(damaged_base, damage):
    path, _ = damaged_base
    _, target = compressed_chunk(path)
    if damage == "truncate":
        os.chmod(target, 0o644)
        os.truncate(target, os.path.getsize(target) - 100)
        match = "truncated"
    elif damage == "header":
        flip(target, 20)
        match = "header"
    else:
        os.unlink(target)
        match = "missing"
    with pytest.raises(mr.CorruptStoreError, match=match) as info:
        mr.ReplayStore.open(path, mode="r")
    assert target in str(info.value)
    problems = mr.verify_store(path)
    assert any(target in p for p in problems), problems


def test_full_disk_while_compressing_turns_the_store_read_only(tmp_path, monkeypatch):
    path = tmp_path / "s"
    s = mr.ReplayStore.create(path, capacity=200, obs_shape=(8, 8), stack=2, chunk_size=16, seed=0)
    drive([s], 40, 0, ends=0)
    s.commit()
    committed = s.id_range

    def full(fd, data):  # noqa: ANN001, ANN202
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(framefile, "_write_all", full)
    with pytest.raises(mr.StoreIOError, match="No space left.*read-only"):
        drive([s], 100, 1, ends=0)
    monkeypatch.undo()
    assert s.sample(4).obs.shape == (4, 2, 8, 8)  # sampling still works
    with pytest.raises(mr.ReadOnlyStoreError):
        s.commit()
    s.close()
    assert not [f for f in _files(path) if f.endswith(".tmp")]
    with mr.ReplayStore.open(path) as again:
        assert again.id_range == committed
        drive([again], 40, 3, ends=0)
    assert mr.verify_store(str(path)) == []


def test_exports_and_imports_are_the_same_as_a_raw_stores(tmp_path):
    c, r = pair(tmp_path, capacity=300, obs_shape=(6, 6), stack=2, n_step=2, chunk_size=32, seed=1)
    drive([c, r], 400, 4, ends=0.03)
    c.close()
    r.close()
    zarr = pytest.importorskip("zarr")
    outs = {}
    for name in ("lz4", "raw"):
        mr.export(str(tmp_path / name), str(tmp_path / f"{name}.zarr"), format="zarr")
        g = zarr.open_group(str(tmp_path / f"{name}.zarr"), mode="r")
        outs[name] = {k: g[k][:] for k in g.array_keys()}
    assert outs["lz4"].keys() == outs["raw"].keys()
    for k in outs["raw"]:
        assert np.array_equal(outs["lz4"][k], outs["raw"][k]), k
    with mr.import_dataset(str(tmp_path / "raw.zarr"), str(tmp_path / "back"), format="zarr", chunk_size=32,
                           progress=False) as back:
        assert back.compression == "lz4"  # imports go through create(): image frames are compressed
        assert any(f.endswith(".obs.lz4") for f in _files(back.path))


def test_cold_reads_request_compressed_ranges_and_read_ahead(tmp_path, monkeypatch):
    c, r = pair(tmp_path, capacity=300, obs_shape=(8, 8), stack=4, n_step=3, chunk_size=32, seed=2)
    drive([c, r], 400, 9)
    c.close()
    r.close()
    for root, _, files in os.walk(tmp_path / "lz4"):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    from mmreplay.reading.reader import FrameReader

    monkeypatch.setattr(FrameReader, "COLD_FAULTS", 0)  # every batch looks cold
    with mr.ReplayStore.open(tmp_path / "lz4", mode="r") as c, mr.ReplayStore.open(tmp_path / "raw", mode="r") as r:
        for reader in (internals.reader(c), internals.reader(r)):
            assert reader.read_ahead == "auto"
        assert_same_rows(c, r)  # batches after the first go through read_ahead_slots() of compressed ranges
        cold_batches, read_ahead_started = internals.read_ahead(c)
        assert cold_batches > 0 and read_ahead_started
        internals.reader(c).read_ahead = True
        assert_same_rows(c, r)
    assert memory_budget() > 0


def test_a_chunk_that_fails_to_compress_stays_raw_and_durable(tmp_path, monkeypatch, caplog):
    from mmreplay.storage.ring import ChunkRing

    c, r = pair(tmp_path, capacity=300, obs_shape=(6, 6), stack=2, n_step=2, chunk_size=16, seed=4)
    drive([c, r], 20, 5, ends=0)
    real = ChunkRing.compress_chunk

    def broken(self, seq):  # noqa: ANN001, ANN202
        if seq == 1:
            raise RuntimeError("an encoder bug")
        return real(self, seq)

    monkeypatch.setattr(ChunkRing, "compress_chunk", broken)
    drive([c, r], 60, 6, ends=0, reset=False)
    c.commit()
    assert "an encoder bug" in caplog.text
    with open(tmp_path / "lz4" / "manifest.json") as f:
        chunks = {e["seq"]: e for e in json.load(f)["chunks"]}
    assert "frames" not in chunks[1] and chunks[1]["crc32"]["obs"] is not None  # raw, checksummed
    assert "frames" in chunks[2]
    assert_same_rows(c, r)
    c.close()
    r.close()
    assert mr.verify_store(str(tmp_path / "lz4")) == []
    with mr.ReplayStore.open(tmp_path / "lz4", mode="r") as c, mr.ReplayStore.open(tmp_path / "raw") as r:
        assert_same_rows(c, r)


def test_format_md_snippet_reads_a_compressed_frame(tmp_path):
    """The numpy + numcodecs snippet of FORMAT.md decodes frames as the store serves them."""
    import re

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "FORMAT.md")) as f:
        code = next(b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if "def read_frame" in b)
    ns: dict = {}
    exec(code, ns)
    with mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(7, 9), chunk_size=16, seed=0) as s:
        drive([s], 40, 3, ends=0)
        s.commit()
        entry, path = compressed_chunk(str(tmp_path / "s"))
        frames = s.episode_frames(s.episodes(), 0)  # one episode from row 0: frame t is row t
    for i in range(16):
        assert np.array_equal(ns["read_frame"](path, i), frames[16 * int(entry["seq"]) + i])


def test_chunks_whose_frames_do_not_shrink_stay_raw(tmp_path):
    c, r = pair(tmp_path, capacity=300, obs_shape=(8, 8), stack=2, n_step=2, chunk_size=16, seed=1)
    rng = np.random.default_rng(0)
    for s in (c, r):
        s.reset(np.zeros((8, 8), np.uint8))
    for t in range(100):
        # noise for the first 40 steps (chunks 0-2), then flat frames
        frame = rng.integers(0, 256, (8, 8), dtype=np.uint8) if t < 40 else np.full((8, 8), t, np.uint8)
        for s in (c, r):
            s.step(t % 3, 1.0, frame, False, False)
    c.commit()
    with open(tmp_path / "lz4" / "manifest.json") as f:
        entries = json.load(f)["chunks"]
    kinds = ["frames" in e for e in entries if e["sealed"]]
    assert kinds[:2] == [False, False] and kinds[-1]  # noise stays raw, flat frames are compressed
    assert all(e["crc32"]["obs"] is not None for e in entries if e["sealed"] and "frames" not in e)
    assert_same_rows(c, r)
    c.close()
    r.close()
    assert mr.verify_store(str(tmp_path / "lz4")) == []


def test_the_numcodecs_reference_path_reads_the_same_rows(tmp_path):
    """Without numba the reader decodes with numcodecs frame by frame: the same rows, the same errors."""
    c, r = pair(tmp_path, capacity=200, obs_shape=(8, 8), stack=3, n_step=2, chunk_size=16, seed=3)
    drive([c, r], 150, 8)
    c.commit()
    internals.read_without_numba(c)
    assert c.inspect()["compressed_chunks"]
    assert_same_rows(c, r)
    c.close()
    r.close()


@pytest.mark.parametrize("compression", ["lz4", None])
def test_a_commit_makes_every_sealed_file_it_names_durable(tmp_path, monkeypatch, compression):
    """Seals do not fsync (the sealer never waits for the disk): the commit does, for every file of a
    sealed chunk its manifest names, and once for the chunks directory (the files' names)."""
    from mmreplay.storage import files, ring

    synced: list[str] = []
    real = files.fsync_file
    monkeypatch.setattr(ring, "fsync_file", lambda p: (synced.append(os.path.realpath(p)), real(p))[1])
    path = tmp_path / "s"
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(8, 8), chunk_size=16, seed=0, compression=compression)
    drive([s], 40, 0, ends=0)  # chunks 0 and 1 sealed, 2 open
    synced.clear()
    s.commit()
    sealed = [c["name"] for c in json.loads((path / "manifest.json").read_text())["chunks"] if c.get("sealed")]
    assert sealed == ["000000000000", "000000000001"]
    for name in sealed:
        named = sorted(f for f in os.listdir(path / "chunks") if f.startswith(name + "."))
        # action, reward, flags and the frames (raw, or compressed: the raw file went)
        assert len(named) == 4 and (compression is None) == (name + ".obs.npy" in named), named
        for f in named:
            assert os.path.realpath(path / "chunks" / f) in synced, (f, synced)
    assert synced.count(os.path.realpath(path / "chunks")) == 1
    s.close()
