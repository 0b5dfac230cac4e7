"""The open chunk's committed rows are covered by checksums (``prefix_crc32``) that ``verify()`` checks.

A byte flipped in any column file of the open chunk, in a row the last commit covers, is reported
naming the file and the stream; a flip in a row written after the last commit is not (those rows are
not part of the store). The checksums a commit records, extended commit after commit, equal the
checksums of the committed rows computed from scratch (``layout.stream_offsets``, the map verify used
before), through chunk rolls, reopening, snapshots and stores written before the checksums existed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from mmreplay.core.layout import home_extents, stream_offsets, stream_runs
from mmreplay.core.prefixcrc import stream_extents
from mmreplay.options import Schema, extent_rows
from tests._support.helpers import data_dir
from tests._support.hostile import forge

HEADER = 4096


def _doc(path) -> dict:
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)


def _open_entry(path) -> dict:
    entry = _doc(path)["chunks"][-1]
    assert not entry["sealed"]
    return entry


def _offsets(path, entry: dict) -> list[np.ndarray]:
    """Slot offsets (within the chunk) of each stream's rows in the chunk, from ``stream_offsets``."""
    schema = Schema.from_json(_doc(path)["schema"])
    rs, n = schema.rows_per_stream, schema.num_envs
    extents = entry.get("extents") or [home_extents(rs, s) for s in range(n)]
    return [stream_offsets(rs, extents[s], int(entry["rows"][s])) for s in range(n)]


def _file(path, entry: dict, column: str) -> str:
    return os.path.join(path, "chunks", f"{entry['name']}.{column}.npy")


def scratch_crc(path, entry: dict) -> dict[str, list[int]]:
    """The open chunk's checksums computed from its files alone: rows gathered by offset, in row order."""
    offsets = _offsets(path, entry)
    out = {}
    for column in entry["prefix_crc32"]:
        data = np.load(_file(path, entry, column), mmap_mode="r")
        out[column] = [zlib.crc32(np.ascontiguousarray(data[o]).tobytes()) for o in offsets]
    return out


def _flip(path, entry: dict, column: str, offset: int) -> None:
    """Flip one bit in the middle of the row at slot ``offset`` of a column file."""
    fpath = _file(path, entry, column)
    row_bytes = np.load(fpath, mmap_mode="r")[0].nbytes
    at = HEADER + offset * row_bytes + row_bytes // 2
    with open(fpath, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ 0x10]))


def _flips_are_reported(path) -> None:
    """Every column and stream of the open chunk: a flip in a committed row (the first, a middle one, the
    last) is reported naming the file and the stream; flipped back, the store verifies clean."""
    entry = _open_entry(path)
    assert entry["prefix_crc32"] == scratch_crc(path, entry)
    offsets = _offsets(path, entry)
    columns = list(entry["prefix_crc32"])
    for column in columns:
        for s, rows in enumerate(offsets):
            assert rows.size >= 3, "the open chunk should hold several committed rows of every stream"
            for i in (0, rows.size // 2, rows.size - 1):
                _flip(path, entry, column, int(rows[i]))
                want = f"{_file(path, entry, column)}: the committed rows of stream {s} in this open chunk"
                problems = mr.verify_store(path)
                assert any(p.startswith(want) and "differs from the recorded" in p for p in problems), problems
                _flip(path, entry, column, int(rows[i]))
    assert mr.verify_store(path) == []


def _vector_steps(s: mr.ReplayStore, rng: np.random.Generator, n: int, start: int = 0) -> None:
    k = s.num_envs
    for t in range(n):
        s.step(rng.integers(0, 4, k), rng.random(k), np.full((k, 5), (start + t) % 251, np.uint8),
               np.zeros(k, bool), np.zeros(k, bool), lp=rng.random(k).astype(np.float32))


def test_single_env_flips_in_every_column(tmp_path):
    path = str(tmp_path / "s")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(5,), stack=2, n_step=2, chunk_size=32,
                              extras={"lp": ((), "float32")})
    s.reset(np.zeros(5, np.uint8))
    for t in range(45):  # one sealed chunk, 13 rows in the open one
        s.step(t % 4, t / 7, np.full(5, t, np.uint8), t == 20, False, lp=np.float32(t))
        if t == 20:
            s.reset(np.ones(5, np.uint8))
    s.close()
    assert set(_open_entry(path)["prefix_crc32"]) == {"obs", "action", "reward", "flags", "x_lp"}
    _flips_are_reported(path)


