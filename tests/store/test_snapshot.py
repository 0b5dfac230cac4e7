"""save()/load(): consistent snapshots while training goes on, exact resume, atomic replacement, retention."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

import mmreplay as mr

PRIO = mr.Prioritized(alpha=0.6, beta=0.4)


class Run:
    """A deterministic add/sample/update_priorities loop that records every batch."""

    def __init__(self, store: mr.ReplayStore, seed: int) -> None:
        self.store = store
        self.rng = np.random.default_rng(seed)
        self.t = 0

    def steps(self, n: int) -> list[mr.Batch]:
        s, out = self.store, []
        for _ in range(n):
            self.t += 1
            if not _open(s):
                s.reset(np.full(4, -self.t, np.int32))
            end = self.rng.random() < 0.03
            s.step(int(self.rng.integers(4)), float(self.rng.integers(-1, 2)), np.full(4, self.t, np.int32), end,
                   False, lp=np.float32(self.rng.standard_normal()))
            if self.t % 4 == 0 and len(s) > 0:
                b = s.sample(16)
                out.append(b)
                if s.schema.prioritized is not None:
                    s.update_priorities(b.index, self.rng.random(16) * 2)
        return out


def _open(s: mr.ReplayStore) -> bool:
    return bool(s.episode_open[0])


def _new(path, prio=PRIO, capacity=200, chunk_size=32):
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(4,), obs_dtype="int32", stack=3, n_step=3,
                              chunk_size=chunk_size, prioritized=prio, extras={"lp": ((), "float32")}, seed=9)
    s.reset(np.zeros(4, np.int32))
    return s


def _same_batches(xs: list[mr.Batch], ys: list[mr.Batch]) -> None:
    assert len(xs) == len(ys) > 0
    for a, b in zip(xs, ys, strict=True):
        for name in ("index", "obs", "next_obs", "action", "reward", "discount", "terminated", "weight"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        np.testing.assert_array_equal(a.extras["lp"], b.extras["lp"])


@pytest.mark.parametrize("prio", [None, PRIO])
def test_exact_resume_from_a_snapshot(tmp_path, prio):
    s = _new(tmp_path / "live", prio)
    run = Run(s, 1)
    run.steps(700)
    snap = s.save(tmp_path / "snap")
    rng_state = run.rng.bit_generator.state
    t = run.t
    after = run.steps(400)  # the uninterrupted run goes on
    s.close()
    r = mr.ReplayStore.load(snap, tmp_path / "restored")
    run2 = Run(r, 0)
    run2.rng.bit_generator.state = rng_state
    run2.t = t
    _same_batches(after, run2.steps(400))
    r.close()


def test_snapshot_links_sealed_chunks_and_costs_one_chunk(tmp_path):
    s = _new(tmp_path / "live", None, capacity=300)
    Run(s, 2).steps(600)
    snap = s.save(tmp_path / "snap")
    names = [f for f in os.listdir(os.path.join(snap, "chunks")) if f.endswith(".obs.npy")]
    linked = copied = 0
    for name in names:
        a = os.path.join(snap, "chunks", name)
        b = os.path.join(s.path, "chunks", name)
        if os.path.exists(b) and os.path.samefile(a, b):
            linked += 1
        else:
            copied += 1
    assert copied == 1 and linked >= 5  # only the open chunk is copied
    s.close()


def test_save_while_training_then_replace_atomically(tmp_path):
    s = _new(tmp_path / "live")
    run = Run(s, 3)
    run.steps(300)
    s.save(tmp_path / "snap")
    first = mr.ReplayStore.open(tmp_path / "snap", mode="r")  # a snapshot opens read-only as a store
    ids1 = first.id_range
    first.close()
    run.steps(300)
    # a second save into the same directory writes a new generation beside the old one
    real_write = mr.core.durability.write_manifest
    calls = []

    def failing_write(*a, **k):
        calls.append(a[0])
        raise OSError(errno.EIO, "injected failure while switching the snapshot")

    mr.core.durability.write_manifest = failing_write
    try:
        with pytest.raises(OSError, match="injected"):
            s.save(tmp_path / "snap")
    finally:
        mr.core.durability.write_manifest = real_write
    with mr.ReplayStore.open(tmp_path / "snap", mode="r") as still_old:
        assert still_old.id_range == ids1  # the old snapshot is intact and loadable
    s.save(tmp_path / "snap")
    with mr.ReplayStore.open(tmp_path / "snap", mode="r") as new:
        assert new.id_range == s.id_range != ids1
        assert new.verify() == []
    s.close()


def test_keep_prunes_older_snapshots_only(tmp_path):
    s = _new(tmp_path / "live", None)
    run = Run(s, 4)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "replay-notes").mkdir()  # not a snapshot: never removed
    for i in range(5):
        run.steps(60)
        s.save(tmp_path / "ckpt" / f"replay-{i:04d}", keep=2)
    left = sorted(os.listdir(tmp_path / "ckpt"))
    assert left == ["replay-0003", "replay-0004", "replay-notes"]
    removed = mr.prune_snapshots(str(tmp_path / "ckpt" / "replay-"), keep=1)
    assert [os.path.basename(r) for r in removed] == ["replay-0003"]
    with pytest.raises(ValueError, match="keep"):
        s.save(tmp_path / "ckpt" / "x", keep=0)
    s.close()


def test_load_errors(tmp_path):
    s = _new(tmp_path / "live", None)
    Run(s, 5).steps(100)
    snap = s.save(tmp_path / "snap")
    s.close()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        mr.ReplayStore.load(snap, tmp_path / "busy")
    assert os.listdir(tmp_path / "busy") == ["x"]
    with pytest.raises(mr.NotAStoreError, match="not a snapshot"):
        mr.ReplayStore.load(tmp_path / "live", tmp_path / "x1")  # a store is not a snapshot
    os.unlink(os.path.join(snap, "manifest.json"))  # as if the first save had been interrupted
    with pytest.raises(mr.NotAStoreError, match="not a complete snapshot"):
        mr.ReplayStore.load(snap, tmp_path / "x2")
    assert not (tmp_path / "x2").exists()
    with pytest.raises(mr.StoreNotFoundError):
        mr.ReplayStore.load(tmp_path / "nope", tmp_path / "x3")


def test_snapshot_across_filesystems_copies(tmp_path, monkeypatch):
    s = _new(tmp_path / "live", PRIO)
    run = Run(s, 6)
    run.steps(300)

    def no_link(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    snap = s.save(tmp_path / "snap")
    r = mr.ReplayStore.load(snap, tmp_path / "restored")
    assert r.id_range == s.id_range
    ok = s.sampleable_ids()
    np.testing.assert_array_equal(r.gather(ok).obs, s.gather(ok).obs)
    np.testing.assert_array_equal(r.priorities(ok), s.priorities(ok))
    r.close()
    s.close()



def test_loaded_store_writes_do_not_touch_the_snapshot(tmp_path):
    s = _new(tmp_path / "live", None)
    Run(s, 7).steps(200)
    snap = s.save(tmp_path / "snap")
    s.close()
    before = mr.verify_store(snap)
    r = mr.ReplayStore.load(snap, tmp_path / "restored")
    Run(r, 8).steps(400)  # fills the copied open chunk and retires linked ones
    r.close()
    assert before == [] and mr.verify_store(snap) == []
    assert mr.ReplayStore.load(snap, tmp_path / "again").id_range[1] < 300


def test_a_failed_save_over_another_stores_snapshot_leaves_it_whole(tmp_path, monkeypatch):
    # the two stores' sealed chunks have the same names and other contents: the new one's may not replace the
    # old one's until the new manifest is written
    def make(path, base):
        s = mr.ReplayStore.create(path, capacity=40, obs_shape=(4,), chunk_size=8, compression=None)
        s.reset(np.zeros(4, np.uint8))
        for i in range(12):
            s.step(0, float(base + i), np.full(4, base + i, np.uint8), False, False)
        return s

    a, b = make(tmp_path / "a", 0), make(tmp_path / "b", 100)
    snap = a.save(tmp_path / "snap")
    rows_a = a.gather(a.sampleable_ids())
    a.close()
    real = mr.core.snapshot.copy_file

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mr.core.snapshot, "copy_file", full)  # the open chunk's copy, after the sealed links
    with pytest.raises(mr.StoreIOError, match="No space left"):
        b.save(snap)
    monkeypatch.setattr(mr.core.snapshot, "copy_file", real)
    assert mr.verify_store(snap) == []
    with mr.ReplayStore.load(snap, tmp_path / "old") as old:
        np.testing.assert_array_equal(old.gather(old.sampleable_ids()).obs, rows_a.obs)
    b.close(commit=False)
    b = mr.ReplayStore.open(tmp_path / "b")  # (read-only after the disk error: reopened)
    b.save(snap)  # this time it completes, and replaces A's snapshot
    rows_b = b.gather(b.sampleable_ids())
    b.close()
    assert mr.verify_store(snap) == []
    with mr.ReplayStore.load(snap, tmp_path / "new") as new:
        np.testing.assert_array_equal(new.gather(new.sampleable_ids()).obs, rows_b.obs)
        np.testing.assert_array_equal(new.gather(new.sampleable_ids()).reward, rows_b.reward)


def test_a_snapshot_opens_read_only_and_a_write_open_is_refused(tmp_path):
    s = _new(tmp_path / "live", None)
    Run(s, 5).steps(100)
    snap = s.save(tmp_path / "snap")
    s.close()
    with pytest.raises(mr.ReadOnlyStoreError, match="is a snapshot.*mode='r'.*ReplayStore.load"):
        mr.ReplayStore.open(snap)  # (mode="r+": its close() would commit it as a plain store)
    with mr.ReplayStore.open(snap, mode="r") as r:
        assert len(r) > 0
    assert mr.verify_store(snap) == []
    with mr.ReplayStore.load(snap, tmp_path / "resumed") as again:  # still a snapshot
        assert len(again) > 0


def test_a_reader_whose_commit_the_writer_moved_past_is_told_to_refresh(tmp_path):
    w = mr.ReplayStore.create(tmp_path / "s", capacity=40, obs_shape=(16, 16), chunk_size=16, compression="lz4")
    w.reset(np.zeros((16, 16), np.uint8))
    for i in range(40):
        w.step(0, float(i), np.full((16, 16), i, np.uint8), False, False)
        if i == 29:
            w.commit()
            r = mr.ReplayStore.open(tmp_path / "s", mode="r")  # its open chunk is sealed (compressed) next
    w.commit()  # ... which removes the raw frames file the reader's commit lists
    with pytest.raises(mr.StoreIOError, match=r"removed by a later commit of the writer; refresh\(\) this reader"):
        r.save(tmp_path / "snap")
    assert not (tmp_path / "snap").exists()
    r.refresh()
    snap = r.save(tmp_path / "snap")  # not turned read-only: the error was not the disk's
    rows = r.gather(r.sampleable_ids())
    r.close()
    w.close()
    with mr.ReplayStore.load(snap, tmp_path / "back") as b:
        np.testing.assert_array_equal(b.gather(b.sampleable_ids()).obs, rows.obs)


def test_a_failed_save_never_replaces_a_file_whose_name_carries_a_generation(tmp_path, monkeypatch):
    # B and C are loaded from one snapshot: their former open chunk, named ...g000002, seals with other data in
    # each. C's snapshot lists it under that name; B's save into the same directory may not replace it
    def one(v):
        return np.full(1, v, np.uint8)

    a = mr.ReplayStore.create(tmp_path / "a", capacity=64, obs_shape=(1,), chunk_size=8)
    a.reset(one(0))
    for _ in range(3):
        a.step(0, 0.0, one(1), False, False)
    a.save(tmp_path / "x")
    a.step(0, 0.0, one(1), False, False)
    x = a.save(tmp_path / "x")  # generation 2: the open chunk is copied as ...g000002
    a.close()
    b, c = mr.ReplayStore.load(x, tmp_path / "b"), mr.ReplayStore.load(x, tmp_path / "c")
    for store, v in ((b, 7), (c, 9)):
        for _ in range(10):
            store.step(0, 0.0, one(v), False, False)
    snap = c.save(tmp_path / "s")
    real = mr.core.durability.write_manifest

    def full(target, body):
        if os.path.abspath(target) == snap:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(target, body)

    monkeypatch.setattr(mr.core.durability, "write_manifest", full)
    with pytest.raises(mr.StoreIOError, match="No space left"):
        b.save(snap)
    monkeypatch.undo()
    assert mr.verify_store(snap) == []
    rows_c = c.gather(c.sampleable_ids())
    with mr.ReplayStore.load(snap, tmp_path / "back") as back:
        np.testing.assert_array_equal(back.gather(back.sampleable_ids()).obs, rows_c.obs)
    b.close(commit=False)
    c.close()
