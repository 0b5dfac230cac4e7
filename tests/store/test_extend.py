"""``extend()``: blocks of one stream's steps, against ``step()`` and against the reference model.

A block must give exactly the ids and rows the same steps give through ``step()``; in a vector
store, blocks of different streams may interleave in any order (streams then advance apart and
chunks may be sealed with part-filled sections), and everything must survive a reopen.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from tests._support.helpers import assert_same, check_sequences, make_pair

EXTRAS = {"lp": ((), "float32"), "vec": ((2,), "int16")}


def _episode(rng: np.random.Generator, length: int, start: int, end: str) -> dict:
    """One stream's episode of ``length`` steps: frames [value, 0] counting from ``start``."""
    return dict(
        obs0=np.array([start, 0], np.int32),
        actions=rng.integers(0, 5, size=length).astype(np.int64),
        rewards=rng.integers(-3, 4, size=length) / 4,
        next_obs=np.array([[start + 1 + i, 0] for i in range(length)], np.int32).reshape(length, 2),
        terminated=np.array([end == "terminated" and i == length - 1 for i in range(length)]),
        truncated=np.array([end == "truncated" and i == length - 1 for i in range(length)]),
        lp=rng.standard_normal(length).astype(np.float32),
        vec=rng.integers(-9, 9, size=(length, 2)).astype(np.int16),
        missing=end != "open" and length > 0 and rng.random() < 0.3,
    )


def _by_steps(store: mr.ReplayStore, ep: dict) -> None:
    store.reset(ep["obs0"])
    n = len(ep["rewards"])
    for i in range(n):
        last_missing = ep["missing"] and i == n - 1
        store.step(int(ep["actions"][i]), float(ep["rewards"][i]), None if last_missing else ep["next_obs"][i],
                   bool(ep["terminated"][i]), bool(ep["truncated"][i]) or (last_missing and not ep["terminated"][i]),
                   lp=ep["lp"][i], vec=ep["vec"][i])


def _by_blocks(store: mr.ReplayStore, ep: dict, cuts: list[int], env: int = 0) -> None:
    store.reset(ep["obs0"], env=env)
    n = len(ep["rewards"])
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < n), n]
    for a, b in zip(bounds, bounds[1:], strict=False):
        missing = ep["missing"] and b == n
        trunc = ep["truncated"][a:b].copy()
        if missing and not ep["terminated"][b - 1]:
            trunc[-1] = True
        store.extend(ep["actions"][a:b], ep["rewards"][a:b], ep["next_obs"][a:b - 1 if missing else b],
                     ep["terminated"][a:b], trunc, env=env, final_missing=missing, lp=ep["lp"][a:b],
                     vec=ep["vec"][a:b])


def _rows_equal(a: mr.ReplayStore, b: mr.ReplayStore) -> None:
    assert a.id_range == b.id_range
    ids = a.sampleable_ids()
    np.testing.assert_array_equal(ids, b.sampleable_ids())
    if ids.size:
        x, y = a.gather(ids), b.gather(ids)
        for name in ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index"):
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)
        for name in EXTRAS:
            np.testing.assert_array_equal(x.extras[name], y.extras[name], err_msg=name)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_blocks_give_the_ids_rows_and_files_of_steps(tmp_path_factory, data):
    """One stream: the same episodes through step() and through extend() in random blocks."""
    cfg = dict(stack=data.draw(st.integers(1, 4)), n_step=data.draw(st.integers(1, 4)),
               chunk_size=data.draw(st.integers(2, 12)), capacity=data.draw(st.integers(1, 30)),
               pad=data.draw(st.sampled_from(["zeros", "first"])), extras=EXTRAS)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    lengths = data.draw(st.lists(st.integers(0, 30), min_size=1, max_size=6))
    ends = data.draw(st.lists(st.sampled_from(["terminated", "truncated", "open"]), min_size=len(lengths),
                              max_size=len(lengths)))
    tmp = tmp_path_factory.mktemp("ext")
    a = mr.ReplayStore.create(str(tmp / "steps"), obs_shape=(2,), obs_dtype="int32", **cfg)
    b = mr.ReplayStore.create(str(tmp / "blocks"), obs_shape=(2,), obs_dtype="int32", **cfg)
    start = 0
    for length, end in zip(lengths, ends, strict=True):
        ep = _episode(rng, length, start, end)
        start += length + 1
        _by_steps(a, ep)
        _by_blocks(b, ep, data.draw(st.lists(st.integers(1, 30), max_size=4)))
    _rows_equal(a, b)
    np.testing.assert_array_equal(a.episode_open, b.episode_open)
    a.close()
    b.close()
    # the same bytes on disk: a block is exactly its steps
    chunks_a, chunks_b = (sorted(os.listdir(tmp / n / "chunks")) for n in ("steps", "blocks"))
    assert chunks_a == chunks_b
    for name in chunks_a:
        assert (tmp / "steps" / "chunks" / name).read_bytes() == (tmp / "blocks" / "chunks" / name).read_bytes(), name