def test_vector_flips_in_every_column(tmp_path):
    path = str(tmp_path / "v")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(5,), num_envs=2, chunk_size=32,
                              extras={"lp": ((), "float32")})
    s.reset(np.zeros((2, 5), np.uint8))
    _vector_steps(s, np.random.default_rng(0), 22)  # 23 rows per stream: a sealed chunk, 7 rows each open
    s.close()
    entry = _open_entry(path)
    assert set(entry["prefix_crc32"]) == {"obs", "action", "reward", "flags", "x_lp", "id"}
    assert all(len(v) == 2 for v in entry["prefix_crc32"].values())
    _flips_are_reported(path)


def test_streams_written_apart_flips_in_every_column(tmp_path):
    """extend()/reset(env=): stream 0 runs out of its home section and takes stream 1's free extents."""
    path = str(tmp_path / "x")
    s = mr.ReplayStore.create(path, capacity=200, obs_shape=(5,), num_envs=2, chunk_size=64,
                              extras={"lp": ((), "float32")})
    rng = np.random.default_rng(1)
    s.reset(np.zeros(5, np.uint8), env=1)
    s.reset(np.zeros(5, np.uint8), env=0)
    for n in (9, 7, 10, 11):  # stream 0: 38 rows, more than its home section of 32
        s.extend(rng.integers(0, 4, n), rng.random(n), np.full((n, 5), n, np.uint8), np.zeros(n, bool),
                 np.zeros(n, bool), env=0, lp=rng.random(n).astype(np.float32))
        s.commit()
    s.extend([1, 2, 3], [0.5, 0.5, 0.5], np.full((3, 5), 7, np.uint8), [False] * 3, [False] * 3, env=1,
             lp=np.zeros(3, np.float32))
    s.close()
    entry = _open_entry(path)
    assert entry.get("extents") and entry["rows"] == [38, 4], entry
    assert extent_rows(32) < 32  # several extents per home section: the runs cross extents
    _flips_are_reported(path)


def test_compressed_store_open_chunk(tmp_path):
    path = str(tmp_path / "c")
    s = mr.ReplayStore.create(path, capacity=200, obs_shape=(8, 8), chunk_size=32, compression="lz4")
    s.reset(np.zeros((8, 8), np.uint8))
    for t in range(40):
        s.step(0, 1.0, np.full((8, 8), t, np.uint8), False, False)
    s.close()
    doc = _doc(path)
    assert doc["chunks"][0]["sealed"] and "prefix_crc32" not in doc["chunks"][0]
    _flips_are_reported(path)


def test_rows_written_after_the_commit_are_not_checked(tmp_path):
    path = str(tmp_path / "s")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(5,), num_envs=2, chunk_size=32)
    rng = np.random.default_rng(2)
    s.reset(np.zeros((2, 5), np.uint8))
    _vector_steps_plain(s, rng, 20)
    s.commit()
    _vector_steps_plain(s, rng, 4)  # written, never committed
    s.close(commit=False)
    entry = _open_entry(path)
    rs = 16
    for column in entry["prefix_crc32"]:
        for stream in range(2):
            committed = int(entry["rows"][stream])
            _flip(path, entry, column, int(stream_offsets(rs, home_extents(rs, stream), committed + 2)[committed]))
    assert mr.verify_store(path) == []
    with mr.ReplayStore.open(path) as again:  # and the writer continues over those rows
        _vector_steps_plain(again, rng, 3)
    entry = _open_entry(path)
    assert entry["prefix_crc32"] == scratch_crc(path, entry)
    assert mr.verify_store(path) == []


