"""Two checkouts of mmreplay side by side: the core's rates in alternating windows, same stores, same machine.

For changes that must not slow anything down (a restructuring, a rename) and for those that should speed
one path up: each checkout runs in a long-lived child process of its own (``PYTHONPATH`` set to its root),
and the two are measured in alternating one-second windows (the order flips every round), so a machine
whose load moves affects both alike. Per window: operations/s and CPU-seconds per 1,000 operations (every
thread of the child). Workloads (capacity 100,000 by default, the repo's recorded Atari frames, stack 4,
n-step 3):

- ``step``: ``step()`` one transition at a time into a fresh store (episodes of 1,000 steps; a new store
  when one fills);
- ``sample-raw``, ``sample-lz4``: ``sample(32)``, frames raw / compressed;
- ``prioritized``: ``sample(32)`` + ``update_priorities`` (compressed frames);
- ``batches``: ``next()`` of ``batches(32, prefetch=2)`` (compressed frames);
- ``sample-raw-256``, ``sample-lz4-512``, ...: ``sample()`` of that many rows.

``--read-threads 1`` opens the stores with one read thread: the CPU of a batch on one core, without the
reader's choice between reading alone and sharing reads with its helpers (which follows the load).

    python tools/ab_core.py --old /path/to/old/checkout --new . [--rounds 7] [--capacity 100000]

Prints one row per workload: the medians of each side and new/old. Writes nothing to BENCHMARKS.md (the
figures belong to the change they measure); the stores live in a temporary directory, deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r'''
import json, os, resource, shutil, sys, time
import numpy as np
import mmreplay as mr

work, stores = sys.argv[1], json.loads(sys.argv[2])
threads = None if sys.argv[3] == "default" else int(sys.argv[3])
rng = np.random.default_rng(0)
opened = {}


def store(name):
    if name not in opened:
        opened[name] = mr.ReplayStore.open(stores[name], mode="r+" if name == "prioritized" else "r", seed=1,
                                       read_threads=threads)
    return opened[name]


frames = np.load(stores["frames"])
fresh = {"n": 0, "store": None, "t": 0, "path": ""}


def step_once():
    s = fresh["store"]
    if s is None or fresh["t"] >= 20_000:
        if s is not None:
            s.close()
            shutil.rmtree(fresh["path"], ignore_errors=True)
        fresh["n"] += 1
        fresh["path"] = os.path.join(work, f"step{fresh['n']}")
        s = fresh["store"] = mr.ReplayStore.create(fresh["path"], capacity=20_000, obs_shape=(84, 84), stack=4, n_step=3)
        fresh["t"] = 0
    t = fresh["t"]
    if t % 1000 == 0:
        s.reset(frames[t % len(frames)])
    s.step(t % 6, 1.0, frames[(t + 1) % len(frames)], t % 1000 == 999, False)
    fresh["t"] = t + 1


iters = {}


def op(kind):
    if kind == "step":
        return step_once
    if kind == "batches":
        it = iters.setdefault(kind, store("sample-lz4").batches(32, prefetch=2))
        return lambda: next(it)
    if kind == "prioritized":
        s = store("prioritized")
        p = rng.random(32) + 0.1

        def f():
            b = s.sample(32)
            s.update_priorities(b.index, p)
        return f
    name, _, size = kind.rpartition("-")
    if size.isdigit():  # e.g. sample-raw-256: another batch size
        s, b = store(name), int(size)
        return lambda: s.sample(b)
    s = store(kind)
    return lambda: s.sample(32)


for kind in ("sample-raw", "sample-lz4", "prioritized", "batches"):
    f = op(kind)
    for _ in range(300):
        f()
print("ready", flush=True)
seen = set()
for line in sys.stdin:
    kind, sec = line.split()
    f = op(kind)
    if kind not in seen:  # a batch size not warmed above
        seen.add(kind)
        for _ in range(30):
            f()
    n, r0, t0 = 0, resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    while time.perf_counter() - t0 < float(sec):
        f()
        n += 1
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    print(json.dumps([n / wall, cpu / n * 1e6]), flush=True)
'''

KINDS = ("step", "sample-raw", "sample-lz4", "prioritized", "batches")


def make_stores(root: str, new: str, capacity: int) -> dict[str, str]:
    """The shared stores, written by the ``new`` checkout (both read them: the format is the same)."""
    script = r'''
import json, os, sys
import numpy as np
import mmreplay as mr
from mmreplay.bench import fill
root, capacity, data = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pool = np.concatenate([np.load(os.path.join(data, g))["frames"][:512]
                       for g in ("breakout.npz", "mspacman.npz", "pong.npz", "seaquest.npz")])
np.save(os.path.join(root, "frames.npy"), pool[:2048])
out = {"frames": os.path.join(root, "frames.npy")}
for name, kw in (("sample-raw", dict(compression=None)), ("sample-lz4", {}),
                 ("prioritized", dict(prioritized=mr.Prioritized()))):
    path = os.path.join(root, name)
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(84, 84), stack=4, n_step=3, seed=0, **kw)
    fill(s, capacity + capacity // 10, pool)
    s.commit()
    s.close()
    out[name] = path
print(json.dumps(out))
'''
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "atari")
    done = subprocess.run([sys.executable, "-c", script, root, str(capacity), data], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": new}, cwd=root, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="root of the checkout to compare against")
    ap.add_argument("--new", default=".", help="root of the checkout being measured (default .)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--read-threads", default="default", help="the stores' read_threads (default: theirs)")
    args = ap.parse_args()
    roots = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    work = tempfile.mkdtemp(prefix="ab-core-")
    children: dict[str, subprocess.Popen[str]] = {}
    try:
        stores = make_stores(work, roots["new"], args.capacity)
        for name, root in roots.items():
            os.makedirs(os.path.join(work, name))
            check = subprocess.run([sys.executable, "-c", "import mmreplay; print(mmreplay.__file__)"], cwd=work,
                                   env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True)
            assert check.stdout.startswith(root), f"{name}: PYTHONPATH={root} imports {check.stdout.strip()}"
            own = dict(stores)  # (priority updates write: each child its own copy)
            own["prioritized"] = os.path.join(work, name, "prioritized")
            shutil.copytree(stores["prioritized"], own["prioritized"])
            p = subprocess.Popen([sys.executable, "-c", CHILD, os.path.join(work, name), json.dumps(own),
                                  args.read_threads],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": root}, cwd=work)  # (cwd: first on sys.path)
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", f"{name} did not start"
            children[name] = p
        print(f"load {os.getloadavg()[0]:.1f} at start; {args.rounds} rounds of {args.seconds} s windows;"
              f" read_threads {args.read_threads}", flush=True)
        print("| workload | old ops/s | old CPU us/op | new ops/s | new CPU us/op | rate new/old | CPU new/old |")
        print("|---|---|---|---|---|---|---|")
        for kind in args.kinds.split(","):
            got: dict[str, list[list[float]]] = {name: [] for name in children}
            for r in range(args.rounds):
                for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    p = children[name]
                    assert p.stdin is not None and p.stdout is not None
                    p.stdin.write(f"{kind} {args.seconds}\n")
                    p.stdin.flush()
                    got[name].append(json.loads(p.stdout.readline()))
            med = {n: (statistics.median(v[0] for v in rows), statistics.median(v[1] for v in rows))
                   for n, rows in got.items()}
            o, n = med["old"], med["new"]
            print(f"| {kind} | {o[0]:,.0f} | {o[1]:.1f} | {n[0]:,.0f} | {n[1]:.1f} | {n[0] / o[0]:.2f} |"
                  f" {n[1] / o[1]:.2f} |", flush=True)
        print(f"load {os.getloadavg()[0]:.1f} at the end", flush=True)
    finally:
        for p in children.values():
            p.kill()
            p.wait()
        time.sleep(0.2)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
