"""The real Atari episodes through the store, every row checked against the reference model."""

from __future__ import annotations

import numpy as np
import pytest

import mmreplay as mr
from tests._support.atari_data import episodes
from tests._support.helpers import FIELDS
from tests._support.model import ModelStore


@pytest.mark.parametrize("game,pad", [("pong", "zeros"), ("breakout", "first")])
def test_atari_rows_match_model(tmp_path, game, pad):
    kw = dict(capacity=2500, obs_shape=(84, 84), stack=4, n_step=3, gamma=0.99, pad=pad, chunk_size=512,
              action_dtype="int32")
    store = mr.ReplayStore.create(tmp_path / "s", **kw)
    model = ModelStore(**kw)
    checked = 0
    for ep in episodes(game):
        for target in (store, model):
            target.reset(ep.frames[0])
        for t in range(len(ep.actions)):
            args = (ep.actions[t], float(ep.rewards[t]), ep.frames[t + 1], bool(ep.terminated[t]),
                    bool(ep.truncated[t]))
            store.step(*args)
            model.step(*args)
        ids = model.sampleable_ids()
        assert store.id_range == (model.oldest_id, model.next_id)
        assert len(store) == len(ids)
        batch = store.gather(np.array(ids))
        for j, i in enumerate(ids):
            row = model.row(i)
            for name in FIELDS:
                assert np.array_equal(getattr(batch, name)[j], row[name]), (name, i)
        checked += len(ids)
    assert store.id_range[0] > 0, "the ring never wrapped"
    assert checked > 10_000
    store.close()
