"""DQN-replay (Dopamine checkpoint) import, checked row by row against the episodes written.

``Dopamine`` below re-expresses the add/padding/cursor/logging rules of Dopamine's
``OutOfGraphReplayBuffer`` and batch_rl's logged buffer, and writes the files they write
(gzip'd ``.npy``; a pickled ``episode_end_indices`` in the newer layout). The oracle
(``expected_rows``) computes every transition's row (stacked obs, n-step reward, discount,
next_obs, flags) from what was added, with plain loops.
"""

from __future__ import annotations

import gzip
import os
import pickle
from dataclasses import dataclass

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.datasets import DatasetError, DatasetNotFoundError, describe, import_dataset
from tests._support.dqn import OBS, Dopamine, Row


# -- the oracle -------------------------------------------------------------------------------------------
@dataclass
class Segment:
    """What the store holds of one episode, from its first stored frame on."""

    frames: list
    actions: list
    rewards: list
    end: str  # "terminated"; "truncated" (final frame missing); "cut" (ended by a gap: final frame stored); "open"
    head_lost: bool


def segments(rows: list[Row], stretches: list[tuple[int, int, bool]]) -> list[Segment]:
    """Segments of the add ranges ``[a, b)`` of each stretch, in order. ``known`` (third item): the
    stretch begins at a buffer start or right after an episode end; otherwise its first rows form an
    episode whose start was lost (leading padding rows included as its frames). A stretch that does not
    end with an episode end leaves it open; the next stretch (after a gap) ends it as "cut"."""
    segs: list[Segment] = []
    for a, b, known in stretches:
        if segs and segs[-1].end == "open":
            segs[-1].end = "cut"
        cur: Segment | None = None
        lost = not known
        for add in range(a, b):
            row = rows[add]
            if cur is None:
                if row.padding and not lost:
                    continue
                cur = Segment([], [], [], "open", lost)
                lost = False
            cur.frames.append(row.frame)
            cur.actions.append(row.action)
            cur.rewards.append(row.reward)
            if row.end:
                cur.end = row.end
                segs.append(cur)
                cur = None
        if cur is not None:
            cur.actions.pop()  # the last row of a running episode has no next frame
            cur.rewards.pop()
            segs.append(cur)
    return segs


def expected_rows(segs: list[Segment], k: int, n: int, gamma: float) -> tuple[dict[int, dict], int]:
    rows: dict[int, dict] = {}
    i = 0
    for seg in segs:
        F, L = seg.frames, len(seg.actions)

        def stack(j, F=F):
            return np.stack([F[q] if q >= 0 else np.zeros(OBS, np.uint8) for q in range(j - k + 1, j + 1)])

        for t in range(L):
            m = min(n, L - t)
            reaches_end = t + m == L and seg.end != "open"
            ok = not (seg.head_lost and t < k - 1)  # a stack needs k stored frames of its episode
            ok &= not (seg.end == "open" and t + n > L)  # the window is still open
            ok &= not (reaches_end and seg.end == "truncated")  # would bootstrap from the missing final frame
            if ok:
                term = reaches_end and seg.end == "terminated"
                rew = np.float32(sum(gamma ** q * seg.rewards[t + q] for q in range(m)))
                rows[i] = {"obs": stack(t), "action": seg.actions[t], "reward": rew,
                           "next_obs": np.zeros((k, *OBS), np.uint8) if term else stack(t + m),
                           "discount": np.float32(0.0) if term else np.float32(gamma ** m),
                           "terminated": term, "truncated": reaches_end and seg.end == "cut"}
            i += 1
    return rows, i


