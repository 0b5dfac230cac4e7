"""A step with ``terminated=True`` and ``truncated=True`` is a termination: sampled with discount 0 and
exported as a terminal, exactly like ``terminated=True`` alone."""

from __future__ import annotations

import h5py
import numpy as np

import mmreplay as mr
from mmreplay.datasets import export, import_dataset


def _store(path, last_truncated):
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(2,), obs_dtype="float32", n_step=3, gamma=0.9)
    s.reset(np.zeros(2, np.float32))
    for t in range(6):
        end = t == 5
        s.step(t % 2, float(t + 1), np.full(2, t + 1, np.float32), end, end and last_truncated)
    s.commit()
    return s


def test_both_flags_sample_as_terminated(tmp_path):
    both, term = _store(tmp_path / "both", True), _store(tmp_path / "term", False)
    ids = np.arange(6)
    a, b = both.gather(ids), term.gather(ids)
    for name in ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    # rows 3, 4, 5 have the last step inside their 3-step window: terminated, no bootstrapping
    assert a.terminated.tolist() == [False] * 3 + [True] * 3 and not a.truncated.any()
    assert a.discount.tolist() == [np.float32(0.9 ** 3)] * 3 + [0.0] * 3
    assert a.reward[5] == np.float32(6.0) and a.reward[3] == np.float32(4 + 0.9 * 5 + 0.9 ** 2 * 6)
    t = both.episodes()
    assert bool(t.terminated[0]) and not bool(t.truncated[0])
    both.close()
    term.close()


def test_both_flags_export_as_a_termination(tmp_path):
    _store(tmp_path / "s", True).close()
    export(tmp_path / "s", tmp_path / "d.hdf5", format="hdf5", progress=False)
    with h5py.File(tmp_path / "d.hdf5", "r") as f:
        assert f["terminals"][()].tolist() == [False] * 5 + [True]
        assert not f["timeouts"][()].any()
    export(tmp_path / "s", tmp_path / "d.zarr", progress=False)
    with import_dataset(tmp_path / "d.zarr", tmp_path / "back", progress=False) as back:
        t = back.episodes()
        assert bool(t.terminated[0]) and not bool(t.truncated[0])
        assert back.gather([5]).discount[0] == 0.0