def test_damage_before_a_reopen_is_refused_at_open(tmp_path):
    """open() recomputes the open chunk's checksums over the committed rows (it does not take in damage
    done meanwhile and carry it on): a flip in a committed row of any column is a CorruptStoreError at
    open, for writers and readers, naming the file and the stream; verify() reports it too."""
    path = str(tmp_path / "s")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(5,), num_envs=2, chunk_size=64,
                              extras={"lp": ((), "float32")})
    rng = np.random.default_rng(7)
    s.reset(np.zeros((2, 5), np.uint8))
    _vector_steps(s, rng, 5)
    s.close()
    entry = _open_entry(path)
    for column in entry["prefix_crc32"]:
        for stream in (0, 1):
            row = int(_offsets(path, entry)[stream][3])
            _flip(path, entry, column, row)
            # (the id column is also checked against the transition count, which names it first)
            want = "" if column == "id" else f": the committed rows of stream {stream} in this open chunk"
            for mode in ("r+", "r"):
                with pytest.raises(mr.CorruptStoreError, match=re.escape(_file(path, entry, column) + want)):
                    mr.ReplayStore.open(path, mode=mode)
            assert any(p.startswith(_file(path, entry, column)) for p in mr.verify_store(path))
            _flip(path, entry, column, row)
    with mr.ReplayStore.open(path) as again:  # flipped back: it opens and continues
        _vector_steps(again, rng, 4)
    assert mr.verify_store(path) == []


def _vector_steps_plain(s: mr.ReplayStore, rng: np.random.Generator, n: int) -> None:
    for t in range(n):
        s.step(rng.integers(0, 4, 2), rng.random(2), np.full((2, 5), t, np.uint8), rng.random(2) < 0.1,
               np.zeros(2, bool))


def test_snapshot_and_load_carry_the_checksums(tmp_path):
    path, snap, loaded = str(tmp_path / "s"), str(tmp_path / "snap"), str(tmp_path / "loaded")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(5,), num_envs=2, chunk_size=32,
                              extras={"lp": ((), "float32")})
    rng = np.random.default_rng(3)
    s.reset(np.zeros((2, 5), np.uint8))
    _vector_steps(s, rng, 20)
    s.commit()
    _vector_steps(s, rng, 3)  # uncommitted rows are in the snapshot: its manifest covers them
    s.save(snap)
    entry = _open_entry(snap)
    assert entry["rows"] == [8, 8] and entry["prefix_crc32"] == scratch_crc(snap, entry)
    assert mr.verify_store(snap) == []
    _vector_steps(s, rng, 2, start=100)  # the store's open chunk moves on; the snapshot's copy does not
    s.close()
    assert mr.verify_store(path) == [] and mr.verify_store(snap) == []
    with mr.ReplayStore.load(snap, loaded) as t:
        _vector_steps(t, rng, 12, start=50)  # through a roll
        t.commit()
        _vector_steps(t, rng, 2, start=70)
    assert mr.verify_store(loaded) == [] and mr.verify_store(snap) == []
    _flips_are_reported(snap)


def test_a_reader_saves_the_committed_checksums(tmp_path):
    path, snap = str(tmp_path / "s"), str(tmp_path / "snap")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(5,), chunk_size=32)
    s.reset(np.zeros(5, np.uint8))
    for t in range(40):
        s.step(0, 1.0, np.full(5, t, np.uint8), False, False)
    s.commit()
    committed = _open_entry(path)
    with mr.ReplayStore.open(path, mode="r") as reader:
        for t in range(3):
            s.step(0, 1.0, np.full(5, 100 + t, np.uint8), False, False)  # after the commit the reader holds
        reader.save(snap)
    s.close()
    entry = _open_entry(snap)
    assert entry["rows"] == committed["rows"] and entry["prefix_crc32"] == committed["prefix_crc32"]
    assert mr.verify_store(snap) == [] and mr.verify_store(path) == []


