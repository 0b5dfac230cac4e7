"""What the SIGBUS guard's checks cost a ``sample(32)`` and a ``step()``: thread CPU time, in alternating
windows of one process, with the checks (``storage.ring.fault_checked`` around the store's reads and the
writer's calls) and without them (the wrapped methods put back in their place). The guard's handler costs nothing until a
fault, so the checks are all there is to measure on the normal path.

    python tools/ab_busguard.py [--capacity 30000] [--windows 21] [--per-window 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import mmreplay as mr
from mmreplay.bench import fill, frame_pool, warm
from mmreplay.core.writer import EpisodeWriter
from mmreplay.native import busguard
from mmreplay.store import ReplayStore

CHECKED = [(ReplayStore, "_assemble"), (EpisodeWriter, "step")]


def use_checks(on: bool) -> None:
    for cls, name in CHECKED:
        checked = cls.__dict__.get("_checked_" + name) or cls.__dict__[name]
        setattr(cls, "_checked_" + name, checked)
        setattr(cls, name, checked if on else checked.__wrapped__)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacity", type=int, default=30000)
    ap.add_argument("--windows", type=int, default=21)
    ap.add_argument("--per-window", type=int, default=300)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="ab-busguard-")
    pool = frame_pool()
    kw = dict(capacity=a.capacity, obs_shape=(84, 84), stack=4, n_step=3, compression=None)
    u = mr.ReplayStore.create(os.path.join(d, "u"), **kw)
    fill(u, int(a.capacity * 1.1), pool)
    warm(u)
    w = mr.ReplayStore.create(os.path.join(d, "w"), **kw)
    w.reset(pool[0])
    print(f"guard installed: {busguard.supported()}, faults so far: {busguard.count()}")
    rng = np.random.default_rng(1)
    times: dict[bool, dict[str, list[float]]] = {on: {"sample": [], "step": []} for on in (False, True)}
    t = 0
    for i in range(2 * a.windows):
        on = i % 4 in (1, 2)  # off, on, on, off, ...: neither comes always first
        use_checks(on)
        start = time.thread_time_ns()
        for _ in range(a.per_window):
            u.sample(32)
        times[on]["sample"].append((time.thread_time_ns() - start) / a.per_window / 1e3)
        start = time.thread_time_ns()
        for _ in range(a.per_window):
            t += 1
            w.step(int(rng.integers(4)), 1.0, pool[t % len(pool)], False, t % 1000 == 0)
            if t % 1000 == 0:
                w.reset(pool[t % len(pool)])
        times[on]["step"].append((time.thread_time_ns() - start) / a.per_window / 1e3)
    use_checks(True)
    for what in ("sample", "step"):
        off, on = statistics.median(times[False][what]), statistics.median(times[True][what])
        pairs = [b - x for x, b in zip(times[False][what], times[True][what], strict=False)]
        low_off, low_on = min(times[False][what]), min(times[True][what])
        print(f"{what}: without checks {off:.2f} us, with {on:.2f} us (thread CPU per call, medians of {a.windows}"
              f" windows of {a.per_window}; lowest windows {low_off:.2f} and {low_on:.2f} us); median paired"
              f" difference {statistics.median(pairs):+.3f} us")


if __name__ == "__main__":
    main()
