"""store.to_arrow() / store.to_pandas(): one row per retained transition, scalar columns, no frames."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

import mmreplay as mr
from tests._support.helpers import require


def _store(path, **kw) -> mr.ReplayStore:
    s = mr.ReplayStore.create(path, capacity=60, obs_shape=(2,), obs_dtype="int32", stack=2, n_step=2,
                              chunk_size=16, extras={"lp": ((), "float32"), "vec": ((2,), "int16"), "step": ((), "int8")},
                              **kw)
    s.reset(np.zeros(2, np.int32))
    for t in range(1, 101):
        end = t % 9 == 0
        s.step(t % 4, t / 10, np.array([t, 0], np.int32), end, t % 13 == 0 and not end,
               lp=np.float32(t / 100), vec=np.array([t, -t], np.int16), step=t % 100)
        if end or t % 13 == 0:
            s.reset(np.array([t, 1], np.int32))
    return s


def test_one_row_per_retained_transition(tmp_path):
    require("pandas")
    s = _store(tmp_path / "s", prioritized=mr.Prioritized())
    lo, hi = s.id_range
    assert lo > 0  # some were evicted
    s.update_priorities(s.sampleable_ids()[:3], np.array([2.0, 3.0, 4.0]))
    s.invalidate([hi - 20])
    df = s.to_pandas()
    assert list(df.columns) == ["id", "episode", "step", "env", "action", "reward", "terminated", "truncated",
                                "sampleable", "priority", "lp", "extra_step"]  # no frames, no shaped extras
    assert df["id"].tolist() == list(range(lo, hi))
    t = s.episodes()
    for i, row in df.iterrows():
        e = int(row["episode"])
        steps = s.episode_steps(t, e)
        pos = int(row["id"]) - int(t.first_id[e]) if t.first_id[e] >= 0 else None
        if t.start_retained[e]:  # a whole episode: its steps, in order
            assert row["step"] == pos
            assert row["action"] == steps.actions[pos] and row["reward"] == steps.rewards[pos]
            assert row["terminated"] == steps.terminated[pos] and row["truncated"] == steps.truncated[pos]
            assert row["lp"] == steps.extras["lp"][pos] and row["extra_step"] == steps.extras["step"][pos]
        assert row["env"] == t.stream[e]
        tstep = int(row["id"]) + 1  # transition id i was written at step t = i + 1 of this stream
        assert row["reward"] == np.float32(tstep / 10) and row["action"] == tstep % 4
        assert row["lp"] == np.float32(tstep / 100)
        assert row["terminated"] == (tstep % 9 == 0) and row["truncated"] == (tstep % 13 == 0 and tstep % 9 != 0)
        del i
    ids = set(s.sampleable_ids().tolist())
    assert df["sampleable"].tolist() == [i in ids for i in range(lo, hi)]
    assert not df.loc[df["id"] == hi - 20, "sampleable"].item()
    valid = df[df["sampleable"]]
    np.testing.assert_array_equal(valid["priority"].to_numpy(), s.priorities(valid["id"].to_numpy()))
    assert df.loc[~df["sampleable"], "priority"].isna().all()
    assert df["reward"].dtype == np.float32 and df["lp"].dtype == np.float32
    s.close()


def test_step_counts_within_each_episode(tmp_path):
    require("pandas")
    s = mr.ReplayStore.create(tmp_path / "s", capacity=1000, obs_shape=(1,), num_envs=2, chunk_size=64)
    s.reset(np.zeros((2, 1), np.uint8))
    for t in range(1, 30):
        s.step([1, 2], [1.0, 2.0], np.full((2, 1), t, np.uint8), [t % 5 == 0, t % 7 == 0], [False, False])
    df = s.to_pandas()
    for env, period in ((0, 5), (1, 7)):
        d = df[df["env"] == env]
        # after each end the next call auto-resets that env (no transition), then its step 0 follows
        assert d["step"].tolist()[:period + 2] == list(range(period)) + [0, 1]
        assert (d.groupby("episode")["step"].min() == 0).all()
        groups = [g["terminated"].tolist() for _, g in d.groupby("episode")]
        assert all(g == [False] * (len(g) - 1) + [True] for g in groups[:-1])  # one end, at the last step
        assert d["step"].max() == period - 1 and len(groups) >= 4
    assert df["action"].tolist()[:2] == [1, 2] and df["env"].tolist()[:2] == [0, 1]
    s.close()


def test_arrow_table_and_shaped_actions(tmp_path):
    pa = require("pyarrow")
    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(1,), action_shape=(2, 3),
                              action_dtype="float32", n_step=1)
    s.reset(np.zeros(1, np.uint8))
    for t in range(5):
        s.step(np.full((2, 3), t, np.float32), 1.0, np.ones(1, np.uint8), False, False)
    table = s.to_arrow()
    assert table.num_rows == 5 and table.column_names[:4] == ["id", "episode", "step", "env"]
    assert table.schema.field("action").type == pa.list_(pa.float32(), 6)
    assert table.column("action").to_pylist()[3] == [3.0] * 6
    assert table.column("sampleable").to_pylist() == [True] * 5
    assert "priority" not in table.column_names
    df = s.to_pandas()
    np.testing.assert_array_equal(df["action"][4], np.full(6, 4.0, np.float32))
    s.close()


def test_an_empty_table_with_a_shaped_action(tmp_path):
    require("pyarrow")
    require("pandas")
    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(1,), action_shape=(2,), n_step=1)
    assert s.to_arrow().num_rows == 0 and s.to_pandas().empty  # a fresh store
    s.reset(np.zeros(1, np.uint8))
    for t in range(3):
        s.step(np.array([t, t]), 1.0, np.ones(1, np.uint8), False, False)
    assert s.to_arrow().num_rows == 3
    s.clear()
    assert s.to_arrow().num_rows == 0 and s.to_pandas().empty
    s.close()


def test_extras_named_like_a_column_or_its_prefixed_name_keep_their_own_columns(tmp_path):
    require("pandas")
    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(1,), n_step=1,
                              extras={"id": ((), "int64"), "extra_id": ((), "int64")})
    s.reset(np.zeros(1, np.uint8))
    for t in range(3):
        s.step(0, 1.0, np.ones(1, np.uint8), False, False, id=100 + t, extra_id=200 + t)
    df = s.to_pandas()
    assert df["id"].tolist() == [0, 1, 2]
    assert df["extra_id"].tolist() == [200, 201, 202]  # the extra "extra_id" keeps its name
    assert df["extra_extra_id"].tolist() == [100, 101, 102]  # "id" is a column, and extra_id is taken
    s.close()


def test_a_clear_error_names_the_extra(tmp_path, monkeypatch):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=10, obs_shape=(1,))
    real = builtins.__import__

    def no_tables(name, *args, **kwargs):
        if name in ("pyarrow", "pandas"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tables)
    import importlib

    monkeypatch.setattr(importlib, "import_module", lambda name, *a: no_tables(name))
    with pytest.raises(ImportError, match=r"to_arrow\(\) needs pyarrow: pip install 'mmreplay\[tables\]'"):
        s.to_arrow()
    with pytest.raises(ImportError, match=r"to_pandas\(\) needs pandas: pip install 'mmreplay\[tables\]'"):
        s.to_pandas()
    monkeypatch.undo()
    s.close()


def _episodes_hold_the_tables_rows(s: mr.ReplayStore) -> None:
    """Each episode's rows in to_pandas() are the ids episodes() gives it, and its steps are theirs."""
    df, t = s.to_pandas(), s.episodes()
    for e in range(len(t)):
        ids = df["id"][df["episode"] == e].tolist()
        assert ids == list(range(int(t.first_id[e]), int(t.first_id[e]) + int(t.length[e]))), e
        np.testing.assert_array_equal(s.episode_steps(t, e).actions, df["action"][df["episode"] == e].to_numpy())


