"""Disk of small stores and open() time at 1M capacity (BENCHMARKS.md, "Small stores and open()").

Reference frames (84x84 uint8, stack 4, n-step 3, episodes of 100..3000 steps). For each small capacity:
the default chunk_size, the disk after filling to 1.1x capacity, and how much of it is the open chunk's
preallocated raw files. At 1M capacity: the default chunk_size and one chunk's raw frame file (the full
store's disk follows from them: it is unchanged when they are), then open() of a store filled until its
open chunk holds ``--open-rows`` committed rows: median of ``--repeat`` opens, warm page cache.

    python tools/bench_small_stores.py                  # the reference workload's generated frames
    python tools/bench_small_stores.py --frames pong     # recorded Pong frames (tests/data/atari): LZ4 shrinks them
    python tools/bench_small_stores.py --small 1000 --small 30000 --open-rows 4000 --repeat 9
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import mmreplay as mr
from mmreplay.bench import disk_bytes, fill, frame_pool
from mmreplay.options import Schema


def _open_chunk_bytes(path: str) -> int:
    """Disk of the open chunk's files (the newest chunk, when it is not sealed)."""
    import json

    with open(os.path.join(path, "manifest.json")) as f:
        chunks = json.load(f)["chunks"]
    if not chunks or chunks[-1]["sealed"]:
        return 0
    name = chunks[-1]["name"]
    total = 0
    for entry in os.scandir(os.path.join(path, "chunks")):
        if entry.name.startswith(name + "."):
            total += entry.stat().st_blocks * 512
    return total


def small(capacity: int, scratch: str, pool: np.ndarray) -> str:
    path = os.path.join(scratch, f"small-{capacity}")
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(84, 84), stack=4, n_step=3)
    fill(s, capacity + capacity // 10, pool)
    chunk = s.schema.chunk_size
    s.close()
    total, open_ = disk_bytes(path), _open_chunk_bytes(path)
    shutil.rmtree(path)
    return (f"capacity {capacity:>9,}: chunk_size {chunk:>6,}, disk {total / 2**20:6.1f} MiB after"
            f" {capacity + capacity // 10:,} steps, of which the open chunk {open_ / 2**20:5.1f} MiB")


def big(capacity: int, open_rows: int, repeat: int, scratch: str, pool: np.ndarray) -> list[str]:
    sch = Schema.build(capacity=capacity, obs_shape=(84, 84), stack=4, n_step=3)
    lines = [f"capacity {capacity:>9,}: chunk_size {sch.chunk_size:>6,}, one chunk's raw frames"
             f" {sch.chunk_size * 84 * 84 / 2**20:.1f} MiB"]
    path = os.path.join(scratch, "big")
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(84, 84), stack=4, n_step=3)
    fill(s, 3 * sch.chunk_size + open_rows, pool)
    s.close()
    for mode in ("r", "r+"):
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            s = mr.ReplayStore.open(path, mode=mode)
            times.append(time.perf_counter() - t)
            s.close(commit=False) if mode == "r+" else s.close()
        lines.append(f"  open(mode={mode!r}) with {open_rows:,} committed rows in the open chunk: median"
                     f" {statistics.median(times) * 1e3:.1f} ms (min {min(times) * 1e3:.1f}) of {repeat}")
    with mr.ReplayStore.open(path, mode="r") as s:
        log = s._parts.log  # benchmark-only access: the open chunk's check alone, where this build has it
        check = getattr(log, "check_prefix", None) or getattr(log, "_check_prefix", None)
        if check is not None:
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                check()
                times.append(time.perf_counter() - t)
            lines.append(f"  of which the open chunk's checksum check: median {statistics.median(times) * 1e3:.1f} ms"
                         f" (min {min(times) * 1e3:.1f}) of {repeat}")
    shutil.rmtree(path)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, action="append", help="repeatable; default 1000 and 30000")
    ap.add_argument("--big", type=int, default=1_000_000, help="the reference capacity (default 1000000)")
    ap.add_argument("--open-rows", type=int, default=4000, help="committed rows in the open chunk (default 4000)")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--frames", default="generated", help="generated (default) or a game of tests/data/atari")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary directory)")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="mmreplay-small-", dir=args.dir)
    if args.frames == "generated":
        pool = frame_pool()
    else:
        root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "atari")
        with np.load(os.path.join(root, args.frames + ".npz")) as z:
            pool = z["frames"]
    print(f"frames: {args.frames}", flush=True)
    try:
        for cap in args.small or [1_000, 30_000]:
            print(small(cap, scratch, pool), flush=True)
        for line in big(args.big, args.open_rows, args.repeat, scratch, pool):
            print(line, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