def check(store: mr.ReplayStore, segs: list[Segment], k: int = 4, n: int = 1, gamma: float = 0.99) -> int:
    exp, total = expected_rows(segs, k, n, gamma)
    assert store.id_range == (0, total)
    ids = np.array(sorted(exp), np.int64)
    assert len(store) == ids.size
    b = store.gather(ids)
    for j, i in enumerate(ids.tolist()):
        for name, want in exp[i].items():
            got = getattr(b, name)[j]
            assert np.array_equal(got, want), f"{name} of id {i}: {got!r} != {want!r}"
    t = store.episodes()
    assert t.head_lost.tolist() == [s.head_lost for s in segs]
    assert t.ended.tolist() == [s.end != "open" for s in segs]
    assert t.terminated.tolist() == [s.end == "terminated" for s in segs]
    assert t.final_missing.tolist() == [s.end in ("terminated", "truncated") for s in segs]
    return int(ids.size)


def ring_start(buf: Dopamine, add_count: int) -> int:
    """First add index a logged file holds (the stale cursor row of a wrapped ring)."""
    return add_count - buf.C if add_count >= buf.C else 0


# -- the tests ------------------------------------------------------------------------------------------
@pytest.fixture
def logged(tmp_path):
    """A logged buffer of 300 slots with suffixes 0, 1, 2 (the ring wrapped twice)."""
    buf = Dopamine(str(tmp_path / "ckpt"), 300)
    buf.play(np.random.default_rng(3), lambda: buf.log_count == 3)
    return buf


def test_snapshot_before_the_ring_was_full(tmp_path, logged):
    store = import_dataset(logged.d, tmp_path / "s", suffixes=[0], progress=False)
    # suffix 0: add_count 299 < 300 slots; rows 0..298 in slot order, 3 padding rows first
    assert check(store, segments(logged.rows, [(0, 299, True)])) > 200
    assert (store.schema.stack, store.schema.n_step, store.schema.pad) == (4, 1, "zeros")  # from invalid_range
    src = store.metadata["source"]
    assert src["format"] == "dqn-replay" and src["terminal_marks_time_limit"] is True and src["rewards_clipped"]
    assert src["checkpoints"][0]["add_count"] == 299 and src["running"] == 1
    store.close()


def test_wrapped_ring_alone_starts_after_the_cursor(tmp_path, logged):
    store = import_dataset(logged.d, tmp_path / "s", suffixes=[1], progress=False)
    lo = ring_start(logged, 599)  # suffix 1 holds adds 299..598; slot 299 (add 299) is the stale cursor row
    known = logged.rows[lo].end is not None
    segs = segments(logged.rows, [(lo + 1, 599, known)])
    check(store, segs)
    assert segs[0].head_lost != known
    store.close()


@pytest.mark.parametrize("k,n,gamma", [(4, 1, 0.99), (2, 3, 0.9)])
def test_several_suffixes_join_into_one_stream(tmp_path, logged, k, n, gamma):
    store = import_dataset(logged.d, tmp_path / "s", suffixes=[0, 1, 2], stack=k, n_step=n, gamma=gamma,
                           progress=False)
    # consecutive logged suffixes continue each other exactly: adds 0..898 as one stream
    segs = segments(logged.rows, [(0, 899, True)])
    assert sum(s.end == "terminated" for s in segs) > 20
    check(store, segs, k, n, gamma)
    assert store.metadata["source"]["suffixes"] == [0, 1, 2]
    store.close()


def test_final_buffer_log_and_a_cursor_inside_the_ring(tmp_path):
    buf = Dopamine(str(tmp_path / "ckpt"), 200)
    rng = np.random.default_rng(5)
    buf.play(rng, lambda: buf.log_count == 2)
    buf.play(rng, lambda: buf.add_count >= 2 * 200 - 1 + 77)
    end = buf.add_count
    buf.log_final()  # suffix 2, written with add_count = the cursor
    # suffix 2 continues suffix 1 (adds 199..398) with adds 399..end-1: slots 199, then 0.. (two slot runs)
    store = import_dataset(buf.d, tmp_path / "s", suffixes=[1, 2], progress=False)
    lo = ring_start(buf, 399)
    check(store, segments(buf.rows, [(lo + 1, end, buf.rows[lo].end is not None)]))
    assert store.metadata["source"]["checkpoints"][1]["final_buffer"] is True
    store.close()


