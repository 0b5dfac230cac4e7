"""``native.plan`` and the frame reader against ``Index.plan`` + ``batch.assemble``, on real stores.

Hypothesis writes stores of every shape the plan arithmetic depends on (stack, n-step, pad mode,
vector envs, chunk sizes small enough that stacks and windows cross chunks and the ring wraps and
retires chunks, episodes ended by termination, truncation, a reset mid-episode, imported episodes
with a missing final frame or a lost head), then plans and gathers every sampleable transition and
random subsets (the plan's global choice between offset and row arithmetic flips with the subset):
every array must equal the numpy path's, exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay as mr
from mmreplay.core import index as index_module
from mmreplay.native import plan as native_plan
from mmreplay.reading.batch import assemble, nstep_returns_numpy
from tests._support import internals


def parts_of(store: mr.ReplayStore):
    """The index, ring arrays, reader and discount table the kernels work on (the one place these tests
    reach into the store's parts)."""
    log = internals.log(store)
    return log.index, log.ring.arrays, internals.reader(store), internals.discounts(store)


@st.composite
def stores(draw):
    num_envs = draw(st.sampled_from([1, 1, 2, 3]))
    spec = {
        "stack": draw(st.integers(1, 4)),
        "n_step": draw(st.integers(1, 4)),
        "pad": draw(st.sampled_from(["zeros", "first"])),
        "num_envs": num_envs,
        "chunk_size": draw(st.sampled_from([8, 12, 32, 64])) * num_envs,
        "capacity": draw(st.integers(20, 150)),
        "gamma": draw(st.sampled_from([0.99, 0.5, 1.0])),
        "steps": draw(st.integers(10, 400)),
        "imports": num_envs == 1 and draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "obs": draw(st.sampled_from([((3,), "int32"), ((2, 2), "uint8"), ((1,), "float32")])),
    }
    return spec


def build(path, spec) -> mr.ReplayStore:
    shape, dtype = spec["obs"]
    n_envs = spec["num_envs"]
    store = mr.ReplayStore.create(path, capacity=spec["capacity"], obs_shape=shape, obs_dtype=dtype,
                                  stack=spec["stack"], n_step=spec["n_step"], gamma=spec["gamma"], pad=spec["pad"],
                                  num_envs=n_envs, chunk_size=spec["chunk_size"], seed=1)
    rng = np.random.default_rng(spec["seed"])
    count = [0]

    def frame(n=None):
        count[0] += 1
        base = np.full(shape, count[0] % 250, dtype)
        if n is None:
            return base
        return np.stack([base + s for s in range(n)])

    if n_envs == 1:
        store.reset(frame())
        for _ in range(spec["steps"]):
            u = rng.random()
            a, r = int(rng.integers(0, 5)), float(rng.normal())
            if spec["imports"] and u < 0.04:
                term = bool(rng.random() < 0.5)
                store.step(a, r, None, term, not term)
                store.reset(frame(), head_lost=bool(rng.random() < 0.3))
            elif u < 0.08:
                store.step(a, r, frame(), True, False)
                store.reset(frame())
            elif u < 0.12:
                store.step(a, r, frame(), False, True)
                store.reset(frame())
            elif u < 0.15:
                store.reset(frame())  # mid-episode: the open episode ends truncated
            else:
                store.step(a, r, frame(), False, False)
    else:
        store.reset(frame(n_envs))
        for _ in range(spec["steps"]):
            u = rng.random((2, n_envs))
            store.step(rng.integers(0, 5, n_envs), rng.normal(size=n_envs), frame(n_envs), u[0] < 0.06,
                       (u[0] >= 0.06) & (u[1] < 0.05))
    len(store)  # decide validity of everything written
    return store


def check(store: mr.ReplayStore, slots: np.ndarray, gamma: float) -> None:
    idx, arrays, reader, discounts = parts_of(store)
    want = idx.plan_numpy(slots)
    got = idx.plan(slots)  # the native pass
    for name in ("slots", "obs_slots", "obs_pad", "next_slots", "next_pad", "reward_slots", "reward_weights",
                 "window", "terminated", "truncated", "next_missing", "stacks", "pad"):
        value, ref = getattr(got, name), getattr(want, name)
        assert value.dtype == ref.dtype or (value.dtype == np.int64 and ref.dtype.kind == "i"), name
        np.testing.assert_array_equal(value, ref, err_msg=name)
    # the count that lets assemble skip zeroing; the numpy plan does not count
    assert got.zeros == int(want.obs_pad.sum() + want.next_pad.sum() + want.next_missing.sum()) and want.zeros == -1
    # the frames (the reader's native kernels) and the returns against the numpy path
    ids = idx.ids_of(slots)
    batch = assemble(want, arrays, ids, discounts, (), reader)
    frames = arrays["obs"]
    out = frames[got.stacks]  # (2, B, k, *frame)
    out[got.pad] = 0
    out[1][got.next_missing] = 0
    np.testing.assert_array_equal(out[0], batch.obs)
    np.testing.assert_array_equal(out[1], batch.next_obs)
    native = assemble(got, arrays, ids, discounts, (), reader)
    np.testing.assert_array_equal(native.obs, batch.obs)
    np.testing.assert_array_equal(native.next_obs, batch.next_obs)
    reward, discount = nstep_returns_numpy(arrays["reward"], want, discounts)
    assert reward.tobytes() == batch.reward.tobytes() and batch.reward.dtype == np.float32
    assert discount.tobytes() == batch.discount.tobytes() and batch.discount.dtype == np.float32
    # sample()'s one pass (plan and returns together), and the reader's one call that also reads the stacks
    inputs = idx.plan_inputs(slots)
    if inputs is not None:
        stacks, pad, values, ends, zeros = native_plan.plan_returns(*inputs, arrays["reward"], discounts)
        np.testing.assert_array_equal(stacks, got.stacks)
        np.testing.assert_array_equal(pad, got.pad)
        np.testing.assert_array_equal(ends, np.stack([got.terminated, got.truncated, got.next_missing]))
        assert zeros == got.zeros and values.dtype == np.float32
        assert values[0].tobytes() == reward.tobytes() and values[1].tobytes() == discount.tobytes()
        assert (values[2] == 1).all()
        for share in (False, True):  # read alone (one native call), or shared with the helpers (planned first)
            reader.SHARE = share
            try:
                obs, next_obs, values2, ends2 = reader.planned_stacks(inputs, arrays["reward"], discounts)
            finally:
                reader.SHARE = None
            assert obs.tobytes() == batch.obs.tobytes() and next_obs.tobytes() == batch.next_obs.tobytes()
            assert values2.tobytes() == values.tobytes() and ends2.tobytes() == ends.tobytes()


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=stores(), subsets=st.integers(0, 2**32 - 1))
def test_plan_and_gather_equal_the_numpy_path(tmp_path_factory, spec, subsets):
    store = build(tmp_path_factory.mktemp("s") / "s", spec)
    try:
        valid = parts_of(store)[0].slots_of(store.sampleable_ids())
        if valid.size == 0:
            return
        check(store, valid, spec["gamma"])  # every sampleable transition at once
        rng = np.random.default_rng(subsets)
        for size in (1, 3, 32):  # small subsets: often all inside their chunks (the offset path)
            check(store, rng.choice(valid, size), spec["gamma"])
    finally:
        store.close()


