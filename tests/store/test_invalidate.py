"""invalidate(ids) and clear(): taken out of sampling at once, durable at the next commit (SEMANTICS.md,
"Invalidating and clearing"), checked against the model's sampleable set minus what was taken out."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from tests._support.helpers import assert_row_equal, make_pair


def _fill(store: mr.ReplayStore, steps: int, episode: int = 7, start: int = 0) -> None:
    """Episodes of ``episode`` steps; frame t holds [t, 0]; the last episode stays open."""
    if not store.episode_open[0]:
        store.reset(np.array([start, 0], np.int32))
    for t in range(start + 1, start + steps + 1):
        end = t % episode == 0
        store.step(t % 3, float(t), np.array([t, 0], np.int32), end, False)
        if end:
            store.reset(np.array([t, 0], np.int32))


def _store(path, **kw) -> mr.ReplayStore:
    return mr.ReplayStore.create(path, capacity=kw.pop("capacity", 500), obs_shape=(2,), obs_dtype="int32",
                                 stack=2, n_step=3, chunk_size=kw.pop("chunk_size", 64), **kw)


def test_invalidated_ids_are_never_sampled_gathered_or_counted(tmp_path):
    s = _store(tmp_path / "s")
    _fill(s, 100)
    before = len(s)
    bad = np.array([5, 6, 7, 40, 98, 99], np.int64)  # 98, 99: windows still open (pending) at the head
    pending = [i for i in bad if i not in set(s.sampleable_ids().tolist())]
    assert pending, "the test needs ids whose window has not closed yet"
    assert s.invalidate(bad) == 6
    assert s.invalidate(bad[:2]) == 0  # already invalidated: counted once
    assert len(s) == before - (6 - len(pending))
    _fill(s, 20, start=100)  # the pending ones' windows close now: they must stay out
    ids = set(s.sampleable_ids().tolist())
    assert ids.isdisjoint(bad.tolist()) and {1, 8, 97, 100}.issubset(ids)
    for _ in range(50):
        assert not np.isin(s.sample(64).index, bad).any()
    with pytest.raises(mr.NotSampleableError, match=r"index\[1\] = 6 was invalidated"):
        s.gather([8, 6])
    epoch = np.concatenate([b.index for b in s.iter_batches(16, seed=1)])
    assert sorted(epoch.tolist()) == sorted(ids) and not np.isin(epoch, bad).any()
    assert len(s.episodes()) and s.episodes().length.sum() >= 110  # episodes keep them
    s.close()


def test_invalidate_checks_ids_and_changes_nothing_on_error(tmp_path):
    s = _store(tmp_path / "s")
    _fill(s, 30)
    n = len(s)
    with pytest.raises(mr.NotSampleableError, match=r"index\[1\] = 30 was never issued"):
        s.invalidate([3, 30])
    with pytest.raises(mr.NotSampleableError, match="never issued"):
        s.invalidate([-1])
    with pytest.raises(ValueError, match="1-D"):
        s.invalidate([[1, 2]])
    with pytest.raises(TypeError, match="integer"):
        s.invalidate([1.5])
    assert len(s) == n and 3 in s.sampleable_ids()
    s.close()
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    with pytest.raises(mr.ReadOnlyStoreError):
        r.invalidate([1])
    with pytest.raises(mr.ReadOnlyStoreError):
        r.clear()
    r.close()


def test_evicted_ids_are_skipped(tmp_path):
    s = _store(tmp_path / "s", capacity=100, chunk_size=32)
    _fill(s, 400)
    lo, _ = s.id_range
    assert lo > 10
    assert s.invalidate([0, 1, lo + 5]) == 1
    assert lo + 5 not in s.sampleable_ids()
    s.close()


def test_prioritized_mass_goes_and_updates_skip(tmp_path):
    s = _store(tmp_path / "s", prioritized=mr.Prioritized(alpha=1.0, eps=0.0))
    _fill(s, 60)
    ids = s.sampleable_ids()
    s.update_priorities(ids, np.full(ids.size, 2.0))
    total = s.inspect()["priority_total"]
    bad = ids[:10]
    s.invalidate(bad)
    state = s.inspect()
    assert state["priority_slots"] == len(s) == ids.size - 10
    assert state["priority_total"] == pytest.approx(total - 20.0)
    skipped = s.priority_updates_skipped
    assert s.update_priorities(bad, np.full(10, 5.0)) == 10
    assert s.priority_updates_skipped == skipped + 10
    with pytest.raises(mr.NotSampleableError, match="invalidated"):
        s.priorities(bad[:1])
    for _ in range(30):
        assert not np.isin(s.sample(32).index, bad).any()
    s.commit()
    s.close()
    assert mr.verify_store(str(tmp_path / "s")) == []  # priorities cover exactly the sampleable set
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    assert r.inspect()["priority_slots"] == len(r) == ids.size - 10
    r.close()


def test_prefetched_batches_are_drawn_again(tmp_path):
    s = _store(tmp_path / "s", seed=3)
    _fill(s, 200)
    it = s.batches(16, prefetch=3)
    next(it)
    drawn = np.concatenate([d.ids for d in it.pending()])  # rows drawn, not handed out
    s.invalidate(drawn)
    rng_after_invalidate = s.inspect()["rng"]
    later = [next(it) for _ in range(4)]
    assert not any(np.isin(b.index, drawn).any() for b in later)
    # they are exactly what repeated sample() calls give from the same point (a twin run shows it)
    s.close(commit=False)
    s2 = _store(tmp_path / "s2", seed=3)
    _fill(s2, 200)
    it2 = s2.batches(16, prefetch=3)
    next(it2)
    s2.invalidate(drawn)
    assert s2.inspect()["rng"] == rng_after_invalidate
    again = [s2.sample(16) for _ in range(4)]
    for a, b in zip(later, again, strict=True):
        np.testing.assert_array_equal(a.index, b.index)
    s2.close()


def test_durable_at_the_next_commit_only(tmp_path):
    path = tmp_path / "s"
    s = _store(path)
    _fill(s, 80)
    s.commit()
    s.invalidate([1, 2, 3])
    s.close(commit=False)  # as a crash: the invalidation was not committed
    s = mr.ReplayStore.open(path)
    assert {1, 2, 3}.issubset(s.sampleable_ids().tolist())
    s.invalidate([1, 2, 3, 50])
    s.commit()
    doc = json.load(open(path / "manifest.json"))
    assert doc["format_version"] == 2 and doc["validity"]["invalid_ids"] == 4
    ranges = np.load(path / doc["validity"]["file"])
    assert ranges.tolist() == [[1, 4], [50, 51]]
    s.close()
    for mode in ("r", "r+"):
        r = mr.ReplayStore.open(path, mode=mode)
        ids = set(r.sampleable_ids().tolist())
        assert ids.isdisjoint({1, 2, 3, 50}) and 4 in ids
        r.close()
    assert mr.verify_store(str(path)) == []


def test_a_record_survives_commits_without_changes_and_snapshots(tmp_path):
    path = tmp_path / "s"
    s = _store(path, prioritized=mr.Prioritized())
    _fill(s, 80)
    s.invalidate([10, 11])
    s.commit()
    rec = json.load(open(path / "manifest.json"))["validity"]
    _fill(s, 10, start=80)
    s.commit()  # nothing invalidated since: the same record and file
    assert json.load(open(path / "manifest.json"))["validity"] == rec
    assert os.path.exists(path / rec["file"])
    snap = s.save(str(tmp_path / "snap"))
    s.close()
    loaded = mr.ReplayStore.load(snap, tmp_path / "loaded")
    assert {10, 11}.isdisjoint(loaded.sampleable_ids().tolist()) and 12 in loaded.sampleable_ids()
    loaded.close()
    assert mr.verify_store(snap) == [] and mr.verify_store(str(tmp_path / "loaded")) == []


def test_stores_without_the_record_open_and_write_version_1(tmp_path):
    path = tmp_path / "s"
    s = _store(path)
    _fill(s, 40)
    s.close()
    doc = json.load(open(path / "manifest.json"))
    assert doc["format_version"] == 1 and "validity" not in doc and "rate_limit" not in doc
    r = mr.ReplayStore.open(path, mode="r")
    assert len(r) > 30
    r.close()


def test_clear_removes_everything_and_ids_keep_counting(tmp_path):
    path = tmp_path / "s"
    s = _store(path)
    _fill(s, 45)  # episodes of 7: one open at 45 (started after 42)
    s.commit()
    rows = s.inspect()["rows"]
    s.clear()
    assert len(s) == 0 and s.sampleable_ids().size == 0 and len(s.episodes()) == 0
    with pytest.raises(mr.NotSampleableError, match="removed by clear"):
        s.gather([44])
    with pytest.raises(mr.NotSampleableError):
        s.sample(1)
    assert s.to_pandas().empty
    _fill(s, 30, start=45)  # the open episode goes on
    assert s.id_range[1] == 75
    ids = s.sampleable_ids()
    assert ids.min() >= 45 and 45 in ids  # its first transition after the clear stacks frames from before
    s.commit()
    s.close()
    r = mr.ReplayStore.open(path, mode="r")
    assert r.sampleable_ids().tolist() == ids.tolist()
    t = r.episodes()
    assert t.complete.tolist() == [False, True, True, True, False]  # the one across the clear is cut; 70- runs
    # listed from its last frame before the clear: the first transition after it (45) is its own
    assert not t.start_retained[0] and t.first_row[0] == rows[0] - 1
    assert t.first_id[0] == 45 and r.episode_steps(t, 0).actions.size == t.length[0]
    first = r.gather(np.array([45]))
    assert first.obs[0, -1, 0] == 45 and first.next_obs[0, -1, 0] == 48  # obs predates the clear (n_step 3)
    r.close()
    out = mr.export(str(path), str(tmp_path / "out.zarr"))
    assert out.episodes == 3 and out.skipped_partial == 1  # 49-56, 56-63, 63-70; 70-75 is still running
    import zarr

    g = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")
    assert int(g["observations"][0][0]) == 49  # nothing from before the clear


def test_clear_right_after_reset_keeps_that_episode_whole(tmp_path):
    s = _store(tmp_path / "s")
    _fill(s, 14)  # ends an episode at 14 and resets: the new episode has only its first observation
    s.clear()
    _fill(s, 7, start=14)
    t = s.episodes()
    assert len(t) == 2 and t.complete[0] and t.length[0] == 7 and t.first_row[0] == 16
    np.testing.assert_array_equal(s.episode_frames(t, 0)[:, 0], np.arange(14, 22))
    s.close()


def test_clear_of_a_vector_store(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=200, obs_shape=(2,), obs_dtype="int32", num_envs=2,
                              n_step=2, chunk_size=32)
    ends = {0: {4, 15, 18}, 1: {8, 12}}
    s.reset(np.zeros((2, 2), np.int32))
    for t in range(1, 20):
        if t == 10:
            cleared = s.id_range[1]
            s.clear()  # at row 10: env 1 auto-reset at row 9 (its episode has no step before the clear)
        s.step([0, 0], [1.0, 1.0], np.full((2, 2), t, np.int32), [t in ends[0], t in ends[1]], [False, False])
    t = s.episodes()
    assert list(zip(t.stream.tolist(), t.first_row.tolist(), t.complete.tolist(), strict=True)) == [
        (0, 9, False), (0, 16, True), (0, 19, False), (1, 9, True), (1, 13, False)]  # env 0: from its last frame
    # before the clear, the observation of its first transition after it
    assert s.sampleable_ids().min() == cleared
    s.close()


@st.composite
def _plan(draw: st.DrawFn) -> list[tuple[str, int]]:
    return draw(st.lists(st.one_of(
        st.tuples(st.just("steps"), st.integers(1, 30)),
        st.tuples(st.just("invalidate"), st.integers(0, 2**31)),
        st.tuples(st.just("clear"), st.just(0)),
        st.tuples(st.just("reopen"), st.just(0))), min_size=1, max_size=12))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=_plan(), stack=st.integers(1, 3), n_step=st.integers(1, 4), episode=st.integers(2, 9))
def test_the_model_minus_what_was_taken_out(tmp_path_factory, plan, stack, n_step, episode):
    """At every step of a random plan (steps, invalidations of evicted, sampleable and pending ids, clears,
    commit and reopen), the sampleable set is the model's minus the invalidated ids and everything before
    the last clear, and every remaining row equals the model's."""
    path = str(tmp_path_factory.mktemp("inv") / "s")
    pair = make_pair(path, capacity=40, stack=stack, n_step=n_step, chunk_size=16)
    store, model = pair.store, pair.model
    out: set[int] = set()
    cleared = t = 0
    store.reset(o := pair.frame(None))
    model.reset(o)
    for op, arg in plan:
        if op == "steps":
            for _ in range(arg):
                t += 1
                end = t % episode == 0
                o = pair.frame(None)
                store.step(t % 3, float(t % 5), o, end, False)
                model.step(t % 3, float(t % 5), o, end, False)
                if end:
                    store.reset(o := pair.frame(None))
                    model.reset(o)
        elif op == "invalidate":
            lo, hi = store.id_range
            if hi:
                rng = np.random.default_rng(arg)
                ids = rng.integers(max(0, lo - 5), hi, size=rng.integers(1, 6))  # some evicted ones too
                store.invalidate(ids)
                out.update(int(i) for i in ids)
        elif op == "clear":
            store.clear()
            cleared = store.id_range[1]
        else:
            store.close()  # commits
            reader = mr.ReplayStore.open(path, mode="r")
            seen = reader.sampleable_ids().tolist()
            reader.close()
            store = mr.ReplayStore.open(path)
            assert store.sampleable_ids().tolist() == seen
        want = [i for i in model.sampleable_ids() if i not in out and i >= cleared]
        assert store.sampleable_ids().tolist() == want
        assert len(store) == len(want)
        if want:
            b = store.gather(np.array(want, np.int64))
            for j, i in enumerate(want):
                assert_row_equal(b, j, model.row(i))
    store.close()


