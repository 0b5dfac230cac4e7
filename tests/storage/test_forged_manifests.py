"""Hostile stores (issue 12, items 1 and 6): forged manifests whose checksum was recomputed (names
that lead out of the store, garbage sampling state) and symbolic links inside a store. Each is refused
with ``CorruptStoreError`` naming the field before anything outside the store is read, written, linked
or deleted. (Sizes: test_size_limits.py; retention: ../store/test_snapshot_retention.py; the lock: test_lock.py.)"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import mmreplay as mr
from tests._support.hostile import fill, fingerprint, forge, outside, read_doc, touched


@pytest.fixture
def victim(tmp_path):
    """Another store beside the one under attack: nothing may touch it."""
    fill(tmp_path / "victim").close()
    return str(tmp_path / "victim")


@pytest.fixture
def store(tmp_path):
    fill(tmp_path / "a").close()
    return str(tmp_path / "a")


def _attempt(call):
    """Run ``call``; return the exception it raised (None if it returned)."""
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - the caller checks the type
        return exc
    if isinstance(result, mr.ReplayStore):
        result.close()
    return None


def _ops(path):
    return {
        "open r+": lambda: mr.ReplayStore.open(path, mode="r+"),
        "open r": lambda: mr.ReplayStore.open(path, mode="r"),
        "verify": lambda: mr.verify_store(path),
    }


def _refused(tmp_path, path, victim, what):
    """Every operation on the forged store raises CorruptStoreError naming ``what`` (verify reports it),
    and touches nothing outside the store; the victim is unchanged."""
    before = fingerprint(victim)
    for name, call in _ops(path).items():
        with touched() as log:
            result = None
            try:
                result = call()
            except mr.CorruptStoreError as exc:
                assert what in str(exc), (name, str(exc))
            else:
                assert name == "verify" and result and what in result[0], (name, result)
        assert outside(log, path, within=tmp_path) == [], name
    assert fingerprint(victim) == before


# -- 1. names from the manifest are plain names inside the store ------------------------------------
def _last_chunk(doc):
    return doc["chunks"][-1]


@pytest.mark.parametrize("name", [
    "../../victim/chunks/{victim_open}",  # relative: leads into the other store
    "{victim_abs}/chunks/{victim_open}",  # absolute
    "{seq}/../../../victim/chunks/{victim_open}",  # the right digits, then a way out
    "sub/{seq}",  # a separator
    "{seq}g12",  # a generation suffix of the wrong length
    "000000000999",  # digits that are not this chunk's seq
    "",
])
def test_forged_chunk_names_are_refused(tmp_path, store, victim, name):
    victim_open = read_doc(victim)["chunks"][-1]["name"]
    seq = _last_chunk(read_doc(store))["seq"]
    forged = name.format(victim_open=victim_open, victim_abs=os.path.abspath(victim), seq=f"{seq:012d}")
    forge(store, lambda d: _last_chunk(d).update(name=forged))
    _refused(tmp_path, store, victim, "chunks[")


def test_a_snapshot_chunk_name_with_its_generation_is_accepted(tmp_path, store):
    s = mr.ReplayStore.open(store)
    snap = s.save(tmp_path / "snap")
    s.close()
    last = read_doc(snap)["chunks"][-1]
    assert last["name"] == f"{last['seq']:012d}g000001" and not last["sealed"]
    assert mr.verify_store(snap) == []


@pytest.mark.parametrize("field,value", [
    ("file", "state/../../victim/state/{victim_file}"),
    ("file", "{victim_abs}/state/{victim_file}"),
    ("file", "state/sub/priorities.000000000001.npy"),
    ("file", "state/priorities-delta.000000000001.npy"),  # a delta where the full file belongs
    ("deltas", ["../victim/state/{victim_file}"]),
    ("deltas", "state/priorities-delta.000000000001.npy"),  # not a list
])
def test_forged_state_file_names_are_refused(tmp_path, store, victim, field, value):
    victim_file = os.path.basename(read_doc(victim)["priorities"]["file"])

    def fmt(v):
        return v.format(victim_file=victim_file, victim_abs=os.path.abspath(victim)) if isinstance(v, str) else v

    value = [fmt(v) for v in value] if isinstance(value, list) else fmt(value)
    forge(store, lambda d: d["priorities"].update({field: value}))
    _refused(tmp_path, store, victim, "priorities.")


def test_load_of_a_forged_snapshot_touches_nothing_outside(tmp_path, store):
    """A state file named ``../../../victim/x`` made ``load()`` unlink and relink a file outside both
    the snapshot and the new store."""
    s = mr.ReplayStore.open(store)
    snap = s.save(tmp_path / "a1" / "b1" / "snap")
    s.close()
    (tmp_path / "c1" / "victim").mkdir(parents=True)
    (tmp_path / "c1" / "victim" / "x").write_text("precious")
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "x").write_text("source")
    forge(snap, lambda d: d["priorities"].update(file="../../../victim/x"))
    target = tmp_path / "c1" / "d1" / "e1" / "restored"
    before = fingerprint(tmp_path / "c1"), fingerprint(tmp_path / "victim")
    with touched() as log:
        with pytest.raises(mr.CorruptStoreError, match="priorities.file"):
            mr.ReplayStore.load(snap, target)
    assert (fingerprint(tmp_path / "c1"), fingerprint(tmp_path / "victim")) == before
    assert outside(log, snap, tmp_path / "c1" / "d1" / "e1", within=tmp_path) == []
    assert not target.exists()


def test_save_over_a_forged_snapshot_is_refused(tmp_path, store, victim):
    s = mr.ReplayStore.open(store)
    snap = s.save(tmp_path / "snap")
    forge(snap, lambda d: d["chunks"][0].update(name="../../victim/chunks/000000000000"))
    before = fingerprint(snap), fingerprint(victim)
    with pytest.raises(mr.CorruptStoreError, match="chunks"):
        s.save(snap)
    assert (fingerprint(snap), fingerprint(victim)) == before
    s.close()


def test_save_never_writes_or_deletes_through_a_linked_directory(tmp_path, store, victim):
    """A snapshot whose chunks/ is a link to another store's: saving again used to delete that store's
    chunk files (they are not listed by the new generation)."""
    s = mr.ReplayStore.open(store)
    snap = s.save(tmp_path / "snap")
    os.rename(os.path.join(snap, "chunks"), os.path.join(snap, "chunks.orig"))
    os.symlink(os.path.join(os.path.abspath(victim), "chunks"), os.path.join(snap, "chunks"))
    before = fingerprint(victim)
    with touched() as log:
        with pytest.raises(mr.CorruptStoreError, match="symbolic link"):
            s.save(snap)
    assert fingerprint(victim) == before
    assert outside(log, snap, store, within=tmp_path) == []
    s.close()


@pytest.mark.parametrize("what", ["chunks dir", "chunk file", "state file"])
def test_links_inside_a_store_are_refused(tmp_path, store, victim, what):
    """A store unpacked from an archive may hold symbolic links: following one would read, or (the open
    chunk, in mode r+) write, another store's files."""
    doc = read_doc(store)
    vdoc = read_doc(victim)
    if what == "chunks dir":
        os.rename(os.path.join(store, "chunks"), os.path.join(store, "chunks.orig"))
        os.symlink(os.path.join(os.path.abspath(victim), "chunks"), os.path.join(store, "chunks"))
        forge(store, lambda d: d.update(chunks=vdoc["chunks"], rows=vdoc["rows"], next_id=vdoc["next_id"],
                                        priorities=None))
        words = "symbolic link"
    elif what == "chunk file":
        name = doc["chunks"][-1]["name"]
        target = os.path.join(store, "chunks", f"{name}.obs.npy")
        os.unlink(target)
        os.symlink(os.path.join(os.path.abspath(victim), "chunks", f"{vdoc['chunks'][-1]['name']}.obs.npy"), target)
        words = "symbolic link"
    else:
        target = os.path.join(store, doc["priorities"]["file"])
        os.unlink(target)
        os.symlink(os.path.join(os.path.abspath(victim), vdoc["priorities"]["file"]), target)
        words = "symbolic link"
    before = fingerprint(victim)
    for name, call in _ops(store).items():
        with touched() as log:
            exc = _attempt(call) if name != "verify" else None
            if name == "verify":
                problems = mr.verify_store(store)
                assert problems and words in problems[0], problems
            else:
                assert isinstance(exc, mr.CorruptStoreError) and words in str(exc), (name, exc)
        assert outside(log, store, within=tmp_path) == [], name
    assert fingerprint(victim) == before


