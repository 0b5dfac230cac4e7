"""Drawing among a subset of the sampleable transitions (``Sampler.draw_where``), on an index fed directly."""

from __future__ import annotations

import numpy as np
import pytest

from mmreplay.core.index import TERMINATED
from mmreplay.errors import NotSampleableError
from mmreplay.options import Prioritized
from mmreplay.sampling import PrioritizedSampler, UniformSampler
from mmreplay.sampling.subset import budget
from tests._support.parts import Feed


def _feed(n_tx: int = 250) -> Feed:
    f = Feed(stack=1, n_step=1, positions=40)
    f.reset()
    for i in range(n_tx):
        f.step(TERMINATED if i == n_tx - 1 else 0)
    f.idx.update_validity()
    return f


class Seen:
    """An accept test that passes the slots in ``keep`` and counts the slots it was asked about."""

    def __init__(self, keep: np.ndarray) -> None:
        self.keep = keep
        self.asked = 0

    def __call__(self, slots: np.ndarray) -> np.ndarray:
        self.asked += slots.size
        return np.isin(slots, self.keep)


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_draw_where_takes_one_round_when_most_pass_and_one_exact_pass_when_few_do(kind):
    f = _feed()
    sampler = UniformSampler(f.idx) if kind == "uniform" else PrioritizedSampler(f.idx, Prioritized())
    sampler.added(f.idx.slots_of(f.idx.valid_ids()))
    rng = np.random.default_rng(0)
    ids = f.idx.valid_ids()
    slots = f.idx.slots_of(ids)
    most = Seen(slots[1:])
    got, _ = sampler.draw_where(rng, 32, most, None)
    assert got.size == 32 and np.isin(got, ids[1:]).all()
    assert most.asked < 3 * 32  # one round of proposals, a little more than the batch
    one = Seen(slots[7:8])  # 1 in 250: fewer pass than the proposal budget would find
    got, w = sampler.draw_where(rng, 32, one, None)
    assert (got == ids[7]).all()
    assert one.asked >= budget(32)  # the proposals ran out, then the exact pass found it
    if kind == "prioritized":
        assert w is not None and np.all(w == 1.0)  # equal masses: weight 1
    none = Seen(np.empty(0, np.int64))
    assert sampler.draw_where(rng, 4, none, None) is None
    empty = Feed(stack=1, n_step=1)
    s2 = UniformSampler(empty.idx) if kind == "uniform" else PrioritizedSampler(empty.idx, Prioritized())
    with pytest.raises(NotSampleableError, match="no sampleable"):
        s2.draw_where(rng, 4, none, None)
