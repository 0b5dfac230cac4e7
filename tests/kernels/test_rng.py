"""native/rng.py draws what NumPy's Generator.integers draws, and leaves the generator where NumPy would."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmreplay.native.rng import Pcg64State, draw_slots, integers

WIDTHS = [1, 2, 3, 7, 100_000, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**40, 2**62]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**63), steps=st.lists(
    st.tuples(st.integers(-10**6, 10**6), st.sampled_from(WIDTHS), st.integers(1, 70), st.integers(0, 3)),
    min_size=1, max_size=25))
def test_integers_equal_numpy_draw_for_draw(seed: int, steps: list[tuple[int, int, int, int]]) -> None:
    ours, ref = np.random.default_rng(seed), np.random.default_rng(seed)
    state = Pcg64State.attach(ours)
    assert state is not None
    for lo, width, n, other in steps:
        out = np.empty(n, np.int64)
        integers(state.st, state.buf, lo, lo + width, out)
        np.testing.assert_array_equal(out, ref.integers(lo, lo + width, size=n, dtype=np.int64))
        # NumPy's own draws in between (32-bit ones use the buffered half-output) and a state restore
        if other == 1:
            np.testing.assert_array_equal(ours.integers(0, 9, 5, dtype=np.int32), ref.integers(0, 9, 5, dtype=np.int32))
        elif other == 2:
            np.testing.assert_array_equal(ours.random(3), ref.random(3))
        elif other == 3:
            ref.random(1)
            ours.bit_generator.state = ref.bit_generator.state  # (written in place: the mapped arrays follow)
        assert ours.bit_generator.state == ref.bit_generator.state


def test_attach_refuses_other_bit_generators() -> None:
    assert Pcg64State.attach(np.random.Generator(np.random.Philox(1))) is None
    assert Pcg64State.attach(np.random.Generator(np.random.PCG64DXSM(1))) is None


def test_draw_slots_looks_up_slots_and_counts_invalid() -> None:
    rng, ref = np.random.default_rng(5), np.random.default_rng(5)
    state = Pcg64State.attach(rng)
    assert state is not None
    id2slot = np.arange(50, dtype=np.int64)[::-1].copy()
    valid = np.ones(50, np.bool_)
    valid[[3, 17, 40]] = False
    ids, slots = np.empty(200, np.int64), np.empty(200, np.int64)
    bad = draw_slots(state.st, state.buf, 100, 180, ids, slots, id2slot, valid)
    want = ref.integers(100, 180, size=200, dtype=np.int64)
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_array_equal(slots, id2slot[want % 50])
    assert bad == int((~valid[id2slot[want % 50]]).sum()) > 0


def test_store_draws_the_same_batches_either_way(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store's uniform batches do not depend on whether the draw ran natively."""
    import mmreplay as mr
    from mmreplay.native import rng as native_rng

    def batches(path: str) -> list[np.ndarray]:
        s = mr.ReplayStore.create(path, obs_shape=(4, 4), obs_dtype=np.uint8, capacity=300, seed=11)
        for t in range(400):
            if t % 37 == 0:
                s.reset(np.full((4, 4), t % 250, np.uint8))
            s.step(t % 3, 1.0, np.full((4, 4), (t + 1) % 250, np.uint8), t % 37 == 36, False)
        out = [s.sample(16).index for _ in range(20)] + [s.sample(8, replace=False).index for _ in range(5)]
        s.close()
        return out

    want = batches(str(tmp_path / "a"))
    monkeypatch.setattr(native_rng.Pcg64State, "attach", classmethod(lambda cls, rng: None))
    got = batches(str(tmp_path / "b"))
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**63), draws=st.lists(st.integers(0, 3), max_size=12))
def test_snapshot_reads_back_as_numpys_state(seed: int, draws: list[int]) -> None:
    rng = np.random.default_rng(seed)
    state = Pcg64State.attach(rng)
    assert state is not None
    for d in draws:  # 32-bit draws leave half an output buffered (has_uint32): the snapshot keeps it
        if d == 0:
            rng.integers(0, 7, 3, dtype=np.int32)
        elif d == 1:
            rng.random(2)
        else:
            rng.integers(0, 2**40, d)
        snap = state.snapshot()
        assert Pcg64State.state_dict(snap) == rng.bit_generator.state
        later = np.random.default_rng()
        later.bit_generator.state = Pcg64State.state_dict(snap)
        np.testing.assert_array_equal(later.random(4), rng.random(4))