# -- the sampling state ------------------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("rng", "garbage"),
    ("rng", {"bit_generator": "PCG64", "state": "x"}),
    ("rng", {"bit_generator": "PCG64", "state": {"state": -1, "inc": 1}, "has_uint32": 0, "uinteger": 0}),
    ("rng", {"bit_generator": "MT19937", "state": {"key": [1], "pos": 0}}),
    ("rng", None),
    ("pending_draws", {"ids": [[10**9]], "weights": None, "rng_after": None}),
    ("pending_draws", {"ids": "x", "rng_after": {}}),
    ("pending_draws", [1, 2]),
])
def test_garbage_sampling_state_is_a_corrupt_store(tmp_path, store, field, value):
    forge(store, lambda d: d.update({field: value}))
    for mode in ("r", "r+"):
        with pytest.raises(mr.CorruptStoreError, match=field):
            mr.ReplayStore.open(store, mode=mode)
    problems = mr.verify_store(store)
    assert len(problems) == 1 and field in problems[0] and "expected" in problems[0]


def test_manifest_written_by_this_version_passes_every_check(tmp_path, store):
    """The checks accept what the writer writes: pending draws, deltas, snapshots, loaded_from."""
    s = mr.ReplayStore.open(store)
    it = s.batches(4, prefetch=2)
    next(it)
    s.save(tmp_path / "snap")
    for _ in range(3):
        s.update_priorities(s.sampleable_ids()[:3], np.full(3, 2.0))
        s.commit()
    doc = read_doc(store)
    assert doc["pending_draws"] and doc["priorities"]["deltas"] and doc["snapshots"]
    s.close()
    assert mr.verify_store(store) == []
    with mr.ReplayStore.load(tmp_path / "snap", tmp_path / "loaded") as loaded:
        assert json.loads(open(tmp_path / "loaded" / "manifest.json").read())["loaded_from"]
        assert loaded.verify() == []