def test_flag_bits_agree_with_the_index():
    assert (native_plan.TERMINATED, native_plan.MISSING, native_plan.END) == (
        index_module.TERMINATED, index_module.MISSING, index_module.END)


@pytest.mark.parametrize("pad", ["zeros", "first"])
def test_atari_shaped_store(tmp_path, pad):
    """84x84 uint8 frames, stack 4, n-step 3 (the reference workload's shape), wrapped once."""
    store = mr.ReplayStore.create(tmp_path / "s", capacity=500, obs_shape=(84, 84), stack=4, n_step=3, pad=pad,
                                  chunk_size=128, seed=0)
    rng = np.random.default_rng(0)
    store.reset(rng.integers(0, 255, (84, 84), np.uint8))
    for t in range(900):
        end = rng.random() < 0.02
        store.step(t % 6, float(rng.random() < 0.1), rng.integers(0, 255, (84, 84), np.uint8), end, False)
        if end:
            store.reset(rng.integers(0, 255, (84, 84), np.uint8))
    len(store)
    valid = parts_of(store)[0].slots_of(store.sampleable_ids())
    check(store, valid, 0.99)
    for _ in range(10):
        check(store, rng.choice(valid, 32), 0.99)
    store.close()


@settings(max_examples=300, deadline=None)
@given(shape=st.tuples(st.integers(1, 2), st.integers(1, 40), st.integers(1, 5)), span=st.integers(1, 300),
       zeros=st.sampled_from(["none", "empty", "some", "all"]), seed=st.integers(0, 2**16),
       layout=st.sampled_from(["random", "stacks", "huge"]))
def test_distinct_slots_equal_numpy_unique(shape, span, zeros, seed, layout):
    """The native distinct slots of a batch's stacks (read once by a device feed) and every entry's position
    among them equal ``np.unique``'s with its inverse, with and without entries that read as zeros: for
    random slots (the kernel's general sort takes over), for rows of ascending runs as stacks are, padding
    repeats and rows that overlap included (its insertion sort), and for slots too large to share a word with
    the entry's index (its argsort)."""
    from mmreplay.reading.batch import distinct_slots, distinct_slots_numpy

    rng = np.random.default_rng(seed)
    if layout == "stacks":  # each row: a base slot's k neighbours, ascending, the first ones repeated (padding)
        base = rng.integers(0, span, shape[:-1])[..., None]
        steps = np.maximum(np.arange(shape[-1]) - rng.integers(0, 3, shape[:-1])[..., None], 0)
        slots = (base + steps).astype(np.int64)
    else:
        slots = rng.integers(0, span, shape).astype(np.int64)  # (a small span: many repeats)
    if layout == "huge":
        slots += 2**60
    zero = {"none": None, "empty": np.zeros(shape, bool), "some": rng.random(shape) < 0.2,
            "all": np.ones(shape, bool)}[zeros]
    read, zeroed, positions = distinct_slots(slots, zero)
    want_read, want_zeroed, want_positions = distinct_slots_numpy(slots, zero)
    np.testing.assert_array_equal(read, want_read)
    assert zeroed == want_zeroed
    np.testing.assert_array_equal(positions, want_positions)
    assert positions.dtype == np.int32 and read.dtype == np.int64
    frames = np.concatenate(([-1] if zeroed else [], read))  # what a feed's frames stand for
    np.testing.assert_array_equal(frames[positions], slots if zero is None else np.where(zero, -1, slots))
