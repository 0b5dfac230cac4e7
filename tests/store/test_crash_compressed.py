"""Kill -9 while a chunk is being compressed: the last commit opens with the same rows, and the next writer
deletes what the crash left (a half-written or unlisted compressed file, an unneeded raw frame file)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import mmreplay as mr
from tests._support.compression import assert_same_rows, drive
from tests._support.crash_compress_writer import KW
from tests._support.crash_trial import kill_trial

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_support")


def _listed_files(path: str) -> set[str]:
    with open(os.path.join(path, "manifest.json")) as f:
        chunks = json.load(f)["chunks"]
    cols = ("action", "reward", "flags")
    return {f"{c['name']}.{col}.npy" for c in chunks for col in cols} | {
        f"{c['name']}.obs.lz4" if c.get("frames") else f"{c['name']}.obs.npy" for c in chunks}


@pytest.mark.parametrize("moment,generation", [("write", 1), ("rename", 1), ("delete", 2)])
def test_kill_during_compression(tmp_path, moment, generation):
    path = str(tmp_path / "s")
    proc = subprocess.Popen([sys.executable, os.path.join(SUPPORT, "crash_compress_writer.py"), path, moment],
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line.strip())
        if line.strip() == "M":
            break
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert seen[-1] == "M" and seen.count("C") >= generation, seen  # "C": a commit was about to start
    leftovers = set(os.listdir(os.path.join(path, "chunks"))) - _listed_files(path)
    assert leftovers  # the crash left something behind: a .tmp, an unlisted .obs.lz4 or a raw file
    replica = mr.ReplayStore.create(tmp_path / "raw", compression=None, **KW)
    drive([replica], 30, 9)
    if generation == 2:
        drive([replica], 40, 10, reset=False)
    with mr.ReplayStore.open(path) as store:  # the next writer
        assert store.generation == generation
        assert set(os.listdir(os.path.join(path, "chunks"))) == _listed_files(path)
        assert_same_rows(store, replica)
        drive([store, replica], 50, 11, reset=False)  # writing (and compressing) goes on
        assert_same_rows(store, replica)
    replica.close()
    assert mr.verify_store(path) == []


@pytest.mark.parametrize("trial", range(6))
def test_sigkill_at_random_moments_with_compression(tmp_path, monkeypatch, trial):
    """The crash test of test_crash.py (``crash_trial.kill_trial``) with every sealed chunk compressed (its
    frames are int32: the codec takes any dtype)."""
    monkeypatch.setenv("MMREPLAY_CRASH_COMPRESSION", "lz4")
    rng = np.random.default_rng(100 + trial)
    kill_trial(str(tmp_path), seed=trial, delay=float(rng.uniform(0.0, 0.35)))
    with mr.ReplayStore.open(tmp_path / "store", mode="r") as s:
        assert s.compression == "lz4"
        assert s.inspect()["compressed_chunks"] or s.id_range[1] < 30
