"""Planted links and special files: nothing outside the store is created, read or
written through a link planted in it (the manifest, the rate-limit files, the writer's temp names), and a
``manifest.json`` or a zarr ``zarr.json`` that is a FIFO, ``/dev/zero`` or a huge sparse file is refused
quickly with a typed error by ``open()``, ``verify``, ``mmreplay info`` and ``import_dataset``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.datasets import DatasetError, describe
from tests._support.hostile import REPO, fill


def _outside_file(tmp_path, content=b"precious\n"):
    p = tmp_path / "outside.bin"
    p.write_bytes(content)
    return p


def _ops(path):
    return [lambda: mr.ReplayStore.open(path, mode="r"), lambda: mr.ReplayStore.open(path, mode="r+")]


def test_a_linked_manifest_is_refused_without_reading_through_it(tmp_path):
    store = tmp_path / "a"
    fill(store).close()
    target = tmp_path / "outside.json"
    shutil.copy(store / "manifest.json", target)  # a valid manifest: only the link is wrong
    os.unlink(store / "manifest.json")
    os.symlink(target, store / "manifest.json")
    before = target.read_bytes()
    for op in _ops(store):
        with pytest.raises(mr.CorruptStoreError, match="manifest.json: is a symbolic link"):
            op()
    problems = mr.verify_store(str(store))
    assert problems and "symbolic link" in problems[0]
    assert target.read_bytes() == before


def _rate_store(path):
    s = mr.ReplayStore.create(path, capacity=200, obs_shape=(1,), chunk_size=16,
                              rate_limit=mr.RateLimit(2.0, 4, 40.0, timeout=0.0))
    s.reset(np.zeros(1, np.uint8))
    for t in range(10):
        s.step(0, 1.0, np.full(1, t, np.uint8), False, False)
    s.commit()
    return s


def test_a_dangling_readers_link_creates_nothing_outside(tmp_path):
    store = tmp_path / "a"
    _rate_store(store).close()
    os.unlink(store / "ratelimit.readers")
    os.symlink(tmp_path / "created-outside", store / "ratelimit.readers")
    with pytest.raises(mr.CorruptStoreError, match="ratelimit.readers: is a symbolic link"):
        mr.ReplayStore.open(store, mode="r")
    assert not (tmp_path / "created-outside").exists()


def test_a_linked_counters_file_is_never_written(tmp_path):
    store = tmp_path / "a"
    _rate_store(store).close()
    target = tmp_path / "counters.npy"
    shutil.copy(store / "ratelimit.npy", target)
    os.unlink(store / "ratelimit.npy")
    os.symlink(target, store / "ratelimit.npy")
    before = target.read_bytes()
    for op in _ops(store):
        with pytest.raises(mr.CorruptStoreError, match="ratelimit.npy: is a symbolic link"):
            op()
    assert target.read_bytes() == before


def test_links_at_the_writers_temp_names_are_removed_not_followed(tmp_path):
    """A link planted at the sealer's ``<seq>.obs.lz4.tmp`` and at the commit's ``manifest.json.tmp-<pid>``:
    the targets keep their bytes, the links are replaced by the store's own files, the store reopens."""
    store = tmp_path / "a"
    s = mr.ReplayStore.create(store, capacity=256, obs_shape=(16, 16), chunk_size=16, compression="lz4")
    victim = _outside_file(tmp_path)
    for seq in range(2):  # the chunks 40 steps seal
        os.symlink(victim, store / "chunks" / f"{seq:012d}.obs.lz4.tmp")
    os.symlink(victim, store / f"manifest.json.tmp-{os.getpid()}")
    s.reset(np.zeros((16, 16), np.uint8))
    for t in range(40):
        s.step(0, 1.0, np.full((16, 16), t, np.uint8), False, False)
    s.commit()
    s.close()
    assert victim.read_bytes() == b"precious\n"
    assert not any(os.path.islink(os.path.join(d, n)) for d, _, fs in os.walk(store) for n in fs)
    r = mr.ReplayStore.open(store, mode="r")
    assert len(r) > 0 and any(n.endswith(".obs.lz4") for n in os.listdir(store / "chunks"))
    r.close()
    assert mr.verify_store(str(store)) == []


# -- special files as manifest.json / zarr.json --------------------------------------------------------------
def _special(path, kind):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    else:
        with open(path, "wb") as f:
            f.truncate(8 << 30)  # sparse: 8 GiB that take no disk


_PROBE = """
import contextlib, io, json, sys
import mmreplay as mr
from mmreplay.cli.main import main
out = {}
for what, path in json.loads(sys.argv[1]):
    try:
        if what == "open":
            mr.ReplayStore.open(path, mode="r")
            got = "no error"
        elif what == "verify":
            got = " ".join(mr.verify_store(path)) or "no problems"
        elif what == "info":
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                got = f"exit {main(['info', path])} {err.getvalue()}"
        else:
            mr.import_dataset(path, path + "-imported", progress=False)
            got = "no error"
    except Exception as exc:
        got = f"{type(exc).__name__} {exc}"
    out[what + " " + path] = got
print(json.dumps(out))
"""


def _probe(calls):
    """Run ``calls`` ((what, path) pairs) in a child with its address space capped and a timeout, so a hang
    or a memory bomb fails the test instead of the machine; what each raised or returned."""
    import json

    prelude = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, "-c", prelude + _PROBE, json.dumps([(w, str(p)) for w, p in calls])],
                         capture_output=True, text=True, timeout=90, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


KINDS = {"fifo": "is a FIFO", "dev-zero": "is a symbolic link", "sparse": "more than the"}


def test_a_special_manifest_is_refused_quickly(tmp_path):
    calls = []
    for kind in KINDS:
        store = tmp_path / kind
        fill(store, steps=20).close()
        os.unlink(store / "manifest.json")
        _special(store / "manifest.json", kind)
        calls += [(w, store) for w in ("open", "verify", "info")]
    got = _probe(calls)
    for kind, words in KINDS.items():
        p = str(tmp_path / kind)
        assert got["open " + p].startswith("CorruptStoreError") and words in got["open " + p], got
        assert words in got["verify " + p] and words in got["info " + p], got
        assert not got["info " + p].startswith("exit 0"), got


def test_a_special_zarr_json_is_refused_quickly(tmp_path):
    pytest.importorskip("zarr")
    store = tmp_path / "a"
    fill(store, prio=None).close()
    words = {"fifo": "is a FIFO", "dev-zero": "is a device", "sparse": "more than the"}
    for kind in words:
        mr.export(str(store), str(tmp_path / kind), progress=False)
        os.unlink(tmp_path / kind / "zarr.json")
        _special(tmp_path / kind / "zarr.json", kind)
    got = _probe([("import", tmp_path / kind) for kind in words])
    for kind, w in words.items():
        msg = got["import " + str(tmp_path / kind)]
        assert msg.startswith("DatasetError") and w in msg, msg
        with pytest.raises(DatasetError, match=w):
            describe(str(tmp_path / kind))


def test_a_fifo_at_the_readers_file_is_refused_not_waited_on(tmp_path):
    import signal

    store = tmp_path / "a"
    _rate_store(store).close()
    os.unlink(store / "ratelimit.readers")
    os.mkfifo(store / "ratelimit.readers")
    signal.alarm(30)  # a regression (opening the FIFO blocks) fails the test instead of hanging the suite
    try:
        with pytest.raises(mr.CorruptStoreError, match="ratelimit.readers: is a FIFO"):
            mr.ReplayStore.open(store, mode="r")
    finally:
        signal.alarm(0)