def test_a_damaged_validity_file_is_named(tmp_path):
    path = tmp_path / "s"
    s = _store(path)
    _fill(s, 40)
    s.invalidate([3, 4, 9])
    s.close()
    rel = json.load(open(path / "manifest.json"))["validity"]["file"]
    np.save(path / rel, np.array([[3, 5], [9, 11]], np.int64))  # different ranges, same shape
    assert any(rel in p and "checksum" in p for p in mr.verify_store(str(path)))
    np.save(path / rel, np.zeros(4))
    with pytest.raises(mr.CorruptStoreError, match=r"invalid\.\d+\.npy: holds float64\[4\], expected int64\[k, 2\]"):
        mr.ReplayStore.open(path, mode="r")
    os.unlink(path / rel)
    with pytest.raises(mr.CorruptStoreError, match="state file named by the manifest is missing"):
        mr.ReplayStore.open(path, mode="r")


def test_a_forged_validity_record_is_refused_before_a_file_is_read(tmp_path):
    from mmreplay.storage.manifest import write_manifest

    path = tmp_path / "s"
    s = _store(path)
    _fill(s, 40)
    s.invalidate([3, 4, 9])
    s.close()
    doc = json.load(open(path / "manifest.json"))
    rel = doc["validity"]["file"]
    body = {k: v for k, v in doc.items() if k not in ("format", "format_version", "checksum")}
    for field, value, msg in [("file", "../../outside.npy", "validity.file"),
                              ("cleared_below", 10**6, "validity.cleared_below"),
                              ("invalid_ids", -1, "validity.invalid_ids")]:
        write_manifest(str(path), {**body, "validity": {**doc["validity"], field: value}})
        with pytest.raises(mr.CorruptStoreError, match=msg):
            mr.ReplayStore.open(path, mode="r")
    write_manifest(str(path), body)
    np.save(path / rel, np.array([[0, 30], [5, 40]], np.int64))  # overlapping ranges
    with pytest.raises(mr.CorruptStoreError, match="sorted, disjoint"):
        mr.ReplayStore.open(path, mode="r")


