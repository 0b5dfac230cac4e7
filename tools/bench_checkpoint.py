"""commit(), save() and load() time at 100K and 1M capacity on the Atari workload (prioritized store).

After filling to 1.1x capacity: 5 rounds of (1,000 more steps with sampling, commit()), 3 rounds of the
same with a commit that rewrites the priorities in full (as every few commits do), then 3 rounds of
(1,000 steps, save() into the same snapshot directory), then load() of that snapshot into a new working
directory (3 times). Medians. Writes the `checkpoint` section of BENCHMARKS.md.

    python tools/bench_checkpoint.py                 # 100K and 1M (needs ~8 GB free disk)
    python tools/bench_checkpoint.py --capacity 100000 --no-write
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import table, write_section  # noqa: E402

import mmreplay as mr  # noqa: E402
from mmreplay.bench import disk_bytes, fill, frame_pool  # noqa: E402


def measure(capacity: int, scratch: str) -> dict[str, float]:
    pool = frame_pool()
    path, snap = os.path.join(scratch, "store"), os.path.join(scratch, "snap")
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(84, 84), stack=4, n_step=3,
                              prioritized=mr.Prioritized())
    fill(s, capacity + capacity // 10, pool)
    s.commit()

    def more(n: int) -> None:
        fill_more(s, n, pool)

    commits, fulls, saves, loads = [], [], [], []
    for _ in range(5):
        more(1000)
        t = time.perf_counter()
        s.commit()
        commits.append(time.perf_counter() - t)
    for _ in range(3):
        more(1000)
        prio = s._parts.sampler.prioritized  # benchmark-only: force the full priority file
        assert prio is not None
        prio.dirty_all = True  # what a commit does once the deltas reach a quarter of the ids
        t = time.perf_counter()
        s.commit()
        fulls.append(time.perf_counter() - t)
    for _ in range(3):
        more(1000)
        t = time.perf_counter()
        s.save(snap)
        saves.append(time.perf_counter() - t)
    store_bytes = disk_bytes(path)
    s.close()
    for i in range(3):
        t = time.perf_counter()
        r = mr.ReplayStore.load(snap, os.path.join(scratch, f"loaded{i}"))
        loads.append(time.perf_counter() - t)
        r.sample(32)
        r.close()
    return {"commit": statistics.median(commits), "full": statistics.median(fulls),
            "save": statistics.median(saves),
            "load": statistics.median(loads), "gb": store_bytes / 1e9}


def fill_more(s: mr.ReplayStore, n: int, pool) -> None:  # noqa: ANN001
    """n more transitions in the middle of training: steps plus a sample + priority update every 4 steps."""
    import numpy as np

    rng = np.random.default_rng(n)
    for i in range(n):
        if not s.episode_open[0]:
            s.reset(pool[i % len(pool)])
        s.step(i % 6, 0.0, pool[(i + 1) % len(pool)], i == n - 1, False)
        if i % 4 == 0:
            b = s.sample(32)
            s.update_priorities(b.index, rng.random(32))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, action="append")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    caps = args.capacity or [100_000, 1_000_000]
    results = {}
    for cap in caps:
        scratch = tempfile.mkdtemp(prefix="mmreplay-ckpt-", dir=args.dir)
        try:
            results[cap] = measure(cap, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(cap, results[cap], flush=True)
    rows = [[f"{cap:,}", f"{r['gb']:.2f}", f"{r['commit'] * 1e3:,.0f}", f"{r['full'] * 1e3:,.0f}",
             f"{r['save'] * 1e3:,.0f}", f"{r['load'] * 1e3:,.0f}"] for cap, r in results.items()]
    if len(caps) == 2:
        a, b = results[caps[0]], results[caps[1]]
        rows.append([f"ratio {caps[1] // caps[0]}x capacity", "", f"**{b['commit'] / a['commit']:.2f}**",
                     f"{b['full'] / a['full']:.2f}", f"**{b['save'] / a['save']:.2f}**",
                     f"**{b['load'] / a['load']:.2f}**"])
    body = "\n".join([
        "## Checkpoints: commit, save, load",
        "",
        "Prioritized Atari store (84x84 uint8, stack 4, n-step 3) filled to 1.1x capacity; each operation",
        "measured after 1,000 further steps of training (a sample and a priority update of 32 every 4 steps),",
        "medians of 5 commits, 3 commits that rewrite the priorities in full, 3 saves into the same snapshot",
        "directory (replacing it) and 3 loads into new directories. A commit writes the priorities that",
        "changed since the last one as a delta file; once the deltas reach a quarter of the retained ids it",
        "rewrites them in full (every ~3rd commit at 100K, every ~30th at 1M with this workload).",
        "A snapshot holds the full priorities; a load rebuilds the index and the sum tree: both O(capacity).",
        "",
        table(["capacity", "store GB", "commit ms", "commit ms, full priorities", "save ms", "load ms"], rows),
        "",
        "Targets: each under 1 s at 1M, 1M/100K ratio under 2. For orientation, the peers section of this",
        "file (tools/bench_peers.py) measures the checkpoint APIs of Dopamine, cpprb and TorchRL.",
    ])
    if not args.no_write:
        write_section("checkpoint", body)
    print(body)


if __name__ == "__main__":
    main()
