"""A/B of two checkouts of mmreplay on the reference workload, in alternating windows of one run.

Each checkout runs in its own long-lived worker process (its tree first on ``sys.path``) holding a warm
uniform store and a warm prioritized store filled with the same transitions. The parent then asks
the workers in turn for short timed windows (``sample(32)``; ``sample(32)`` + ``update_priorities``;
``step()``), so load on a shared machine hits both alike; it reports the median of the per-window
ratios B/A (>1: B is faster).

    python tools/ab_trees.py OLD_TREE NEW_TREE [--capacity 30000] [--windows 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WORKER = r"""
import json, sys, time, tempfile, os
import numpy as np
import mmreplay as mr
from mmreplay.bench import fill, frame_pool, warm
cap = int(sys.argv[1])
d = tempfile.mkdtemp(prefix="ab-", dir=sys.argv[2])
pool = frame_pool()
kw = dict(capacity=cap, obs_shape=(84, 84), stack=4, n_step=3)
extra = {"compression": None} if "compression" in mr.ReplayStore.create.__code__.co_varnames else {}
u = mr.ReplayStore.create(os.path.join(d, "u"), **kw, **extra)
fill(u, int(cap * 1.1), pool)
p = mr.ReplayStore.create(os.path.join(d, "p"), prioritized=mr.Prioritized(), **kw, **extra)
fill(p, int(cap * 1.1), pool)
w = mr.ReplayStore.create(os.path.join(d, "w"), **kw, **extra)
warm(u); warm(p)
rng = np.random.default_rng(1)
w.reset(pool[0]); t_step = 0
print("ready", flush=True)
for line in sys.stdin:
    kind, n = line.split()
    n = int(n)
    t0 = time.perf_counter()
    if kind == "sample":
        for _ in range(n):
            u.sample(32)
    elif kind == "prio":
        for _ in range(n):
            b = p.sample(32)
            p.update_priorities(b.index, rng.random(32) + 0.01)
    elif kind == "step":
        for _ in range(n):
            t_step += 1
            w.step(0, 0.0, pool[t_step % len(pool)], t_step % 1000 == 0, False)
            if t_step % 1000 == 0:
                w.reset(pool[(t_step + 3) % len(pool)])
    print(json.dumps(time.perf_counter() - t0), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--capacity", type=int, default=30_000)
    ap.add_argument("--windows", type=int, default=15)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="ab-trees-", dir=args.dir)
    workers = {}
    for name, tree in (("A", args.a), ("B", args.b)):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        workers[name] = subprocess.Popen([sys.executable, "-c", WORKER, str(args.capacity), scratch], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree)
        assert workers[name].stdout is not None and workers[name].stdout.readline().strip() == "ready"

    def run(name: str, kind: str, n: int) -> float:
        proc = workers[name]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{kind} {n}\n")
        proc.stdin.flush()
        return float(json.loads(proc.stdout.readline()))

    sizes = {"sample": 200, "prio": 150, "step": 20_000}
    results = {}
    for kind, n in sizes.items():
        run("A", kind, n // 4)
        run("B", kind, n // 4)  # warm-up
        ratios, rates = [], {"A": [], "B": []}
        for w in range(args.windows):
            order = ("A", "B") if w % 2 == 0 else ("B", "A")
            t = {name: run(name, kind, n) for name in order}
            ratios.append(t["A"] / t["B"])
            for name in t:
                rates[name].append(n / t[name])
        results[kind] = {"ratio_b_over_a": statistics.median(ratios), "a_per_s": statistics.median(rates["A"]),
                         "b_per_s": statistics.median(rates["B"]), "ratio_min": min(ratios), "ratio_max": max(ratios)}
        print(kind, json.dumps(results[kind]), flush=True)
    for proc in workers.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    subprocess.run(["rm", "-rf", scratch], check=False)


if __name__ == "__main__":
    main()
