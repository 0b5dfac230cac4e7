"""Batches: ``batches(prefetch=2)`` against a ``sample()`` loop (warm and cold), rows/s by batch size,
the native kernels against their numpy paths, and numba's import, compile and cache costs.

Reference workload (DESIGN.md §5): 84x84 uint8 frames, stack 4, n-step 3, episodes of 100..3000
steps, filled to 1.1x capacity. Rates are measured in short alternating windows in one process
(this machine's 2 cores are shared with other work), medians over rounds, and each ratio is the
median of the per-round ratios. "kernels" rows route the store through ``tools/_wired.py``, a
benchmark-only prototype of the proposed wiring of ``mmreplay.native`` (the store's own path is the
numpy one until the wiring lands; its batches are checked equal before measuring).
Writes the ``batches`` and ``native`` sections of BENCHMARKS.md.

    python tools/bench_batches.py                         # capacity 100,000: ~6 min
    python tools/bench_batches.py --capacity 20000 --rounds 3 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _wired  # noqa: E402
from _report import table, write_section  # noqa: E402
from bench_cold import drop_cache  # noqa: E402

import mmreplay as mr  # noqa: E402
from mmreplay.bench import fill, frame_pool, warm  # noqa: E402
from mmreplay.native import gather, plan, priorities  # noqa: E402
from mmreplay.native.reference import priority_update_numpy  # noqa: E402
from mmreplay.sampling.numpy_sumtree import NumpySumTree  # noqa: E402
from mmreplay.sampling.sumtree import SumTree  # noqa: E402

LEARNER_STEP = 0.002  # seconds: a learner's step between batches, spent off the CPU (waiting for a GPU)
FIELDS = ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index", "weight")


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, file=sys.stderr, flush=True)


def rate(step: Callable[[], Any], seconds: float) -> float:
    """Calls per second of ``step`` over about ``seconds`` (after one untimed call)."""
    return rate_cpu(step, seconds)[0]


def rate_cpu(step: Callable[[], Any], seconds: float) -> tuple[float, float]:
    """Calls per second of ``step`` over about ``seconds`` (after one untimed call), and the process's CPU
    time per call in microseconds (all threads: the work a call costs, whatever else runs meanwhile)."""
    step()
    n = 0
    cpu0 = _cpu()
    t0 = time.perf_counter()
    while True:
        step()
        n += 1
        if n % 4 == 0 and time.perf_counter() - t0 >= seconds:
            wall = time.perf_counter() - t0
            return n / wall, (_cpu() - cpu0) / n * 1e6


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def per_call_us(fn: Callable[[], Any], number: int = 2000, repeat: int = 5) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def check_same(a: mr.ReplayStore, b: mr.ReplayStore, batch: int, n: int = 5) -> None:
    for _ in range(n):
        x, y = a.sample(batch), b.sample(batch)
        for f in FIELDS:
            if not np.array_equal(getattr(x, f), getattr(y, f)):
                raise AssertionError(f"the kernel path's {f} differs from the numpy path's")


# ---- warm: sample() loop vs batches(prefetch=2), by batch size ---------------------------------------

def warm_rates(path: str, sizes: list[int], rounds: int, seconds: float) -> dict[str, dict[Any, dict[str, float]]]:
    out: dict[str, dict[Any, dict[str, float]]] = {}
    for label in ("numpy path", "kernels"):
        if label == "kernels":  # the prototype wiring hands out the numpy path's batches
            ref, wired = (mr.ReplayStore.open(path, mode="r", seed=7) for _ in range(2))
            _wired.wire(wired)
            check_same(ref, wired, 32)
            ref.close()
            wired.close()
        stores = [mr.ReplayStore.open(path, mode="r", seed=7) for _ in range(2)]
        for s in stores:
            warm(s)
            if label == "kernels":
                _wired.wire(s)
        s_sample, s_iter = stores
        out[label] = {}
        # the sizes alternate inside each round, so their rows/s come from the same minutes
        iters = {b: s_iter.batches(b, prefetch=2) for b in sizes}
        acc: dict[int, list[tuple[float, float, float, float]]] = {b: [] for b in sizes}
        for _ in range(rounds):
            for b in sizes:
                x, cx = rate_cpu(lambda b=b, s=s_sample: s.sample(b), seconds)  # type: ignore[misc]
                y, cy = rate_cpu(lambda it=iters[b]: next(it), seconds)  # type: ignore[misc]
                acc[b].append((x, y, cx, cy))
        for b in sizes:
            iters[b].close()
            r = acc[b]
            out[label][b] = {"sample": statistics.median(v[0] for v in r),
                             "batches": statistics.median(v[1] for v in r),
                             "ratio": statistics.median(v[1] / v[0] for v in r),
                             "cpu_sample": statistics.median(v[2] for v in r),
                             "cpu_batches": statistics.median(v[3] for v in r),
                             # rows/s against batch 32's in the same round
                             "scale": statistics.median(v[0] * b / (w[0] * 32) for v, w in zip(r, acc[32], strict=True))}
            log(f"  warm {label} B={b}: sample {out[label][b]['sample']:,.0f}/s, batches(2) "
                f"{out[label][b]['batches']:,.0f}/s, ratio {out[label][b]['ratio']:.2f}")
        # a learner: each batch followed by a step that leaves the CPU (a GPU's, say)
        it = s_iter.batches(32, prefetch=2)
        r_s, r_b = [], []
        for _ in range(max(3, rounds // 2)):
            r_s.append(rate(lambda s=s_sample: (s.sample(32), time.sleep(LEARNER_STEP)), seconds))  # type: ignore[misc]
            r_b.append(rate(lambda it=it: (next(it), time.sleep(LEARNER_STEP)), seconds))  # type: ignore[misc]
        it.close()
        out[label]["learner"] = {"sample": statistics.median(r_s), "batches": statistics.median(r_b),
                                 "ratio": statistics.median([y / x for x, y in zip(r_s, r_b, strict=True)])}
        for s in stores:
            s.close()
    return out


# ---- cold: the same batches from a dropped page cache ------------------------------------------------

def cold_rates(path: str, n_batches: int, rounds: int) -> dict[str, Any]:
    res: dict[str, list[float]] = {"sample": [], "batches": [], "k_sample": [], "k_batches": []}
    resident = []
    for r in range(rounds):
        order = list(res) if r % 2 == 0 else list(reversed(res))
        for mode in order:
            resident.append(drop_cache(path))
            s = mr.ReplayStore.open(path, mode="r", seed=100 + r)  # the same batches for every mode
            if mode.startswith("k_"):
                _wired.wire(s)
            t0 = time.perf_counter()
            if mode.endswith("batches"):
                it = s.batches(32, prefetch=2)
                for _ in range(n_batches):
                    next(it)
                it.close()
            else:
                for _ in range(n_batches):
                    s.sample(32)
            res[mode].append(n_batches / (time.perf_counter() - t0))
            s.close()
        log(f"  cold round {r}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in res.items()))
    return {"rates": {k: statistics.median(v) for k, v in res.items()},
            "ratio": statistics.median([b / a for a, b in zip(res["sample"], res["batches"], strict=True)]),
            "k_ratio": statistics.median([b / a for a, b in zip(res["k_sample"], res["k_batches"], strict=True)]),
            "resident": max(resident)}


# ---- the kernels against their numpy paths, per batch ----------------------------------------------

def kernel_table(path: str, capacity: int) -> list[list[str]]:
    rows: list[list[str]] = []
    s = mr.ReplayStore.open(path, mode="r", seed=3)
    warm(s)
    rng = np.random.default_rng(0)
    for b in (32, 512):
        rows += _batch_kernels(s, b, rng)
    s.close()
    # the sum tree alone, at the 1M store's ring size and at this store's
    for leaves in (1_100_000, capacity + capacity // 10):
        for b in (32, 512):
            rows.append(_tree_row(leaves, b, rng))
    return rows


def _batch_kernels(s: mr.ReplayStore, b: int, rng: np.random.Generator) -> list[list[str]]:
    rows = []
    log_ = s._log  # benchmark-only: the index arrays the kernels read
    idx = log_.index
    w = _wired.Wiring(s)
    valid = np.flatnonzero(idx.valid)
    slot_sets = [rng.choice(valid, b) for _ in range(64)]
    ids_sets = [idx.slot_id[x] for x in slot_sets]
    plans = [idx.plan(x, log_.seq_of_pos) for x in slot_sets]
    kplans = [w.plan(i) for i in ids_sets]
    k = [0]

    def nxt() -> int:
        k[0] = (k[0] + 1) % 64
        return k[0]

    def row(work: str, np_name: str, np_fn: Callable[[], Any], k_name: str, k_fn: Callable[[], Any],
            number: int) -> list[str]:
        t_np, t_k = per_call_us(np_fn, number), per_call_us(k_fn, number)
        return [work, np_name, f"{t_np:,.1f}", k_name, f"{t_k:,.1f}", f"{t_np / t_k:.1f}x"]

    rows.append(row(f"batch plan (ids -> slots of stacks, windows, pads), B={b}",
                    "`Index.plan`", lambda: idx.plan(slot_sets[nxt()], log_.seq_of_pos),
                    "`plan_batch`", lambda: w.plan(ids_sets[nxt()]), 500))
    frames = s._arrays["obs"]
    flat = frames.reshape(frames.shape[0], -1)
    both = np.empty((2, b, idx.k) + frames.shape[1:], frames.dtype)
    out = both.reshape(2, b, idx.k, -1)

    def take_numpy() -> None:
        p = plans[nxt()]
        np.take(frames, np.concatenate((p.obs_slots.reshape(-1), p.next_slots.reshape(-1))), axis=0,
                out=both.reshape((-1,) + frames.shape[1:]), mode="clip")
        if p.obs_pad.any():
            both[0][p.obs_pad] = 0
        if p.next_pad.any():
            both[1][p.next_pad] = 0
        if p.next_missing.any():
            both[1][p.next_missing] = 0

    def take_kernel() -> None:
        q = kplans[nxt()]
        gather.gather_stacks(flat, q[1], q[2], q[6][2], out, 0, b)

    rows.append(row(f"stack copy + padding, one thread, B={b} ({2 * b * idx.k} frames)",
                    "`np.take` + masks", take_numpy, "`gather_stacks`", take_kernel, 200))
    reward = s._arrays["reward"]

    def returns_numpy() -> None:
        p = plans[nxt()]
        np.add.accumulate(reward[p.reward_slots] * p.reward_weights, axis=1)[:, -1].astype(np.float32)
        d = s._discounts[p.m]
        d[p.terminated] = 0

    def returns_kernel() -> None:
        q = kplans[nxt()]
        plan.nstep_returns(reward, q[3], q[4], s._discounts, q[5], q[6][0])

    rows.append(row(f"n-step returns and discounts, B={b}", "numpy (assemble)", returns_numpy,
                    "`nstep_returns`", returns_kernel, 1000))
    # update_priorities' checks and duplicate resolution (ids: a batch plus 4 repeats)
    upd = [(np.concatenate([i, i[:4]]), rng.random(b + 4)) for i in ids_sets]

    def upd_numpy() -> None:
        ids, p = upd[nxt()]
        priority_update_numpy(ids, p, log_.oldest_id, log_.next_id, idx.id2slot, idx.valid)

    def upd_kernel() -> None:
        ids, p = upd[nxt()]
        priorities.priority_update(ids, p, log_.oldest_id, log_.next_id, idx.id2slot, idx.valid)

    rows.append(row(f"priority update: check, ids -> slots, last wins, B={b}", "numpy reference", upd_numpy,
                    "`priority_update`", upd_kernel, 1000))
    return rows


def _tree_row(leaves: int, b: int, rng: np.random.Generator) -> list[str]:
    masses = rng.random(leaves)
    t = {}
    for name, cls in (("numpy", NumpySumTree), ("native", SumTree)):
        tree = cls.from_leaves(masses)
        g = np.random.default_rng(1)
        idx = rng.integers(0, leaves, b)
        values = rng.random(b)

        def draw_and_update(tree: Any = tree, g: Any = g, idx: Any = idx, values: Any = values) -> None:
            sl = tree.sample_stratified(g, b)
            np.power(tree.get(sl) / tree.min_positive, -0.4)
            tree.set_distinct(idx, values)

        t[name] = per_call_us(draw_and_update, 500)
    return [f"sum tree: stratified draw + weights + update of {b}, {leaves:,} leaves", "`NumpySumTree`",
            f"{t['numpy']:,.1f}", "`SumTree`", f"{t['native']:,.1f}", f"{t['numpy'] / t['native']:.1f}x"]


def whole_batch(path: str, capacity: int, rounds: int, seconds: float, prioritized_path: str) -> list[list[str]]:
    rows = []
    a = mr.ReplayStore.open(path, mode="r", seed=5)
    b = mr.ReplayStore.open(path, mode="r", seed=5)
    warm(a)
    warm(b)
    _wired.wire(b)
    check_same(a, b, 32)
    for size in (32, 512):
        ra, rb = [], []
        for _ in range(rounds):
            ra.append(rate_cpu(lambda size=size: a.sample(size), seconds))
            rb.append(rate_cpu(lambda size=size: b.sample(size), seconds))
        rows.append(_whole_row(f"`sample({size})`, uniform", ra, rb))
    a.close()
    b.close()
    stores = [mr.ReplayStore.open(os.path.join(prioritized_path, n), seed=5) for n in ("a", "b")]
    for s in stores:
        warm(s)
    _wired.wire(stores[1])
    ps = np.random.default_rng(0).random((64, 32)) + 0.01
    for s in stores:  # the same draws, updates and skips on both
        for i in range(5):
            x = s.sample(32)
            s.update_priorities(x.index, ps[i])
    ra, rb = [], []
    for _ in range(rounds):
        for store, acc in ((stores[0], ra), (stores[1], rb)):
            n = [0]

            def step(store: Any = store, n: list[int] = n) -> None:
                x = store.sample(32)
                n[0] += 1
                store.update_priorities(x.index, ps[n[0] % 64])

            acc.append(rate_cpu(step, seconds))
    rows.append(_whole_row("`sample(32)` + `update_priorities(32)`, prioritized", ra, rb))
    for s in stores:
        s.close()
    return rows


def _whole_row(label: str, ra: list[tuple[float, float]], rb: list[tuple[float, float]]) -> list[str]:
    """wall us per call and CPU us per call of both paths, and the median per-window rate ratio."""
    wa, wb = (statistics.median(1e6 / r for r, _ in x) for x in (ra, rb))
    ca, cb = (statistics.median(c for _, c in x) for x in (ra, rb))
    ratio = statistics.median([y[0] / x[0] for x, y in zip(ra, rb, strict=True)])
    return [label, f"{wa:,.0f}", f"{ca:,.0f}", f"{wb:,.0f}", f"{cb:,.0f}", f"{ratio:.2f}", f"{ca / cb:.2f}"]


# ---- numba: import, first compile, cache -------------------------------------------------------------

NUMBA_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numba
t1 = time.perf_counter()
import numpy as np
from mmreplay.native import gather, plan, priorities, sumtree
kernels = [sumtree.check_set, sumtree.tree_set, sumtree.tree_load, sumtree.tree_flush, sumtree.tree_find,
           sumtree.tree_stratified, sumtree.tree_proportional, priorities.priority_update, plan.plan_batch,
           plan.nstep_returns, gather.gather_stacks]
t2 = time.perf_counter()
ist, fst = sumtree.new_state(5000)
sumtree.tree_load(ist, fst, np.ones(5000))
idx = np.arange(4); v = np.ones(4); u = np.full(4, 0.5); o = np.empty(4, np.int64)
sumtree.check_set(ist, idx, v); sumtree.tree_set(ist, fst, idx, v); sumtree.tree_flush(ist, fst)
sumtree.tree_find(ist, fst, u, o); sumtree.tree_stratified(ist, fst, u, o); sumtree.tree_proportional(ist, fst, u, o)
priorities.priority_update(idx, v, 0, 10, np.arange(10), np.ones(10, np.bool_))
cfg = plan.config(1, 64, 64, 4, 4, 3, False, False, 0, 200)
flags = np.zeros(256, np.uint8); epos = np.full(256, 10, np.int32); seq = np.arange(4)
w = np.zeros((4, 3))
st, pad, rs, rw, m, ends = plan.plan_batch(np.array([20, 30]), flags, epos, seq, cfg, w)
plan.nstep_returns(np.zeros(256, np.float32), rs, rw, np.ones(4, np.float32), m, ends[0])
gather.gather_stacks(np.zeros((256, 7056), np.uint8), st, pad, ends[2], np.empty((2, 2, 4, 7056), np.uint8), 0, 2)
t3 = time.perf_counter()
hits = sum(sum(k.stats.cache_hits.values()) for k in kernels)
misses = sum(sum(k.stats.cache_misses.values()) for k in kernels)
print(json.dumps({"numba_import_s": t1 - t0, "kernels_import_s": t2 - t1, "first_calls_s": t3 - t2,
                  "cache_hits": hits, "cache_misses": misses, "numba": numba.__version__}))
"""