def test_checkpoint_with_any_cursor(tmp_path):
    """A Dopamine checkpoint saved at an arbitrary add count: rows after the cursor come first."""
    buf = Dopamine(str(tmp_path / "ckpt"), 150, log=False)
    rng = np.random.default_rng(11)
    buf.play(rng, lambda: buf.add_count >= 380)
    a = buf.add_count
    buf.save(7)
    store = import_dataset(buf.d, tmp_path / "s", progress=False)
    assert a % 150 not in (0, 149)  # the cursor is inside the ring: two slot runs
    check(store, segments(buf.rows, [(a - 150 + 1, a, buf.rows[a - 150].end is not None)]))
    store.close()


def test_overlapping_checkpoints_are_joined_once(tmp_path):
    buf = Dopamine(str(tmp_path / "ckpt"), 200, log=False)
    rng = np.random.default_rng(2)
    for i, at in enumerate((150, 320, 470)):  # overlapping windows [0,150), [120,320), [270,470)
        buf.play(rng, lambda at=at: buf.add_count >= at)
        buf.save(i)
    store = import_dataset(buf.d, tmp_path / "s", progress=False)
    check(store, segments(buf.rows, [(0, buf.add_count, True)]))
    store.close()


def test_a_gap_between_suffixes_cuts_the_open_episode(tmp_path, logged):
    store = import_dataset(logged.d, tmp_path / "s", suffixes=[0, 2], progress=False)
    lo = ring_start(logged, 899)
    segs = segments(logged.rows, [(0, 299, True), (lo + 1, 899, logged.rows[lo].end is not None)])
    check(store, segs)
    store.close()


@pytest.mark.parametrize("n", [1, 3])
def test_newer_layout_reads_episode_end_indices_without_unpickling(tmp_path, monkeypatch, n):
    buf = Dopamine(str(tmp_path / "ckpt"), 250, newer=True, horizon=2)
    buf.play(np.random.default_rng(9), lambda: buf.log_count == 2, time_limit=12)
    assert any(r.end == "truncated" for r in buf.rows)

    def no_unpickling(*a, **k):
        raise AssertionError("a dataset file was unpickled")

    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    store = import_dataset(buf.d, tmp_path / "s", n_step=n, progress=False)
    segs = segments(buf.rows, [(0, 249 + 250, True)])
    assert any(s.end == "truncated" for s in segs)
    check(store, segs, 4, n)
    src = store.metadata["source"]
    assert src["update_horizon"] == 2 and src["terminal_marks_time_limit"] is False and src["truncated"] > 0
    store.close()


# -- bad input ------------------------------------------------------------------------------------------
def _leftovers(parent) -> list[str]:
    return sorted(p for p in os.listdir(parent) if p.startswith("."))