def test_stores_written_before_the_checksums(tmp_path):
    """No ``prefix_crc32`` (an older mmreplay wrote the store): verify() checks nothing more and reports
    nothing; the next commit computes the checksums over all the committed rows."""
    path = str(tmp_path / "s")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(5,), num_envs=2, chunk_size=32)
    s.reset(np.zeros((2, 5), np.uint8))
    _vector_steps_plain(s, np.random.default_rng(4), 20)
    s.close()

    def strip(doc):
        del doc["chunks"][-1]["prefix_crc32"]

    forge(path, strip)
    entry = _open_entry(path)
    _flip(path, entry, "reward", int(_offsets(path, entry)[1][2]))
    assert mr.verify_store(path) == []  # nothing recorded, nothing to compare with
    _flip(path, entry, "reward", int(_offsets(path, entry)[1][2]))
    with mr.ReplayStore.open(path) as again:
        again.commit()  # no new row: the checksums of the rows already committed
        entry = _open_entry(path)
        assert entry["prefix_crc32"] == scratch_crc(path, entry)
        _vector_steps_plain(again, np.random.default_rng(5), 3)
    entry = _open_entry(path)
    assert entry["prefix_crc32"] == scratch_crc(path, entry)
    assert mr.verify_store(path) == []


def test_golden_version1_store_gets_checksums(tmp_path):
    golden = os.path.join(data_dir(), "golden", "raw_v1")
    path = str(tmp_path / "g")
    shutil.copytree(golden, path)
    doc = _doc(path)
    assert all("prefix_crc32" not in c for c in doc["chunks"])
    assert mr.verify_store(path) == []
    with mr.ReplayStore.open(path) as s:
        s.commit()
    entry = _open_entry(path)
    assert entry["prefix_crc32"] == scratch_crc(path, entry)
    assert mr.verify_store(path) == []


@pytest.mark.parametrize("change, field", [
    (lambda e: e.update(prefix_crc32=[1, 2]), "prefix_crc32"),
    (lambda e: e["prefix_crc32"].pop("flags"), "prefix_crc32"),
    (lambda e: e["prefix_crc32"].update(x_other=[0, 0]), "prefix_crc32"),
    (lambda e: e["prefix_crc32"].update(obs=[1]), "prefix_crc32['obs']"),
    (lambda e: e["prefix_crc32"].update(obs=[1, 2, 3]), "prefix_crc32['obs']"),
    (lambda e: e["prefix_crc32"].update(obs="00"), "prefix_crc32['obs']"),
    (lambda e: e["prefix_crc32"].update(obs=[1, -1]), "prefix_crc32['obs']"),
    (lambda e: e["prefix_crc32"].update(obs=[1, 2**32]), "prefix_crc32['obs']"),
    (lambda e: e["prefix_crc32"].update(obs=[1, 2.0]), "prefix_crc32['obs']"),
    (lambda e: e["prefix_crc32"].update(obs=[1, True]), "prefix_crc32['obs']"),
])
def test_malformed_checksums_are_refused(tmp_path, change, field):
    path = str(tmp_path / "s")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(5,), num_envs=2, chunk_size=32)
    s.reset(np.zeros((2, 5), np.uint8))
    _vector_steps_plain(s, np.random.default_rng(6), 20)
    s.close()
    forge(path, lambda doc: change(doc["chunks"][-1]))
    for mode in ("r", "r+"):
        with pytest.raises(mr.CorruptStoreError, match=re.escape(f"chunks[1].{field} is")):
            mr.ReplayStore.open(path, mode=mode)
    problems = mr.verify_store(path)
    assert len(problems) == 1 and "prefix_crc32" in problems[0], problems


