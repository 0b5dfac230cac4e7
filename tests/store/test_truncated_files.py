"""Files truncated by another process while stores have them mapped: the rate-limit
counters, a sealed compressed frame file, a sealed column, the open chunk. The next use of the counters,
``commit()`` and a reader's ``refresh()`` raise ``CorruptStoreError`` instead of reading past the new end
(a SIGBUS, which kills the process). Everything runs in a child process, so a SIGBUS fails the test
instead of killing pytest. (A batch read or a step between the truncation and the next check raises
too: ``test_sigbus.py``.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from tests._support.hostile import REPO

_SCRIPT = r"""
import json, os, sys
import numpy as np
import mmreplay as mr
from tests._support.truncation import truncate

out = {}
root = sys.argv[1]


def attempt(key, call):
    try:
        call()
        out[key] = "ok"
    except mr.CorruptStoreError as exc:
        out[key] = "CorruptStoreError " + str(exc)


def writer(path, **kw):
    s = mr.ReplayStore.create(path, capacity=512, obs_shape=(16, 16), chunk_size=32, **kw)
    s.reset(np.zeros((16, 16), np.uint8))
    for t in range(80):  # two sealed chunks and an open one
        s.step(0, 1.0, np.full((16, 16), t % 7, np.uint8), False, False)
    s.commit()
    return s


# 1. the counters file, under a reader that samples and a writer that commits
p = os.path.join(root, "counters")
w = writer(p, rate_limit=mr.RateLimit(4.0, 4, 400.0, timeout=0.0))
r = mr.ReplayStore.open(p, mode="r")
r.sample(4)
truncate(os.path.join(p, "ratelimit.npy"), 64)
attempt("counters sample", lambda: r.sample(4))
attempt("counters commit", w.commit)
attempt("counters can_sample", lambda: r.can_sample(1))
r.close()
w.close(commit=False)

# 2-4. a sealed compressed frame file, a sealed column, the open chunk's column
for key, name in (("lz4", "000000000000.obs.lz4"), ("column", "000000000001.reward.npy"),
                  ("open", "000000000002.action.npy")):
    p = os.path.join(root, key)
    w = writer(p, compression="lz4")
    w.sample(8)
    r = mr.ReplayStore.open(p, mode="r")
    r.sample(8)
    f = os.path.join(p, "chunks", name)
    assert os.path.exists(f), sorted(os.listdir(os.path.join(p, "chunks")))
    truncate(f, 100)
    attempt(key + " refresh", r.refresh)
    attempt(key + " commit", w.commit)
    r.close()
    w.close(commit=False)
    attempt(key + " reopen", lambda: mr.ReplayStore.open(p, mode="r").close())
print(json.dumps(out))
"""


def test_truncated_files_under_live_stores_raise_instead_of_sigbus(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode != -signal.SIGBUS, "SIGBUS: " + r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    for key in ("counters sample", "counters commit", "counters can_sample"):
        assert got[key].startswith("CorruptStoreError") and "truncated" in got[key], (key, got[key])
    for key in ("lz4", "column", "open"):
        for op in ("refresh", "commit", "reopen"):
            msg = got[f"{key} {op}"]
            assert msg.startswith("CorruptStoreError"), (key, op, msg)
            if op != "reopen":
                assert "truncated to 100 bytes" in msg and "SIGBUS" in msg, (key, op, msg)
