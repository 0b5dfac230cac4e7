"""A signal turned into an exception half-way through a call that changes the store (Ctrl-C's
``KeyboardInterrupt``, a preemption handler's ``sys.exit()``), then ``close()`` or a ``with`` block's exit:
nothing half-done is committed; the store refuses further use until reopened, and reopens at its last commit,
as after a crash. The interrupt is raised by a trace function at one chosen line of the store's code, where
Python would deliver a signal that arrived there."""

from __future__ import annotations

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.core.index import Index
from mmreplay.core.log import ChunkLog
from mmreplay.core.prefixcrc import PrefixCrc
from mmreplay.sampling.prioritized import PrioritizedSampler
from tests._support.helpers import interrupt_at


def _store(path, prioritized=False, chunk_size=None):
    s = mr.ReplayStore.create(path, capacity=1000, obs_shape=(4,), chunk_size=chunk_size,
                              prioritized=mr.Prioritized() if prioritized else None)
    s.reset(np.zeros(4, np.uint8))
    for t in range(60):
        s.step(0, 1.0, np.full(4, t, np.uint8), False, False)
    s.commit()  # the last commit: 60 transitions
    for t in range(60, 75):
        s.step(0, 1.0, np.full(4, t, np.uint8), False, False)
    return s


def _reopens_at_the_last_commit(path, n=60):
    with mr.ReplayStore.open(path, mode="r") as r:
        assert r.id_range == (0, n)
        assert r.verify() == []
        np.testing.assert_array_equal(r.gather(np.arange(n)).next_obs[:, -1, 0], np.arange(n))
    with mr.ReplayStore.open(path) as s:  # and goes on being written
        s.step(0, 1.0, np.full(4, 99, np.uint8), False, False)
    assert mr.verify_store(str(path)) == []


CASES = {
    # a transition counted by the index before its id (the index's row count moved first)
    "step": (Index.append_row, "self._next_id +=",
             lambda s: s.step(0, 1.0, np.full(4, 200, np.uint8), False, False)),
    # a block spanning a chunk boundary, its first run accounted for
    "extend": (ChunkLog.finish_run, None,
               lambda s: s.extend(np.zeros(40, np.int64), np.ones(40, np.float32),
                                  np.full((40, 4), 7, np.uint8), np.zeros(40, bool), np.zeros(40, bool))),
    # the open chunk's checksums: one column extended, the next not, the rows they cover not recorded
    "commit": (PrefixCrc.extend, "crcs[s] = crc32_rows(", lambda s: s.commit()),
}


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_call_interrupted_half_way_commits_nothing_and_the_store_reopens_at_its_last_commit(tmp_path, case, exc):
    func, line, call = CASES[case]
    hit = 2 if case == "commit" else 1
    with pytest.raises(exc):
        with _store(tmp_path / "s", chunk_size=32) as s:
            with interrupt_at(func, line, hit, exc):
                call(s)
    assert s.closed
    with pytest.raises(mr.StoreClosedError, match=rf"interrupted inside {case}\(\).*reopen"):
        s.sample(4)
    _reopens_at_the_last_commit(tmp_path / "s")


def test_after_an_interrupt_every_call_refuses_until_reopened_and_close_commits_nothing(tmp_path):
    s = _store(tmp_path / "s")
    with pytest.raises(KeyboardInterrupt), interrupt_at(Index.append_row, "self._next_id +="):
        s.step(0, 1.0, np.full(4, 200, np.uint8), False, False)
    for call in (lambda: s.step(0, 1.0, np.zeros(4, np.uint8), False, False), lambda: s.sample(4), s.commit,
                 lambda: s.save(tmp_path / "snap")):
        with pytest.raises(mr.StoreClosedError, match=r"interrupted inside step\(\) \(KeyboardInterrupt\)"):
            call()
    s.close()
    assert not (tmp_path / "snap").exists()
    _reopens_at_the_last_commit(tmp_path / "s")


def test_interrupted_priority_updates_are_not_committed(tmp_path):
    s = _store(tmp_path / "s", prioritized=True)
    ids = np.arange(0, 60, 3)
    # the sum tree set, the max priority not yet raised
    with pytest.raises(KeyboardInterrupt), interrupt_at(PrioritizedSampler.update, "self.max_priority = top"):
        s.update_priorities(ids, np.full(ids.size, 7.0))
    s.close()
    _reopens_at_the_last_commit(tmp_path / "s")


def test_an_interrupt_between_calls_leaves_the_store_whole_and_the_with_exit_commits(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with _store(tmp_path / "s"):
            raise KeyboardInterrupt  # in the user's own code (an env step), not inside a store call
    _reopens_at_the_last_commit(tmp_path / "s", 75)


def test_an_iterator_made_before_the_interrupt_hands_out_nothing_more(tmp_path):
    s = _store(tmp_path / "s")
    it = s.batches(8, prefetch=2)
    next(it)
    with pytest.raises(KeyboardInterrupt), interrupt_at(Index.append_row, "self._next_id +="):
        s.step(0, 1.0, np.full(4, 200, np.uint8), False, False)
    with pytest.raises(mr.StoreClosedError, match=r"interrupted inside step\(\)"):
        next(it)
    s.close()
    _reopens_at_the_last_commit(tmp_path / "s")


def test_an_interrupted_update_of_the_sampleable_transitions_leaves_the_store_unusable(tmp_path):
    """A reading call updates which transitions are sampleable (index first, then the sampler): interrupted in
    between, the index counts transitions the priorities do not hold, which a commit would record."""
    s = _store(tmp_path / "s", prioritized=True)
    with pytest.raises(KeyboardInterrupt), interrupt_at(PrioritizedSampler.added, None):
        s.sample(4)
    with pytest.raises(mr.StoreClosedError, match="interrupted inside an update of the sampleable transitions"):
        len(s.sample(4))
    s.close()
    _reopens_at_the_last_commit(tmp_path / "s")


def test_a_reader_interrupted_while_refreshing_must_be_reopened(tmp_path):
    from mmreplay.store import ReplayStore

    s = _store(tmp_path / "s")
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    s.commit()
    with pytest.raises(KeyboardInterrupt), interrupt_at(ReplayStore._attach, "self._reader = FrameReader("):
        r.refresh()
    with pytest.raises(mr.StoreClosedError, match=r"interrupted inside refresh\(\)"):
        r.sample(4)
    r.close()
    s.close()
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as r:
        assert r.id_range == (0, 75) and len(r.sample(4).index) == 4
