"""A careless or hostile caller of the store: every call is refused with a clear error or succeeds, the
store stays usable and its committed data intact, and resources are released."""

from __future__ import annotations

import errno
import gc
import os

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.core import durability, snapshot
from mmreplay.storage import lock


def _store(path, prioritized=None, steps=60, **kw):
    s = mr.ReplayStore.create(path, capacity=200, obs_shape=(4,), chunk_size=16, prioritized=prioritized, **kw)
    s.reset(np.zeros(4, np.uint8))
    for t in range(steps):
        s.step(t % 3, 1.0, np.full(4, t % 250, np.uint8), t % 20 == 19, False)
        if t % 20 == 19:
            s.reset(np.zeros(4, np.uint8))
    return s


def _mappings_of(path) -> int:
    with open("/proc/self/maps") as f:
        return sum(str(path) in line for line in f)


def test_a_dropped_store_releases_its_mappings_and_lock(tmp_path):
    s = _store(tmp_path / "s")
    s.commit()
    assert _mappings_of(tmp_path / "s") > 0
    del s
    gc.collect()
    assert _mappings_of(tmp_path / "s") == 0
    with mr.ReplayStore.open(tmp_path / "s") as again:  # the writer lock went with it
        assert len(again) > 0


def test_save_on_a_full_disk_leaves_no_partial_snapshot_and_turns_the_store_read_only(tmp_path, monkeypatch):
    s = _store(tmp_path / "s")
    s.save(tmp_path / "old")
    before = sorted(os.listdir(tmp_path / "old" / "chunks"))
    ids = s.sampleable_ids()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snapshot, "copy_file", full)
    for target in ("new", "old"):
        with pytest.raises(mr.StoreIOError, match="saving a snapshot .* free space"):
            s.save(tmp_path / target)
    monkeypatch.undo()
    assert not (tmp_path / "new").exists()  # a new directory is removed whole
    assert sorted(os.listdir(tmp_path / "old" / "chunks")) == before  # the old snapshot is untouched
    with mr.ReplayStore.open(tmp_path / "old", mode="r") as old:
        np.testing.assert_array_equal(old.sampleable_ids(), ids)
    with pytest.raises(mr.ReadOnlyStoreError, match="free space"):
        s.step(0, 0.0, np.zeros(4, np.uint8), False, False)
    assert len(s.sample(4)) == 4  # sampling still works
    s.close()


def test_a_failed_create_leaves_nothing_so_a_retry_works(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(durability, "write_manifest", broken)
    with pytest.raises(OSError, match="injected"):
        mr.ReplayStore.create(tmp_path / "s", capacity=10, obs_shape=(2,))
    assert not (tmp_path / "s").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(OSError, match="injected"):
        mr.ReplayStore.create(tmp_path / "empty", capacity=10, obs_shape=(2,))
    assert os.listdir(tmp_path / "empty") == []
    monkeypatch.undo()
    mr.ReplayStore.create(tmp_path / "s", capacity=10, obs_shape=(2,)).close()


@pytest.mark.parametrize("reward, exc, words", [
    (1e39, ValueError, "overflows float32"),
    (-1e39, ValueError, "overflows float32"),
    ("1.0", TypeError, "expected a real number"),
    (np.array([1.0, 2.0]), TypeError, "expected a real number"),
])
def test_rewards_that_cannot_be_stored_are_refused(tmp_path, reward, exc, words):
    s = _store(tmp_path / "s", steps=5)
    n = s.id_range[1]
    with pytest.raises(exc, match=words):
        s.step(0, reward, np.zeros(4, np.uint8), False, False)
    assert s.id_range[1] == n
    s.step(0, 3.4e38, np.zeros(4, np.uint8), False, False)  # the largest float32 is fine
    s.close()


def test_batched_rewards_that_overflow_are_refused(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "v", capacity=50, obs_shape=(2,), num_envs=2, chunk_size=8)
    s.reset(np.zeros((2, 2), np.uint8))
    with pytest.raises(ValueError, match="env 1 overflows float32"):
        s.step(np.zeros(2, int), np.array([0.0, 1e39]), np.zeros((2, 2), np.uint8), np.zeros(2, bool),
               np.zeros(2, bool))
    assert s.id_range == (0, 0)
    s.close()


def test_an_array_flag_on_a_single_env_store_says_so(tmp_path):
    s = _store(tmp_path / "s", steps=3)
    with pytest.raises(ValueError, match="expected one bool .* num_envs"):
        s.step(0, 0.0, np.zeros(4, np.uint8), np.array([True, False]), False)
    s.close()


def test_absurd_batch_sizes_are_refused_before_the_rng_moves(tmp_path):
    s = _store(tmp_path / "s")
    rng = s.inspect()["rng"]
    with pytest.raises(ValueError, match="batch_size=1000000000000 needs .* ask for fewer rows"):
        s.sample(10**12)
    with pytest.raises(ValueError, match="ask for fewer rows"):
        s.batches(10**12)
    assert s.inspect()["rng"] == rng
    s.close()


def test_ids_that_are_not_ids(tmp_path):
    s = _store(tmp_path / "s")
    with pytest.raises(ValueError, match=r"index\[0\] = 18446744073709551615 is not a transition id"):
        s.gather(np.array([2**64 - 1], np.uint64))
    with pytest.raises(mr.NotSampleableError, match=r"-5 is not a transition id"):
        s.gather([-5])
    s.close()


def test_negative_zero_priority_is_zero(tmp_path):
    s = _store(tmp_path / "s", prioritized=mr.Prioritized())
    ids = s.sampleable_ids()[:2]
    s.update_priorities(ids, np.array([-0.0, 1.0]))
    np.testing.assert_array_equal(s.priorities(ids), [0.0, 1.0])
    s.close()


def test_opening_for_writing_where_nothing_can_be_written_says_to_read(tmp_path, monkeypatch):
    _store(tmp_path / "s").close()
    real = os.open

    def read_only_fs(path, flags, *a, **k):
        if str(path).endswith(lock.LOCK):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", read_only_fs)
    with pytest.raises(mr.ReadOnlyStoreError, match="mode='r'"):
        mr.ReplayStore.open(tmp_path / "s", mode="r+")
    monkeypatch.undo()
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as r:
        assert len(r) > 0


def test_damaged_priority_state_files_are_named_by_verify(tmp_path):
    s = _store(tmp_path / "s", prioritized=mr.Prioritized())
    s.update_priorities(s.sampleable_ids()[:3], np.array([2.0, 3.0, 4.0]))
    s.commit()
    s.update_priorities(s.sampleable_ids()[:1], np.array([5.0]))
    s.commit()  # a delta file on top of the full one
    state = s.inspect()["priority_state"]
    s.close()
    assert mr.verify_store(str(tmp_path / "s")) == []
    for rel in (state["file"], state["deltas"][-1]):
        path = tmp_path / "s" / rel
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x40  # one bit of one priority
        path.write_bytes(bytes(data))
        problems = mr.verify_store(str(tmp_path / "s"))
        assert any(os.path.basename(rel) in p and "checksum" in p for p in problems), problems
        data[-3] ^= 0x40
        path.write_bytes(bytes(data))
    assert mr.verify_store(str(tmp_path / "s")) == []
