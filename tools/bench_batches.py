"""Batches: ``batches(prefetch=2)`` against a ``sample()`` loop (warm and cold), rows/s by batch size,
the native kernels against their numpy references, and numba's import, compile and cache costs.

Reference workload (BENCHMARKS.md): 84x84 uint8 frames, stack 4, n-step 3, episodes of 100..3000
steps, filled to 1.1x capacity. Rates are measured in short alternating windows in one process
(this machine's 2 cores are shared with other work), medians over rounds, and each ratio is the
median of the per-round ratios. The store keeps its frames raw (``compression=None``; these generated
frames would not compress, and compressed stores have tools/bench_compression.py). The kernel table
calls each kernel the store uses and the numpy reference the tests compare it with, on the store's own
index and frames (after checking that the plans agree on the batches timed).
Writes the ``batches`` and ``native`` sections of BENCHMARKS.md.

    python tools/bench_batches.py                         # capacity 100,000: ~2 min
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
from _report import table, write_section  # noqa: E402
from bench_cold import drop_cache  # noqa: E402

import mmreplay as mr  # noqa: E402
from mmreplay.bench import fill, frame_pool, warm  # noqa: E402
from mmreplay.native import plan  # noqa: E402
from mmreplay.native.reference import priority_update_numpy  # noqa: E402
from mmreplay.reading.batch import nstep_returns_numpy  # noqa: E402
from mmreplay.reading.reader import native_kernels  # noqa: E402
from mmreplay.sampling.numpy_sumtree import NumpySumTree  # noqa: E402
from mmreplay.sampling.sumtree import SumTree  # noqa: E402

LEARNER_STEP = 0.002  # seconds: a learner's step between batches, spent off the CPU (waiting for a GPU)
PLAN_FIELDS = ("slots", "obs_slots", "obs_pad", "next_slots", "next_pad", "reward_slots", "reward_weights", "window",
               "terminated", "truncated", "next_missing")


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


# ---- warm: sample() loop vs batches(prefetch=2), by batch size ---------------------------------------

def warm_rates(path: str, sizes: list[int], rounds: int, seconds: float) -> dict[Any, dict[str, float]]:
    # two stores on the same files, so neither window warms the other's output buffers
    stores = [mr.ReplayStore.open(path, mode="r", seed=7) for _ in range(2)]
    for s in stores:
        warm(s)
    s_sample, s_iter = stores
    out: dict[Any, dict[str, float]] = {}
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
        out[b] = {"sample": statistics.median(v[0] for v in r),
                  "batches": statistics.median(v[1] for v in r),
                  "ratio": statistics.median(v[1] / v[0] for v in r),
                  "cpu_sample": statistics.median(v[2] for v in r),
                  "cpu_batches": statistics.median(v[3] for v in r),
                  # rows/s against batch 32's in the same round
                  "scale": statistics.median(v[0] * b / (w[0] * 32) for v, w in zip(r, acc[32], strict=True))}
        log(f"  warm B={b}: sample {out[b]['sample']:,.0f}/s, batches(2) {out[b]['batches']:,.0f}/s, "
            f"ratio {out[b]['ratio']:.2f}")
    # a learner: each batch followed by a step that leaves the CPU (a GPU's, say)
    it = s_iter.batches(32, prefetch=2)
    r_s, r_b = [], []

    def learn_sample() -> None:
        s_sample.sample(32)
        time.sleep(LEARNER_STEP)

    def learn_batches() -> None:
        next(it)
        time.sleep(LEARNER_STEP)

    for _ in range(max(3, rounds // 2)):
        r_s.append(rate(learn_sample, seconds))
        r_b.append(rate(learn_batches, seconds))
    it.close()
    out["learner"] = {"sample": statistics.median(r_s), "batches": statistics.median(r_b),
                      "ratio": statistics.median([y / x for x, y in zip(r_s, r_b, strict=True)])}
    for s in stores:
        s.close()
    return out


# ---- cold: the same batches from a dropped page cache ------------------------------------------------

def cold_rates(path: str, n_batches: int, rounds: int) -> dict[str, Any]:
    res: dict[str, list[float]] = {"sample": [], "batches": []}
    resident = []
    for r in range(rounds):
        for mode in ("sample", "batches") if r % 2 == 0 else ("batches", "sample"):
            resident.append(drop_cache(path))
            s = mr.ReplayStore.open(path, mode="r", seed=100 + r)  # the same batches for both ways
            t0 = time.perf_counter()
            if mode == "batches":
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
            "resident": max(resident)}


# ---- each kernel against its numpy reference, per call -----------------------------------------------

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
    log_ = s._parts.log  # benchmark-only: the index and ring arrays the kernels read
    idx = log_.index
    geo = idx.geo
    if not (geo.lockstep and geo.num_envs == 1):
        raise RuntimeError("the benchmark store should be planned by the kernel (one stream, lockstep layout)")
    valid = idx.valid_ids()
    ids_sets = [valid[rng.integers(0, valid.size, b)] for _ in range(64)]
    slot_sets = [idx.slots_of(x) for x in ids_sets]
    plans = [idx.plan(x) for x in slot_sets]
    for x, p in zip(slot_sets[:8], plans[:8], strict=False):  # like for like: the kernel's plan is the oracle's
        q = idx.plan_numpy(x)
        for f in PLAN_FIELDS:
            if not np.array_equal(getattr(p, f), getattr(q, f)):
                raise AssertionError(f"Index.plan's {f} differs from Index.plan_numpy's")
    k = [0]

    def nxt() -> int:
        k[0] = (k[0] + 1) % 64
        return k[0]

    def row(work: str, np_name: str, np_fn: Callable[[], Any], k_name: str, k_fn: Callable[[], Any],
            number: int) -> list[str]:
        t_np, t_k = per_call_us(np_fn, number), per_call_us(k_fn, number)
        return [work, np_name, f"{t_np:,.1f}", k_name, f"{t_k:,.1f}", f"{t_np / t_k:.1f}x"]

    rows.append(row(f"batch plan (slots -> slots of stacks, windows, pads), B={b}",
                    "`Index.plan_numpy`", lambda: idx.plan_numpy(slot_sets[nxt()]),
                    "`Index.plan` (`plan_batch`)", lambda: idx.plan(slot_sets[nxt()]), 500))
    arrays = log_.ring.arrays
    frames = arrays["obs"]
    both = np.empty((2, b, idx.stack) + frames.shape[1:], frames.dtype)

    def take_numpy() -> None:
        p = plans[nxt()]
        assert p.stacks is not None  # (2, B, k)
        np.take(frames, p.stacks.reshape(-1), axis=0, out=both.reshape((-1,) + frames.shape[1:]), mode="clip")
        if p.obs_pad.any():
            both[0][p.obs_pad] = 0
        if p.next_pad.any():
            both[1][p.next_pad] = 0
        if p.next_missing.any():
            both[1][p.next_missing] = 0

    reader = s._reader
    kernels = native_kernels()
    assert kernels is not None
    lz4 = kernels[0]
    kernel_args = reader._kernel_args()
    flat_out = both.reshape(-1).view(np.uint8)

    def take_kernel() -> None:
        p = plans[nxt()]
        lz4.gather_pairs(p.obs_slots, p.next_slots, 0, b, flat_out, *kernel_args)

    def take_reader() -> None:
        p = plans[nxt()]
        reader.stacks(p.obs_slots, p.next_slots)

    rows.append(row(f"both stacks of every row, one thread, B={b} ({2 * b * idx.stack} frames)",
                    "`np.take` + masks", take_numpy, "`lz4.gather_pairs`", take_kernel, 200))
    rows.append(row(f"both stacks of every row, the store's reader, B={b}",
                    "`np.take` + masks (one thread)", take_numpy,
                    f"`FrameReader.stacks` (`native.crew`, up to {reader.threads} threads)", take_reader, 200))
    reward = arrays["reward"]
    discounts = s._discounts

    def returns_kernel() -> None:
        p = plans[nxt()]
        plan.nstep_returns(reward, p.reward_slots, p.reward_weights, discounts, p.window, p.terminated)

    rows.append(row(f"n-step returns and discounts, B={b}", "`nstep_returns_numpy`",
                    lambda: nstep_returns_numpy(reward, plans[nxt()], discounts),
                    "`nstep_returns`", returns_kernel, 1000))
    # update_priorities' checks and duplicate resolution (ids: a batch plus 4 repeats)
    upd = [(np.concatenate([i, i[:4]]), rng.random(b + 4)) for i in ids_sets]

    def upd_numpy() -> None:
        ids, p = upd[nxt()]
        priority_update_numpy(ids, p, idx.oldest_id, idx.next_id, idx._id2slot, idx._valid)  # (as priority_targets)

    def upd_kernel() -> None:
        ids, p = upd[nxt()]
        idx.priority_targets(ids, p)

    rows.append(row(f"priority update: check, ids -> slots, last wins, B={b}", "`priority_update_numpy`",
                    upd_numpy, "`Index.priority_targets` (`priority_update`)", upd_kernel, 1000))
    return rows


def _tree_row(leaves: int, b: int, rng: np.random.Generator) -> list[str]:
    masses = rng.random(leaves)
    t = {}
    for name, cls in (("numpy", NumpySumTree), ("native", SumTree)):
        tree = cls.from_leaves(masses)
        g = np.random.default_rng(1)
        idx = rng.integers(0, leaves, b)
        values = rng.random(b)
        raw, changed = np.zeros(leaves), np.zeros(leaves, np.bool_)  # the sampler's arrays beside its tree

        def draw_and_update(tree: Any = tree, g: Any = g, idx: Any = idx, values: Any = values, raw: Any = raw,
                            changed: Any = changed) -> None:
            _, w = tree.stratified_sample_normalised(g, b)  # (as PrioritizedSampler.draw and update call it)
            np.power(w, -0.4, out=w).astype(np.float32)
            tree.set_distinct_with(idx, values, raw, values, changed)

        t[name] = per_call_us(draw_and_update, 500)
    return [f"sum tree: stratified draw + weights + update of {b}, {leaves:,} leaves", "`NumpySumTree`",
            f"{t['numpy']:,.1f}", "`SumTree`", f"{t['native']:,.1f}", f"{t['numpy'] / t['native']:.1f}x"]


# ---- numba: import, first compile, cache -------------------------------------------------------------

# The kernels of the batch path, called with the argument types the store passes them.
NUMBA_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numba
t1 = time.perf_counter()
import numpy as np
from mmreplay.native import crew, lz4, plan, priorities, sumtree
kernels = [sumtree.check_set, sumtree.tree_set, sumtree.tree_set_with, sumtree.tree_load, sumtree.tree_flush,
           sumtree.tree_find, sumtree.tree_stratified, sumtree.tree_stratified_normalised, sumtree.tree_proportional,
           priorities.priority_update, plan.plan_batch,
           plan.nstep_returns, lz4.gather_pairs, lz4.gather, crew.post, crew.join, crew.serve]
t2 = time.perf_counter()
meta, nodes = sumtree.new_state(5000)
sumtree.tree_load(meta, nodes, np.ones(5000))
idx = np.arange(4); v = np.ones(4); u = np.full(4, 0.5); o = np.empty(4, np.int64)
sumtree.check_set(meta, idx, v); sumtree.tree_set(meta, nodes, idx, v); sumtree.tree_flush(meta, nodes)
sumtree.tree_set_with(meta, nodes, idx, v, np.zeros(5000), v, np.zeros(5000, np.bool_))
sumtree.tree_find(meta, nodes, u, o); sumtree.tree_stratified(meta, nodes, u, o); sumtree.tree_proportional(meta, nodes, u, o)
sumtree.tree_stratified_normalised(meta, nodes, u, o, np.empty(4))
priorities.priority_update(idx, v, 0, 10, np.arange(10), np.ones(10, np.bool_))
cfg = plan.config(1, 64, 64, 4, 4, 3, False, False, 0, 200)
flags = np.zeros(256, np.uint8); episode_pos = np.full(256, 10, np.int32); seq = np.arange(4)
st, pad, rs, rw, m, ends, _ = plan.plan_batch(np.array([20, 30]), flags, episode_pos, seq, cfg, np.ones(3))
plan.nstep_returns(np.zeros(256, np.float32), rs, rw, np.ones(4, np.float32), m, ends[0])
raw = np.zeros(256 * 7056, np.uint8); kind = np.zeros(4, np.int8); z = np.zeros(4, np.int64)
comp = np.zeros(8, np.uint8); out = np.empty(2 * 2 * 4 * 7056, np.uint8)
args = (raw, comp, comp.view(np.int64), kind, z, z, 64, 0, 7056)
lz4.gather_pairs(st[0], st[1], 0, 2, out, *args)
lz4.gather(st[0].reshape(-1), out, *args)
ctl = np.zeros(crew.CTL_SIZE, np.int64); crew.post(ctl, 1, 0, np.zeros(crew.FIELDS, np.int64)); crew.join(ctl, 1, 0)
ctl[crew.STOP] = 1; crew.serve(ctl)
t3 = time.perf_counter()
hits = sum(sum(k.stats.cache_hits.values()) for k in kernels)
misses = sum(sum(k.stats.cache_misses.values()) for k in kernels)
print(json.dumps({"numba_import_s": t1 - t0, "kernels_import_s": t2 - t1, "first_calls_s": t3 - t2,
                  "cache_hits": hits, "cache_misses": misses, "kernels": len(kernels), "numba": numba.__version__}))
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

def build_store(path: str, capacity: int) -> None:
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(84, 84), stack=4, n_step=3, seed=0,
                              compression=None)
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
        log(f"filling {args.capacity:,}")
        build_store(path, args.capacity)
        log("numba costs")
        nb = numba_costs(scratch, 3)
        log("kernels")
        kern = kernel_table(path, args.capacity)
        log("warm")
        warm_r = warm_rates(path, [32, 256, 512], args.rounds, args.seconds)
        log("cold")
        cold = cold_rates(path, args.cold_batches, args.rounds)
        loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    minutes = (time.time() - t_start) / 60
    batches_body = report_batches(args, warm_r, cold, loads, minutes)
    native_body = report_native(args, kern, nb)
    if not args.no_write:
        write_section("batches", batches_body)
        write_section("native", native_body)
    print(batches_body + "\n\n" + native_body)


def report_batches(args: argparse.Namespace, warm_r: dict, cold: dict, loads: list[float], minutes: float) -> str:
    rows = []
    for b, r in warm_r.items():
        if b != "learner":
            rows.append([f"{b}", f"{r['sample']:,.0f}", f"{r['sample'] * b:,.0f}", f"{r['cpu_sample']:,.0f}",
                         f"{r['batches']:,.0f}", f"{r['batches'] * b:,.0f}", f"{r['cpu_batches']:,.0f}",
                         f"**{r['ratio']:.2f}**"])
    learner = warm_r["learner"]
    c = cold["rates"]
    return "\n".join([
        "## Batches: `batches(prefetch=2)` against a `sample()` loop; rows/s by batch size",
        "",
        f"Store of {args.capacity:,} transitions of the reference workload (84x84 uint8, stack 4, n-step 3),",
        "filled to 1.1x, frames kept raw (`compression=None`: these generated frames would not compress;",
        "compressed stores: the compression section). Warm: every page touched first; each rate is the median"
        f" of {args.rounds} windows of {args.seconds} s",
        "alternating between a `sample(B)` loop and `next()` on `batches(B, prefetch=2)` (two stores opened on",
        "the same files, so neither window warms the other's output buffers); the ratio is the median of",
        "the per-window ratios (> 1: the iterator is faster). CPU us/batch: the process's CPU time (all",
        "threads) per batch, the work it costs whatever else the machine runs.",
        "",
        table(["B", "sample() batches/s", "rows/s", "CPU us/batch", "batches(2) batches/s", "rows/s",
               "CPU us/batch", "batches(2) ÷ sample()"], rows),
        "",
        f"A learner loop (batch 32, then a {LEARNER_STEP * 1e3:g} ms step off the CPU, as a learner waiting for"
        f" its GPU), batches per second: sample() {learner['sample']:,.0f}/s, batches(2)"
        f" {learner['batches']:,.0f}/s, **{learner['ratio']:.2f}**.",
        "",
        "Rows/s relative to batch 32 (sample() loop, sizes alternating within each round; median of the"
        " per-round ratios): " + ", ".join(f"B={b} {r['scale']:.2f}x" for b, r in warm_r.items()
                                          if b not in (32, "learner")) + ".",
        "",
        f"Cold: {args.cold_batches} batches of 32 from a freshly opened reader after every chunk file's pages were",
        "dropped (POSIX_FADV_DONTNEED, all mappings closed; fincore residency before each run: max "
        f"{cold['resident'] * 100:.2f}%), the same",
        f"batches (same seed) for both ways, median of {args.rounds} rounds in alternating order.",
        "",
        table(["sample() batches/s", "batches(2) batches/s", "batches(2) ÷ sample()"],
              [[f"{c['sample']:,.1f}", f"{c['batches']:,.1f}", f"**{cold['ratio']:.2f}**"]]),
        "",
        "Targets: `batches(prefetch=2)` ÷ `sample()` >= 1.0 warm and > 1 cold; rows/s at B=256 and 512 >= B=32's.",
        "",
        f"The run took {minutes:.0f} minutes; 1-minute load average at its start and end: {loads[0]:.1f} and"
        f" {loads[-1]:.1f} (2 cores shared with other work: compare the ratios, measured in neighbouring windows).",
    ])


def report_native(args: argparse.Namespace, kern: list[list[str]], nb: dict) -> str:
    first, again, imports = nb["first"], nb["again"], nb["imports"]

    def med(key: str, items: list[dict]) -> float:
        return statistics.median(x[key] for x in items)

    misses_again = sum(x["cache_misses"] for x in again)
    return "\n".join([
        "## Native kernels (numba) against their numpy references",
        "",
        "The store runs these kernels (the batch plan while its streams are in lockstep, the n-step returns,",
        "the priority update, the sum tree); the numpy references are the tests' oracles, which give the same",
        "arrays bit for bit (tests/kernels/). The stacks rows: `lz4.gather_pairs` copies raw frames and",
        "decodes compressed ones; a row's next_obs frames its obs stack holds are copied from the output. The",
        "store's reader shares a batch's rows between the calling thread and helper threads (`native.crew`).",
        f"Per call, microseconds, best of 5 repeats over 64 rotating random batches of the {args.capacity:,}"
        " store above (warm).",
        "",
        table(["work", "numpy reference", "us", "kernel", "us", "speed-up"], kern),
        "",
        f"numba {first['numba']}: `import numba` {med('numba_import_s', again) * 1e3:.0f} ms; `import mmreplay`"
        f" {med('mmreplay_s', imports) * 1e3:.0f} ms in all (numba included: the index and the sum tree import"
        " their kernels);",
        f"first calls of the {first['kernels']} kernels of the table (the sum tree's {first['kernels'] - 5}, the plan,"
        f" the returns, the priority update, the stack copy in one thread and shared with helpers) in a process with an empty cache (compilation): {first['first_calls_s']:.1f} s ({first['cache_misses']} compiled);",
        f"the same in a new process with the cache (`cache=True`, in `mmreplay/native/__pycache__` or"
        f" `NUMBA_CACHE_DIR`): {med('first_calls_s', again) * 1e3:.0f} ms,"
        f" {again[0]['cache_hits']} signatures loaded from the cache and {misses_again} compiled again in"
        f" {len(again)} processes.",
    ])


if __name__ == "__main__":
    main()
