"""Files truncated by another process under a store that reads them: the next ``sample()`` (any way of
drawing: plain, prefetched, shared with the reader's helper threads, sequences) or ``step()`` that touches
a page past the new end raises ``CorruptStoreError`` naming the file, instead of dying of SIGBUS; the
error stays; reopening and ``verify`` name the file too. Other stores of the process are not affected, and
a SIGBUS anywhere else kills the process as before (faulthandler, when enabled, still reports it).

Every case runs in a child process, so a SIGBUS fails the test instead of killing pytest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from mmreplay.native import busguard
from tests._support.hostile import REPO

pytestmark = pytest.mark.skipif(not busguard.supported(), reason="the SIGBUS guard needs numba and Linux x86-64/aarch64")

_COMMON = r"""
import hashlib, json, mmap, os, sys
import numpy as np
import mmreplay as mr
from tests._support.truncation import truncate

root = sys.argv[1]
out = {}


def frames(t):
    # a quarter noise, the rest zeros: LZ4 shrinks them enough to compress, and a chunk's file spans pages
    f = np.zeros((64, 64), np.uint8)
    f[:16] = np.random.default_rng(t).integers(0, 256, (16, 64), dtype=np.uint8)
    return f


def writer(path, **kw):
    s = mr.ReplayStore.create(path, capacity=512, obs_shape=(64, 64), chunk_size=32, seed=3, **kw)
    s.reset(frames(0))
    for t in range(80):  # two sealed chunks and an open one (16 rows written)
        s.step(t % 3, 1.0, frames(t + 1), False, False)
    s.commit()
    return s


def attempt(key, call):
    try:
        call()
        out[key] = "ok"
    except mr.CorruptStoreError as exc:
        out[key] = "CorruptStoreError " + str(exc)


def digest(batch):
    h = hashlib.sha256()
    for name in ("obs", "next_obs", "action", "reward", "discount", "index"):
        h.update(np.ascontiguousarray(getattr(batch, name)).tobytes())
    return h.hexdigest()
"""

_TRUNCATE = _COMMON + r"""
# (a compressed file keeps whole pages: its record table stays, its frames' pages are gone)
cases = (("raw sealed", "000000000000.obs.npy", None, 100), ("raw open", "000000000002.obs.npy", None, 100),
         ("sealed column", "000000000001.reward.npy", None, 100),
         ("lz4 sealed", "000000000000.obs.lz4", "lz4", 2 * mmap.PAGESIZE))
for key, name, codec, size in cases:
    p = os.path.join(root, key.replace(" ", "_"))
    w = writer(p, compression=codec)
    r = mr.ReplayStore.open(p, mode="r", seed=5)
    other = writer(p + "_other", compression=codec)  # a second store of the process, left alone
    expect = digest(mr.ReplayStore.open(p + "_other", mode="r", seed=7).sample(64))
    r.sample(8)
    e = mr.ReplayStore.open(p, mode="r")  # reads episodes only
    table = e.episodes()
    assert os.path.getsize(os.path.join(p, "chunks", name)) > 2 * size
    truncate(os.path.join(p, "chunks", name), size)
    for who, store in (("reader", r), ("writer", w)):
        attempt(f"{key} {who} sample", lambda: store.sample(64))
        attempt(f"{key} {who} sample again", lambda: store.sample(1))
    attempt(f"{key} sequences", lambda: r.sample_sequences(8, 4))
    attempt(f"{key} episodes", lambda: (e.episode_steps(table, 0), e.episode_frames(table, 0), e.episodes()))
    e.close()
    attempt(f"{key} step", lambda: w.step(0, 1.0, frames(99), False, False))
    attempt(f"{key} commit", w.commit)
    attempt(f"{key} save", lambda: w.save(p + "_snapshot"))
    attempt(f"{key} other live", lambda: (other.sample(64), other.step(0, 1.0, frames(7), False, False)))
    out[f"{key} other"] = digest(mr.ReplayStore.open(p + "_other", mode="r", seed=7).sample(64)) == expect
    other.close()
    r.close()
    w.close(commit=False)
    attempt(f"{key} reopen", lambda: mr.ReplayStore.open(p, mode="r").close())
    out[f"{key} verify"] = " ".join(mr.verify_store(p))

# a write into the open chunk's column, before anything read it
p = os.path.join(root, "write")
w = writer(p, compression=None)
truncate(os.path.join(p, "chunks", "000000000002.action.npy"))
attempt("write step", lambda: w.step(0, 1.0, frames(99), False, False))
attempt("write step again", lambda: w.step(0, 1.0, frames(99), False, False))
attempt("write sample", lambda: w.sample(4))
w.close(commit=False)
print(json.dumps(out))
"""


def _run(script: str, root: object, flags: tuple[str, ...] = (),
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-c", script, str(root)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": REPO, **(env or {})})


def _result(r: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert r.returncode != -signal.SIGBUS, "SIGBUS: " + r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(json.loads(r.stdout.splitlines()[-1]))


def _truncated(msg: object, name: str) -> None:
    assert isinstance(msg, str) and msg.startswith("CorruptStoreError"), msg
    assert name in msg and "truncated" in msg and "verify" in msg and "stop every process" in msg, msg


def test_sample_step_and_commit_raise_for_a_file_truncated_under_them(tmp_path):
    got = _result(_run(_TRUNCATE, tmp_path, ("-X", "faulthandler")))  # (chained behind faulthandler)
    for key, name in (("raw sealed", "000000000000.obs.npy"), ("raw open", "000000000002.obs.npy"),
                      ("sealed column", "000000000001.reward.npy"), ("lz4 sealed", "000000000000.obs.lz4")):
        for op in ("reader sample", "reader sample again", "writer sample", "writer sample again", "sequences",
                   "episodes", "step", "commit", "save"):
            _truncated(got[f"{key} {op}"], name)
        assert got[f"{key} other live"] == "ok" and got[f"{key} other"] is True, key  # as before, bit for bit
        assert got[f"{key} reopen"].startswith("CorruptStoreError") and name in got[f"{key} reopen"], key
        assert name in got[f"{key} verify"], got[f"{key} verify"]
    for op in ("write step", "write step again", "write sample"):
        _truncated(got[op], "000000000002.action.npy")


_THREADS = _COMMON + r"""
import threading
from mmreplay.native import busguard
from mmreplay.reading.reader import FrameReader

