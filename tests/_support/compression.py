"""Helpers of the compression tests: real Atari frames, one episode stream written into several stores, rows
compared between a compressed and a raw store, and damage to a compressed frame file."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import mmreplay as mr

ATARI = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "atari")


def atari_frames(game: str) -> np.ndarray:
    """The real frames of ``tests/data/atari/<game>.npz`` (skipped when absent, a failure under CI=true)."""
    path = os.path.join(ATARI, game + ".npz")
    if not os.path.exists(path):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path} is missing in CI")
        pytest.skip(f"{path} not present")
    return np.load(path)["frames"]


def atari_npz(game: str) -> dict[str, np.ndarray]:
    atari_frames(game)  # skips when absent
    with np.load(os.path.join(ATARI, game + ".npz")) as d:
        return {k: d[k] for k in d.files}


FIELDS = ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index", "weight")


def frame_maker(shape: tuple[int, ...], seed: int):  # noqa: ANN201
    """Frames with the mix a codec meets: flat ones that shrink a lot, noisy ones that do not shrink."""
    rng = np.random.default_rng(seed)

    def make(t: int) -> np.ndarray:
        if rng.random() < 0.3:
            return rng.integers(0, 256, shape, dtype=np.uint8)
        f = np.full(shape, t % 251, np.uint8)
        f.reshape(-1)[t % f.size] = 255 - t % 7
        return f

    return make


def drive(stores: list[mr.ReplayStore], steps: int, seed: int, num_envs: int = 1, ends: float = 0.05,
          reset: bool = True) -> None:
    """The same episode stream (seeded) into every store (``reset=False``: going on with the open episode)."""
    shape = stores[0].schema.obs_shape
    make = frame_maker(shape, seed)
    rng = np.random.default_rng(seed + 1)
    vector = stores[0].schema.vector
    first = np.stack([make(i) for i in range(num_envs)]) if vector else make(0)
    for s in stores if reset else []:
        s.reset(first)
    for t in range(1, steps + 1):
        if vector:
            obs = np.stack([make(t * num_envs + i) for i in range(num_envs)])
            a = rng.integers(0, 4, num_envs)
            r = rng.random(num_envs).astype(np.float32)
            term, trunc = rng.random(num_envs) < ends, rng.random(num_envs) < ends / 2
            for s in stores:
                s.step(a, r, obs, term, trunc)
        else:
            obs, a, r = make(t), int(rng.integers(0, 4)), float(rng.random())
            term, trunc = bool(rng.random() < ends), bool(rng.random() < ends / 2)
            for s in stores:
                s.step(a, r, obs, term, trunc)
            if term or trunc:
                nxt = make(t + 10**6)
                for s in stores:
                    s.reset(nxt)


def assert_batches_equal(a: mr.Batch, b: mr.Batch) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.extras.keys() == b.extras.keys()
    for name in a.extras:
        assert np.array_equal(a.extras[name], b.extras[name]), name


def assert_same_rows(c: mr.ReplayStore, r: mr.ReplayStore, seed: int = 0) -> None:
    """Every read path gives the same arrays from the compressed store ``c`` and the raw store ``r``."""
    assert c.id_range == r.id_range and len(c) == len(r)
    ids = r.sampleable_ids()
    assert np.array_equal(c.sampleable_ids(), ids)
    if ids.size:
        assert_batches_equal(c.gather(ids), r.gather(ids))
        assert_batches_equal(c.sample(min(32, ids.size)), r.sample(min(32, ids.size)))
        for x, y in zip(c.iter_batches(7, seed=seed), r.iter_batches(7, seed=seed), strict=True):
            assert_batches_equal(x, y)
        ic, ir = c.batches(5, prefetch=2), r.batches(5, prefetch=2)
        for _ in range(4):
            assert_batches_equal(next(ic), next(ir))
        ic.close()
        ir.close()
    assert np.array_equal(c.current_obs(), r.current_obs())
    tc, tr = c.episodes(), r.episodes()
    assert len(tc) == len(tr)
    for i in range(len(tr)):
        assert np.array_equal(c.episode_frames(tc, i), r.episode_frames(tr, i))


def pair(tmp_path, **kw):  # noqa: ANN001, ANN201
    c = mr.ReplayStore.create(tmp_path / "lz4", compression="lz4", **kw)
    r = mr.ReplayStore.create(tmp_path / "raw", compression=None, **kw)
    return c, r


def compressed_chunk(path) -> tuple[dict, str]:  # noqa: ANN001
    """The manifest entry of the first chunk whose frames are compressed, and its ``.obs.lz4`` file."""
    with open(os.path.join(path, "manifest.json")) as f:
        chunks = [c for c in json.load(f)["chunks"] if c.get("frames")]
    c = chunks[0]
    return c, os.path.join(path, "chunks", f"{c['name']}.obs.lz4")


def flip(path: str, offset: int) -> None:
    """Flip one bit of the byte at ``offset`` of ``path`` (made writable first)."""
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))