def test_the_episode_running_across_a_clear_holds_its_first_transition_after_it(tmp_path):
    require("pandas")
    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(1,), obs_dtype="int32")
    s.reset(np.array([0], np.int32))
    for t in range(1, 4):
        s.step(t, float(t), np.array([t], np.int32), False, False)  # ids 0..2
    s.clear()
    assert len(s.episodes()) == 0 and s.to_pandas().empty  # nothing written before the clear is listed
    for t in range(4, 6):
        s.step(t, float(t), np.array([t], np.int32), False, False)  # ids 3, 4: the episode goes on
    t = s.episodes()
    assert t.first_id.tolist() == [3] and t.length.tolist() == [2] and t.returns.tolist() == [9.0]
    assert not t.start_retained[0] and not t.complete[0]
    _episodes_hold_the_tables_rows(s)
    s.close()


def test_a_transition_whose_observation_was_retired_is_in_neither_listing(tmp_path):
    require("pandas")
    s = mr.ReplayStore.create(tmp_path / "s", capacity=20, obs_shape=(1,), obs_dtype="int32", chunk_size=8)
    s.reset(np.array([0], np.int32))
    for t in range(1, 60):
        s.step(t, float(t), np.array([t], np.int32), False, False)
    lo, hi = s.id_range
    df = s.to_pandas()
    assert df["id"].iloc[0] == lo + 1 and df["id"].iloc[-1] == hi - 1  # id lo's observation is gone
    assert lo not in s.sampleable_ids()
    _episodes_hold_the_tables_rows(s)
    s.close()