FrameReader.SHARE = True  # every read shared with the helper threads
p = os.path.join(root, "s")
w = writer(p, compression=None)
r = mr.ReplayStore.open(p, mode="r", seed=5, read_threads=3)
r.sample(64)
it = r.batches(64, prefetch=2)
next(it)
truncate(os.path.join(p, "chunks", "000000000000.obs.npy"))
truncate(os.path.join(p, "chunks", "000000000001.obs.npy"))
attempt("helpers", lambda: r.sample(256))


def drain():
    for _ in range(20):
        next(it)


attempt("prefetched", drain)
attempt("frames distinct", lambda: next(iter(r.batches(32, prefetch=1, frames="distinct"))))
seen = busguard.count()
pid = os.fork()
if pid == 0:  # a forked child inherits the guard, and the store's damage
    try:
        r.sample(8)
        code = 1
    except mr.CorruptStoreError:
        code = 0
    os._exit(code)
out["fork"] = os.waitpid(pid, 0)[1]
out["faults"] = seen
print(json.dumps(out))
"""


def test_helper_threads_prefetch_and_fork(tmp_path):
    got = _result(_run(_THREADS, tmp_path))
    for key in ("helpers", "prefetched", "frames distinct"):
        _truncated(got[key], ".obs.npy")
    assert got["fork"] == 0
    assert isinstance(got["faults"], int) and got["faults"] > 0


_FOREIGN = r"""
import mmap, os, sys
import numpy as np
import mmreplay as mr

root = sys.argv[1]
s = mr.ReplayStore.create(os.path.join(root, "s"), capacity=64, obs_shape=(8,), chunk_size=16)
s.reset(np.zeros(8, np.uint8))
s.step(0, 0.0, np.ones(8, np.uint8), False, False)
s.sample(1)  # the guard is installed
path = os.path.join(root, "foreign")
with open(path, "wb") as f:
    f.write(b"x" * 4 * mmap.PAGESIZE)
with open(path, "r+b") as f:
    m = mmap.mmap(f.fileno(), 4 * mmap.PAGESIZE)
os.truncate(path, 10)
print("reading", flush=True)
print(m[3 * mmap.PAGESIZE])  # not a store's mapping: SIGBUS, as without the guard
print("survived", flush=True)
"""


@pytest.mark.parametrize("faulthandler", [False, True])
def test_a_fault_outside_the_stores_still_kills_the_process(tmp_path, faulthandler):
    r = _run(_FOREIGN, tmp_path, ("-X", "faulthandler") if faulthandler else ())
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "reading" in r.stdout and "survived" not in r.stdout
    assert ("Fatal Python error: Bus error" in r.stderr) == faulthandler, r.stderr[-2000:]


def test_without_the_jit_nothing_is_installed(tmp_path):
    script = (r"""
import os, sys
import numpy as np
import mmreplay as mr
from mmreplay.native import busguard
from tests._support import internals
s = mr.ReplayStore.create(os.path.join(sys.argv[1], "s"), capacity=64, obs_shape=(8,), chunk_size=16)
s.reset(np.zeros(8, np.uint8))
s.step(0, 0.0, np.ones(8, np.uint8), False, False)
s.sample(1)
print(busguard.supported(), busguard.register(internals.log(s).ring.arrays["obs"].ctypes.data, 4096, False))
""")
    r = _run(script, tmp_path, env={"NUMBA_DISABLE_JIT": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "-1"]


_COUNTERS = _COMMON + r"""
p = os.path.join(root, "limited")
w = writer(p, compression=None, rate_limit=mr.RateLimit(4.0, 4, 400.0, timeout=0.0))
r = mr.ReplayStore.open(p, mode="r")
r.sample(4)
truncate(os.path.join(p, "ratelimit.npy"), 0)  # (the counts share one page: a shorter file still maps it)
attempt("writer step", lambda: w.step(0, 1.0, frames(99), False, False))
attempt("writer step again", lambda: w.step(0, 1.0, frames(99), False, False))
attempt("reader sample", lambda: r.sample(4))
r.close()
w.close(commit=False)
print(json.dumps(out))
"""


def test_the_rate_limit_counters_truncated_under_a_writer(tmp_path):
    got = _result(_run(_COUNTERS, tmp_path))
    for key in ("writer step", "writer step again", "reader sample"):
        msg = got[key]
        assert isinstance(msg, str) and msg.startswith("CorruptStoreError") and "ratelimit.npy: truncated" in msg, msg


def test_a_sigbus_sent_by_a_process_still_kills(tmp_path):
    script = _FOREIGN.split("path = os.path.join(root")[0] + (
        "import signal\nprint('reading', flush=True)\nos.kill(os.getpid(), signal.SIGBUS)\nprint('survived', flush=True)\n")
    r = _run(script, tmp_path)
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "reading" in r.stdout and "survived" not in r.stdout
