"""The rate-limit counters file under attack: a flipped bit is refused or repaired,
never counted or committed; a process stopped while holding the counters' lock makes the others wait at
most their timeout; a file deleted and recreated while processes run is detected instead of splitting
the counts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.core.ratelimit import INSERTED, PREVIOUS_TOTAL, SAMPLED_TOTAL

SLOT0 = 128  # the counters' offset in ratelimit.npy (a version 1.0 .npy header)


def _create(path, timeout=0.0):
    s = mr.ReplayStore.create(path, capacity=500, obs_shape=(1,), chunk_size=32,
                              rate_limit=mr.RateLimit(4.0, 4, 200.0, timeout=timeout))
    s.reset(np.zeros(1, np.uint8))
    for t in range(20):
        s.step(0, 1.0, np.full(1, t, np.uint8), False, False)
    s.commit()
    return s


def _flip(path, slot, bit):
    with open(path / "ratelimit.npy", "r+b") as f:
        f.seek(SLOT0 + 8 * slot)
        v = int.from_bytes(f.read(8), "little", signed=True)
        f.seek(SLOT0 + 8 * slot)
        f.write(((v ^ (1 << bit)) & (2**64 - 1)).to_bytes(8, "little"))


@pytest.mark.parametrize("bit", [0, 20, 62])
def test_a_flipped_sampled_count_is_refused_never_committed(tmp_path, bit):
    s = _create(tmp_path / "s")
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    r.sample(8)
    _flip(tmp_path / "s", SAMPLED_TOTAL, bit)
    with pytest.raises(mr.CorruptStoreError, match="ratelimit.npy: damaged rate-limit counters.*Close every process"):
        r.sample(8)
    with pytest.raises(mr.CorruptStoreError, match="damaged rate-limit counters"):
        s.commit()
    s.step(0, 1.0, np.full(1, 9, np.uint8), False, False)  # the store stays writable
    with pytest.raises(mr.CorruptStoreError, match="damaged rate-limit counters"):
        s.close()  # its commit is refused too; the files and the lock are released all the same
    r.close()
    # the last commit opens; following the advice (every process closed, file deleted) recovers
    with pytest.raises(mr.CorruptStoreError, match="damaged rate-limit counters"):
        mr.ReplayStore.open(tmp_path / "s", mode="r+")
    os.unlink(tmp_path / "s" / "ratelimit.npy")
    s = mr.ReplayStore.open(tmp_path / "s", mode="r+")
    assert s.inspect()["rate_limit"]["sampled"] == 0 and len(s) == 20
    s.commit()
    s.close()
    assert mr.verify_store(str(tmp_path / "s")) == []


def _slot(path, slot, value=None):
    with open(path / "ratelimit.npy", "r+b") as f:
        f.seek(SLOT0 + 8 * slot)
        if value is None:
            return int.from_bytes(f.read(8), "little", signed=True)
        f.write(int(value).to_bytes(8, "little", signed=True))
        return value


def test_a_sampler_killed_between_its_count_and_its_check_is_undone_not_damage(tmp_path):
    s = _create(tmp_path / "s")
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    r.sample(8)
    r.sample(8)
    assert _slot(tmp_path / "s", PREVIOUS_TOTAL) == 8 and _slot(tmp_path / "s", SAMPLED_TOTAL) == 16
    # what a sampler killed after storing its new total, before its check, leaves: the total the check says first
    _slot(tmp_path / "s", PREVIOUS_TOTAL, 16)
    _slot(tmp_path / "s", SAMPLED_TOTAL, 21)
    r.sample(8)  # the lock holder puts the total back (16), then counts its own rows
    assert s.inspect()["rate_limit"]["sampled"] == 24
    s.commit()
    r.close()
    s.close()
    assert mr.verify_store(str(tmp_path / "s")) == []


_KILLED_CLEARING = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[2])
import mmreplay as mr
from tests._support import internals
s = mr.ReplayStore.open(sys.argv[1], mode="r+")
s.step(0, 1.0, np.full(1, 7, np.uint8), False, False)
internals.killed_in_sampled_change()
s.clear()
"""
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_writer_killed_in_clear_leaves_counts_that_open_not_damage(tmp_path):
    s = _create(tmp_path / "s")
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    r.sample(8)
    r.close()
    s.close()
    child = subprocess.run([sys.executable, "-c", _KILLED_CLEARING, str(tmp_path / "s"), ROOT])
    assert child.returncode == -signal.SIGKILL
    # whatever process comes next takes the counts as they are (no damage): a reader waits for a writer (the
    # killed one had published its cleared store's size), a writer sets them from its last commit
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    with pytest.raises(mr.RateLimitTimeout, match="len.store. is 0, below min_size"):
        r.sample(4)
    s = mr.ReplayStore.open(tmp_path / "s", mode="r+")
    assert len(s) == 20 and s.inspect()["rate_limit"]["inserted"] == 20
    assert len(r.sample(4).index) == 4
    r.close()
    s.commit()
    s.close()
    assert mr.verify_store(str(tmp_path / "s")) == []


def test_a_flipped_inserted_count_is_the_writers_and_is_repaired(tmp_path):
    s = _create(tmp_path / "s")
    _flip(tmp_path / "s", INSERTED, 61)
    s.commit()
    assert s.inspect()["rate_limit"]["inserted"] == 20
    s.close()
    s = mr.ReplayStore.open(tmp_path / "s", mode="r+")
    assert s.inspect()["rate_limit"]["inserted"] == 20
    s.close()


_HOLDER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_a_stopped_lock_holder_delays_commit_and_sample_only_until_the_timeout(tmp_path):
    s = _create(tmp_path / "s", timeout=0.2)
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / "s" / "ratelimit.npy")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        signal.alarm(60)  # a regression fails the test rather than hanging the suite
        with pytest.raises(mr.RateLimitTimeout, match="another process holds.*stopped"):
            s.commit()
        with pytest.raises(mr.RateLimitTimeout, match="another process holds"):
            r.sample(4)
        signal.alarm(0)
        s.step(0, 1.0, np.full(1, 9, np.uint8), False, False)  # still writable: nothing failed on disk
    finally:
        holder.kill()
        holder.wait()
    s.commit()
    r.sample(4)
    assert s.inspect()["rate_limit"]["sampled"] == 4
    r.close()
    s.close()


def test_a_counters_file_recreated_under_running_processes_is_detected(tmp_path):
    s = _create(tmp_path / "s")
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    r.sample(8)
    os.unlink(tmp_path / "s" / "ratelimit.npy")  # the advice followed too early
    r2 = mr.ReplayStore.open(tmp_path / "s", mode="r")  # recreates the file from the last commit
    with pytest.raises(mr.CorruptStoreError, match="deleted or replaced while this store had it open"):
        r.sample(8)
    with pytest.raises(mr.CorruptStoreError, match="deleted or replaced"):
        s.commit()
    r.close()
    r2.close()
    s.close(commit=False)
    s = mr.ReplayStore.open(tmp_path / "s", mode="r+")
    s.commit()
    s.close()
    assert mr.verify_store(str(tmp_path / "s")) == []


def test_the_damage_message_says_to_close_every_process_first(tmp_path):
    _create(tmp_path / "s").close()
    (tmp_path / "s" / "ratelimit.npy").write_bytes(b"garbage")
    with pytest.raises(mr.CorruptStoreError, match="close every process that has the store open, delete the file"):
        mr.ReplayStore.open(tmp_path / "s", mode="r")
