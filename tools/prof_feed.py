"""Where the learner's thread spends ``device_batches``' ``next()``: a profile, not a benchmark.

On a CUDA device, the Nature-DQN learner of ``tools/bench_gpu.py`` is fed by ``device_batches(store, B,
"cuda", prefetch=2)``; with ``--device meta`` (no GPU), the 2 ms GIL-bound stand-in learner of
``tools/bench_feed.py`` is fed by the GPU way's host side (a copier to PyTorch's meta device). For B=32 and
256 it prints:

- the learner alone on one fixed batch: updates/s, and its thread's CPU time against the wall time per
  update (on a GPU the backward pass runs on the autograd engine's device thread while the learner's thread
  waits, so wall > CPU there);
- fed: updates/s over ``--batches`` batches, of which the second half is profiled; from the first half the
  median thread CPU and wall time of ``next()``, the learner's update's thread CPU, how many reads were
  posted to the reader's helpers, how often ``PostGate`` turned posting off and the host ring waited;
- a cProfile of ``next()`` alone on the learner's thread (enabled around each call: the profiler's own cost
  inflates every figure, by 1.5-1.8x here, so read it for shares, not times).

    python tools/prof_feed.py --store STORE                     # CUDA
    python tools/prof_feed.py --store STORE --device meta       # the host side, without a GPU
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_feed import gpu_host_feed  # noqa: E402
from bench_gpu import sync  # noqa: E402

import mmreplay as mr  # noqa: E402
from mmreplay.torch import device_batches, to_tensors  # noqa: E402


def learner_for(device: str) -> Any:
    if device == "cuda":
        import bench_gpu

        return bench_gpu.Learner(torch.device("cuda"))
    import bench_feed

    return bench_feed.Learner(0.002)


def alone(store: mr.ReplayStore, learner: Any, b: int, device: str, n: int = 600) -> str:
    fixed: Any = to_tensors(store.sample(b), as_dict=False)
    if device == "cuda":
        fixed = fixed.to("cuda")
    for _ in range(50):
        learner.update(fixed)
    sync(torch.device(device))
    cpu, t0 = time.thread_time(), time.perf_counter()
    for _ in range(n):
        learner.update(fixed)
    sync(torch.device(device))
    wall = time.perf_counter() - t0
    return (f"B={b} learner alone: {n / wall:.0f} updates/s; per update, its thread's CPU"
            f" {(time.thread_time() - cpu) / n * 1e6:.0f} us, wall {wall / n * 1e6:.0f} us")


def fed(store: mr.ReplayStore, learner: Any, b: int, device: str, n: int, lines: int) -> str:
    it: Any = device_batches(store, b, "cuda", prefetch=2) if device == "cuda" else gpu_host_feed(store, b)
    try:
        for _ in range(100):
            learner.update(next(it))
        gate = store._reader._gate
        posts, off, waits = gate.posts, gate.times_off, it.ring.waits
        prof = cProfile.Profile()
        cpu: list[float] = []
        wall: list[float] = []
        update: list[float] = []
        half = n // 2
        t0 = time.perf_counter()
        for i in range(n):
            c, w = time.thread_time(), time.perf_counter()
            if i >= half:
                prof.enable()
            tb = next(it)
            if i >= half:
                prof.disable()
            cpu.append(time.thread_time() - c)
            wall.append(time.perf_counter() - w)
            u = time.thread_time()
            learner.update(tb)
            update.append(time.thread_time() - u)
        sync(torch.device(device))
        rate = n / (time.perf_counter() - t0)
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("tottime").print_stats(lines)
        stats.sort_stats("cumulative").print_stats(lines)
        return (f"B={b} fed: {rate:.0f} updates/s (the second half profiled); next() in the first half: thread"
                f" CPU median {statistics.median(cpu[:half]) * 1e6:.0f} us (p90"
                f" {sorted(cpu[:half])[int(half * 0.9)] * 1e6:.0f}), wall {statistics.median(wall[:half]) * 1e6:.0f}"
                f" us; the update's thread CPU {statistics.mean(update[:half]) * 1e6:.0f} us; posted"
                f" {gate.posts - posts} of {n} reads, posting turned off {gate.times_off - off}x, ring waits"
                f" {it.ring.waits - waits}\n" + out.getvalue())
    finally:
        it.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a filled store (e.g. one tools/bench_gpu.py --store reads)")
    ap.add_argument("--device", choices=("cuda", "meta"), default="cuda")
    ap.add_argument("--batches", type=int, default=1500)
    ap.add_argument("--batch", type=int, action="append", help="default: 32 and 256")
    ap.add_argument("--lines", type=int, default=40, help="of each profile listing")
    args = ap.parse_args()
    learner = learner_for(args.device)
    with mr.ReplayStore.open(args.store, "r", seed=0) as store:
        for b in args.batch or [32, 256]:
            print(alone(store, learner, b, args.device), flush=True)
            print(fed(store, learner, b, args.device, args.batches, args.lines), flush=True)


if __name__ == "__main__":
    main()
