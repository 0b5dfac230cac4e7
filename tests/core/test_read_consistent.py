"""``read_consistent``: a reader attaching to a manifest whose chunks a newer commit retired tries again, as
long as each failure met a newer commit (not a fixed number of times), and real damage is reported at once."""

from __future__ import annotations

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.core import durability
from mmreplay.core.durability import read_consistent
from mmreplay.storage.manifest import read_manifest


@pytest.fixture
def writer(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(2,), chunk_size=16)
    s.reset(np.zeros(2, np.uint8))
    s.step(0, 0.0, np.zeros(2, np.uint8), False, False)
    s.commit()
    yield s
    s.close()


def test_a_reader_overtaken_by_many_commits_in_a_row_attaches_once_they_pause(writer):
    seen = []

    def attach(manifest):
        seen.append(manifest["generation"])
        if len(seen) <= 12:  # each attempt overtaken by a commit retiring what it maps
            writer.step(0, 0.0, np.zeros(2, np.uint8), False, False)
            writer.commit()
            raise mr.CorruptStoreError("chunks/x.obs.npy: chunk file is missing")
        return "attached"

    assert read_consistent(writer.path, attach, writer=False) == "attached"
    assert seen == list(range(seen[0], seen[0] + 13))  # a fresh manifest each time


def test_damage_without_a_newer_commit_is_reported_at_once_and_a_writer_never_retries(writer):
    calls = []

    def damaged(manifest):
        calls.append(1)
        raise mr.CorruptStoreError("chunks/x.obs.npy: damaged")

    with pytest.raises(mr.CorruptStoreError, match="damaged$"):
        read_consistent(writer.path, damaged, writer=False)
    assert len(calls) == 1

    def overtaken(manifest):
        calls.append(1)
        writer.commit()
        raise mr.CorruptStoreError("chunks/x.obs.npy: chunk file is missing")

    calls.clear()
    with pytest.raises(mr.CorruptStoreError, match="missing$"):
        read_consistent(writer.path, overtaken, writer=True)
    assert len(calls) == 1


def test_a_writer_that_never_pauses_is_named_after_the_patience_runs_out(writer, monkeypatch):
    monkeypatch.setattr(durability, "READ_PATIENCE", 0.02)
    before = read_manifest(writer.path)["generation"]

    def overtaken(manifest):
        writer.commit()
        raise mr.CorruptStoreError("chunks/x.obs.npy: chunk file is missing")

    with pytest.raises(mr.CorruptStoreError, match=r"missing\. The store may be intact: its writer committed \d+ times"
                                                   r" \(generations " + str(before)):
        read_consistent(writer.path, overtaken, writer=False)
