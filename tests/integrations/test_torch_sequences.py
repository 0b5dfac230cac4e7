"""The PyTorch loader's sequences: time axis second, exactly the reader's ``sample_sequences``."""

from __future__ import annotations

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.synthetic import atari_like_episodes

FIELDS = ("obs", "action", "reward", "terminated", "truncated", "is_first", "mask", "ids", "index", "weight")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("torchseq") / "store"
    with mr.ReplayStore.create(path, capacity=3000, obs_shape=(84, 84), stack=4, n_step=3,
                               extras={"h": ((16,), "float16")}, prioritized=mr.Prioritized()) as s:
        for ep in atari_like_episodes(5, seed=4, min_len=20, max_len=90):
            s.reset(ep.frames[0])
            for t in range(ep.length):
                s.step(ep.actions[t], ep.rewards[t], ep.frames[t + 1], ep.terminated and t == ep.length - 1, False,
                       h=np.full(16, t, np.float16))
        ids = s.sampleable_ids()
        s.update_priorities(ids, np.random.default_rng(0).random(ids.size) + 0.1)
    return path


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_yields_the_readers_sequences_time_axis_second(torch, mt, store_path, workers):
    loader = mt.replay_loader(store_path, batch_size=4, num_workers=workers, seed=5, sequence_length=12,
                              num_batches=3)
    got = list(loader)
    assert len(got) == 3
    with mr.ReplayStore.open(store_path, mode="r", seed=5) as reader:
        for batch in got:
            want = reader.sample_sequences(4, 12)
            for name in FIELDS:
                t = batch[name]
                assert isinstance(t, torch.Tensor) and t.numpy().dtype == getattr(want, name).dtype, name
                assert np.array_equal(t.numpy(), getattr(want, name)), name
            assert np.array_equal(batch["extras"]["h"].numpy(), want.extras["h"])
    b = got[0]
    assert b["obs"].shape == (4, 13, 4, 84, 84) and b["obs"].dtype == torch.uint8
    assert b["action"].shape == b["reward"].shape == b["mask"].shape == b["ids"].shape == (4, 12)
    assert b["index"].shape == b["weight"].shape == (4,)
    assert b["extras"]["h"].shape == (4, 12, 16)
    assert torch.equal(b["index"], b["ids"][:, 0])


def test_strict_tensor_sequence_batches(torch, mt, store_path):
    ds = mt.ReplayDataset(store_path, batch_size=8, seed=2, num_batches=2, as_dict=False, sequence_length=15,
                          strict=True, beta=1.0)
    for tb in ds:
        assert isinstance(tb, mt.TensorSequenceBatch) and len(tb) == 8
        assert bool(tb.mask.all())
        assert tb.to("cpu").obs.shape == (8, 16, 4, 84, 84)
        assert float(tb.weight.max()) <= 1.0


def test_sequence_arguments_are_checked(mt, store_path):
    with pytest.raises(ValueError, match="sequence_length"):
        mt.ReplayDataset(store_path, batch_size=4, sequence_length=0)
    with pytest.raises(ValueError, match="sequence_length= too"):
        mt.ReplayDataset(store_path, batch_size=4, strict=True)
    with pytest.raises(TypeError, match="strict"):
        mt.ReplayDataset(store_path, batch_size=4, sequence_length=3, strict=1)
