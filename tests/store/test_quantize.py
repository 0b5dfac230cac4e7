"""quantize=True: floating frames in [0, 1] are stored as uint8 round(x * 255); anything else is refused."""

from __future__ import annotations

import numpy as np
import pytest

import mmreplay as mr


def _create(path, **kw) -> mr.ReplayStore:
    return mr.ReplayStore.create(path, capacity=100, obs_shape=(3, 4), quantize=True, **kw)


def test_create_checks_quantize(tmp_path):
    with pytest.raises(ValueError, match="quantize=True .* needs obs_dtype='uint8', got obs_dtype=float32"):
        mr.ReplayStore.create(tmp_path / "a", capacity=10, obs_shape=(2,), obs_dtype="float32", quantize=True)
    with pytest.raises(TypeError, match="quantize must be True or False"):
        mr.ReplayStore.create(tmp_path / "b", capacity=10, obs_shape=(2,), quantize="yes")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    s = _create(tmp_path / "c")
    s.close()
    r = mr.ReplayStore.open(tmp_path / "c")
    assert r.schema.quantize and r.schema.obs_dtype == np.uint8  # round-trips through the manifest
    r.close()


def test_frames_are_stored_as_round_x_times_255(tmp_path):
    s = _create(tmp_path / "s", stack=2)
    rng = np.random.default_rng(0)
    # every representable step of 1/255 and the halfway points between them, in float32 and float64
    x0 = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    x1 = (np.arange(12).reshape(3, 4) + 0.5) / 255  # float64 halves: ties go to even, as Python's round
    x2 = rng.random((3, 4)).astype(np.float16)
    s.reset(x0)
    s.step(0, 0.0, x1, False, False)
    s.step(1, 0.0, x2, True, False)
    s.reset(np.full((3, 4), 7, np.uint8))  # integer frames are stored as they are
    s.step(1, 0.0, np.ones((3, 4)), True, False)
    want = [np.array([round(float(v) * 255) for v in x.ravel()], np.uint8).reshape(3, 4) for x in (x0, x1, x2)]
    b = s.gather(np.array([0, 1, 2]))
    assert b.obs.dtype == np.uint8 and b.next_obs.dtype == np.uint8
    np.testing.assert_array_equal(b.obs[0, -1], want[0])
    np.testing.assert_array_equal(b.obs[1, -1], want[1])
    np.testing.assert_array_equal(b.next_obs[1, -1], want[2])
    np.testing.assert_array_equal(b.obs[2, -1], np.full((3, 4), 7))
    np.testing.assert_array_equal(b.next_obs[2, -1], np.full((3, 4), 255))
    assert s.sample(4).obs.dtype == np.uint8
    s.close()


@pytest.mark.parametrize("bad, shown", [(np.nan, "nan"), (-0.001, "-0.001"), (1.0001, "1.0001"), (np.inf, "inf")])
def test_values_outside_0_1_and_nan_raise_naming_the_first(tmp_path, bad, shown):
    s = _create(tmp_path / "s")
    s.reset(np.zeros((3, 4)))
    frame = np.full((3, 4), 0.5)
    frame[1, 2] = bad
    frame[2, 3] = 2.0  # a later bad value is not the one named
    with pytest.raises(ValueError, match=rf"next_obs: quantize=True takes floating frames in \[0, 1\], got .*{shown}.* at \(1, 2\)"):
        s.step(0, 0.0, frame, False, False)
    with pytest.raises(ValueError, match=r"obs: quantize=True .* at \(1, 2\)"):
        s.reset(frame)
    assert s.id_range == (0, 0) and s.inspect()["rows"] == [1]  # nothing was written (rows per stream)
    with pytest.raises(ValueError, match="expected shape"):
        s.step(0, 0.0, np.zeros((4, 3)), False, False)
    s.close()


def test_vector_stores_quantize_every_env(tmp_path):
    s = _create(tmp_path / "s", num_envs=2)
    s.reset(np.stack([np.zeros((3, 4)), np.ones((3, 4))]))
    s.step([0, 1], [0.0, 0.0], np.full((2, 3, 4), 0.2, np.float32), [False, False], [False, False])
    bad = np.full((2, 3, 4), 0.2)
    bad[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"at \(1, 0, 0\)"):
        s.step([0, 1], [0.0, 0.0], bad, [False, False], [False, False])
    b = s.gather(np.array([0, 1]))
    np.testing.assert_array_equal(b.obs[:, -1, 0, 0], [0, 255])
    np.testing.assert_array_equal(b.next_obs[:, -1], np.full((2, 3, 4), round(0.2 * 255)))
    s.close()