_GARBAGE = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=8),
                                  st.floats(allow_nan=True), st.sampled_from(["../x.npy", "state/invalid.npy"])),
                        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=8)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["validity", "rate_limit"]), field=st.sampled_from(
    [None, "cleared_below", "cleared_row", "invalid_ids", "file", "inserted", "sampled", "sampled_total", "size"]),
    value=_GARBAGE)
def test_mutated_records_open_or_raise_a_documented_error(tmp_path_factory, key, field, value):
    from mmreplay.storage.manifest import write_manifest

    path = tmp_path_factory.mktemp("mut") / "s"
    s = mr.ReplayStore.create(path, capacity=200, obs_shape=(2,), obs_dtype="int32", n_step=2, chunk_size=32,
                              rate_limit=mr.RateLimit(1.0, 5, 100.0, timeout=0))
    _fill(s, 30)
    s.sample(4)
    s.invalidate([2, 3])
    s.close()
    doc = json.load(open(path / "manifest.json"))
    body = {k: v for k, v in doc.items() if k not in ("format", "format_version", "checksum")}
    if field is None:
        body[key] = value
    else:
        body[key] = {**body[key], field: value}
    try:
        write_manifest(str(path), body)
    except (TypeError, ValueError):
        return  # not writable as JSON
    os.unlink(path / "ratelimit.npy")  # made again from the (mutated) record
    for mode in ("r", "r+"):
        try:
            r = mr.ReplayStore.open(path, mode=mode)
        except mr.MMReplayError:
            continue
        try:
            assert len(r) == r.sampleable_ids().size and r.inspect()["rate_limit"]["inserted"] >= 0
        finally:
            r.close()
