"""Smaller defects: a frame record pointing into the record table, import/export
leftovers of a killed process, a forged schema under an address-space limit, can_sample() vs sample()."""

from __future__ import annotations

import os

import google_crc32c
import numpy as np
import pytest

import mmreplay as mr
from mmreplay.storage import framefile
from tests._support.hostile import forge


def _compressed_store(path):
    s = mr.ReplayStore.create(path, capacity=256, obs_shape=(16, 16), chunk_size=16, compression="lz4")
    s.reset(np.zeros((16, 16), np.uint8))
    for t in range(40):
        s.step(0, 1.0, np.full((16, 16), t, np.uint8), False, False)
    s.close()


def test_a_frame_record_pointing_into_the_record_table_is_refused(tmp_path):
    """Every checksum recomputed: the record of frame 0 points at record 1's bytes (inside the table)."""
    path = tmp_path / "s"
    _compressed_store(path)
    name = next(n for n in sorted(os.listdir(path / "chunks")) if n.endswith(".obs.lz4"))
    f = path / "chunks" / name
    os.chmod(f, 0o644)
    buf = bytearray(f.read_bytes())
    h = int.from_bytes(buf[8:12], "little")
    entry = bytes(buf[h + 16:h + 32])  # record 1's 16 bytes, taken as frame 0's entry
    rec = np.zeros(1, framefile.RECORD)
    rec[0] = (h + 16, 16, google_crc32c.value(entry))
    buf[h:h + 16] = rec.tobytes()
    crc = google_crc32c.value(bytes(buf[:-4]))
    buf[-4:] = crc.to_bytes(4, "little")
    f.write_bytes(bytes(buf))

    def change(doc):
        for c in doc["chunks"]:
            if c.get("frames") and name.startswith(c["name"]):
                c["frames"]["crc32c"] = crc
    forge(path, change)
    with pytest.raises(mr.CorruptStoreError, match="frame 0 is damaged .its record points outside the data"):
        mr.ReplayStore.open(path, mode="r")
    problems = mr.verify_store(str(path))
    assert any("frame 0 is damaged" in p and "points outside" in p for p in problems), problems