# One operation on a vector store: (kind, env, length, end): kind 0 extend, 1 reset(env=), 2 batched step,
# 3 batched reset; end 0 open, 1 terminated, 2 truncated, 3 terminated with the final observation missing.
OPS = st.tuples(st.sampled_from([0] * 6 + [1, 2, 3]), st.integers(0, 3), st.integers(0, 9),
                st.sampled_from([0] * 4 + [1, 2, 3]))


def _drive(pair, ops: list, n_env: int, rng: np.random.Generator, check_every: int = 0) -> None:
    store, model = pair.store, pair.model
    for j, (kind, env, length, end) in enumerate(ops):
        env %= n_env
        if kind == 1 or (kind == 0 and not store.episode_open[env]):
            store.reset(o := pair.frame(None), env=env)
            model.reset(o, env=env)
        elif kind == 3:
            store.reset(o := pair.frame(n_env))
            model.reset(o)
        elif kind == 2:
            if not all(f is not None for f in model.current):
                continue
            args = (rng.integers(0, 5, size=n_env), rng.integers(-3, 4, size=n_env) / 4, pair.frame(n_env),
                    rng.random(n_env) < 0.1, rng.random(n_env) < 0.1)
            ex = dict(lp=rng.standard_normal(n_env).astype(np.float32),
                      vec=rng.integers(-9, 9, size=(n_env, 2)).astype(np.int16))
            store.step(*args, **ex)
            model.step(*args, **ex)
        if kind == 0:
            term = np.zeros(length, np.bool_)
            trunc = np.zeros(length, np.bool_)
            missing = end == 3 and length > 0
            if length and end:
                term[-1] = end in (1, 3)
                trunc[-1] = end == 2
            frames = np.stack([pair.frame(None) for _ in range(length)]) if length else np.zeros((0, 2), np.int32)
            args = (rng.integers(0, 5, size=length), rng.integers(-3, 4, size=length) / 4,
                    frames[:-1] if missing else frames, term, trunc)
            ex = dict(lp=rng.standard_normal(length).astype(np.float32),
                      vec=rng.integers(-9, 9, size=(length, 2)).astype(np.int16))
            first = store.extend(*args, env=env, final_missing=missing, **ex)
            assert first == model.next_id
            model.extend(*args, env=env, final_missing=missing, **ex)
        if check_every and j % check_every == check_every - 1:
            assert_same(pair)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_interleaved_blocks_of_a_vector_store_match_the_model(tmp_path_factory, data):
    """Blocks of several streams in any order (with batched calls between), small chunks and capacity so
    that sections are sealed part-filled and chunks retire; then the same after a reopen."""
    n_env = data.draw(st.integers(2, 3))
    cfg = dict(num_envs=n_env, stack=data.draw(st.integers(1, 3)), n_step=data.draw(st.integers(1, 3)),
               gamma=0.9, pad=data.draw(st.sampled_from(["zeros", "first"])),
               chunk_size=n_env * data.draw(st.sampled_from([2, 3, 5, 8, 9, 10, 17, 21])),  # extents of 1..21 rows
               capacity=data.draw(st.integers(1, 30)), extras=EXTRAS)
    tmp = tmp_path_factory.mktemp("vec")
    path = str(tmp / "s")
    pair = make_pair(path, **cfg)
    pair.store.reset(o := pair.frame(n_env))
    pair.model.reset(o)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    ops = data.draw(st.lists(OPS, min_size=1, max_size=40))
    _drive(pair, ops, n_env, rng, check_every=data.draw(st.integers(3, 15)))
    assert_same(pair)
    check_sequences(pair, [1, 3, 7], rng)  # sequences follow each stream's own rows, also across extents
    event(f"extents sealed part-filled: {pair.store.inspect()['holes'] > 0}")
    pair.store.close()
    with open(os.path.join(path, "manifest.json")) as f:
        event(f"a stream left its home section: {any('extents' in c for c in json.load(f)['chunks'])}")
    assert mr.ReplayStore.open(path, mode="r").verify() == []
    pair.store = mr.ReplayStore.open(path)
    assert_same(pair)
    np.testing.assert_array_equal(pair.store.episode_open,
                                  [c is not None and c.end is None for c in pair.model.current])
    _drive(pair, data.draw(st.lists(OPS, min_size=1, max_size=20)), n_env, rng)  # continues after the reopen
    assert_same(pair)
    pair.store.close()


