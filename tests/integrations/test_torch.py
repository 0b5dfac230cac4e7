"""The PyTorch dataset yields exactly the rows ``sample`` gives a reader with the same seed."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.synthetic import atari_like_episodes
from tests._support.helpers import require

FIELDS = ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index", "weight")


@pytest.fixture(scope="module")
def atari_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("torch") / "store"
    with mr.ReplayStore.create(path, capacity=5000, obs_shape=(84, 84), stack=4, n_step=3,
                               extras={"log_prob": ((), "float32")}) as s:
        for ep in atari_like_episodes(6, seed=2, min_len=60, max_len=200):
            s.reset(ep.frames[0])
            for t in range(ep.length):
                s.step(ep.actions[t], ep.rewards[t], ep.frames[t + 1], ep.terminated and t == ep.length - 1, False,
                       log_prob=np.float32(-t))
    return path


@pytest.fixture(scope="module")
def prio_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("torch") / "prio"
    rng = np.random.default_rng(0)
    with mr.ReplayStore.create(path, capacity=1000, obs_shape=(3,), obs_dtype="float32", n_step=2,
                               prioritized=mr.Prioritized(alpha=0.7, beta=0.5)) as s:
        s.reset(rng.random(3, np.float32))
        for t in range(300):
            s.step(t % 4, float(t), rng.random(3, np.float32), t % 50 == 49, False)
            if t % 50 == 49:
                s.reset(rng.random(3, np.float32))
        ids = np.arange(0, 290, 7)
        s.update_priorities(ids, rng.random(ids.size) * 5)
    return path


def assert_rows(got, want, torch):
    """A dict of tensors equals a numpy Batch, dtypes included."""
    for name in FIELDS:
        t = got[name]
        assert isinstance(t, torch.Tensor)
        a = getattr(want, name)
        assert t.numpy().dtype == a.dtype, name
        assert np.array_equal(t.numpy(), a), name
    assert got["extras"].keys() == want.extras.keys()
    for name, a in want.extras.items():
        assert np.array_equal(got["extras"][name].numpy(), a), name


def test_dataset_yields_what_sample_gives(torch, mt, atari_store):
    got = list(mt.ReplayDataset(atari_store, batch_size=16, seed=7, num_batches=5))
    assert len(got) == 5
    with mr.ReplayStore.open(atari_store, mode="r", seed=7) as reader:
        for batch in got:
            assert_rows(batch, reader.sample(16), torch)
    assert got[0]["obs"].dtype == torch.uint8 and got[0]["obs"].shape == (16, 4, 84, 84)
    other = next(iter(mt.ReplayDataset(atari_store, batch_size=16, seed=8)))
    assert not torch.equal(other["index"], got[0]["index"])


def test_prioritized_weights_and_tensor_batches(torch, mt, prio_store):
    ds = mt.ReplayDataset(prio_store, batch_size=32, seed=3, num_batches=3, as_dict=False, beta=0.9)
    got = list(ds)
    with mr.ReplayStore.open(prio_store, mode="r", seed=3) as reader:
        for tb in got:
            assert isinstance(tb, mt.TensorBatch) and len(tb) == 32
            want = reader.sample(32, beta=0.9)
            assert np.array_equal(tb.index.numpy(), want.index)
            assert np.array_equal(tb.weight.numpy(), want.weight)
            assert np.array_equal(tb.to("cpu").obs.numpy(), want.obs)
    assert not np.all(got[0].weight.numpy() == 1.0)


def test_dataloader_workers_each_follow_their_seed(torch, mt, atari_store):
    loader = mt.replay_loader(atari_store, batch_size=8, num_workers=2, seed=3)
    got = [b for _, b in zip(range(6), loader, strict=False)]
    readers = [mr.ReplayStore.open(atari_store, mode="r", seed=3 + w) for w in range(2)]
    want = [[r.sample(8) for _ in range(3)] for r in readers]
    for j, batch in enumerate(got):  # the loader takes the workers' batches in turn
        assert_rows(batch, want[j % 2][j // 2], torch)
    for r in readers:
        r.close()


def test_pin_memory(torch, mt, atari_store, monkeypatch, accelerator):
    ds = mt.ReplayDataset(atari_store, batch_size=4, num_batches=1, pin_memory=True)
    if accelerator:
        assert next(iter(ds))["obs"].is_pinned()
    else:
        with pytest.warns(UserWarning, match="no accelerator"):
            batch = next(iter(ds))
        assert batch["obs"].dtype == torch.uint8
    # inside a DataLoader worker, pinning is the loader's job
    monkeypatch.setattr(mt, "get_worker_info", lambda: SimpleNamespace(id=0, num_workers=1))
    with pytest.raises(ValueError, match="DataLoader\\(pin_memory=True\\)"):
        iter(ds)


def test_arguments_are_checked(mt, atari_store, tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        mt.ReplayDataset(atari_store, batch_size=0)
    with pytest.raises(TypeError, match="seed"):
        mt.ReplayDataset(atari_store, batch_size=4, seed=1.5)
    with pytest.raises(mr.StoreNotFoundError):
        next(iter(mt.ReplayDataset(tmp_path / "nowhere", batch_size=4)))


def test_refresh_follows_the_writer(torch, mt, tmp_path):
    path = tmp_path / "live"
    writer = mr.ReplayStore.create(path, capacity=1000, obs_shape=(2,), obs_dtype="int32")
    writer.reset(np.zeros(2, np.int32))
    for t in range(10):
        writer.step(0, 1.0, np.full(2, t + 1, np.int32), False, False)
    writer.commit()
    stream = iter(mt.ReplayDataset(path, batch_size=64, seed=1, refresh_every=2, prefetch=0))
    first = [next(stream)["index"] for _ in range(2)]
    assert max(int(i.max()) for i in first) < 10
    for t in range(10, 500):
        writer.step(0, 1.0, np.full(2, t + 1, np.int32), False, False)
    writer.commit()
    later = next(stream)["index"]
    assert int(later.max()) >= 10 and int(later.max()) < 500  # the reader moved to the new commit
    writer.close()


@pytest.mark.slow
def test_dqn_example_trains_saves_and_resumes(torch, tmp_path, capsys):
    """tools/dqn_atari.py, briefly: learn, checkpoint, run again with more steps, resume where it stopped."""
    require("gymnasium")
    require("ale_py")
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools", "dqn_atari.py")
    spec = importlib.util.spec_from_file_location("dqn_atari", path)
    dqn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dqn)
    args = ["--replay-dir", str(tmp_path), "--learning-starts", "20", "--checkpoint-every", "30", "--threads", "1"]
    assert dqn.main(["--steps", "60", *args]) == 0
    first = capsys.readouterr().out
    assert "new run" in first and "checkpoint step=60" in first
    assert dqn.main(["--steps", "90", *args]) == 0
    second = capsys.readouterr().out
    assert "resumed from step 60" in second and "done step=90" in second
    with mr.ReplayStore.open(tmp_path / "snapshot", mode="r") as snap:
        assert snap.metadata["dqn"]["step"] == 90 and snap.id_range[1] == 90
    assert sorted(os.listdir(tmp_path)) == ["model-000000090.pt", "snapshot", "store"]