def _expect_failure(tmp_path, src, exc, *words, **kw):
    target = tmp_path / "out" / "store"
    with pytest.raises(exc) as info:
        import_dataset(src, target, format="dqn-replay", progress=False, **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert not target.exists()
    assert not (target.parent.exists() and _leftovers(target.parent))
    return info.value


def _copy(buf, tmp_path):
    import shutil

    d = tmp_path / "bad"
    shutil.copytree(buf.d, d)
    return d


def test_missing_file(tmp_path, logged):
    d = _copy(logged, tmp_path)
    os.unlink(d / "$store$_reward_ckpt.1.gz")
    err = _expect_failure(tmp_path, d, DatasetNotFoundError, "$store$_reward_ckpt.1.gz")
    assert isinstance(err, FileNotFoundError)
    _expect_failure(tmp_path, d, DatasetNotFoundError, "$store$_observation_ckpt.5.gz", suffixes=[5])


def test_truncated_observation_file(tmp_path, logged):
    d = _copy(logged, tmp_path)
    p = d / "$store$_observation_ckpt.1.gz"
    raw = p.read_bytes()
    p.write_bytes(raw[:len(raw) * 2 // 3])
    _expect_failure(tmp_path, d, DatasetError, "$store$_observation_ckpt.1.gz", "truncated", suffixes=[0, 1])


def test_mismatched_lengths(tmp_path, logged):
    d = _copy(logged, tmp_path)
    with gzip.open(d / "$store$_action_ckpt.0.gz", "wb") as g:
        np.save(g, logged.action[:-5])
    _expect_failure(tmp_path, d, DatasetError, "$store$_action_ckpt.0.gz", "$store$_action", "300")


def test_not_gzip_and_not_npy(tmp_path, logged):
    d = _copy(logged, tmp_path)
    with open(d / "$store$_terminal_ckpt.0.gz", "wb") as f:
        np.save(f, logged.terminal)  # a bare .npy, not gzip'd
    _expect_failure(tmp_path, d, DatasetError, "$store$_terminal_ckpt.0.gz", "not a gzip file")
    with gzip.open(d / "$store$_terminal_ckpt.0.gz", "wb") as g:
        g.write(b"this is not an array" * 10)
    _expect_failure(tmp_path, d, DatasetError, "$store$_terminal_ckpt.0.gz", "not a .npy")
    with gzip.open(d / "$store$_terminal_ckpt.0.gz", "wb") as g:
        np.save(g, np.array([{"x": 1}] * 300, dtype=object), allow_pickle=True)
    _expect_failure(tmp_path, d, DatasetError, "$store$_terminal_ckpt.0.gz", "unpickling")


def test_malicious_episode_end_indices_are_refused(tmp_path):
    buf = Dopamine(str(tmp_path / "ckpt"), 120, newer=True)
    buf.play(np.random.default_rng(1), lambda: buf.log_count == 1)

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    with gzip.open(os.path.join(buf.d, "episode_end_indices_ckpt.0.gz"), "wb") as g:
        pickle.dump({1, 2, Evil()}, g)
    _expect_failure(tmp_path, buf.d, DatasetError, "episode_end_indices_ckpt.0.gz", "refusing")
    assert not (tmp_path / "pwned").exists()


def test_invalid_range_must_match_the_cursor(tmp_path, logged):
    d = _copy(logged, tmp_path)
    with gzip.open(d / "invalid_range_ckpt.0.gz", "wb") as g:
        np.save(g, np.array([5, 6, 7, 8, 9]))
    _expect_failure(tmp_path, d, DatasetError, "invalid_range_ckpt.0.gz", "cursor")


def test_unrelated_checkpoints_are_refused(tmp_path):
    a = Dopamine(str(tmp_path / "a"), 100, log=False)
    a.play(np.random.default_rng(1), lambda: a.add_count >= 90)
    a.save(0)
    b = Dopamine(str(tmp_path / "b"), 100, log=False, seed=1)
    b.play(np.random.default_rng(2), lambda: b.add_count >= 150)
    b.save(1)
    os.rename(os.path.join(b.d, "$store$_observation_ckpt.1.gz"), os.path.join(a.d, "$store$_observation_ckpt.1.gz"))
    for name in ("$store$_action", "$store$_reward", "$store$_terminal", "add_count", "invalid_range"):
        os.rename(os.path.join(b.d, f"{name}_ckpt.1.gz"), os.path.join(a.d, f"{name}_ckpt.1.gz"))
    _expect_failure(tmp_path, a.d, DatasetError, "does not continue")


def test_final_buffer_alone_is_refused_with_a_hint(tmp_path):
    buf = Dopamine(str(tmp_path / "ckpt"), 100)
    rng = np.random.default_rng(4)
    buf.play(rng, lambda: buf.log_count == 2)
    buf.play(rng, lambda: buf.add_count >= 199 + 40)
    buf.log_final()
    _expect_failure(tmp_path, buf.d, DatasetError, "padding", suffixes=[2])


def _rewrite(d, name, suffix, arr):
    with gzip.open(os.path.join(d, f"{name}_ckpt.{suffix}.gz"), "wb") as g:
        np.save(g, arr, allow_pickle=False)


def _reread(d, name, suffix):
    with gzip.open(os.path.join(d, f"{name}_ckpt.{suffix}.gz"), "rb") as g:
        return np.load(g)


def test_rows_of_no_bytes_are_refused_before_anything_is_allocated_per_slot(tmp_path):
    d = str(tmp_path / "ckpt")
    os.makedirs(d)
    slots = 10**12  # declared by files of a few hundred bytes
    for name, dtype in (("observation", np.uint8), ("action", np.int32), ("reward", np.float32),
                        ("terminal", np.uint8)):
        _rewrite(d, "$store$_" + name, 0, np.empty((slots, 0), dtype))
    _rewrite(d, "add_count", 0, np.array(slots - 1))
    _rewrite(d, "invalid_range", 0, (slots - 2 + np.arange(5)) % slots)
    with pytest.raises(DatasetError, match=r"observation_ckpt\.0\.gz: .*rows of no bytes"):
        describe(d)
    _expect_failure(tmp_path, d, DatasetError, "$store$_observation_ckpt.0.gz", "rows of no bytes")


@pytest.mark.parametrize("name", ["reward", "terminal"])
def test_complex_rewards_or_terminals_are_refused_not_cast(tmp_path, logged, name):
    d = _copy(logged, tmp_path)
    arr = _reread(d, "$store$_" + name, 0)
    _rewrite(d, "$store$_" + name, 0, arr.astype(np.complex64) + 1j)
    _expect_failure(tmp_path, d, DatasetError, f"$store$_{name}_ckpt.0.gz", "complex64", "real numbers")


@pytest.fixture
def two_runs(tmp_path):
    """Two checkpoints of one run that do not overlap (adds 0..79, then 80..179)."""
    buf = Dopamine(str(tmp_path / "ckpt"), 100, log=False)
    rng = np.random.default_rng(1)
    buf.play(rng, lambda: buf.add_count >= 80)
    buf.save(0)
    buf.play(rng, lambda: buf.add_count >= 180)
    buf.save(1)
    return buf.d


def test_a_later_checkpoint_whose_actions_the_store_cannot_hold(tmp_path, two_runs):
    a = _reread(two_runs, "$store$_action", 1).astype(np.int64)
    _rewrite(two_runs, "$store$_action", 1, a)  # int64 values that fit the first checkpoint's int32
    store = import_dataset(two_runs, tmp_path / "fits", progress=False)
    assert store.schema.action_dtype == np.int32
    store.close()
    slot = int(np.flatnonzero(a)[0])
    a[slot] += 2**33
    _rewrite(two_runs, "$store$_action", 1, a)
    _expect_failure(tmp_path, two_runs, DatasetError, "$store$_action_ckpt.1.gz", f"{a[slot]} at slot {slot}",
                    "int32")
    _rewrite(two_runs, "$store$_action", 1, a.astype(np.float32))
    _expect_failure(tmp_path, two_runs, DatasetError, "$store$_action_ckpt.1.gz", "float32", "int32")


def test_checkpoints_holding_different_extras_are_refused(tmp_path, two_runs):
    _rewrite(two_runs, "$store$_logit", 0, np.zeros(100, np.float32))
    _expect_failure(tmp_path, two_runs, DatasetError, "$store$_logit_ckpt.0.gz", "checkpoint 1 does not")
    _rewrite(two_runs, "$store$_logit", 1, np.zeros((100, 2), np.float32))
    _expect_failure(tmp_path, two_runs, DatasetError, "$store$_logit_ckpt.1.gz", "(2,)")


def test_a_reward_the_store_cannot_hold_names_its_file_and_slot(tmp_path, two_runs):
    r = _reread(two_runs, "$store$_reward", 0)
    r[50] = np.nan
    _rewrite(two_runs, "$store$_reward", 0, r)
    _expect_failure(tmp_path, two_runs, DatasetError, "$store$_reward_ckpt.0.gz", "nan at slot 50", suffixes=[0])
