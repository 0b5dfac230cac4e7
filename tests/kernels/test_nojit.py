"""Sampling where numba does not compile (``NUMBA_DISABLE_JIT=1``: the numpy paths take over) or its threading
layer cannot load (``NUMBA_THREADING_LAYER=tbb`` or ``safe`` without TBB: no kernel needs one, the native paths
run), bit for bit the batches of a normal run. numba reads these
variables when it is imported, so each run is a fresh interpreter (``isolated.run_scenario``); each prints
a digest of everything it sampled, which must equal a normal run's.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import mmreplay as mr
from tests._support import internals
from tests._support.compression import atari_frames
from tests._support.isolated import run_scenario


def sample_digest(path: str, expect: str) -> None:
    """A small prioritized store of compressed Atari frames: batches, a prefetching iterator, sequences,
    gathers and a priority update; prints ``digest <sha256>``. ``expect``: which paths this process must take
    (``native``, ``numpy``: no JIT)."""
    from mmreplay.reading.reader import native_kernels

    kernels = native_kernels()
    took = "numpy" if kernels is None else "native"
    assert took == expect, (took, expect)
    frames = atari_frames("pong")[:700]
    s = mr.ReplayStore.create(path, capacity=400, obs_shape=(84, 84), stack=4, n_step=3, chunk_size=128,
                              compression="lz4", prioritized=mr.Prioritized(alpha=0.6, beta=0.4), seed=3)
    s.reset(frames[0])
    for t in range(650):
        s.step(t % 5, float(t % 7) - 3, frames[t + 1], t % 150 == 149, False)
        if t % 150 == 149:
            s.reset(frames[t + 1])
    s.commit()
    assert s.inspect()["compressed_chunks"], "the sealer compressed nothing"
    if expect == "numpy":
        assert type(internals.sampler(s).tree).__name__ == "NumpySumTree"
    h = hashlib.sha256()

    def add(batch: object) -> None:
        for name in sorted(vars(batch)):
            value = getattr(batch, name)
            for a in (value.values() if isinstance(value, dict) else [value]):
                a = np.asarray(a)
                assert a.dtype != object, name
                h.update(name.encode() + a.tobytes())

    b = s.sample(32)
    add(b)
    s.update_priorities(b.index, np.arange(32.0) / 4)
    add(s.sample(64))
    it = s.batches(16, prefetch=2)
    for _ in range(3):
        add(next(it))
    it.close()
    it = s.batches(16, prefetch=1, frames="distinct")  # (its returns are computed apart from sample()'s)
    add(next(it))
    it.close()
    add(s.sample_sequences(4, 6))
    add(s.gather(s.sampleable_ids()[::7]))
    add(s.sample(128))
    h.update(np.asarray(s.current_obs()).tobytes())
    s.close()
    with mr.ReplayStore.open(path, mode="r") as r:
        assert r.verify() == []
        add(r.sample(32))
    print("digest", h.hexdigest())


def _digest(tmp_path, name: str, expect: str, env: dict[str, str] | None = None) -> str:
    out = run_scenario("tests.kernels.test_nojit", "sample_digest", str(tmp_path / name), expect, env=env, timeout=300)
    return out.split("digest ")[1].split()[0]


@pytest.fixture(scope="module")
def normal(tmp_path_factory):
    atari_frames("pong")  # skips when the frames are absent
    return _digest(tmp_path_factory.mktemp("nojit"), "normal", "native")


def test_sampling_with_the_jit_disabled_is_the_numpy_path_bit_for_bit(tmp_path, normal):
    assert _digest(tmp_path, "nojit", "numpy", {"NUMBA_DISABLE_JIT": "1"}) == normal


@pytest.mark.parametrize("layer", ["tbb", "safe"])
def test_sampling_with_any_threading_layer_asked_for(tmp_path, normal, layer):
    """No kernel is ``parallel=True``: a layer that cannot load (TBB missing) changes nothing."""
    assert _digest(tmp_path, layer, "native", {"NUMBA_THREADING_LAYER": layer}) == normal
