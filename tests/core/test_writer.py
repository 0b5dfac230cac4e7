"""The episode writer on its own: reset/step rules, autoreset, importers' hooks, resuming its state."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mmreplay._inputs import Inputs
from mmreplay.core.log import ChunkLog
from mmreplay.core.writer import EpisodeWriter
from mmreplay.errors import EpisodeStateError
from mmreplay.options import Schema, initial_positions


class _Quiet:
    def before_unmap(self) -> None:
        pass

    def slots_cleared(self, slots: np.ndarray) -> None:
        pass

    def ring_resized(self, size: int, moves: list[tuple[slice, slice]]) -> None:
        pass


def _writer(tmp_path, num_envs=1, **kw) -> tuple[EpisodeWriter, ChunkLog]:
    os.makedirs(tmp_path / "chunks", exist_ok=True)
    schema = Schema.build(capacity=50, obs_shape=(2,), obs_dtype="int32", chunk_size=8 * num_envs,
                          num_envs=num_envs, **kw)
    log = ChunkLog(str(tmp_path), schema, True, initial_positions(schema), _Quiet())
    return EpisodeWriter(schema, log, Inputs(schema)), log


def _obs(t, n=None):
    return np.array([t, 0], np.int32) if n is None else np.stack([np.array([t, s], np.int32) for s in range(n)])


def test_episode_rules_of_one_stream(tmp_path):
    w, log = _writer(tmp_path)
    with pytest.raises(EpisodeStateError, match="reset"):
        w.step(0, 0.0, _obs(1), False, False, {})
    assert not w.episode_open[0]
    w.reset(_obs(0))
    assert w.episode_open[0]
    w.step(1, 1.0, _obs(1), True, True, {})  # both flags: terminated wins
    assert not w.episode_open[0]
    with pytest.raises(EpisodeStateError, match="after the episode ended"):
        w.step(0, 0.0, _obs(2), False, False, {})
    table = log.index.episodes(log.ring.arrays["reward"])
    assert table.terminated.tolist() == [True] and table.truncated.tolist() == [False]
    w.reset(_obs(3))
    w.step(0, 0.0, _obs(4), False, False, {})
    w.reset(_obs(5))  # ends the open episode as truncated
    table = log.index.episodes(log.ring.arrays["reward"])
    assert table.truncated.tolist() == [False, True, False]


def test_vector_autoreset_stores_no_transition(tmp_path):
    w, log = _writer(tmp_path, num_envs=2)
    w.reset(_obs(0, 2))
    w.step(np.array([1, 1]), np.array([1.0, 1.0]), _obs(1, 2), np.array([True, False]), np.array([False, False]), {})
    np.testing.assert_array_equal(w.episode_open, [False, True])
    before = log.next_id
    w.step(np.array([9, 1]), np.array([5.0, 1.0]), _obs(2, 2), np.array([False, False]), np.array([False, False]), {})
    assert log.next_id == before + 1  # env 0 was reset by this step: only env 1 stored a transition
    np.testing.assert_array_equal(w.episode_open, [True, True])


def test_missing_final_observation_and_lost_heads(tmp_path):
    w, log = _writer(tmp_path, stack=2)
    w.reset(_obs(0), head_lost=True)
    w.step(0, 0.0, _obs(1), False, False, {})
    with pytest.raises(ValueError, match="only allowed on a step that ends the episode"):
        w.step(0, 0.0, None, False, False, {})
    w.step(0, 0.0, None, True, False, {})
    table = log.index.episodes(log.ring.arrays["reward"])
    assert table.final_missing.tolist() == [True] and table.head_lost.tolist() == [True]
    v, _ = _writer(tmp_path / "v", num_envs=2)
    with pytest.raises(ValueError, match="one env stream"):
        v.reset(_obs(0, 2), head_lost=True)


def test_a_writer_resumes_the_streams_state_from_the_log(tmp_path):
    w, log = _writer(tmp_path, num_envs=2)
    w.reset(_obs(0, 2))
    w.step(np.array([1, 1]), np.array([0.0, 0.0]), _obs(1, 2), np.array([False, True]), np.array([False, False]), {})
    again = EpisodeWriter(log.schema, log, Inputs(log.schema))
    np.testing.assert_array_equal(again.episode_open, [True, False])