def _vector_pair(tmp_path, **kw):
    cfg = dict(num_envs=2, stack=2, n_step=2, gamma=0.5, chunk_size=8, capacity=12, extras=EXTRAS)
    cfg.update(kw)
    pair = make_pair(str(tmp_path / "s"), **cfg)
    return pair


def _block(pair, length, end=0):
    term = np.zeros(length, np.bool_)
    if length and end:
        term[-1] = True
    return ((np.arange(length) % 3).astype(np.int64), np.ones(length), np.stack([pair.frame(None) for _ in range(length)])
            if length else np.zeros((0, 2), np.int32), term, np.zeros(length, np.bool_))


def _ex(length):
    return dict(lp=np.zeros(length, np.float32), vec=np.zeros((length, 2), np.int16))


def test_a_stream_idle_for_a_whole_capacity_continues_its_episode_after_a_reopen(tmp_path):
    """Stream 1's last frame is retired while stream 0 writes on; its episode must still continue exactly,
    also after a reopen (its state then comes from the manifest, not from a retained frame)."""
    pair = _vector_pair(tmp_path)
    pair.store.reset(o := pair.frame(2))
    pair.model.reset(o)
    args = _block(pair, 3)
    pair.store.extend(*args, env=1, **_ex(3))
    pair.model.extend(*args, env=1, **_ex(3))
    for _ in range(12):  # stream 0 writes ~10 capacities
        args = _block(pair, 11)
        pair.store.extend(*args, env=0, **_ex(11))
        pair.model.extend(*args, env=0, **_ex(11))
    assert pair.store.inspect()["rows"][1] == 4
    assert_same(pair)
    pair.store.close()
    pair.store = mr.ReplayStore.open(str(tmp_path / "s"))
    assert pair.store.episode_open.tolist() == [True, True]
    args = _block(pair, 6, end=1)
    pair.store.extend(*args, env=1, **_ex(6))
    pair.model.extend(*args, env=1, **_ex(6))
    assert_same(pair)
    assert pair.store.episode_open.tolist() == [True, False]
    pair.store.close()


