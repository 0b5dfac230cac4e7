"""One kill -9 trial: run ``crash_writer.py``, SIGKILL it, and check what reopens (the store at a commit it
made, a snapshot loaded to the state it was saved at or refused) against an uninterrupted writer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

import mmreplay as mr
from tests._support.crash_writer import CFG, create, drive, replay
from tests._support.helpers import Pair, assert_same
from tests._support.model import ModelStore

WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_writer.py")


def kill_trial(tmp: str, seed: int, delay: float, total: int = 400) -> dict:
    """Run a writer, SIGKILL it after ``delay`` seconds of writing, check everything; return what was seen."""
    path, snap = os.path.join(tmp, "store"), os.path.join(tmp, "snap")
    proc = subprocess.Popen([sys.executable, WRITER, path, snap, str(seed), str(total)], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "R"
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    commits = {0: 0}
    snaps: dict[int, int] = {}
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "C":
            commits[int(rest[0])] = int(rest[1])
        elif kind == "S":
            snaps[int(rest[0])] = int(rest[1])
    store = mr.ReplayStore.open(path)
    gen = store.generation
    assert gen in commits and gen >= max(commits) - 1, (gen, commits)  # the last finished commit or the one in flight
    _check(store, seed, commits[gen], os.path.join(tmp, "replica"))
    # writing continues from the commit, and the next commit is durable
    store.step(0, 0.0, np.zeros(3, np.int32), False, False) if store.episode_open[0] else store.reset(
        np.zeros(3, np.int32))
    store.close()
    mr.ReplayStore.open(path, mode="r").close()
    snapshot_state = "none"
    if os.path.isdir(snap):
        try:
            loaded = mr.ReplayStore.load(snap, os.path.join(tmp, "restored"))
        except mr.NotAStoreError as exc:
            assert "not a complete snapshot" in str(exc)
            snapshot_state = "refused"
        else:
            sg = loaded.generation
            assert sg in snaps, (sg, snaps)
            _check(loaded, seed, snaps[sg], os.path.join(tmp, "replica-snap"))
            loaded.close()
            snapshot_state = "loaded"
    return {"generation": gen, "snapshot": snapshot_state, "finished": "D" in out.split()}


def _check(store: mr.ReplayStore, seed: int, events_written: int, replica_path: str) -> None:
    # priorities and the sampling RNG first (the row checks below sample): those of an uninterrupted
    # writer after the same events
    replica = create(replica_path, seed)
    drive(replica, seed, events_written)
    ids = replica.sampleable_ids()
    np.testing.assert_array_equal(store.sampleable_ids(), ids)
    np.testing.assert_array_equal(store.priorities(ids), replica.priorities(ids))
    assert store.max_priority == replica.max_priority
    if ids.size:
        a, b = store.sample(4), replica.sample(4)
        np.testing.assert_array_equal(a.index, b.index)
        np.testing.assert_array_equal(a.weight, b.weight)
    replica.close()
    model = ModelStore(**CFG)
    replay(model, seed, events_written)
    assert_same(Pair(store, model))
    if events_written:
        np.testing.assert_array_equal(store.current_obs(), model.current_obs())
    assert store.verify() == []
