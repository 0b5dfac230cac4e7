"""save(keep=N) and prune_snapshots remove only snapshots save() made under the same name pattern and,
from save(), only snapshots of the same store (issue 12, item 2)."""

from __future__ import annotations

import os
import time

import pytest

import mmreplay as mr
from mmreplay.core import snapshot
from tests._support.hostile import fill, forge


@pytest.fixture
def store(tmp_path):
    fill(tmp_path / "a").close()
    return str(tmp_path / "a")


def test_keep_never_removes_differently_named_siblings(tmp_path, store):
    """``save("ckpt/b", keep=1)`` deleted the siblings below: they start with "b" but are not b<digits>."""
    s = mr.ReplayStore.open(store)
    ckpt = tmp_path / "ckpt"
    for name in ("baseline", "best-model-replay", "best_run_2023", "b7"):
        s.save(ckpt / name)
        time.sleep(0.01)
    s.save(ckpt / "b", keep=1)
    assert sorted(os.listdir(ckpt)) == ["b", "baseline", "best-model-replay", "best_run_2023"]  # b7 was older
    s.save(ckpt / "b12", keep=2)
    assert sorted(os.listdir(ckpt)) == ["b", "b12", "baseline", "best-model-replay", "best_run_2023"]
    s.close()


def _other_store_snapshot(tmp_path, name):
    o = fill(tmp_path / "other", steps=30, prio=None)
    o.save(name)
    o.close()


def test_prune_siblings_keeps_other_stores_snapshots(tmp_path, store):
    s = mr.ReplayStore.open(store)
    ckpt = tmp_path / "ckpt"
    s.save(ckpt / "replay-0001")
    time.sleep(0.01)
    _other_store_snapshot(tmp_path, ckpt / "replay-0002")  # another run writing the same pattern
    time.sleep(0.01)
    s.save(ckpt / "replay-0003")
    time.sleep(0.01)
    s.save(ckpt / "replay-0004")
    removed = snapshot.prune_siblings(str(ckpt / "replay-0004"), keep=1)
    assert sorted(os.path.basename(r) for r in removed) == ["replay-0001", "replay-0003"]
    assert sorted(os.listdir(ckpt)) == ["replay-0002", "replay-0004"]
    # prune_snapshots without of= considers every snapshot of the pattern; of= restricts it
    assert mr.prune_snapshots(str(ckpt / "replay-"), keep=1, of=store) == []
    s.close()


def test_save_keep_keeps_other_stores_snapshots(tmp_path, store):
    s = mr.ReplayStore.open(store)
    ckpt = tmp_path / "ckpt"
    _other_store_snapshot(tmp_path, ckpt / "replay-0001")
    time.sleep(0.01)
    s.save(ckpt / "replay-0002", keep=1)
    assert sorted(os.listdir(ckpt)) == ["replay-0001", "replay-0002"]
    s.close()


def test_prune_leaves_forged_and_foreign_directories_alone(tmp_path, store):
    s = mr.ReplayStore.open(store)
    ckpt = tmp_path / "ckpt"
    s.save(ckpt / "r1")
    forge(ckpt / "r1", lambda d: d["chunks"][0].update(name="../../x"))  # not a snapshot we can trust
    (ckpt / "r2").mkdir()
    (ckpt / "r2" / "notes.txt").write_text("mine")
    os.symlink(ckpt / "r1", ckpt / "r3")
    time.sleep(0.01)
    s.save(ckpt / "r4")
    assert mr.prune_snapshots(str(ckpt / "r"), keep=1) == []
    assert sorted(os.listdir(ckpt)) == ["r1", "r2", "r3", "r4"]
    s.close()


