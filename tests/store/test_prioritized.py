"""Prioritized replay: distribution, importance weights, updates, persistence, rows against the model."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from tests._support.helpers import assert_row_equal, make_pair

PRIO = mr.Prioritized(alpha=0.6, beta=0.4, eps=1e-6)


def _store(path, capacity=50, n_step=1, stack=1, chunk_size=16, steps=60, prio=PRIO, seed=0):
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(2,), obs_dtype="int32", stack=stack,
                              n_step=n_step, chunk_size=chunk_size, prioritized=prio, seed=seed)
    s.reset(np.zeros(2, np.int32))
    for t in range(steps):
        end = t % 25 == 24
        s.step(t % 3, 1.0, np.array([t + 1, 0], np.int32), end, False)
        if end:
            s.reset(np.array([t + 1, 1], np.int32))
    return s


def test_options_are_validated_and_frozen():
    with pytest.raises(ValueError, match="alpha"):
        mr.Prioritized(alpha=-1)
    with pytest.raises(TypeError, match="beta"):
        mr.Prioritized(beta="high")
    with pytest.raises(ValueError, match="eps"):
        mr.Prioritized(eps=float("nan"))
    p = mr.Prioritized(alpha=0.7)
    with pytest.raises(AttributeError):
        p.alpha = 0.5  # type: ignore[misc]
    assert mr.Prioritized.from_json(p.to_json()) == p


def test_new_transitions_enter_with_max_priority(tmp_path):
    s = _store(tmp_path / "s")
    ids = np.arange(*s.id_range)
    assert np.all(s.priorities(ids) == 1.0) and s.max_priority == 1.0
    s.update_priorities(ids[:3], [5.0, 0.5, 2.0])
    assert s.max_priority == 5.0
    s.step(0, 0.0, np.array([99, 0], np.int32), False, False)
    s.step(0, 0.0, np.array([100, 0], np.int32), True, False)
    new = np.arange(s.id_range[1] - 2, s.id_range[1])
    assert np.all(s.priorities(new) == 5.0)
    s.update_priorities(ids[:1], [0.1])
    assert s.max_priority == 5.0  # never decreases
    s.close()


def test_sampling_frequencies_follow_priorities(tmp_path):
    s = _store(tmp_path / "s", capacity=40, steps=40, chunk_size=64)
    ids = np.arange(*s.id_range)
    assert len(s) == ids.size == 40
    rng = np.random.default_rng(3)
    p = rng.integers(1, 20, ids.size).astype(np.float64)
    p[5] = 0.0  # eps keeps it reachable
    s.update_priorities(ids, p)
    mass = (p + PRIO.eps) ** PRIO.alpha
    expected_p = mass / mass.sum()
    draws = np.concatenate([s.sample(64).index for _ in range(1500)])
    counts = np.bincount(draws - ids[0], minlength=ids.size)
    exp = expected_p * draws.size
    big = exp > 5
    chi2 = float((((counts - exp) ** 2) / exp)[big].sum())
    dof = int(big.sum()) - 1
    crit = dof * (1 - 2 / (9 * dof) + 3.09 * np.sqrt(2 / (9 * dof))) ** 3  # 0.999 quantile
    assert chi2 < crit, (chi2, crit)
    # the same chi-square test rejects the uniform distribution
    uni = draws.size / ids.size
    assert float((((counts - uni) ** 2) / uni).sum()) > crit
    s.close()


def test_importance_weights_match_the_formula(tmp_path):
    s = _store(tmp_path / "s", capacity=40, steps=40, chunk_size=64)
    ids = np.arange(*s.id_range)
    p = np.linspace(0.5, 8.0, ids.size)
    s.update_priorities(ids, p)
    n = len(s)
    mass = (p + PRIO.eps) ** PRIO.alpha
    prob = mass / mass.sum()
    for beta in (0.4, 1.0):
        b = s.sample(256, beta=beta)
        w = (n * prob[b.index - ids[0]]) ** -beta
        want = w / ((n * prob) ** -beta).max()
        np.testing.assert_allclose(b.weight, want.astype(np.float32), rtol=1e-6)
        assert b.weight.dtype == np.float32 and b.weight.max() <= 1.0
    s.beta = 1.0
    assert s.beta == 1.0
    with pytest.raises(ValueError, match="beta"):
        s.beta = -1
    s.close()


def test_update_priorities_duplicates_skips_and_errors(tmp_path):
    s = _store(tmp_path / "s", capacity=20, steps=80, chunk_size=8)
    lo, hi = s.id_range
    assert lo > 0
    a, b, c, d, e = s.sampleable_ids()[:5].tolist()
    s.update_priorities([a, a, b], [1.0, 7.0, 3.0])  # the last occurrence wins
    np.testing.assert_array_equal(s.priorities([a, b]), [7.0, 3.0])
    skipped = s.update_priorities([0, 1, c], [2.0, 2.0, 4.0])  # 0 and 1 were evicted
    assert skipped == 2 and s.priority_updates_skipped == 2
    assert s.priorities([c])[0] == 4.0
    before = s.priorities([a, b, c, d, e])
    for ids, pr, exc, words in [
        ([a, b], [1.0, float("nan")], ValueError, ["priorities[1]", "nan"]),
        ([a, b], [float("inf"), 1.0], ValueError, ["priorities[0]", "inf"]),
        ([a, b], [1.0, -2.0], ValueError, ["priorities[1]", "-2.0"]),
        ([a, b], [1.0], ValueError, ["shape", "(2,)", "(1,)"]),
        ([a, hi + 5], [1.0, 1.0], mr.NotSampleableError, ["index[1]", "never issued"]),
    ]:
        with pytest.raises(exc) as info:
            s.update_priorities(ids, pr)
        for w in words:
            assert w in str(info.value)
    np.testing.assert_array_equal(s.priorities([a, b, c, d, e]), before)
    assert s.priority_updates_skipped == 2
    with pytest.raises(ValueError, match="replace=False"):
        s.sample(4, replace=False)
    s.close()


def test_priority_mass_names_no_smallest_mass_when_none_is_positive(tmp_path):
    s = _store(tmp_path / "s", prio=mr.Prioritized(alpha=0.6, beta=0.4, eps=0.0))
    total, smallest = s.priority_mass()
    assert total > 0 and smallest == 1.0  # everything entered with max_priority 1.0
    ids = s.sampleable_ids()
    s.update_priorities(ids, np.zeros(ids.size))
    assert s.priority_mass() == (0.0, 0.0)  # as for a store with nothing sampleable (it was inf)
    s.update_priorities(ids[:1], [4.0])
    assert s.priority_mass()[1] == 4.0 ** 0.6
    s.close()


def test_pending_transitions_are_skipped_not_raised(tmp_path):
    s = _store(tmp_path / "s", n_step=3, steps=10)
    lo, hi = s.id_range
    assert s.update_priorities([hi - 1], [3.0]) == 1  # its 3-step window is still open
    s.close()


def test_priorities_persist_through_commit_and_open(tmp_path):
    s = _store(tmp_path / "s", capacity=30, steps=70, chunk_size=8)
    ids = np.arange(*s.id_range)
    ids = s.sampleable_ids()
    p = np.random.default_rng(0).random(ids.size) * 10
    s.update_priorities(ids, p)
    s.update_priorities([0], [1.0])  # evicted: counted
    s.beta = 0.7
    s.close()
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as r:
        np.testing.assert_array_equal(r.priorities(ids), p)
        assert r.max_priority == pytest.approx(p.max()) and r.beta == 0.7
        assert r.priority_updates_skipped == 1
        a = [r.sample(16) for _ in range(3)]
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as r2:
        b = [r2.sample(16) for _ in range(3)]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.index, y.index)
        np.testing.assert_array_equal(x.weight, y.weight)



def test_uniform_store_refuses_priority_calls(tmp_path):
    s = _store(tmp_path / "s", prio=None)
    for call in (lambda: s.update_priorities([0], [1.0]), lambda: s.priorities([0]), lambda: s.beta,
                 lambda: s.sample(2, beta=0.5)):
        with pytest.raises(ValueError, match="prioritized"):
            call()
    s.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_prioritized_rows_match_model_and_never_draw_invalid(tmp_path_factory, data):
    num_envs = data.draw(st.integers(1, 3))
    cfg = dict(num_envs=num_envs, vector=num_envs > 1, stack=data.draw(st.integers(1, 4)),
               n_step=data.draw(st.integers(1, 4)), gamma=0.9, pad=data.draw(st.sampled_from(["zeros", "first"])),
               chunk_size=num_envs * data.draw(st.integers(2, 8)), capacity=data.draw(st.integers(1, 30)),
               prioritized=PRIO)
    pair = make_pair(str(tmp_path_factory.mktemp("p") / "s"), **cfg)
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    vec = cfg["vector"]
    pair.store.reset(o := pair.frame(num_envs if vec else None))
    pair.model.reset(o)
    ended = False
    for t in range(data.draw(st.integers(1, 150))):
        if not vec and ended:
            pair.store.reset(o := pair.frame(None))
            pair.model.reset(o)
        shape = (num_envs,) if vec else ()
        ev = rng.random(shape)
        args = (rng.integers(0, 4, shape), rng.integers(-2, 3, shape).astype(np.float64),
                pair.frame(num_envs if vec else None), ev < 0.06, (ev > 0.06) & (ev < 0.1))
        if not vec:
            args = (args[0], float(args[1]), args[2], bool(args[3]), bool(args[4]))
        pair.store.step(*args)
        pair.model.step(*args)
        ended = bool(np.any(args[3] | args[4]))
        valid = set(pair.model.sampleable_ids())
        if valid and t % 7 == 0:
            b = pair.store.sample(16)
            assert set(b.index.tolist()) <= valid
            for j, i in enumerate(b.index):
                assert_row_equal(b, j, pair.model.row(int(i)))
            pair.store.update_priorities(b.index, rng.random(16) * 3)
    pair.store.close()


def test_tree_holds_mass_only_on_sampleable_slots(tmp_path):
    s = _store(tmp_path / "s", capacity=20, n_step=3, stack=2, steps=90, chunk_size=8)
    n = len(s)
    assert s.inspect()["priority_slots"] == n  # internal check: no mass on evicted or pending slots
    s.close()


def _same_priority_state(a: mr.ReplayStore, b: mr.ReplayStore) -> None:
    """Bit-for-bit the same sampleable set, raw priorities, tree masses and tree root."""
    ids = a.sampleable_ids()
    np.testing.assert_array_equal(ids, b.sampleable_ids())
    np.testing.assert_array_equal(a.priorities(ids), b.priorities(ids))
    ia, ib = a.inspect(ids), b.inspect(ids)
    np.testing.assert_array_equal(ia["priority_masses"], ib["priority_masses"])
    assert ia["priority_total"] == ib["priority_total"] and a.max_priority == b.max_priority


def test_commits_write_priority_deltas_that_reopen_exactly(tmp_path):
    """Commits in place write only the changed priorities (delta files after a full one); a reader of
    every commit rebuilds the writer's tree bit for bit, across evictions, a ring that grows (one-step
    episodes), compaction into a new full file, and two interleaved env streams."""
    path = tmp_path / "s"
    s = mr.ReplayStore.create(path, capacity=1500, obs_shape=(2,), obs_dtype="int32", stack=2, n_step=3,
                              chunk_size=32, num_envs=2, prioritized=PRIO, seed=3)
    rng = np.random.default_rng(0)
    s.reset(np.zeros((2, 2), np.int32))
    kinds, growth_seen = [], False
    positions = s.inspect()["ring_positions"]
    for commit in range(60):
        one_step = 25 <= commit < 32  # short episodes fill chunks with starts: the ring grows
        for _ in range(int(rng.integers(5, 40)) if commit else 900):
            end = rng.random(2) < (0.9 if one_step else 0.05)
            s.step(rng.integers(0, 3, 2), rng.random(2), rng.integers(0, 99, (2, 2)).astype(np.int32), end,
                   np.zeros(2, bool))
            if len(s) and rng.random() < 0.3:
                b = s.sample(8)
                s.update_priorities(b.index, rng.random(8) * rng.choice([0.5, 3.0]))
        s.commit()
        growth_seen |= s.inspect()["ring_positions"] != positions
        entry = s.inspect()["priority_state"]
        kinds.append("delta" if entry["deltas"] else "full")
        referenced = {os.path.basename(f) for f in [entry["file"], *entry["deltas"]]}
        assert set(os.listdir(path / "state")) == referenced  # nothing else is kept
        with mr.ReplayStore.open(path, mode="r") as r:
            _same_priority_state(s, r)
            for _ in range(2):  # the reader samples what the writer samples from this commit on
                rb, wb = r.sample(8), s.sample(8)
                np.testing.assert_array_equal(rb.index, wb.index)
                np.testing.assert_array_equal(rb.weight, wb.weight)
    assert growth_seen, kinds
    assert kinds.count("delta") > 30  # most commits wrote a delta...
    # ...and the chain was compacted into a new full file after its first one
    assert any(a == "delta" and b == "full" for a, b in zip(kinds, kinds[1:], strict=False))
    s.close()
    with mr.ReplayStore.open(path) as w:  # a writer reopening a chain continues it
        b = w.sample(8)
        w.update_priorities(b.index, np.full(8, 7.0))
        w.commit()
        assert w.inspect()["priority_state"]["deltas"]
        with mr.ReplayStore.open(path, mode="r") as r:
            _same_priority_state(w, r)
            np.testing.assert_array_equal(r.priorities(np.unique(b.index)), 7.0)


def test_a_missing_priority_delta_is_named(tmp_path):
    s = _store(tmp_path / "s", capacity=200, steps=120, chunk_size=16)
    s.commit()
    s.update_priorities(s.sampleable_ids()[:5], np.full(5, 2.0))
    s.commit()
    delta = s.inspect()["priority_state"]["deltas"][-1]
    s.close()
    os.unlink(tmp_path / "s" / delta)
    with pytest.raises(mr.CorruptStoreError, match=os.path.basename(delta)):
        mr.ReplayStore.open(tmp_path / "s", mode="r")
    problems = mr.verify_store(str(tmp_path / "s"))
    assert any(os.path.basename(delta) in p for p in problems)


def test_damaged_priority_files_are_named_and_the_store_opens_once_repaired(tmp_path):
    path = tmp_path / "s"
    s = _store(path, capacity=200, steps=120, chunk_size=16)
    s.commit()
    ids = s.sampleable_ids()[:5]
    s.update_priorities(ids, np.full(5, 2.0))
    s.commit()
    state = s.inspect()["priority_state"]
    full, delta = state["file"], state["deltas"][-1]
    s.close()
    cases = [(delta, np.zeros((2, 5)), r"expected float64\[3, n\]"),  # a delta without its id row
             (full, np.zeros((2, 10**4)), "covers 10000 ids")]  # more ids than the commit issued
    for rel, bad, message in cases:
        original = (path / rel).read_bytes()
        np.save(path / rel, bad)
        with pytest.raises(mr.CorruptStoreError, match=os.path.basename(rel) + ".*" + message):
            mr.ReplayStore.open(path, mode="r")
        (path / rel).write_bytes(original)
    with mr.ReplayStore.open(path) as again:
        np.testing.assert_array_equal(again.priorities(ids), 2.0)
