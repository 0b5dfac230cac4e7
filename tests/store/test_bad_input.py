"""Bad input gets a clear error, and the store is unchanged and still usable afterwards."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import mmreplay as mr


def _frame(v: int = 1) -> np.ndarray:
    return np.full((4, 4), v, np.uint8)


@pytest.fixture
def store(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(4, 4), stack=2, n_step=2, chunk_size=16,
                              extras={"lp": ((), "float32")})
    s.reset(_frame(0))
    for t in range(10):
        s.step(t % 3, 1.0, _frame(t + 1), False, False, lp=0.5)
    yield s
    if not s.closed:
        s.close()


def _snapshot(s: mr.ReplayStore):
    valid = s.sampleable_ids()
    b = s.gather(np.array(valid))
    return s.id_range, len(s), b.obs.copy(), b.reward.copy(), s.current_obs().copy()



def _same(a, b):
    assert a[0] == b[0] and a[1] == b[1]
    for x, y in zip(a[2:], b[2:], strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("call,exc,words", [
    (lambda s: s.step(0, 1.0, np.zeros((4, 5), np.uint8), False, False, lp=0.0), ValueError, ["(4, 4)", "(4, 5)"]),
    (lambda s: s.step(0, 1.0, np.zeros((4, 4), np.float32), False, False, lp=0.0), TypeError, ["uint8", "float32"]),
    (lambda s: s.step(0.5, 1.0, _frame(), False, False, lp=0.0), TypeError, ["action", "int64", "float64"]),
    (lambda s: s.step(0, float("nan"), _frame(), False, False, lp=0.0), ValueError, ["reward", "finite"]),
    (lambda s: s.step(0, 1.0, _frame(), "yes", False, lp=0.0), TypeError, ["terminated", "bool"]),
    (lambda s: s.step(0, 1.0, _frame(), False, False), TypeError, ["missing", "lp"]),
    (lambda s: s.step(0, 1.0, _frame(), False, False, lp=0.0, other=1), TypeError, ["other", "not declared"]),
    (lambda s: s.step(0, 1.0, _frame(), False, False, lp=np.zeros(3)), ValueError, ["lp", "()", "(3,)"]),
    (lambda s: s.reset(np.zeros((3, 4, 4), np.uint8)), ValueError, ["obs", "(4, 4)"]),
    (lambda s: s.gather([999]), mr.NotSampleableError, ["999", "never issued"]),
    (lambda s: s.gather([-1]), mr.NotSampleableError, ["-1", "not a transition id"]),
    (lambda s: s.gather([9]), mr.NotSampleableError, ["9", "not sampleable"]),
    (lambda s: s.gather([[1, 2]]), ValueError, ["1-D"]),
    (lambda s: s.gather([1.5]), TypeError, ["integer"]),
    (lambda s: s.sample(0), ValueError, ["batch_size"]),
    (lambda s: s.sample(1000, replace=False), mr.NotSampleableError, ["1000", "distinct", "replace=True"]),
])
def test_bad_input_changes_nothing(store, call, exc, words):
    before = _snapshot(store)
    with pytest.raises(exc) as info:
        call(store)
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value}"
    _same(before, _snapshot(store))
    store.step(1, 1.0, _frame(99), True, False, lp=1.0)  # still writable
    assert store.sample(4).obs.shape == (4, 2, 4, 4)


def test_step_before_reset_and_after_end(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=10, obs_shape=(2,), obs_dtype="float32")
    with pytest.raises(mr.EpisodeStateError, match=r"reset\(obs\) first"):
        s.step(0, 0.0, np.zeros(2, np.float32), False, False)
    with pytest.raises(mr.EpisodeStateError, match="before the first reset"):
        s.current_obs()
    s.reset(np.zeros(2, np.float32))
    s.step(0, 0.0, np.ones(2, np.float32), False, True)
    with pytest.raises(mr.EpisodeStateError, match="episode ended"):
        s.step(0, 0.0, np.ones(2, np.float32), False, False)
    s.reset(np.zeros(2, np.float32))
    s.step(0, 0.0, np.ones(2, np.float32), False, False)
    assert s.id_range == (0, 2)
    s.close()


def test_sampling_an_empty_store(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=10, obs_shape=(2,), n_step=3)
    with pytest.raises(mr.NotSampleableError, match="no sampleable transitions"):
        s.sample(1)
    s.reset(np.zeros(2, np.uint8))
    s.step(0, 0.0, np.ones(2, np.uint8), False, False)
    with pytest.raises(mr.NotSampleableError, match="window"):
        s.sample(1)  # the only transition's 3-step window is still open
    s.step(0, 0.0, np.ones(2, np.uint8), True, False)
    assert len(s) == 2 and s.sample(3).index.tolist()
    s.close()


def test_vector_batch_sizes(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=10, obs_shape=(2,), num_envs=3, chunk_size=6)
    with pytest.raises(ValueError, match=r"\(3, 2\).*num_envs=3"):
        s.reset(np.zeros((2, 2), np.uint8))
    s.reset(np.zeros((3, 2), np.uint8))
    good = dict(action=np.zeros(3, np.int64), reward=np.zeros(3), next_obs=np.ones((3, 2), np.uint8),
                terminated=np.zeros(3, bool), truncated=np.zeros(3, bool))
    for name, bad in [("action", np.zeros(2, np.int64)), ("reward", np.zeros(4)),
                      ("next_obs", np.ones((2, 2), np.uint8)), ("terminated", np.zeros(2, bool)),
                      ("truncated", np.zeros((3, 1), bool))]:
        with pytest.raises(ValueError, match=name):
            s.step(**dict(good, **{name: bad}))
    assert s.id_range == (0, 0)
    s.step(**good)
    assert s.id_range == (0, 3)
    s.close()


def test_read_only_store_refuses_writes(tmp_path, store):
    store.close()
    r = mr.ReplayStore.open(tmp_path / "s", mode="r")
    before = _snapshot(r)
    for call in (lambda: r.reset(_frame()), lambda: r.step(0, 1.0, _frame(), False, False, lp=0.0), r.commit):
        with pytest.raises(mr.ReadOnlyStoreError, match="mode='r+'"):
            call()
    _same(before, _snapshot(r))
    r.close()


def test_create_on_non_empty_directory(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        mr.ReplayStore.create(tmp_path / "d", capacity=10, obs_shape=(2,))
    assert os.listdir(tmp_path / "d") == ["notes.txt"]
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        mr.ReplayStore.create(tmp_path / "f", capacity=10, obs_shape=(2,))


@pytest.mark.parametrize("kw,words", [
    (dict(capacity=0), ["capacity", ">= 1"]),
    (dict(obs_shape=(0, 3)), ["obs_shape", "positive"]),
    (dict(obs_dtype="U4"), ["obs_dtype"]),
    (dict(stack=0), ["stack"]),
    (dict(n_step=1.5), ["n_step", "int"]),
    (dict(gamma=1.5), ["gamma"]),
    (dict(pad="edge"), ["pad", "'zeros' or 'first'"]),
    (dict(num_envs=3, chunk_size=10), ["chunk_size", "multiple of num_envs=3", "12"]),
    (dict(extras={"reward": ((), "float32")}), ["reserved"]),
    (dict(extras={"x": "float32"}), ["(shape, dtype)"]),
    (dict(prioritized={"alpha": 0.6}), ["mr.Prioritized"]),
    (dict(capacity=1_000_000, chunk_size=64), ["chunk_size=64", "memory", "chunk_size >= "]),
    (dict(read_threads="auto"), ["read_threads", "int >= 1", "'auto'"]),
    (dict(read_threads=0), ["read_threads", "int >= 1", "got 0"]),
    (dict(seed=-1), ["seed must be an int >= 0", "got -1"]),
])
def test_create_arguments_are_validated(tmp_path, kw, words):
    args = dict(capacity=10, obs_shape=(2,))
    args.update(kw)
    with pytest.raises((ValueError, TypeError)) as info:
        mr.ReplayStore.create(tmp_path / "s", **args)
    for w in words:
        assert w in str(info.value)
    assert not (tmp_path / "s").exists()


def test_open_refuses_a_bad_read_threads(store):
    store.commit()
    for bad in ("auto", 0, 2.5, True):
        with pytest.raises(ValueError, match="read_threads: expected None"):
            mr.ReplayStore.open(store.path, mode="r", read_threads=bad)


def test_open_foreign_or_newer_directory(tmp_path, store):
    with pytest.raises(mr.StoreNotFoundError):
        mr.ReplayStore.open(tmp_path / "nope")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.bin").write_bytes(b"\0" * 10)
    with pytest.raises(mr.NotAStoreError, match="not an mmreplay store"):
        mr.ReplayStore.open(tmp_path / "other")
    store.close()
    path = tmp_path / "s" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["format_version"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(mr.FormatVersionError, match="version 99"):
        mr.ReplayStore.open(tmp_path / "s")


def test_use_after_close(store):
    store.close()
    store.close()  # idempotent
    with pytest.raises(mr.StoreClosedError, match="closed"):
        store.sample(1)
    with pytest.raises(mr.StoreClosedError):
        len(store)


def test_second_writer_is_refused(tmp_path, store):
    with pytest.raises(mr.StoreLockedError, match="already open for writing"):
        mr.ReplayStore.open(tmp_path / "s", mode="r+")
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as r:
        assert r.id_range == (0, 0)  # the reader sees the last commit (create's empty store)


def test_create_on_a_plain_directory_says_it_is_not_a_store(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not an mmreplay store; give a new or empty directory") as info:
        mr.ReplayStore.create(tmp_path, capacity=10, obs_shape=(2,))
    assert "ReplayStore.open" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing was added


def test_create_on_a_store_points_to_open(tmp_path):
    mr.ReplayStore.create(tmp_path / "s", capacity=10, obs_shape=(2,)).close()
    with pytest.raises(ValueError, match=r"already holds an mmreplay store; continue it with ReplayStore.open"):
        mr.ReplayStore.create(tmp_path / "s", capacity=10, obs_shape=(2,))


def test_a_url_is_refused_as_a_stores_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (where a URL taken as a relative path would have made "s3:/bucket/run")
    with pytest.raises(ValueError, match="'s3://bucket/run' is a URL; a store is a local directory"):
        mr.ReplayStore.create("s3://bucket/run", capacity=10, obs_shape=(2,))
    s = mr.ReplayStore.create("local", capacity=10, obs_shape=(2,))
    snap = s.save("snap")
    s.close()
    with pytest.raises(ValueError, match="load\\(\\): 'memory://x' is a URL"):
        mr.ReplayStore.load(snap, "memory://x")
    assert sorted(os.listdir(tmp_path)) == ["local", "snap"]


def test_open_refuses_a_negative_seed_naming_it(tmp_path):
    mr.ReplayStore.create(tmp_path / "s", capacity=10, obs_shape=(2,)).close()
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -3"):
        mr.ReplayStore.open(tmp_path / "s", seed=-3)
    mr.ReplayStore.open(tmp_path / "s", seed=3).close()  # (the lock was not kept by the refused open)


def test_actions_and_extras_that_do_not_fit_their_dtype_are_refused_not_wrapped(tmp_path):
    s = mr.ReplayStore.create(tmp_path / "s", capacity=100, obs_shape=(2,), action_dtype="int8",
                              extras={"h": ((), "int16"), "f": ((2,), "float16")})
    s.reset(np.zeros(2, np.uint8))
    ok = dict(h=np.int64(5), f=np.zeros(2))
    with pytest.raises(ValueError, match="action: 300 does not fit the store's dtype int8"):
        s.step(300, 1.0, np.zeros(2, np.uint8), False, False, **ok)  # (a cast would have stored 44)
    with pytest.raises(ValueError, match=r"extras\['h'\]: 70000 does not fit the store's dtype int16"):
        s.step(1, 1.0, np.zeros(2, np.uint8), False, False, h=70000, f=np.zeros(2))
    with pytest.raises(ValueError, match=r"extras\['f'\]: 10000000000.0 at \(1,\) does not fit .* float16"):
        s.step(1, 1.0, np.zeros(2, np.uint8), False, False, h=5, f=np.array([0.5, 1e10]))
    with pytest.raises(ValueError, match=r"actions: 1000 at \(0,\) does not fit"):
        s.extend([1000, 2], [1.0, 1.0], np.zeros((2, 2), np.uint8), [False, False], [False, False],
                 h=np.zeros(2, np.int64), f=np.zeros((2, 2)))
    assert s.id_range == (0, 0)  # nothing was written
    s.step(-128, 1.0, np.zeros(2, np.uint8), False, False, h=np.int64(-32768), f=np.array([0.1, 65504.0]))
    s.step(np.uint64(127), 1.0, np.zeros(2, np.uint8), False, False, **ok)
    assert s.gather([0, 1]).action.tolist() == [-128, 127]
    u = mr.ReplayStore.create(tmp_path / "u", capacity=100, obs_shape=(2,), action_dtype="uint8")
    u.reset(np.zeros(2, np.uint8))
    u.step(3, 1.0, np.zeros(2, np.uint8), False, False)  # a Python int into uint8 (it was refused as int64)
    with pytest.raises(ValueError, match="action: -1 does not fit the store's dtype uint8"):
        u.step(-1, 1.0, np.zeros(2, np.uint8), False, False)
    with pytest.raises(TypeError, match="action: expected dtype uint8, got float64"):
        u.step(1.5, 1.0, np.zeros(2, np.uint8), False, False)
    u.close()
    s.close()
    f = mr.ReplayStore.create(tmp_path / "f", capacity=100, obs_shape=(2,), action_dtype="float16")
    f.reset(np.zeros(2, np.uint8))
    with pytest.raises(ValueError, match="action: 70000 does not fit the store's dtype float16"):
        f.step(70000, 1.0, np.zeros(2, np.uint8), False, False)  # (an int beyond float16's range: inf)
    f.step(300, 1.0, np.zeros(2, np.uint8), False, False)
    assert f.gather([0]).action.tolist() == [300.0]
    f.close()