# -- leftovers of killed imports and exports ---------------------------------------------------------------
_KILLED = """
import os, signal, sys
import numpy as np
from mmreplay.datasets._common import atomic_output
from mmreplay.datasets._importing import StoreBuilder
kind, dest = sys.argv[1], sys.argv[2]
if kind == "import":
    b = StoreBuilder(dest)
    s = b.create(capacity=100, obs_shape=(2,))
    s.reset(np.zeros(2, np.uint8))
    s.step(0, 1.0, np.zeros(2, np.uint8), False, False)
    s.commit()
    os.kill(os.getpid(), signal.SIGKILL)
with atomic_output(dest) as tmp:
    os.makedirs(tmp)
    open(os.path.join(tmp, "part"), "wb").write(b"x" * 1000)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _hidden(parent, name):
    return sorted(n for n in os.listdir(parent) if n.startswith(f".{name}."))


@pytest.mark.parametrize("kind", ["import", "export"])
def test_a_killed_import_or_exports_leftover_is_removed_by_the_next_one(tmp_path, kind):
    import subprocess
    import sys

    from mmreplay.storage.files import temp_sibling
    from tests._support.hostile import REPO

    dest = tmp_path / ("store" if kind == "import" else "d.zarr")
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, "-c", _KILLED, kind, str(dest)], env=env, timeout=120, capture_output=True)
    assert r.returncode == -9, r.stderr
    left = _hidden(tmp_path, dest.name)
    assert len(left) == 1 and not dest.exists()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # a live process's temp output (same host): never touched
        alive = temp_sibling(str(dest), "partial").replace(f"-{os.getpid()}-", f"-{live.pid}-")
        os.makedirs(alive)
        src = tmp_path / "src"
        s = mr.ReplayStore.create(src, capacity=100, obs_shape=(2,))
        s.reset(np.zeros(2, np.uint8))
        for t in range(5):
            s.step(0, 1.0, np.full(2, t, np.uint8), t == 4, False)
        s.close()
        if kind == "import":
            mr.export(str(src), str(tmp_path / "x.zarr"), progress=False)
            mr.import_dataset(str(tmp_path / "x.zarr"), str(dest), progress=False).close()
        else:
            mr.export(str(src), str(dest), progress=False)
        assert _hidden(tmp_path, dest.name) == [os.path.basename(alive)]
    finally:
        live.kill()
        live.wait()


def test_a_killed_loads_leftover_is_removed_by_the_next_load(tmp_path):
    import subprocess
    import sys

    from mmreplay.storage.files import temp_sibling

    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(2,))
    s.reset(np.zeros(2, np.uint8))
    for t in range(5):
        s.step(0, 1.0, np.full(2, t, np.uint8), False, False)
    snap = s.save(tmp_path / "snap")
    s.close()
    dest = tmp_path / "resumed"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # what a load killed half-way leaves (same host, its process gone), and a live load's temp directory
        stale = temp_sibling(str(dest), "loading").replace(f"-{os.getpid()}-", f"-{dead.pid}-")
        alive = temp_sibling(str(dest), "loading").replace(f"-{os.getpid()}-", f"-{live.pid}-")
        for d in (stale, alive):
            os.makedirs(os.path.join(d, "chunks"))
        mr.ReplayStore.load(snap, dest).close()
        assert _hidden(tmp_path, dest.name) == [os.path.basename(alive)]
    finally:
        live.kill()
        live.wait()


def test_a_schema_too_big_for_the_address_space_is_a_corrupt_store_not_enomem(tmp_path):
    from tests._support.hostile import fill, run_limited

    path = str(tmp_path / "s")
    fill(path, prio=None).close()

    def change(doc):  # within every bound of the checks, but TiBs of address space for the ring
        doc["schema"]["capacity"] = 100_000
        doc["schema"]["obs_shape"] = [16384]
    forge(path, change)
    r = run_limited(f"""
        import mmreplay as mr
        try:
            mr.ReplayStore.open({path!r}, mode="r")
        except Exception as exc:
            print(type(exc).__name__, exc)
        print(mr.verify_store({path!r}))
    """, address_space=2 << 30)
    assert r.stdout.startswith("CorruptStoreError") and "address space" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "raise the limit" in r.stdout and r.stdout.splitlines()[1].startswith("['"), r.stdout  # verify reports


def test_can_sample_says_false_exactly_when_sample_would_raise_not_sampleable(tmp_path):
    w = mr.ReplayStore.create(tmp_path / "s", capacity=500, obs_shape=(1,), chunk_size=32,
                              rate_limit=mr.RateLimit(4.0, 4, 200.0, timeout=0.0))
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")  # sees the empty first commit
    w.reset(np.zeros(1, np.uint8))
    for t in range(20):
        w.step(0, 1.0, np.full(1, t, np.uint8), False, False)
    w.can_sample(1)  # publishes the writer's len(store): the limit alone would allow the reader's batch
    assert not r.can_sample(4)
    with pytest.raises(mr.NotSampleableError):
        r.sample(4)
    assert r.inspect()["rate_limit"]["sampled"] == 0  # the refused draw counted nothing
    w.commit()
    r.refresh()
    assert r.can_sample(4)
    r.sample(4)
    r.close()
    w.close()
    p = mr.ReplayStore.create(tmp_path / "p", capacity=100, obs_shape=(1,), prioritized=mr.Prioritized(0.6, 0.4, eps=0.0))
    p.reset(np.zeros(1, np.uint8))
    for t in range(5):
        p.step(0, 1.0, np.full(1, t, np.uint8), False, False)
    ids = p.sampleable_ids()
    p.update_priorities(ids, np.zeros(ids.size))
    assert not p.can_sample(1)
    with pytest.raises(mr.NotSampleableError):
        p.sample(1)
    p.close()