def test_a_rejected_block_changes_nothing(tmp_path):
    pair = _vector_pair(tmp_path)
    s = pair.store
    with pytest.raises(mr.EpisodeStateError, match=r"reset\(obs, env=1\)"):
        s.extend(*_block(pair, 2), env=1, **_ex(2))
    s.reset(pair.frame(None), env=1)
    s.extend(*_block(pair, 3), env=1, **_ex(3))
    before = (s.id_range, len(s), s.episode_open.tolist(), s.inspect()["rows"])
    acts, rew, obs, term, trunc = _block(pair, 4)
    bad_calls = [
        (ValueError, "may only be the block's last step",
         dict(args=(acts, rew, obs, np.array([False, True, False, False]), trunc))),
        (ValueError, "shape", dict(args=(acts, rew, obs[:3], term, trunc))),
        (ValueError, "shape", dict(args=(acts[:3], rew, obs, term, trunc))),
        (ValueError, "finite", dict(args=(acts, np.array([0, np.nan, 0, 0]), obs, term, trunc))),
        (TypeError, "dtype", dict(args=(acts, rew, obs.astype(np.float64), term, trunc))),
        (ValueError, "last step must end the episode", dict(args=(acts, rew, obs[:3], term, trunc), final_missing=True)),
        (ValueError, "env stream index", dict(args=(acts, rew, obs, term, trunc), env=2)),
        (TypeError, "missing extras", dict(args=(acts, rew, obs, term, trunc), extras={})),
    ]
    for exc, match, call in bad_calls:
        extras = call.get("extras", _ex(4))
        with pytest.raises(exc, match=match):
            s.extend(*call["args"], env=call.get("env", 1), final_missing=call.get("final_missing", False), **extras)
        assert (s.id_range, len(s), s.episode_open.tolist(), s.inspect()["rows"]) == before
    s.extend(acts, rew, obs, np.array([False, False, False, True]), trunc, env=1, **_ex(4))  # still writable
    with pytest.raises(mr.EpisodeStateError, match="after the episode ended"):
        s.extend(*_block(pair, 1), env=1, **_ex(1))
    with pytest.raises(ValueError, match="one env's observation"):
        s.reset(pair.frame(2), env=0)
    s.close()


def test_unbatched_extend_is_env_0_and_needs_a_reset(tmp_path):
    s = mr.ReplayStore.create(str(tmp_path / "s"), capacity=10, obs_shape=(2,), obs_dtype="int32")
    with pytest.raises(mr.EpisodeStateError, match=r"call reset\(obs\) first"):
        s.extend([0], [1.0], np.zeros((1, 2), np.int32), [False], [False])
    s.reset(np.zeros(2, np.int32), env=0)
    assert s.extend([0, 1], [1.0, 2.0], np.ones((2, 2), np.int32), [False, True], [False, False]) == 0
    with pytest.raises(mr.EpisodeStateError, match="after the episode ended"):
        s.extend([0], [1.0], np.zeros((1, 2), np.int32), [False], [False])
    s.reset(np.zeros(2, np.int32))
    assert s.extend([], [], np.zeros((0, 2), np.int32), [], []) == 2  # an empty block appends nothing
    with pytest.raises(ValueError, match="env stream index in 0..0"):
        s.reset(np.zeros(2, np.int32), env=1)
    assert len(s) == 2 and s.id_range == (0, 2)
    s.close()


def test_a_block_can_fill_many_chunks_and_every_part_is_retained_right(tmp_path):
    """A block longer than several chunks is written a section at a time; capacity still holds."""
    pair = make_pair(str(tmp_path / "s"), stack=3, n_step=3, chunk_size=8, capacity=20, extras=EXTRAS)
    pair.store.reset(o := pair.frame(None))
    pair.model.reset(o)
    args = _block(pair, 100, end=1)
    pair.store.extend(*args, **_ex(100))
    pair.model.extend(*args, **_ex(100))
    assert_same(pair)
    assert pair.store.inspect()["chunks"] <= 20 // 8 + 3
    pair.store.close()


