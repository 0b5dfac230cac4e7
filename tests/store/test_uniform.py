"""Uniform sampling: coverage of the most recent capacity, uniformity, seeding, epochs."""

from __future__ import annotations

import os

import numpy as np
import pytest

import mmreplay as mr


def _fill(path, steps=900, seed=0, **kw):
    args = dict(capacity=200, obs_shape=(2,), obs_dtype="int32", stack=4, n_step=3, chunk_size=32)
    args.update(kw)
    s = mr.ReplayStore.create(path, **args)
    rng = np.random.default_rng(seed)
    s.reset(np.zeros(2, np.int32))
    for t in range(steps):
        end = rng.random() < 0.03
        s.step(t % 4, 1.0, np.array([t + 1, 0], np.int32), end, rng.random() < 0.01)
        if end or s.episode_open[0] == 0:
            s.reset(np.array([t + 1, 1], np.int32))
    return s


def test_recent_capacity_all_sampled_and_nothing_older_than_slack(tmp_path):
    s = _fill(tmp_path / "s")
    lo, hi = s.id_range
    valid = set(s.sampleable_ids().tolist())
    assert valid == set(s.gather(sorted(valid)).index.tolist())
    recent = {i for i in valid if i >= hi - s.capacity}
    # at least capacity most recent transitions are sampleable, except those still pending at the head
    pending = {i for i in range(hi - s.capacity, hi) if i not in valid}
    assert all(i >= hi - 3 for i in pending), sorted(pending)
    drawn = np.concatenate([s.sample(64).index for _ in range(1500)])
    assert recent <= set(drawn.tolist())
    assert set(drawn.tolist()) <= valid
    slack = 2 * 32  # at most two chunks of slots beyond capacity (plus stack history)
    assert drawn.min() >= hi - s.capacity - slack - 4
    s.close()



def test_uniform_frequencies(tmp_path):
    s = _fill(tmp_path / "s")
    n = len(s)
    draws = np.concatenate([s.sample(256).index for _ in range(800)])
    counts = np.unique(draws, return_counts=True)[1]
    assert counts.size == n
    expected = draws.size / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 0.999 quantile of chi-square with n-1 degrees of freedom (Wilson-Hilferty approximation)
    dof = n - 1
    crit = dof * (1 - 2 / (9 * dof) + 3.09 * np.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < crit, (chi2, crit)
    s.close()


def test_replace_false_distinct_and_exhaustive(tmp_path):
    s = _fill(tmp_path / "s")
    n = len(s)
    b = s.sample(n, replace=False)
    assert len(set(b.index.tolist())) == n
    for size in (1, 7, n // 3):
        assert len(set(s.sample(size, replace=False).index.tolist())) == size
    s.close()


def test_seeded_sampling_is_reproducible(tmp_path):
    a = _fill(tmp_path / "a", seed=3)
    a.close()
    runs = []
    for seed in (11, 11, 12):
        with mr.ReplayStore.open(tmp_path / "a", mode="r", seed=seed) as r:
            runs.append(np.concatenate([r.sample(32).index for _ in range(5)]))
    assert np.array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])
    # the committed RNG state continues when no seed is given
    with mr.ReplayStore.open(tmp_path / "a", mode="r") as r1, mr.ReplayStore.open(tmp_path / "a", mode="r") as r2:
        assert np.array_equal(r1.sample(32).index, r2.sample(32).index)


def test_iter_batches_is_one_epoch_and_keeps_the_rng(tmp_path):
    s = _fill(tmp_path / "s")
    state = s.inspect()["rng"]
    seen = np.concatenate([b.index for b in s.iter_batches(50, shuffle=True, seed=1)])
    assert sorted(seen.tolist()) == sorted(set(seen.tolist()))
    assert seen.size == len(s)
    assert s.inspect()["rng"] == state
    again = np.concatenate([b.index for b in s.iter_batches(50, shuffle=True, seed=1)])
    assert np.array_equal(seen, again)
    ordered = np.concatenate([b.index for b in s.iter_batches(64, shuffle=False)])
    assert np.all(np.diff(ordered) > 0)
    sizes = [len(b) for b in s.iter_batches(64, shuffle=False, drop_last=True)]
    assert set(sizes) == {64}
    s.close()


def test_iter_batches_and_gather_refuse_what_they_cannot_do(tmp_path):
    s = _fill(tmp_path / "s")
    with pytest.raises(TypeError, match="shuffle: expected True or False, got 'False'"):
        s.iter_batches(8, shuffle="False")  # (a truthy string would have shuffled)
    with pytest.raises(TypeError, match="drop_last: expected True or False"):
        s.iter_batches(8, drop_last=1)
    assert len(s.gather(s.sampleable_ids()[:3])) == 3
    s.close()
    big = mr.ReplayStore.create(tmp_path / "big", capacity=100, obs_shape=(84, 84), stack=4)  # 56 KiB a row
    big.reset(np.zeros((84, 84), np.uint8))
    big.step(0, 1.0, np.zeros((84, 84), np.uint8), False, False)
    budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    with pytest.raises(ValueError, match="half of this machine's memory"):
        big.gather(np.zeros(budget // (2 * 4 * 84 * 84) + 1, np.int64))  # refused before anything is allocated
    big.close()


def test_iter_batches_skips_rows_evicted_meanwhile(tmp_path):
    s = _fill(tmp_path / "s", steps=300)
    total = len(s)
    it = s.iter_batches(10, shuffle=False)
    first = next(it)
    for t in range(100):  # evicts the oldest part of what the epoch fixed
        if s.episode_open[0]:
            s.step(0, 0.0, np.array([5000 + t, 0], np.int32), False, False)
        else:
            s.reset(np.zeros(2, np.int32))
    oldest = s.id_range[0]
    rest = np.concatenate([b.index for b in it])
    assert rest.size and rest.min() >= oldest
    assert 0 < first.index.size + rest.size < total
    assert set(rest.tolist()).isdisjoint(first.index.tolist())
    s.close()


@pytest.mark.parametrize("pad", ["zeros", "first"])
def test_current_obs_pads_like_a_stack(tmp_path, pad):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=10, obs_shape=(2,), stack=3, pad=pad)
    s.reset(np.array([5, 5], np.uint8))
    want_pad = 0 if pad == "zeros" else 5
    np.testing.assert_array_equal(s.current_obs(), [[want_pad] * 2, [want_pad] * 2, [5, 5]])
    s.step(0, 0.0, np.array([6, 6], np.uint8), False, False)
    np.testing.assert_array_equal(s.current_obs(), [[want_pad] * 2, [5, 5], [6, 6]])
    s.close()
