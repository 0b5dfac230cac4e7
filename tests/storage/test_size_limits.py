"""Sizes meant to exhaust memory or hang (issue 12, item 3): refused before anything is created or
allocated, at once, with an error that names the parameter and the bound."""

from __future__ import annotations

import os

import numpy as np
import pytest

import mmreplay as mr
from tests._support.hostile import fill, forge, read_doc, run_limited


@pytest.fixture
def store(tmp_path):
    fill(tmp_path / "a").close()
    return str(tmp_path / "a")


@pytest.mark.parametrize("kw,words", [
    (dict(n_step=10**6), ["n_step=1,000,000", "at most 1,000"]),
    (dict(stack=10**6), ["stack=1,000,000", "at most 1,000"]),
    (dict(capacity=10, chunk_size=10**9), ["chunk_size=1,000,000,000", "capacity=10", "chunk_size <= 4,096"]),
    (dict(obs_shape=(10**6, 10**6)), ["obs_shape", "bytes per row", "256 MiB"]),
    (dict(capacity=10**11, chunk_size=10**8), ["capacity=100,000,000,000", "in-RAM index", "GiB"]),
    (dict(obs_shape=(2**20,), obs_dtype="float64", capacity=10**8, chunk_size=2**22),
     ["address space", "TiB"]),
])
def test_resource_bombs_at_create_are_refused_at_once(tmp_path, kw, words):
    args = dict(capacity=10, obs_shape=(2,))
    args.update(kw)
    code = f"""
        import time, os, mmreplay as mr
        t = time.perf_counter()
        try:
            mr.ReplayStore.create({str(tmp_path / 's')!r}, **{args!r})
        except ValueError as exc:
            print("REFUSED", time.perf_counter() - t, exc)
        else:
            print("CREATED")
        print("EXISTS" if os.path.exists({str(tmp_path / 's')!r}) else "ABSENT")
    """
    r = run_limited(code, timeout=30)
    assert r.stdout.startswith("REFUSED"), (r.stdout, r.stderr[-2000:])
    for w in words:
        assert w in r.stdout, (w, r.stdout)
    assert r.stdout.split()[-1] == "ABSENT"


def test_ring_positions_bomb_in_a_manifest(tmp_path, store):
    forge(store, lambda d: d.update(ring_positions=10**12))
    r = run_limited(f"""
        import mmreplay as mr
        try:
            mr.ReplayStore.open({store!r}, mode="r")
        except mr.CorruptStoreError as exc:
            print("REFUSED", exc)
    """, timeout=60)
    assert r.stdout.startswith("REFUSED") and "ring_positions" in r.stdout, (r.stdout, r.stderr[-2000:])


def test_state_file_header_declaring_terabytes(tmp_path, store):
    """numpy.load allocates what a header declares: a 100-byte state file asked for 14 TiB."""
    rel = read_doc(store)["priorities"]["file"]
    path = os.path.join(store, rel)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (2, 10**12)})
        f.write(b"\0" * 64)
    for call in (lambda: mr.ReplayStore.open(store, mode="r"), lambda: mr.ReplayStore.open(store, mode="r+")):
        with pytest.raises(mr.CorruptStoreError, match="declares"):
            call()
    assert "declares" in mr.verify_store(store)[0]