def test_pending_draws_rng_before_is_checked_and_may_be_absent(tmp_path, store):
    """``pending_draws.rng_before`` (one generator state per pending batch) is checked like ``rng``; a manifest
    without it (written before it was recorded) still resumes its pending batches, and a commit made after
    the first of them was handed out writes a manifest that opens."""
    s = mr.ReplayStore.open(store)
    it = s.batches(4, prefetch=2)
    next(it)
    s.commit()
    want = [next(it) for _ in range(3)]
    s.close(commit=False)
    assert len(read_doc(store)["pending_draws"]["rng_before"]) == 2
    saved = read_doc(store)
    forge(store, lambda d: d["pending_draws"].update(rng_before=[{}]))
    with pytest.raises(mr.CorruptStoreError, match="rng_before"):
        mr.ReplayStore.open(store)
    forge(store, lambda d: (d.clear(), d.update(saved), d["pending_draws"].pop("rng_before")))
    with mr.ReplayStore.open(store) as r:
        resumed = r.batches(4, prefetch=2)
        np.testing.assert_array_equal(next(resumed).index, want[0].index)
        r.commit()  # (the second pending batch is still pending)
    with mr.ReplayStore.open(store) as r:
        np.testing.assert_array_equal(next(r.batches(4, prefetch=2)).index, want[1].index)
    assert mr.verify_store(store) == []


def test_a_linked_id_column_file_is_refused(tmp_path):
    """The id column (stores with several env streams) is checked like the other column files: the
    open chunk's is mapped writable in mode r+, so a link would let the writer write elsewhere."""
    paths = []
    for name in ("s", "other"):
        s = mr.ReplayStore.create(tmp_path / name, capacity=50, obs_shape=(3,), num_envs=2, chunk_size=16)
        s.reset(np.zeros((2, 3), np.uint8))
        s.step([0, 1], [1.0, 1.0], np.ones((2, 3), np.uint8), [False, False], [False, False])
        s.close()
        paths.append(str(tmp_path / name))
    entry = read_doc(paths[0])["chunks"][-1]
    target = os.path.join(paths[0], "chunks", f"{entry['name']}.id.npy")
    os.unlink(target)
    os.symlink(os.path.join(paths[1], "chunks", f"{entry['name']}.id.npy"), target)
    before = fingerprint(paths[1])
    for mode in ("r", "r+"):
        with pytest.raises(mr.CorruptStoreError, match="symbolic link"):
            mr.ReplayStore.open(paths[0], mode=mode)
    problems = mr.verify_store(paths[0])
    assert problems and "symbolic link" in problems[0], problems
    assert fingerprint(paths[1]) == before
