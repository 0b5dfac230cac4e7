"""Where the CPU feed's ``next()`` goes after a learner's step, and what work on the learner's thread does to
its next step.

1. ``device_batches(store, B, "cpu", prefetch=2)`` fed to the stand-in learner of ``tools/bench_feed.py``
   (~2 ms of GIL-bound Python per update): each part of ``next()`` is timed by wrapping the call that makes
   it (medians over the batches after a warm-up): the draw of batch i+2 (of which the uniform draw and
   the plan), joining and assembling batch i, posting batch i+1's frames to the reader's helper threads (of
   which the native post, most of it the system call that wakes a parked helper), and the tensors. The
   wrappers add about a microsecond each; ``next()``'s own median is taken in a separate, unwrapped pass.
2. The learner's update timed alone (thread CPU) right after one of these on its thread, in alternating
   windows: nothing; ``store.sample(B)`` (reads shared with the helper threads as the reader chooses);
   ``store.sample(B)`` on the same store opened with ``read_threads=1`` (no helpers); a NumPy gather of
   the same stacks from an in-RAM array (what an in-RAM buffer does); and touching 4 MiB of memory (the
   caches emptied, no other work). The ratio to "nothing" is how much slower the learner's own Python runs
   after each.

Store: the repository's real Atari episodes, capacity 50,000, stack 4, n-step 3, compressed (the default).
Writes the ``next`` section of BENCHMARKS.md.

    python tools/bench_next.py                  # ~3 min
    python tools/bench_next.py --rounds 2 --no-write
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import atari_pool, fill_reference, settle, table, write_section  # noqa: E402
from bench_feed import Learner  # noqa: E402

import mmreplay as mr  # noqa: E402
import mmreplay.native.crew as crew_module  # noqa: E402
from mmreplay.torch import device_batches  # noqa: E402

PARTS = ("draw", "uniform draw", "plan", "join and assemble", "post", "native post", "tensors")


class Timed:
    """Wraps attributes of objects with timers (nanoseconds per call, by part)."""

    def __init__(self) -> None:
        self.ns: dict[str, list[int]] = {p: [] for p in PARTS}
        self._undo: list[Callable[[], None]] = []

    def wrap(self, obj: Any, name: str, part: str) -> None:
        fn = getattr(obj, name)
        ns = self.ns[part]

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                ns.append(time.perf_counter_ns() - t0)

        setattr(obj, name, timed)
        self._undo.append(lambda: setattr(obj, name, fn))

    def undo(self) -> None:
        for u in reversed(self._undo):
            u()
        self._undo = []


def fed_pass(store: mr.ReplayStore, b: int, learner: Learner, n: int,
             timed: Timed | None = None) -> list[int]:
    """Nanoseconds of each of ``n`` ``next()`` calls of a feed, each after a learner's step (with ``timed``:
    its parts wrapped while the pass runs)."""
    times: list[int] = []
    it = device_batches(store, b, "cpu", prefetch=2)
    if timed is not None:
        bi = it._it
        timed.wrap(bi, "_draw", "draw")
        timed.wrap(store._parts.sampler, "draw", "uniform draw")
        timed.wrap(store._index, "plan", "plan")
        timed.wrap(bi, "_assemble", "join and assemble")  # (the post runs inside it, once the frames are joined)
        timed.wrap(bi, "_post", "post")
        timed.wrap(crew_module, "post", "native post")
        timed.wrap(it, "_on_cpu", "tensors")
    try:
        for _ in range(n):
            learner.update(None)
            t0 = time.perf_counter_ns()
            batch = next(it)
            times.append(time.perf_counter_ns() - t0)
            learner.update(batch)
    finally:
        if timed is not None:
            timed.undo()
        it.close()
    return times


def parts_of_next(store: mr.ReplayStore, b: int, learner: Learner, n: int) -> tuple[dict[str, float], float, float]:
    """Median microseconds of each part of ``next()``, of ``next()`` unwrapped (a pass of its own) and of
    ``next()`` with its parts wrapped."""
    plain = fed_pass(store, b, learner, n)
    timed = Timed()
    wrapped = fed_pass(store, b, learner, n, timed)
    skip = n // 5
    med = {p: statistics.median(v[skip:]) / 1e3 for p, v in timed.ns.items() if v[skip:]}
    med["join and assemble"] -= med.get("post", 0.0)
    return med, statistics.median(plain[skip:]) / 1e3, statistics.median(wrapped[skip:]) / 1e3


def after_effects(store: mr.ReplayStore, alone_store: mr.ReplayStore, b: int, learner: Learner, rounds: int,
                  n: int, ram: np.ndarray) -> dict[str, list[float]]:
    """Per round, the learner's median update (thread CPU, us) right after each kind of work (``ram``: the
    in-RAM frames the NumPy gather reads)."""
    rng = np.random.default_rng(0)
    junk = np.zeros(4 << 20, np.uint8)

    def numpy_gather() -> Any:
        i = rng.integers(4, ram.shape[0] - 2, size=b)
        stack = i[:, None] + np.arange(-3, 1)
        return ram[stack], ram[stack + 1]

    def touch() -> None:
        junk[::64] += 1

    work: dict[str, Callable[[], Any]] = {
        "nothing": lambda: None, "`sample()`": lambda: store.sample(b),
        "`sample()`, `read_threads=1`": lambda: alone_store.sample(b), "NumPy gather": numpy_gather,
        "4 MiB touched": touch}
    out: dict[str, list[float]] = {k: [] for k in work}
    names = list(work)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn, cpu = work[name], []
            for _ in range(n):
                keep = fn()
                c0 = time.thread_time_ns()
                learner.update(None)
                cpu.append(time.thread_time_ns() - c0)
                del keep
            out[name].append(statistics.median(cpu[n // 10:]) / 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacity", type=int, default=50_000)
    ap.add_argument("--batch", type=int, action="append", help="default: 32 and 256")
    ap.add_argument("--rounds", type=int, default=8, help="alternating rounds of the after-effect windows")
    ap.add_argument("--batches", type=int, default=2000, help="batches timed for the parts of next()")
    ap.add_argument("--learner-ms", type=float, default=2.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    sizes = args.batch or [32, 256]
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    pool = atari_pool()
    ram = pool[np.arange(50_000) % len(pool)]  # (the NumPy gather's in-RAM frames)
    tmp = tempfile.mkdtemp(prefix="bench_next_")
    try:
        path = os.path.join(tmp, "store")
        fill_reference(path, args.capacity, pool)
        settle()
        store = mr.ReplayStore.open(path, "r", seed=0)
        alone_store = mr.ReplayStore.open(path, "r", seed=0, read_threads=1)
        learner = Learner(args.learner_ms / 1000)
        part_rows, effect_rows, spread = [], [], []
        for b in sizes:
            med, plain, wrapped = parts_of_next(store, b, learner, args.batches)
            print(f"B={b}: next() {plain:.0f} us, wrapped {wrapped:.0f}, " + ", ".join(f"{p} {v:.1f}" for p, v in med.items()),
                  flush=True)
            part_rows.append([str(b), f"{plain:.0f}", f"{wrapped:.0f}"]
                             + [f"{med.get(p, float('nan')):.1f}" for p in PARTS])
            eff = after_effects(store, alone_store, b, learner, args.rounds, 400, ram)
            base = eff["nothing"]
            ratio = {k: statistics.median(x / a for x, a in zip(v, base, strict=True)) for k, v in eff.items()}
            print(f"B={b}: " + ", ".join(f"{k} {[round(x) for x in v]}" for k, v in eff.items()), flush=True)
            spread.append(f"{min(base):.0f}-{max(base):.0f} us (B={b})")
            effect_rows.append([str(b), f"{statistics.median(base):.0f}"]
                               + [f"{ratio[k]:.3f}" for k in eff if k != "nothing"])
        store.close()
        alone_store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    body = "\n\n".join([
        "### Where the CPU feed's `next()` goes",
        f"`device_batches(store, B, \"cpu\", prefetch=2)` fed to the stand-in learner of \"Device feed on the CPU\""
        f" ({learner.seconds * 1e3:.1f} ms per update alone); store: the repository's Atari episodes, capacity"
        f" {args.capacity:,}, stack 4, n-step 3, compressed. Median microseconds after a learner's step, over"
        f" {args.batches:,} batches: `next()` unwrapped (a pass of its own), then in a second pass `next()` with each"
        " part timed by wrapping the call that makes it"
        " (the draw of batch i+2, of which the uniform draw and the plan; joining batch i's frames and assembling it,"
        " less the post's median;"
        " posting batch i+1's frames to the reader's helper threads, of which the native post, mostly the system call"
        " that wakes the parked helper; the tensors). The two passes run minutes apart: on a shared machine their"
        " `next()` differ by more than the wrappers' microseconds.",
        table(["batch", "`next()`", "`next()`, wrapped"] + list(PARTS), part_rows),
        "The learner's own update (thread CPU, median us) right after each kind of work on its thread, as a ratio to"
        " right after nothing; medians over"
        f" {args.rounds} alternating rounds of 400 updates: `sample(B)` of the store (reads shared with the helper"
        " threads where the reader finds that faster), of the same store opened with `read_threads=1`, a NumPy gather"
        " of the same stacks from an in-RAM array, and 4 MiB of memory touched (the caches emptied).",
        table(["batch", "after nothing (us)", "after `sample()`", "after `sample()`, `read_threads=1`",
               "after a NumPy gather", "after 4 MiB touched"], effect_rows),
        "Over the rounds the learner's update after nothing took " + " and ".join(spread) + ": where the"
        " range is wide, the machine's speed changed between windows, and only ratios of neighbouring windows"
        " (the tables' medians of per-round figures) carry meaning.",
        f"Load average (1 min) {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.",
    ])
    print(body)
    if not args.no_write:
        write_section("next", body)


if __name__ == "__main__":
    main()