IMPORT_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy
t1 = time.perf_counter()
import mmreplay
t2 = time.perf_counter()
print(json.dumps({"numpy_s": t1 - t0, "mmreplay_s": t2 - t1, "numba_loaded": "numba" in sys.modules}))
"""


def numba_costs(scratch: str, rounds: int) -> dict[str, Any]:
    cache = os.path.join(scratch, "numba-cache")
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))

    def child(code: str) -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    shutil.rmtree(cache, ignore_errors=True)
    first = child(NUMBA_CHILD)  # an empty cache: every kernel compiles
    again = [child(NUMBA_CHILD) for _ in range(rounds)]  # new processes: loaded from the cache
    imports = [child(IMPORT_CHILD) for _ in range(rounds)]
    return {"first": first, "again": again, "imports": imports}


# ---- report --------------------------------------------------------------------------------------------

def build_store(path: str, capacity: int, prioritized: bool = False) -> None:
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(84, 84), stack=4, n_step=3, seed=0,
                              prioritized=mr.Prioritized(alpha=0.6, beta=0.4) if prioritized else None)
    fill(s, capacity + capacity // 10, frame_pool())
    s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=7, help="alternating windows per measurement (default 7)")
    ap.add_argument("--seconds", type=float, default=0.5, help="length of one window (default 0.5 s)")
    ap.add_argument("--cold-batches", type=int, default=150)
    ap.add_argument("--dir", default=None, help="scratch directory on the disk to measure")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    loads = [os.getloadavg()[0]]
    t_start = time.time()
    scratch = tempfile.mkdtemp(prefix="mmreplay-batches-", dir=args.dir)
    try:
        path = os.path.join(scratch, "store")
        log(f"filling {args.capacity:,} (uniform, and two prioritized)")
        build_store(path, args.capacity)
        prio_dir = os.path.join(scratch, "prio")
        for name in ("a", "b"):
            build_store(os.path.join(prio_dir, name), args.capacity, prioritized=True)
        log("numba costs")
        nb = numba_costs(scratch, 3)
        log("kernels")
        kern = kernel_table(path, args.capacity)
        log("whole batches")
        whole = whole_batch(path, args.capacity, args.rounds, args.seconds, prio_dir)
        log("warm")
        warm_r = warm_rates(path, [32, 256, 512], args.rounds, args.seconds)
        log("cold")
        cold = cold_rates(path, args.cold_batches, max(3, args.rounds // 2))
        loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    minutes = (time.time() - t_start) / 60
    batches_body = report_batches(args, warm_r, cold, loads, minutes)
    native_body = report_native(args, kern, whole, nb)
    if not args.no_write:
        write_section("batches", batches_body)
        write_section("native", native_body)
    print(batches_body + "\n\n" + native_body)


def report_batches(args: argparse.Namespace, warm_r: dict, cold: dict, loads: list[float], minutes: float) -> str:
    rows = []
    learner = []
    for label, by_size in warm_r.items():
        for b, r in by_size.items():
            if b == "learner":
                learner.append(f"{label}: sample() {r['sample']:,.0f}/s, batches(2) {r['batches']:,.0f}/s, "
                               f"**{r['ratio']:.2f}**")
                continue
            rows.append([label, f"{b}", f"{r['sample']:,.0f}", f"{r['sample'] * b:,.0f}", f"{r['cpu_sample']:,.0f}",
                         f"{r['batches']:,.0f}", f"{r['batches'] * b:,.0f}", f"{r['cpu_batches']:,.0f}",
                         f"**{r['ratio']:.2f}**"])
    c = cold["rates"]
    cold_rows = [["numpy path", f"{c['sample']:,.1f}", f"{c['batches']:,.1f}", f"**{cold['ratio']:.2f}**"],
                 ["kernels", f"{c['k_sample']:,.1f}", f"{c['k_batches']:,.1f}", f"**{cold['k_ratio']:.2f}**"]]
    scale = {label: {b: r["scale"] for b, r in by_size.items() if b != "learner"}
             for label, by_size in warm_r.items()}
    return "\n".join([
        "## Batches: `batches(prefetch=2)` against a `sample()` loop; rows/s by batch size",
        "",
        f"Store of {args.capacity:,} transitions of the reference workload (84x84 uint8, stack 4, n-step 3),",
        "filled to 1.1x. Warm: every page touched first; each rate is the median of "
        f"{args.rounds} windows of {args.seconds} s",
        "alternating between a `sample(B)` loop and `next()` on `batches(B, prefetch=2)` (two stores opened on",
        "the same files, so neither window warms the other's output buffers); the ratio is the median of",
        "the per-window ratios (> 1: the iterator is faster). CPU us/batch: the process's CPU time (all",
        "threads) per batch, the work it costs whatever else the machine runs. \"kernels\": the store routed",
        "through `tools/_wired.py`, the prototype of the proposed wiring of `mmreplay.native` (same batches).",
        "",
        table(["path", "B", "sample() batches/s", "rows/s", "CPU us/batch", "batches(2) batches/s", "rows/s",
               "CPU us/batch", "batches(2) ÷ sample()"], rows),
        "",
        f"A learner loop (batch 32, then a {LEARNER_STEP * 1e3:g} ms step off the CPU, as a learner waiting for"
        " its GPU), batches per second: " + "; ".join(learner) + ".",
        "",
        "Rows/s relative to batch 32 (sample() loop, sizes alternating within each round; median of the"
        " per-round ratios): " + "; ".join(
            f"{label}: " + ", ".join(f"B={b} {v:.2f}x" for b, v in s.items() if b != 32) for label, s in scale.items())
        + ".",
        "",
        f"Cold: {args.cold_batches} batches of 32 from a freshly opened reader after every chunk file's pages were",
        "dropped (POSIX_FADV_DONTNEED, all mappings closed; fincore residency before each run: max "
        f"{cold['resident'] * 100:.2f}%), the same",
        f"batches (same seed) for both ways, median of {max(3, args.rounds // 2)} rounds in alternating order.",
        "",
        table(["path", "sample() batches/s", "batches(2) batches/s", "batches(2) ÷ sample()"], cold_rows),
        "",
        "Targets: `batches(prefetch=2)` ÷ `sample()` >= 1.0 warm and > 1 cold; rows/s at B=256 and 512 >= B=32's.",
        "",
        f"The run took {minutes:.0f} minutes; 1-minute load average at its start and end: {loads[0]:.1f} and"
        f" {loads[-1]:.1f} (2 cores shared with other work: compare the ratios, measured in neighbouring windows).",
    ])


def report_native(args: argparse.Namespace, kern: list[list[str]], whole: list[list[str]], nb: dict) -> str:
    first, again, imports = nb["first"], nb["again"], nb["imports"]

    def med(key: str, items: list[dict]) -> float:
        return statistics.median(x[key] for x in items)

    misses_again = sum(x["cache_misses"] for x in again)
    return "\n".join([
        "## Native kernels (numba) against their numpy paths",
        "",
        f"Per call, microseconds, best of 5 repeats over 64 rotating random batches of a {args.capacity:,}"
        " store (warm);",
        "each kernel's results are those of its numpy path, bit for bit (tests/test_native_*.py).",
        "",
        table(["work", "numpy path", "us", "kernel", "us", "speed-up"], kern),
        "",
        "Whole batches, microseconds per batch, wall and CPU (all threads of the process; CPU time measures",
        "the work whatever else runs on the machine) (warm, medians of alternating windows; \"kernels\"",
        "through `tools/_wired.py`, the prototype wiring: plan, stack copy split with the store's reader thread,",
        "returns, priority update; the sum tree is native in both columns since `mr.SumTree` is):",
        "",
        table(["call", "numpy path us", "CPU us", "kernels us", "CPU us", "rate: kernels ÷ numpy",
               "CPU: numpy ÷ kernels"], whole),
        "",
        f"numba {first['numba']}: `import numba` {med('numba_import_s', again) * 1e3:.0f} ms; `import mmreplay`"
        f" {med('mmreplay_s', imports) * 1e3:.0f} ms in all (numba included: the sum tree imports its kernels);",
        f"first calls of all {11} kernels in a process with an empty cache (compilation):"
        f" {first['first_calls_s']:.1f} s ({first['cache_misses']} compiled);",
        f"the same in a new process with the cache (`cache=True`, in `mmreplay/native/__pycache__` or"
        f" `NUMBA_CACHE_DIR`): {med('first_calls_s', again) * 1e3:.0f} ms,"
        f" {again[0]['cache_hits']} signatures loaded from the cache and {misses_again} compiled again in"
        f" {len(again)} processes.",
    ])


if __name__ == "__main__":
    main()
