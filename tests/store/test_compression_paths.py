"""Compressed stores through the paths around the store: the torch loader, show/stats pictures, HDF5
exports, a growing ring, and a reader process following a writer."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import mmreplay as mr
from tests._support.compression import assert_same_rows, drive, pair
from tests._support.helpers import require


def _atari_pair(tmp_path, **kw):  # noqa: ANN001, ANN202
    from mmreplay.synthetic import atari_like_episodes

    c, r = pair(tmp_path, capacity=600, obs_shape=(84, 84), stack=4, n_step=3, chunk_size=64, seed=1, **kw)
    for ep in atari_like_episodes(8, seed=3, min_len=40, max_len=120):
        frames = ep.frames & 0xE0  # the generator's pixel noise removed: frames that shrink, as Atari's do
        for s in (c, r):
            s.reset(frames[0])
            for t in range(ep.length):
                s.step(ep.actions[t], ep.rewards[t], frames[t + 1], t == ep.length - 1, False)
    c.commit()
    assert len(c.inspect()["compressed_chunks"]) > 2
    return c, r


def test_torch_loader_batches_are_identical(tmp_path):
    torch = require("torch")
    import mmreplay.torch as mt

    c, r = _atari_pair(tmp_path)
    c.close()
    r.close()
    for workers in (0, 2):
        got = [list(zip(range(4), mt.replay_loader(str(tmp_path / name), batch_size=8, num_workers=workers,
                                                   seed=5), strict=False)) for name in ("lz4", "raw")]
        for (_, a), (_, b) in zip(*got, strict=True):
            for name in ("obs", "next_obs", "index", "reward"):
                assert torch.equal(a[name], b[name]), name


def test_show_and_stats_pictures_are_identical(tmp_path):
    require("PIL.Image")
    from mmreplay.cli import viz

    c, r = _atari_pair(tmp_path)
    ids = r.sampleable_ids()[::37]
    a, b = np.asarray(viz.show_image(c, c.gather(ids))), np.asarray(viz.show_image(r, r.gather(ids)))
    w = min(a.shape[1], b.shape[1])  # the header line names the store's path: its width may differ
    assert a.shape[0] == b.shape[0] and np.array_equal(a[viz.HEADER:, :w], b[viz.HEADER:, :w])
    sc, sr = viz.store_stats(c), viz.store_stats(r)
    assert viz.stats_text(sc)[1:] == viz.stats_text(sr)[1:]  # the first line is the path
    assert np.array_equal(sc.returns, sr.returns) and np.array_equal(sc.lengths, sr.lengths)
    c.close()
    r.close()


@pytest.mark.parametrize("fmt", ["hdf5", "minari"])
def test_hdf5_exports_are_identical(tmp_path, fmt):
    import h5py  # a core dependency (the HDF5 exports)

    c, r = _atari_pair(tmp_path)
    c.close()
    r.close()
    outs = {}
    for name in ("lz4", "raw"):
        out = tmp_path / f"{name}-{fmt}"
        if fmt == "minari":
            require("minari")
            mr.export(str(tmp_path / name), str(out), format="minari", dataset_id="test/pair-v0", progress=False)
            files = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs if f.endswith(".hdf5")]
        else:
            mr.export(str(tmp_path / name), str(out) + ".h5", format="hdf5", progress=False)
            files = [str(out) + ".h5"]
        got = {}
        for path in files:
            with h5py.File(path, "r") as f:
                f.visititems(lambda k, v, got=got: got.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None)
        outs[name] = got
    assert outs["lz4"].keys() == outs["raw"].keys() and outs["raw"]
    for k in outs["raw"]:
        assert np.array_equal(outs["lz4"][k], outs["raw"][k]), k


def test_ring_growth_remaps_compressed_chunks(tmp_path):
    c, r = pair(tmp_path, capacity=40, obs_shape=(8, 8), stack=2, n_step=2, chunk_size=8, seed=2)
    positions = c.inspect()["ring_positions"]
    drive([c, r], 300, 4, ends=0.6)  # one- and two-step episodes: chunks hold few transitions
    assert c.inspect()["ring_positions"] > positions  # it did grow
    assert_same_rows(c, r)
    c.close()
    r.close()
    assert mr.verify_store(str(tmp_path / "lz4")) == []


READER = """
import sys, numpy as np
import mmreplay as mr
s = mr.ReplayStore.open(sys.argv[1], mode="r", seed=1)
s.sample(16)
print("R", flush=True)
seen = set()
while True:
    s.refresh()
    if len(s):
        s.sample(16)
        if s.generation not in seen:
            seen.add(s.generation)
            print("G", s.generation, flush=True)
    if s.metadata.get("done"):
        break
ids = s.sampleable_ids()
b = s.gather(ids)
np.savez(sys.argv[2], ids=ids, obs=b.obs, next_obs=b.next_obs, gens=np.array(sorted(seen)))
"""


def test_reader_process_follows_a_compressing_writer(tmp_path):
    path = tmp_path / "s"
    s = mr.ReplayStore.create(path, capacity=200, obs_shape=(8, 8), stack=3, n_step=2, chunk_size=16, seed=0)
    drive([s], 10, 1)
    s.commit()
    proc = subprocess.Popen([sys.executable, "-c", READER, str(path), str(tmp_path / "out.npz")],
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "R"
    for i in range(30):
        drive([s], 25, 10 + i, reset=False)
        s.commit()
        if i < 3:  # the reader samples the first commits before the next (it may miss later ones)
            while int(proc.stdout.readline().split()[1]) < s.generation:
                pass
        time.sleep(0.02)
    s.metadata["done"] = True
    s.commit()
    assert proc.wait(timeout=120) == 0
    got = np.load(tmp_path / "out.npz")
    assert {1, 2, 3, 4} <= set(got["gens"].tolist())  # the reader moved through the commits it was shown
    want = s.gather(got["ids"])
    assert np.array_equal(got["ids"], s.sampleable_ids())
    assert np.array_equal(got["obs"], want.obs) and np.array_equal(got["next_obs"], want.next_obs)
    s.close()
