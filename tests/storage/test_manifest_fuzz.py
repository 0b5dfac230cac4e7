"""Fuzzing open()/verify() with mutated manifests and state files (issue 12).

Manifests get keys removed, values of the wrong type, huge and negative numbers, names that lead
out of the store and nested garbage, with the checksum recomputed so every mutation reaches the
checks behind it; state files get truncated, byte-flipped, replaced by arrays of the wrong dtype or
shape, pickled object arrays and headers declaring terabytes. Whatever the mutation, ``open()``
(both modes) and ``verify()`` either work on a usable store or raise one of mmreplay's documented
errors (``mr.MMReplayError``): never ``TypeError``/``KeyError``/``IndexError``/``MemoryError``/
``RecursionError`` or a crash, and never touch a file outside the store.

CI runs a bounded number of examples; ``MMREPLAY_FUZZ_EXAMPLES=2000`` runs a longer search.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from mmreplay.storage.manifest import write_manifest
from tests._support.hostile import fill, fingerprint, outside, read_doc, touched

EXAMPLES = int(os.environ.get("MMREPLAY_FUZZ_EXAMPLES", "100"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize="MMREPLAY_FUZZ_EXAMPLES" not in os.environ,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

BAD_NAMES = ["../x", "../../victim/chunks/000000000000", "/etc/passwd", "a/b", "", ".", "..", "000000000000/..",
             "state/../../x.npy", "state/priorities.000000000001.npy/..", "x" * 300, "\x00", "000000000000\n"]
HUGE = [2**31, 2**32, 2**53 + 1, 2**62, 2**63, 2**64, 10**18, 10**30, 10**100, -1, -(2**63), -(10**30)]

leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from(HUGE),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.sampled_from(BAD_NAMES))
garbage = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                       max_leaves=12)


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """Stores to mutate: prioritized (full state file, deltas, pending prefetched draws, a snapshot
    entry) and uniform; and a victim store beside them that nothing may touch."""
    base = tmp_path_factory.mktemp("fuzz")
    s = fill(base / "prio")
    it = s.batches(4, prefetch=2)
    next(it)
    s.save(base / "snap")
    for _ in range(2):
        s.update_priorities(s.sampleable_ids()[:3], np.full(3, 2.0))
        s.commit()
    doc = read_doc(base / "prio")
    assert doc["pending_draws"] and doc["priorities"]["deltas"] and doc["snapshots"]
    s.close(commit=False)  # keep the commit above
    fill(base / "uniform", prio=None).close()
    fill(base / "victim", prio=None).close()
    return base


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key/index path in a JSON value."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            out += _paths(v, (*prefix, i))
    return out


def _apply(doc: dict[str, Any], path: tuple, action: str, value: Any) -> None:
    parent: Any = doc
    for p in path[:-1]:
        parent = parent[p]
    key = path[-1]
    if action == "delete":
        del parent[key]
    elif action == "bump" and isinstance(parent[key], int) and not isinstance(parent[key], bool):
        parent[key] += value if isinstance(value, int) and not isinstance(value, bool) else 1
    else:
        parent[key] = value


def _check(store_dir: str, root: str) -> None:
    """open() in both modes and verify(): documented errors only, a usable store otherwise, nothing
    outside ``store_dir`` (inside the test's ``root``) touched."""
    victim = os.path.join(root, "victim")
    before = fingerprint(victim)
    with touched() as log:
        for mode in ("r", "r+"):
            try:
                s = mr.ReplayStore.open(store_dir, mode=mode)
            except mr.MMReplayError:
                continue
            try:
                ids = s.sampleable_ids()
                assert len(s) == ids.size
                if ids.size:
                    b = s.sample(min(4, ids.size))
                    assert np.isin(b.index, ids).all()
                    assert np.array_equal(s.gather(ids[:4]).index, ids[:4])
                    if s.schema.prioritized is not None:
                        assert np.isfinite(s.priorities(ids[:4])).all()
                        if mode == "r+":
                            s.update_priorities(ids[:2], np.array([0.5, 4.0][: min(2, ids.size)]))
                assert isinstance(s.verify(), list)
            except mr.MMReplayError:
                pass
            finally:
                try:
                    s.close()
                except mr.MMReplayError:
                    pass
        problems = mr.verify_store(store_dir)
        assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    assert outside(log, store_dir, within=root) == []
    assert fingerprint(victim) == before


def _copy(originals, which: str) -> tuple[str, str]:
    work = tempfile.mkdtemp(dir=originals)
    shutil.copytree(originals / which, os.path.join(work, "store"), symlinks=True)
    shutil.copytree(originals / "victim", os.path.join(work, "victim"), symlinks=True)
    return work, os.path.join(work, "store")


@SETTINGS
@given(data=st.data(), which=st.sampled_from(["prio", "uniform"]))
def test_mutated_manifests(originals, data, which):
    work, store = _copy(originals, which)
    try:
        doc = read_doc(store)
        for _ in range(data.draw(st.integers(1, 3), label="mutations")):
            paths = _paths(doc)
            path = data.draw(st.sampled_from(paths), label="path")
            action = data.draw(st.sampled_from(["delete", "replace", "bump"]), label="action")
            value = data.draw(st.one_of(garbage, st.sampled_from(HUGE)), label="value")
            _apply(doc, path, action, value)
        try:
            write_manifest(store, doc)
        except (ValueError, TypeError, RecursionError):
            return  # not writable as JSON (e.g. a non-string key): not a manifest anyone can forge
        _check(store, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _state_files(store: str) -> list[str]:
    p = read_doc(store)["priorities"]
    return [os.path.join(store, rel) for rel in [p["file"], *p["deltas"]]]


@SETTINGS
@given(data=st.data())
def test_mutated_state_files(originals, data):
    work, store = _copy(originals, "prio")
    try:
        target = data.draw(st.sampled_from(_state_files(store)), label="file")
        raw = open(target, "rb").read()
        kind = data.draw(st.sampled_from(["truncate", "flip", "dtype", "shape", "pickle", "huge", "empty",
                                          "directory", "missing"]), label="kind")
        if kind == "truncate":
            raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
        elif kind == "flip":
            buf = bytearray(raw)
            for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8), label="positions"):
                buf[pos] ^= data.draw(st.integers(1, 255), label="mask")
            raw = bytes(buf)
        elif kind in ("dtype", "shape", "pickle"):
            arr = np.load(target)
            if kind == "dtype":
                with np.errstate(invalid="ignore"):
                    arr = arr.astype(data.draw(st.sampled_from(["<f4", "<i8", "<U3", "|b1", "<c16"])))
            elif kind == "shape":
                arr = np.zeros(data.draw(st.sampled_from([(3,), (3, arr.shape[1]), (2, 0), (2, 10**5), ()])))
            else:
                arr = np.array([{"x": 1}, None], dtype=object)
            out = tempfile.TemporaryFile()
            np.save(out, arr, allow_pickle=True)
            out.seek(0)
            raw = out.read()
        elif kind == "huge":
            head = tempfile.TemporaryFile()
            np.lib.format.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False,
                                                       "shape": (2, data.draw(st.sampled_from(HUGE[4:9])))})
            head.seek(0)
            raw = head.read() + b"\0" * 64
        if kind == "directory":
            os.unlink(target)
            os.mkdir(target)
        elif kind == "missing":
            os.unlink(target)
        else:
            with open(target, "wb") as f:
                f.write(raw)
        _check(store, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_deeply_nested_garbage(originals):
    """100,000 nested lists in a field: the JSON parser's recursion limit is a corrupt store, not a crash."""
    work, store = _copy(originals, "uniform")
    try:
        doc = read_doc(store)
        doc["metadata"] = "NESTED"
        doc.update(format="mmreplay-store", format_version=1)
        nested = "[" * 100_000 + "]" * 100_000
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":")).replace('"NESTED"', nested)
        crc = zlib.crc32(canonical.encode())
        with open(os.path.join(store, "manifest.json"), "w") as f:
            f.write(canonical[:-1] + f',"checksum":{crc}}}')
        with pytest.raises(mr.CorruptStoreError, match="manifest"):
            mr.ReplayStore.open(store, mode="r")
        _check(store, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
