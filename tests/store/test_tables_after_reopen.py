"""``to_arrow()``/``to_pandas()``'s ``step`` column after a reopen equals what the writing store said,
also for episodes whose first chunks were retired."""

from __future__ import annotations

import numpy as np
import pytest

import mmreplay as mr

pytest.importorskip("pyarrow")


@pytest.mark.parametrize("num_envs", [1, 2])
def test_steps_of_episodes_with_retired_heads_survive_a_reopen(tmp_path, num_envs):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=96, obs_shape=(2,), chunk_size=16, num_envs=num_envs)
    rng = np.random.default_rng(0)
    obs = (lambda v: np.full((num_envs, 2), v, np.uint8)) if num_envs > 1 else (lambda v: np.full(2, v, np.uint8))
    s.reset(obs(0))
    for t in range(400):  # long episodes: the ring wraps several times, heads are retired
        ends = rng.random(num_envs) < 0.02
        if num_envs == 1:
            s.step(0, 1.0, obs(t % 250), bool(ends[0]), False)
            if ends[0]:
                s.reset(obs(0))
        else:
            s.step(np.zeros(num_envs, np.int64), np.ones(num_envs), obs(t % 250), ends, np.zeros(num_envs, bool))
    s.commit()
    before = s.to_arrow().to_pydict()
    assert (~s.episodes().start_retained).any()  # episodes whose first rows were retired
    assert max(before["step"]) > 60  # positions beyond what the retained rows alone would give
    s.close()
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    after = r.to_arrow().to_pydict()
    assert after["id"] == before["id"] and after["step"] == before["step"]
    assert r.to_pandas()["step"].tolist() == before["step"]
    r.close()
    w = mr.ReplayStore.open(tmp_path / "s", mode="r+")  # a writer going on counts on from there too
    w.step(*((0, 1.0, obs(1), False, False) if num_envs == 1 else
             (np.zeros(num_envs, np.int64), np.ones(num_envs), obs(1), np.zeros(num_envs, bool),
              np.zeros(num_envs, bool))))
    t = w.to_arrow().to_pydict()
    last = {e: st for e, st in zip(t["env"], t["step"], strict=True)}
    prev = {e: st for e, st in zip(before["env"], before["step"], strict=True)}
    assert all(last[e] == prev[e] + 1 for e in prev if e in last)
    w.close()