def test_checksums_on_a_sealed_chunk_are_refused(tmp_path):
    path = str(tmp_path / "s")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(5,), chunk_size=16)
    s.reset(np.zeros(5, np.uint8))
    for t in range(20):
        s.step(0, 1.0, np.full(5, t, np.uint8), False, False)
    s.close()
    forge(path, lambda doc: doc["chunks"][0].update(prefix_crc32=doc["chunks"][-1]["prefix_crc32"]))
    with pytest.raises(mr.CorruptStoreError, match="prefix_crc32.*none on a sealed chunk"):
        mr.ReplayStore.open(path)


# -- the runs of rows, and the incremental checksums against the ones from scratch ------------------------
@settings(max_examples=200, deadline=None)
@given(st.data())
def test_stream_runs_are_the_offsets(data):
    rs = data.draw(st.sampled_from([1, 6, 16, 24, 40, 96]))
    e = extent_rows(rs)
    n_env = data.draw(st.integers(1, 3))
    pool = list(range(n_env * rs // e))
    extents = data.draw(st.permutations(pool))[: data.draw(st.integers(0, len(pool)))]
    hi = data.draw(st.integers(0, len(extents) * e))
    lo = data.draw(st.integers(0, hi))
    runs = stream_runs(rs, extents, lo, hi)
    got = np.concatenate([np.arange(a, a + n) for a, n in runs]) if runs else np.empty(0, np.int64)
    assert got.tolist() == stream_offsets(rs, extents, hi)[lo:].tolist()
    assert all(n > 0 for _, n in runs)
    assert all(a + n != b for (a, n), (b, _) in zip(runs, runs[1:], strict=False))  # adjacent runs merged
    assert stream_extents(rs, n_env, None) == [home_extents(rs, s) for s in range(n_env)]


ops = st.lists(st.one_of(
    st.tuples(st.just("step"), st.integers(1, 12), st.integers(0, 3)),  # batched steps, then whose episode ends
    st.tuples(st.just("extend"), st.integers(0, 1), st.integers(1, 30)),
    st.tuples(st.just("commit"), st.just(0), st.just(0)),
    st.tuples(st.just("reopen"), st.booleans(), st.just(0)),  # close (with or without a commit), open r+
), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.integers(0, 2**16))
def test_incremental_checksums_equal_scratch(script, seed):
    """Random batched steps, blocks of one stream, commits and reopenings (chunks roll and retire): after
    every commit the recorded checksums are those of the committed rows, computed from scratch."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s")
        s = mr.ReplayStore.create(path, capacity=60, obs_shape=(3,), num_envs=2, chunk_size=48,
                                  extras={"lp": ((), "float32")})
        s.reset(rng.integers(0, 255, (2, 3)).astype(np.uint8))
        s.commit()  # a reopening without a commit comes back here
        try:
            for op, a, b in script:
                if op == "step":
                    for t in range(a):
                        end = np.array([b & 1, b & 2], bool) & (t == a - 1)
                        s.step(rng.integers(0, 4, 2), rng.random(2), rng.integers(0, 255, (2, 3)).astype(np.uint8),
                               end, np.zeros(2, bool), lp=rng.random(2).astype(np.float32))
                elif op == "extend":
                    if not s.episode_open[a]:
                        s.reset(rng.integers(0, 255, 3).astype(np.uint8), env=a)
                    s.extend(rng.integers(0, 4, b), rng.random(b), rng.integers(0, 255, (b, 3)).astype(np.uint8),
                             np.zeros(b, bool), np.zeros(b, bool), env=a, lp=rng.random(b).astype(np.float32))
                elif op == "commit":
                    s.commit()
                else:
                    s.close(commit=a)
                    s = mr.ReplayStore.open(path)
                if op == "commit" or (op == "reopen" and a):
                    entry = _doc(path)["chunks"][-1]
                    if not entry["sealed"]:
                        assert entry["prefix_crc32"] == scratch_crc(path, entry)
                        event(f"committed in chunk {min(entry['seq'], 2)}+" + (" with extents" if "extents" in entry else ""))
        finally:
            s.close()
        entry = _doc(path)["chunks"][-1]
        assert entry["prefix_crc32"] == scratch_crc(path, entry)
        assert mr.verify_store(path) == []
