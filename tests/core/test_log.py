"""The chunk log on its own: rows into chunks, sealing, retirement, growth, reopening, strays."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from mmreplay.core.log import ChunkLog
from mmreplay.core.restore import open_log
from mmreplay.errors import CorruptStoreError
from mmreplay.options import Schema, initial_positions
from mmreplay.storage.ring import chunk_file, chunk_name


class Listener:
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def before_unmap(self) -> None:
        self.events.append(("unmap", None))

    def slots_cleared(self, slots: np.ndarray) -> None:
        self.events.append(("cleared", slots))

    def ring_resized(self, size: int, moves: list[tuple[slice, slice]]) -> None:
        self.events.append(("resized", size))


def _log(tmp_path, capacity=20, chunk_size=8, stack=1) -> tuple[ChunkLog, Listener]:
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "chunks"), exist_ok=True)
    schema = Schema.build(capacity=capacity, obs_shape=(2,), obs_dtype="int32", stack=stack, chunk_size=chunk_size)
    listener = Listener()
    return ChunkLog(root, schema, True, initial_positions(schema), listener), listener


def _write_rows(log: ChunkLog, n: int, start_every: int = 0) -> None:
    """Rows of one stream: a START first (and every ``start_every`` rows), transitions otherwise."""
    for _ in range(n):
        slot = log.prepare_row()
        row = int(log.rows[0])
        start = row == 0 or (start_every and row % start_every == 0)
        log.write_frame(slot, np.array([row, 0], np.int32))
        log.ring.arrays["flags"][slot] = 1 if start else 0
        if start:
            log.index.note_frames(np.array([slot]), np.array([1], np.uint8), np.zeros(1, np.int32), np.array([-1]))
        else:
            log.index.note_frame(slot, 0, 1, log.next_id)
        log.finish_row(0 if start else 1)


def test_full_chunks_are_sealed_read_only_with_checksums(tmp_path):
    log, _ = _log(tmp_path)
    _write_rows(log, 20)
    log.wait_sealed()
    sealed = [c for c in log.chunks if c.sealed]
    assert [c.seq for c in sealed] == [0, 1] and not log.chunks[-1].sealed
    for col in ("obs", "flags"):
        path = chunk_file(str(tmp_path), sealed[0].name, col)
        assert not os.stat(path).st_mode & stat.S_IWUSR
        assert sealed[0].crc32 is not None and col in sealed[0].crc32
    np.testing.assert_array_equal(np.load(chunk_file(str(tmp_path), sealed[0].name, "obs"))[:, 0], np.arange(8))
    log.close()


def test_retirement_keeps_capacity_and_tells_the_listener(tmp_path):
    log, listener = _log(tmp_path, capacity=10, chunk_size=4)
    _write_rows(log, 40)
    kinds = [k for k, _ in listener.events]
    assert "cleared" in kinds and kinds.index("unmap") < kinds.index("cleared")
    assert log.next_id - log.oldest_id >= 10  # at least capacity transitions retained
    # ...and the oldest chunk was needed when the open one was started: without it there were fewer
    assert log.retained_tx - log.chunks[0].n_transitions - log.chunks[-1].n_transitions - 1 < 10
    log.close()


def test_a_retired_chunk_no_commit_listed_is_deleted_in_the_background(tmp_path):
    log, _ = _log(tmp_path, capacity=10, chunk_size=4)
    _write_rows(log, 40)
    log.wait_sealed()  # (the sealer thread unlinks them; wait_sealed, and so close, waits for that)
    first = log.chunks[0].seq
    assert first > 0
    retired = {chunk_name(seq) for seq in range(first)}
    left = [f for f in os.listdir(tmp_path / "chunks") if f.split(".")[0] in retired]
    assert left == []
    log.close()


def test_the_ring_grows_when_chunks_hold_few_transitions(tmp_path):
    log, listener = _log(tmp_path, capacity=10, chunk_size=4)
    positions = log.ring.positions
    _write_rows(log, 60, start_every=2)  # every other row starts an episode: chunks hold 2 transitions
    assert log.ring.positions > positions
    assert ("resized", log.index.size) in listener.events
    log.close()


def test_reopening_from_the_manifest_body_rebuilds_the_index(tmp_path):
    log, _ = _log(tmp_path, capacity=12, chunk_size=4)
    _write_rows(log, 30, start_every=7)
    log.sync_open_chunk()
    body = log.manifest_body()
    log.index.update_validity()
    want = log.index.valid_ids()
    log.after_commit()
    log.close()
    again = open_log(str(tmp_path), log.schema, body, False, Listener())
    again.index.update_validity()
    np.testing.assert_array_equal(again.index.valid_ids(), want)
    assert (again.oldest_id, again.next_id) == (log.oldest_id, log.next_id)
    again.close()
    bad = dict(body, next_id=body["next_id"] + 1)
    with pytest.raises(CorruptStoreError, match="flags columns hold"):
        open_log(str(tmp_path), log.schema, bad, False, Listener())


def test_unlisted_files_are_strays(tmp_path):
    log, _ = _log(tmp_path)
    _write_rows(log, 3)
    stray = tmp_path / "chunks" / "000000000077.obs.npy"
    stray.write_bytes(b"left over by a crashed run")
    log.remove_strays()
    assert not stray.exists()
    assert os.path.exists(chunk_file(str(tmp_path), log.chunks[0].name, "obs"))
    log.close()


def test_a_retired_chunk_listed_by_the_last_commit_is_deleted_by_the_next(tmp_path):
    log, _ = _log(tmp_path, capacity=4, chunk_size=4)
    _write_rows(log, 8)
    log.sync_open_chunk()
    log.after_commit()  # a commit now lists chunks 0 and 1
    _write_rows(log, 12)  # chunk 0 retires
    first = chunk_file(str(tmp_path), "000000000000", "obs")
    assert os.path.exists(first)  # the last commit still needs it
    log.sync_open_chunk()
    log.after_commit()
    assert not os.path.exists(first)
    log.close()
