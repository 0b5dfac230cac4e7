"""``mmreplay demo``: the built-in example, end to end on generated Atari-like episodes."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import numpy as np

from . import __version__
from .bench import disk_bytes, rss_anon_mb
from .cli import out, progress
from .store import ReplayStore
from .synthetic import atari_like_episodes


def cmd_demo(args: argparse.Namespace) -> int:
    path = args.path or os.path.join(tempfile.mkdtemp(prefix="mmreplay-demo-"), "store")
    out(f"mmreplay {__version__} demo: a replay store of generated Atari-like episodes (84x84 uint8 frames)")
    store = ReplayStore.create(path, capacity=args.capacity, obs_shape=(84, 84), stack=4, n_step=3, gamma=0.99,
                               extras={"log_prob": ((), "float32")}, seed=0)
    t0 = time.perf_counter()
    steps = 0
    episodes = 0
    with progress(args.steps, "recording", args.quiet) as bar:
        for ep in atari_like_episodes(10**9, seed=1, min_len=100, max_len=800, time_limit=600):
            store.reset(ep.frames[0])
            for t in range(ep.length):
                store.step(ep.actions[t], ep.rewards[t], ep.frames[t + 1], ep.terminated and t == ep.length - 1,
                           ep.truncated and t == ep.length - 1, log_prob=np.float32(-1.79))
                steps += 1
            bar.update(ep.length)
            episodes += 1
            if steps >= args.steps:
                break
    t_write = time.perf_counter() - t0
    store.commit()
    t0 = time.perf_counter()
    n_batches = 200
    for _ in range(n_batches):
        batch = store.sample(32)
    t_sample = (time.perf_counter() - t0) / n_batches
    lo, hi = store.id_range
    out(f"  wrote {steps} transitions in {episodes} episodes at {steps / t_write:,.0f} steps/s -> {path}")
    out(f"  ids {lo}..{hi - 1} retained (capacity {store.capacity}); {len(store)} sampleable now")
    out(f"  sample(32): obs {batch.obs.shape} {batch.obs.dtype}, next_obs {batch.next_obs.shape},"
         f" reward {batch.reward.dtype}, discount {batch.discount.dtype}; {t_sample * 1e6:,.0f} us per batch")
    out(f"  first row: id {batch.index[0]}, action {batch.action[0]}, 3-step reward {batch.reward[0]:.3f},"
         f" discount {batch.discount[0]:.4f}, terminated {bool(batch.terminated[0])}")
    out(f"  disk {disk_bytes(path) / 2**20:,.1f} MiB, anonymous memory of this process {rss_anon_mb():,.0f} MB")
    store.close()
    with ReplayStore.open(path, mode="r") as again:
        out(f"  reopened read-only: {len(again)} sampleable, same ids {again.id_range == (lo, hi)}")
    return 0



def register(sub: Any, common: argparse.ArgumentParser) -> None:
    d = sub.add_parser("demo", parents=[common], help="build a store from generated Atari-like episodes, sample it,"
                       " summarize")
    d.add_argument("path", nargs="?", help="where to create the store (default: a new temporary directory)")
    d.add_argument("--steps", type=int, default=5000)
    d.add_argument("--capacity", type=int, default=4000)
    d.set_defaults(func=cmd_demo)