def test_streams_that_advance_apart_leave_at_most_part_of_an_extent_each_per_chunk(tmp_path):
    """Round-robin blocks, then one stream writing alone: a stream whose home section is full takes the
    free extents of the others', so sealed chunks keep at most each stream's last extent part-filled."""
    pair = _vector_pair(tmp_path, chunk_size=64, capacity=400)  # sections of 32 rows: extents of 2 rows
    pair.store.reset(o := pair.frame(2))
    pair.model.reset(o)
    extent = 2
    for _ in range(10):
        for env in (1, 0):
            args = _block(pair, 5)
            pair.store.extend(*args, env=env, **_ex(5))
            pair.model.extend(*args, env=env, **_ex(5))
    state = pair.store.inspect()
    assert state["rows"] == [51, 51] and state["holes"] <= 2 * (extent - 1) * (state["chunks"] - 1)
    for _ in range(20):  # stream 1 stops: stream 0 takes the extents of stream 1's home sections
        args = _block(pair, 7)
        pair.store.extend(*args, env=0, **_ex(7))
        pair.model.extend(*args, env=0, **_ex(7))
    state = pair.store.inspect()
    assert state["holes"] <= 2 * (extent - 1) * (state["chunks"] - 1)
    pair.store.commit()
    with open(tmp_path / "s" / "manifest.json") as f:
        assert any("extents" in c for c in json.load(f)["chunks"])  # some chunk is not laid out as home sections
    assert_same(pair)
    snap = pair.store.save(str(tmp_path / "snap"))  # a snapshot of a store with holes loads the same rows
    loaded = mr.ReplayStore.load(snap, str(tmp_path / "loaded"))
    assert loaded.verify() == []
    np.testing.assert_array_equal(loaded.sampleable_ids(), pair.store.sampleable_ids())
    a, b = loaded.sample(16), pair.store.sample(16)
    for name in ("obs", "next_obs", "reward", "discount", "index"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    loaded.close()
    pair.store.close()


def _vector_with_extents(tmp_path):
    """A committed 2-stream store whose chunks list their extents (stream 1 stopped, stream 0 wrote on)."""
    pair = _vector_pair(tmp_path, chunk_size=64, capacity=400)
    s = pair.store
    s.reset(pair.frame(2))
    s.extend(*_block(pair, 5), env=1, **_ex(5))
    for _ in range(12):
        s.extend(*_block(pair, 7), env=0, **_ex(7))
    s.close()
    return str(tmp_path / "s")


@pytest.mark.parametrize("name, change", [
    ("rows of another length", lambda d: d.update(rows=d["rows"][:1])),
    ("a stream's rows beyond a chunk", lambda d: d["chunks"][0].update(rows=[65, 0])),
    ("an extent out of range", lambda d: d["chunks"][0].update(extents=[[0, 99], [1]])),
    ("an extent listed twice", lambda d: d["chunks"][0].update(extents=[[0, 1], [1]])),
    ("too few extents for the rows", lambda d: d["chunks"][0].update(extents=[[0], []])),
    ("streams of the wrong shape", lambda d: d.update(streams=[[True, 1]] * 2)),
    ("more rows held than written", lambda d: d.update(rows=[1, 1])),
])
def test_forged_stream_layouts_are_refused_before_anything_is_mapped(tmp_path, name, change):
    from tests._support.hostile import forge, read_doc

    path = _vector_with_extents(tmp_path)
    assert any("extents" in c for c in read_doc(path)["chunks"])
    forge(path, change)
    with pytest.raises(mr.CorruptStoreError):
        mr.ReplayStore.open(path, mode="r")


def test_blocks_take_quantized_frames_count_against_a_rate_limit_and_survive_clear(tmp_path):
    """extend() with the training-loop controls: quantize=True frames, a rate limit that counts a block
    as its steps (and refuses to wait for what only sampling could allow), clear() between streams
    written apart."""
    s = mr.ReplayStore.create(tmp_path / "q", capacity=100, obs_shape=(2,), quantize=True, num_envs=2)
    s.reset(np.zeros(2), env=0)
    s.extend([0, 1], [1.0, 1.0], np.array([[0.5, 1.0], [0.0, 0.25]]), [False, True], [False, False], env=0)
    np.testing.assert_array_equal(s.gather(np.array([0])).next_obs[0, -1], [128, 255])
    with pytest.raises(ValueError, match=r"quantize=True takes floating frames in \[0, 1\]"):
        s.extend([0], [1.0], np.array([[1.5, 0.0]]), [False], [False], env=1)
    s.close()

    limit = mr.RateLimit(samples_per_insert=1.0, min_size=4, error_buffer=2.0, timeout=0.0)
    r = mr.ReplayStore.create(tmp_path / "r", capacity=100, obs_shape=(2,), obs_dtype="int32", rate_limit=limit)
    r.reset(np.zeros(2, np.int32))
    r.extend(np.zeros(5, np.int64), np.ones(5), np.ones((5, 2), np.int32), np.zeros(5, bool), np.zeros(5, bool))
    assert r.inspect()["rate_limit"]["inserted"] == 5
    with pytest.raises(mr.RateLimitTimeout):  # 6 more would pass samples_per_insert * min_size + error_buffer
        r.extend(np.zeros(6, np.int64), np.ones(6), np.ones((6, 2), np.int32), np.zeros(6, bool), np.zeros(6, bool))
    assert r.id_range == (0, 5)
    r.close()

    pair = _vector_pair(tmp_path / "c", capacity=200)
    st = pair.store
    st.reset(pair.frame(2))
    st.extend(*_block(pair, 10), env=0, **_ex(10))
    st.extend(*_block(pair, 3), env=1, **_ex(3))
    st.clear()
    st.extend(*_block(pair, 4, end=1), env=1, **_ex(4))  # its episode began before the clear: not listed whole
    st.reset(pair.frame(None), env=0)
    st.extend(*_block(pair, 6, end=1), env=0, **_ex(6))
    for store in (st, None):
        if store is None:
            st.close()
            store = mr.ReplayStore.open(tmp_path / "c" / "s", mode="r")
        t = store.episodes()
        assert t.complete.sum() == 1 and int(t.length[t.complete][0]) == 6  # only stream 0's new episode
        assert store.sampleable_ids().min() >= 13  # nothing from before the clear
    store.close()


def test_a_stream_that_took_another_streams_extents_is_planned_through_the_geometry(tmp_path):
    """Regression: stream 0 fills its home section and takes free extents of stream 1's, stream 1 then
    moves on to a new chunk; rows must come from where each stream's rows are (not format 1's arithmetic)."""
    cfg = dict(num_envs=2, stack=1, n_step=1, gamma=0.9, pad="zeros", chunk_size=16, capacity=1, extras=EXTRAS)
    pair = make_pair(str(tmp_path / "s"), **cfg)
    pair.store.reset(o := pair.frame(2))
    pair.model.reset(o)
    _drive(pair, [(0, 0, 1, 0), (0, 0, 1, 0), (0, 0, 6, 0), (0, 0, 6, 0), (0, 1, 7, 0), (0, 1, 7, 0)], 2,
           np.random.default_rng(0), check_every=1)
    assert pair.store.inspect()["holes"] == 0
    pair.store.close()


def test_streams_written_apart_read_the_same_from_compressed_chunks(tmp_path):
    """Sealed chunks whose extents hold two streams' rows (and holes) compress and decode to the same rows."""
    stores = [mr.ReplayStore.create(tmp_path / c, capacity=400, obs_shape=(16, 16), stack=3, n_step=2, num_envs=2,
                                    chunk_size=128, compression=None if c == "raw" else "lz4")
              for c in ("raw", "lz4")]
    rng = np.random.default_rng(5)
    for s in stores:
        for env in (0, 1):
            s.reset(np.zeros((16, 16), np.uint8), env=env)
    for k in range(40):
        env, n = k % 2 if k < 20 else 0, int(rng.integers(1, 9))
        frames = (np.arange(n)[:, None, None] + k * 10 + np.zeros((n, 16, 16))).astype(np.uint8)
        done = np.zeros(n, bool)
        done[-1] = k % 7 == 6
        for s in stores:
            s.extend(np.zeros(n, np.int64), np.ones(n), frames, done, np.zeros(n, bool), env=env)
            if done[-1]:
                s.reset(np.full((16, 16), k, np.uint8), env=env)
    for s in stores:
        s.close()
    raw, lz4 = (mr.ReplayStore.open(tmp_path / c, mode="r") for c in ("raw", "lz4"))
    assert lz4.inspect()["compressed_chunks"] and raw.inspect()["holes"] == lz4.inspect()["holes"]
    ids = raw.sampleable_ids()
    np.testing.assert_array_equal(ids, lz4.sampleable_ids())
    a, b = raw.gather(ids), lz4.gather(ids)
    np.testing.assert_array_equal(a.obs, b.obs)
    np.testing.assert_array_equal(a.next_obs, b.next_obs)
    assert lz4.verify() == []
    raw.close()
    lz4.close()
