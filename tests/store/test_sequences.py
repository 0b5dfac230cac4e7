"""Sequences (SEMANTICS.md "Sequences"): every field of every sequence against the model, at every distance
from an episode end and from the write head; strict draws; prioritized starts; resume and prefetch."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from tests._support import internals
from tests._support.helpers import SEQ_FIELDS, check_sequences, drive_pair, make_pair

EXTRAS = {"lp": ((), "float32"), "vec": ((2,), "int16")}
# An episode event per env and step: 0 continue, 1 terminated, 2 truncated, 3 both flags.
EVENTS = st.sampled_from([0] * 8 + [1, 2, 3])


@st.composite
def configs(draw: st.DrawFn) -> dict:
    num_envs = draw(st.integers(1, 3))
    vector = num_envs > 1 or draw(st.booleans())
    return dict(
        num_envs=num_envs,
        vector=vector,
        stack=draw(st.integers(1, 4)),
        n_step=draw(st.integers(1, 4)),
        gamma=0.9,
        pad=draw(st.sampled_from(["zeros", "first"])),
        chunk_size=num_envs * draw(st.integers(2, 9)),  # small chunks: the ring wraps many times
        capacity=draw(st.integers(1, 30)),
        extras=EXTRAS,
        action_shape=draw(st.sampled_from([(), (2,)])),
        action_dtype=draw(st.sampled_from(["int64", "float32"])),
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs(), data=st.data())
def test_sequences_match_the_model(tmp_path_factory, cfg, data):
    steps = data.draw(st.integers(1, 80))
    n = cfg["num_envs"]
    events = data.draw(st.lists(st.lists(EVENTS, min_size=n, max_size=n), min_size=steps, max_size=steps))
    resets = data.draw(st.lists(st.sampled_from([False] * 20 + [True]), min_size=steps, max_size=steps))
    lengths = sorted(set(data.draw(st.lists(st.integers(1, 14), min_size=1, max_size=3)) + [1]))
    pair = make_pair(str(tmp_path_factory.mktemp("seq") / "s"), **cfg)
    rng = np.random.default_rng(steps)
    drive_pair(pair, cfg, events, resets, data.draw(st.integers(4, 25)), lambda: check_sequences(pair, lengths, rng))
    pair.store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs(), data=st.data())
def test_the_index_keeps_the_fitting_starts_up_to_date(tmp_path_factory, cfg, data):
    """The starts strict draws fall back to, kept incrementally by the index (a part's method, called here
    directly), are after every step exactly the model's sampleable starts with `length` steps (ids that
    stopped being sampleable may linger: draws check them), and never an evicted id."""
    steps = data.draw(st.integers(1, 60))
    n = cfg["num_envs"]
    events = data.draw(st.lists(st.lists(EVENTS, min_size=n, max_size=n), min_size=steps, max_size=steps))
    resets = data.draw(st.lists(st.sampled_from([False] * 20 + [True]), min_size=steps, max_size=steps))
    length = data.draw(st.integers(1, 8))
    pair = make_pair(str(tmp_path_factory.mktemp("fits") / "s"), **cfg)

    def check() -> None:
        pair.store.sampleable_ids()  # updates the index's validity, as a draw does
        index = internals.log(pair.store).index
        got = index.fitting_starts(length)
        assert got.size == np.unique(got).size and (got >= pair.model.oldest_id).all()
        sampleable = set(pair.model.sampleable_ids())
        want = {i for i in sampleable if pair.model.sequence_fits(i, length)}
        assert {int(i) for i in got} & sampleable == want

    drive_pair(pair, cfg, events, resets, 1, check)
    pair.store.close()


def test_long_run_with_many_wraparounds(tmp_path):
    """Hundreds of chunk retirements, two streams, long sequences: still every field of every start."""
    cfg = dict(num_envs=2, vector=True, stack=3, n_step=2, gamma=0.9, pad="first", chunk_size=10, capacity=24,
               extras=EXTRAS, action_shape=(), action_dtype="int64")
    rng = np.random.default_rng(3)
    events = [[int(rng.choice([0] * 14 + [1, 2])) for _ in range(2)] for _ in range(600)]
    pair = make_pair(str(tmp_path / "s"), **cfg)
    drive_pair(pair, cfg, events, [False] * 600, 41, lambda: check_sequences(pair, [1, 4, 13, 30], rng))
    pair.store.close()


# ---- fields the random streams do not reach -------------------------------------------------------------

def test_missing_final_observation_reads_as_a_zero_state(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=50, obs_shape=(1,), obs_dtype="int32", stack=2)
    s.reset(np.array([10], np.int32))
    s.step(0, 1.0, np.array([11], np.int32), False, False)
    s.step(1, 2.0, None, True, False)  # the final observation was never available
    seq = s.gather_sequences([0, 1], 4)
    assert seq.mask.tolist() == [[True, True, False, False], [True, False, False, False]]
    np.testing.assert_array_equal(seq.obs[0, :, :, 0], [[0, 10], [10, 11], [0, 0], [0, 0], [0, 0]])
    np.testing.assert_array_equal(seq.obs[1, :, :, 0], [[10, 11], [0, 0], [0, 0], [0, 0], [0, 0]])
    assert seq.terminated.tolist() == [[False, True, False, False], [True, False, False, False]]
    s.close()


def test_an_episode_whose_head_was_lost_has_no_first_step(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=50, obs_shape=(1,), obs_dtype="int32", stack=1)
    s.reset(np.array([10], np.int32), head_lost=True)
    for t in range(3):
        s.step(0, 1.0, np.array([11 + t], np.int32), t == 2, False)
    s.reset(np.array([20], np.int32))
    s.step(0, 1.0, np.array([21], np.int32), True, False)
    seq = s.gather_sequences(s.sampleable_ids(), 2)
    assert seq.is_first[:, 0].tolist() == [False, False, False, True]
    s.close()


def test_a_reset_after_the_draw_does_not_change_a_drawn_sequence(tmp_path):
    """A drawn sequence is fixed when drawn: the truncation a later reset() adds to its newest step shows in
    sequences drawn after it, not in one drawn (and prefetched) before."""
    s = mr.ReplayStore.create(tmp_path / "s", capacity=50, obs_shape=(1,), obs_dtype="int32", seed=1)
    s.reset(np.array([0], np.int32))
    for t in range(3):
        s.step(0, 1.0, np.array([t + 1], np.int32), False, False)
    it = s.sequence_batches(1, 5, prefetch=1)
    first = next(it)
    s.reset(np.array([9], np.int32))  # truncates the episode at its last step (id 2)
    second, third = next(it), next(it)  # `second` was drawn with `first`, `third` after the reset
    for seq in (first, second, third):
        last = int(seq.mask[0].sum()) - 1
        assert seq.ids[0, last] == 2
        assert seq.truncated[0, last] == (seq is third)
    s.close()


def test_arguments_are_checked(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=50, obs_shape=(1,), obs_dtype="int32")
    s.reset(np.array([0], np.int32))
    s.step(0, 1.0, np.array([1], np.int32), True, False)
    with pytest.raises(ValueError, match="length"):
        s.sample_sequences(2, 0)
    with pytest.raises(ValueError, match="length"):
        s.sample_sequences(2, True)
    with pytest.raises(ValueError, match="batch_size"):
        s.sample_sequences(0, 3)
    with pytest.raises(TypeError, match="strict"):
        s.sample_sequences(2, 3, strict="yes")
    with pytest.raises(ValueError, match="prioritized"):
        s.sample_sequences(2, 3, beta=0.5)
    with pytest.raises(ValueError, match="prefetch"):
        s.sequence_batches(2, 3, prefetch=-1)
    with pytest.raises(mr.NotSampleableError, match="never issued"):
        s.gather_sequences([5], 3)
    with pytest.raises(ValueError, match="half of this machine's memory"):
        s.sample_sequences(2, 10**12)  # refused before anything is drawn or allocated
    with pytest.raises(ValueError, match="half of this machine's memory"):
        s.gather_sequences([0], 10**12)
    empty = s.gather_sequences(np.empty(0, np.int64), 3)
    assert empty.obs.shape == (0, 4, 1, 1) and empty.ids.shape == (0, 3)
    rng_before = s.inspect()["rng"]
    with pytest.raises(mr.NotSampleableError, match="2 steps"):
        s.sample_sequences(2, 2, strict=True)
    assert s.inspect()["rng"] == rng_before  # a refused strict draw leaves the RNG as it was
    s.close()


# ---- distributions ----------------------------------------------------------------------------------------

def chi2_ok(counts: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """Chi-square statistic and its 0.999 quantile (Wilson-Hilferty), over cells expecting > 5."""
    big = expected > 5
    stat = float((((counts - expected) ** 2) / expected)[big].sum())
    dof = int(big.sum()) - 1
    return stat, dof * (1 - 2 / (9 * dof) + 3.09 * np.sqrt(2 / (9 * dof))) ** 3


def episodic_store(path, lengths: list[int], prioritized: mr.Prioritized | None = None, seed: int = 0):
    """Episodes of the given lengths (terminated), one frame value per step."""
    s = mr.ReplayStore.create(path, capacity=sum(lengths) + 10, obs_shape=(1,), obs_dtype="int32",
                              prioritized=prioritized, seed=seed)
    v = 0
    for n in lengths:
        s.reset(np.array([v], np.int32))
        for t in range(n):
            v += 1
            s.step(0, 0.0, np.array([v], np.int32), t == n - 1, False)
    return s


def fitting(store: mr.ReplayStore, length: int) -> np.ndarray:
    ids = store.sampleable_ids()
    return ids[store.gather_sequences(ids, length).mask.all(axis=1)]


@pytest.mark.parametrize("shape", ["common", "rare"])  # rare: fewer than 1 in 30 starts fit (the exact pass)
def test_strict_uniform_starts_are_uniform_among_those_that_fit(tmp_path, shape):
    lengths = [30, 12, 45, 8, 60] * 3 if shape == "common" else [1] * 900 + [14, 16]
    s = episodic_store(tmp_path / "s", lengths, seed=4)
    fit = fitting(s, 10)
    assert 0 < fit.size < (len(s) / 30 if shape == "rare" else len(s))
    draws = np.concatenate([s.sample_sequences(32, 10, strict=True).index for _ in range(300)])
    assert np.isin(draws, fit).all()
    counts = np.array([np.count_nonzero(draws == i) for i in fit])
    stat, crit = chi2_ok(counts, np.full(fit.size, draws.size / fit.size))
    assert stat < crit, (stat, crit)
    s.close()


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("shape", ["common", "rare"])
def test_prioritized_starts_follow_priorities(tmp_path, strict, shape):
    prio = mr.Prioritized(alpha=0.7, beta=0.5)
    lengths = [20, 9, 35, 14] * 3 if shape == "common" else [1] * 500 + [12, 15]
    s = episodic_store(tmp_path / "s", lengths, prio, seed=2)
    ids = s.sampleable_ids()
    rng = np.random.default_rng(0)
    p = rng.integers(1, 30, ids.size).astype(np.float64)
    if shape == "rare":  # the starts that fit carry little of the mass
        p[:] = 40.0
        p[-27:] = rng.integers(1, 30, 27)
    s.update_priorities(ids, p)
    mass = (p + prio.eps) ** prio.alpha
    allowed = np.isin(ids, fitting(s, 8)) if strict else np.ones(ids.size, bool)
    if shape == "rare" and strict:
        assert mass[allowed].sum() < mass.sum() / 30
    draws, weights = [], []
    for _ in range(400):
        seq = s.sample_sequences(32, 8, strict=strict)
        draws.append(seq.index)
        weights.append(seq.weight)
    drawn = np.concatenate(draws)
    pos = np.searchsorted(ids, drawn)
    assert allowed[pos].all()
    counts = np.bincount(pos, minlength=ids.size)[allowed]
    expected = mass[allowed] / mass[allowed].sum() * drawn.size
    stat, crit = chi2_ok(counts, expected)
    assert stat < crit, (stat, crit)
    # weights are sample()'s: (P(i) / P_min) ** -beta over the whole store
    want = (mass[pos] / mass.min()) ** -prio.beta
    np.testing.assert_allclose(np.concatenate(weights), want.astype(np.float32), rtol=1e-6)
    s.close()


def test_sequence_priorities_round_trip(tmp_path):
    s = episodic_store(tmp_path / "s", [20, 7, 30], mr.Prioritized(alpha=1.0, beta=1.0, eps=0.0))
    seq = s.sample_sequences(16, 10)
    td = np.abs(np.random.default_rng(1).standard_normal(seq.mask.shape))
    td[~seq.mask] = np.nan  # masked steps are ignored
    p = mr.sequence_priority(td, seq.mask, eta=0.9)
    for b in range(16):
        row = td[b, seq.mask[b]]
        assert p[b] == pytest.approx(0.9 * row.max() + 0.1 * row.mean())
    s.update_priorities(seq.index, p)
    last = {int(i): v for i, v in zip(seq.index, p, strict=True)}  # the last value of a repeated id wins
    np.testing.assert_array_equal(s.priorities(np.array(list(last))), np.array(list(last.values())))
    s.close()


def test_sequence_priority_checks_its_inputs():
    mask = np.array([[True, True, False]])
    assert mr.sequence_priority(np.array([[1.0, 3.0, np.nan]]), mask, eta=0.0)[0] == 2.0
    assert mr.sequence_priority(np.array([[1.0, 3.0, 7.0]]), mask, eta=1.0)[0] == 3.0
    with pytest.raises(ValueError, match="shape"):
        mr.sequence_priority(np.ones((1, 2)), mask)
    with pytest.raises(ValueError, match="batch, length"):
        mr.sequence_priority(np.ones(3), mask[0])
    with pytest.raises(ValueError, match=r"abs_td\[0, 1\]"):
        mr.sequence_priority(np.array([[1.0, np.nan, 1.0]]), mask)
    with pytest.raises(ValueError, match=r"abs_td\[0, 0\]"):
        mr.sequence_priority(np.array([[-1.0, 1.0, 1.0]]), mask)
    with pytest.raises(ValueError, match="no unmasked step"):
        mr.sequence_priority(np.ones((1, 3)), np.zeros((1, 3), bool))
    with pytest.raises(TypeError, match="bool"):
        mr.sequence_priority(np.ones((1, 3)), np.ones((1, 3)))
    with pytest.raises(ValueError, match="eta"):
        mr.sequence_priority(np.ones((1, 3)), mask, eta=1.5)


# ---- reproducibility -----------------------------------------------------------------------------------

def same_sequences(a: mr.SequenceBatch, b: mr.SequenceBatch) -> None:
    for name in (*SEQ_FIELDS, "index", "weight"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in a.extras:
        np.testing.assert_array_equal(a.extras[name], b.extras[name])


def running_store(path, prioritized=None):
    """Episodes of 5..40 steps in two streams, the last ones still running."""
    s = mr.ReplayStore.create(path, capacity=300, obs_shape=(2,), obs_dtype="int32", stack=2, n_step=3,
                              num_envs=2, chunk_size=40, extras={"h": ((3,), "float16")}, prioritized=prioritized,
                              seed=11)
    rng = np.random.default_rng(5)
    s.reset(np.zeros((2, 2), np.int32))
    for t in range(260):
        write_step(s, rng, t)
    return s, rng


def write_step(s, rng, t):
    s.step(rng.integers(0, 4, 2), rng.random(2), np.full((2, 2), t + 1, np.int32), rng.random(2) < 0.05,
           rng.random(2) < 0.02, h=rng.random((2, 3)).astype(np.float16))


@pytest.mark.parametrize("prioritized", [None, mr.Prioritized()])
def test_prefetched_sequences_equal_repeated_sample_sequences(tmp_path, prioritized):
    s, _ = running_store(tmp_path / "s", prioritized)
    s.commit()
    for strict in (False, True):
        with mr.ReplayStore.open(tmp_path / "s", mode="r", seed=3) as a, \
                mr.ReplayStore.open(tmp_path / "s", mode="r", seed=3) as b:
            it = b.sequence_batches(4, 12, prefetch=3, strict=strict)
            for _ in range(6):
                same_sequences(a.sample_sequences(4, 12, strict=strict), next(it))
    s.close()


@pytest.mark.parametrize("prioritized", [None, mr.Prioritized()])
def test_sample_sequences_continue_after_reopen_and_load(tmp_path, prioritized):
    s, _ = running_store(tmp_path / "s", prioritized)
    s.sample_sequences(4, 9)
    s.commit()
    s.save(tmp_path / "snap")
    want = [s.sample_sequences(4, 9, strict=k % 2 == 1) for k in range(4)]
    s.close(commit=False)
    for store in (mr.ReplayStore.open(tmp_path / "s"), mr.ReplayStore.load(tmp_path / "snap", tmp_path / "w")):
        for k in range(4):
            same_sequences(want[k], store.sample_sequences(4, 9, strict=k % 2 == 1))
        store.close()


@pytest.mark.parametrize("prioritized", [None, mr.Prioritized()])
def test_a_resumed_iterator_hands_out_the_pending_sequences(tmp_path, prioritized):
    """Sequences drawn but not handed out at a commit come out first after a resume, exactly as they were
    drawn - although steps, and a reset() that truncates the newest step a drawn sequence holds, came
    between the draw and the commit."""
    s, rng = running_store(tmp_path / "s", prioritized)
    it = s.sequence_batches(4, 300, prefetch=3)
    for _ in range(2):
        next(it)
    every = s.gather_sequences(s.sampleable_ids(), 400)
    m = every.mask.sum(axis=1) - 1
    rows = np.arange(m.size)
    at_head = ~(every.terminated | every.truncated)[rows, m]  # stopped without an end: at the newest step
    newest = set(every.ids[rows, m][at_head].tolist())
    assert newest
    s.reset(np.zeros((2, 2), np.int32))  # ends both running episodes at those steps: truncated
    for t in range(3):
        write_step(s, rng, 1000 + t)
    s.commit()
    s.save(tmp_path / "snap")
    want = [next(it) for _ in range(6)]  # 3 drawn before the commit, 3 after
    hits = 0
    for w in want[:3]:
        hit = np.isin(w.ids, list(newest))
        hits += int(hit.sum())
        assert not w.truncated[hit].any()  # as drawn: not ended yet
        assert s.gather_sequences(w.index, 300).truncated[hit].all()  # drawn now: truncated by the reset
    assert hits
    s.close(commit=False)
    for store in (mr.ReplayStore.open(tmp_path / "s"), mr.ReplayStore.load(tmp_path / "snap", tmp_path / "w")):
        resumed = store.sequence_batches(4, 300, prefetch=1)
        for w in want:
            same_sequences(w, next(resumed))
        store.close()


def test_pending_sequences_are_not_handed_to_another_kind_of_iterator(tmp_path):
    """A resumed iterator of another kind (length, or transitions) does not take the pending sequences: it
    draws what the committed run draws with its iterator put aside, from the RNG after the pending draws."""
    s, _ = running_store(tmp_path / "s")
    it = s.sequence_batches(4, 10, prefetch=2)
    next(it)
    s.commit()
    it.close()  # the committed run goes on with other kinds
    want = [next(s.sequence_batches(4, 11, prefetch=0)), next(s.batches(4, prefetch=0))]
    s.close(commit=False)
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as r:
        got = next(r.sequence_batches(4, 11, prefetch=0))  # another length
        assert got.length == 11
        same_sequences(got, want[0])
        np.testing.assert_array_equal(next(r.batches(4, prefetch=0)).index, want[1].index)


def test_sequences_from_a_reader_process_and_a_forked_child(tmp_path):
    """A reader (mode='r') samples the writer's last commit; a forked child of the writer samples too."""
    import os

    s, rng = running_store(tmp_path / "s")
    s.commit()
    head = s.id_range[1]
    for t in range(5):
        write_step(s, rng, 2000 + t)
    with mr.ReplayStore.open(tmp_path / "s", mode="r", seed=7) as r:
        seq = r.sample_sequences(16, 50)
        assert seq.ids.max() < head  # nothing past the commit
        same_sequences(seq, r.gather_sequences(seq.index, 50))
    r_fd, w_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            got = s.sample_sequences(8, 20)
            ok = bool(got.mask[:, 0].all()) and got.obs.shape == (8, 21, 2, 2)
            os.write(w_fd, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w_fd)
    assert os.read(r_fd, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(r_fd)
    s.close()


def test_the_readme_recurrent_state_recipe_runs(tmp_path, monkeypatch):
    import os
    import re

    readme = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "README.md")
    section = open(readme, encoding="utf-8").read().split("## Sequences", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "no python block under '## Sequences' in README.md"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    exec(compile(code.group(1), "README.md sequences", "exec"), namespace)
    seq = namespace["seq"]
    assert seq.obs.shape == (32, 81, 1, 8) and seq.extras["h"].shape == (32, 80, 512)
    # the stored state of a start is the one its step was written with: zeros at an episode's first step
    assert not seq.extras["h"][:, 0][seq.is_first[:, 0]].any()


@pytest.mark.parametrize("change,words", [
    (lambda seq: seq.update(length=0), "length"),
    (lambda seq: seq.update(strict="yes"), "strict"),
    (lambda seq: seq.update(heads=seq["heads"][:-1]), "heads"),
    (lambda seq: seq.update(heads=[10**9] * len(seq["heads"])), "heads"),
])
def test_forged_pending_sequences_are_a_corrupt_store(tmp_path, change, words):
    from tests._support.hostile import forge, read_doc

    s, _ = running_store(tmp_path / "s")
    it = s.sequence_batches(4, 10, prefetch=2)
    next(it)
    s.commit()
    s.close(commit=False)
    assert read_doc(tmp_path / "s")["pending_draws"]["sequences"]["length"] == 10  # what the writer writes
    forge(tmp_path / "s", lambda d: change(d["pending_draws"]["sequences"]))
    with pytest.raises(mr.CorruptStoreError, match=words):
        mr.ReplayStore.open(tmp_path / "s", mode="r")


def test_a_pending_head_before_its_starts_is_drawn_afresh(tmp_path):
    from tests._support.hostile import forge

    s, _ = running_store(tmp_path / "s")
    it = s.sequence_batches(4, 10, prefetch=2)
    next(it)
    s.commit()
    s.close(commit=False)
    forge(tmp_path / "s", lambda d: d["pending_draws"]["sequences"].update(
        heads=[1] * len(d["pending_draws"]["sequences"]["heads"])))
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as a, mr.ReplayStore.open(tmp_path / "s", mode="r") as b:
        got = next(a.sequence_batches(4, 10, prefetch=0))  # not the forged pending draws: afresh from `rng`
        same_sequences(got, b.sample_sequences(4, 10))


def test_the_memory_check_counts_the_extras(tmp_path):
    # 32 KiB of extras per step, tiny frames: what a request needs is nearly all extras
    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(1,), chunk_size=16,
                              extras={"h": ((4096,), "float64")})
    s.reset(np.zeros(1, np.uint8))
    for t in range(20):
        s.step(0, 1.0, np.full(1, t, np.uint8), False, False, h=np.zeros(4096))
    budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    length = budget // (40 * 32768) + 1  # 40 such sequences need more than the budget
    rng_before = s.inspect()["rng"]
    with pytest.raises(ValueError, match="half of this machine's memory"):
        s.sample_sequences(40, length)
    with pytest.raises(ValueError, match="half of this machine's memory"):
        s.gather_sequences(np.zeros(40, np.int64), length)
    with pytest.raises(ValueError, match="half of this machine's memory"):
        s.sample(budget // 32768 + 1)
    assert s.inspect()["rng"] == rng_before  # refused before anything was drawn
    assert s.sample_sequences(2, 3).extras["h"].shape == (2, 3, 4096)
    s.close()
