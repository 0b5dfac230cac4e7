"""The device feed on the CPU: does it keep a GIL-bound learner fed, and what does it cost?

A stand-in learner spends about 2 ms per update the way an eager PyTorch update does on its Python side:
a fixed amount of pure-Python work cut into ~100 steps, each followed by a tiny torch op (which releases
the GIL for a moment, as every op of an eager update does). Its updates/s are measured alone and fed by
``sample()`` (+ ``to_tensors``), ``batches(prefetch=2)`` (+ ``to_tensors``) and
``mmreplay.torch.device_batches(store, B, "cpu", prefetch=2)``, in alternating windows in one process;
each ratio is the median over rounds of the per-round ratio to "alone" (this machine's cores are shared).
Also the time the learner's thread spends in the feed's ``next()`` per batch (wall, and that thread's CPU
time: the most it can hold the GIL there), and the process's CPU-seconds per 1,000 batches in a tight
loop (getrusage: every thread) of the feed, ``sample()`` and cpprb 11's ``ReplayBuffer.sample()``
(1-step, ``next_of="obs"`` + ``stack_compress="obs"``, as tools/peers/peer_cpprb.py configures it for this
workload; it does less work: no n-step return, stacks of its own layout, numpy not tensors).

Store: the repository's real Atari episodes (tests/data/atari, 84x84 uint8) cycled into episodes of
100..3000 steps, stack 4, n-step 3, compressed (the default), filled to 1.1x capacity.
Writes the ``feed`` section of BENCHMARKS.md.

    python tools/bench_feed.py                       # capacity 50,000, 5 rounds: ~4 min
    python tools/bench_feed.py --capacity 20000 --rounds 2 --seconds 1 --no-write
    python tools/bench_feed.py --baseline ../old    # also the feed of another checkout, same windows
    python tools/bench_feed.py --unsteered          # also this feed with its helpers left to the scheduler

``--baseline DIR`` loads ``DIR``'s ``mmreplay/torch.py`` and ``mmreplay/reading/prefetch.py`` (an earlier
commit's feed and prefetching iterator; the rest of the package is this checkout's) and measures its feed in
the same alternating windows, as "feed (baseline)".
"""

from __future__ import annotations

import argparse
import os
import resource
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

import mmreplay as mr  # noqa: E402
from mmreplay.torch import Copier, DeviceBatches, device_batches, to_tensors  # noqa: E402

STEPS = 100  # Python steps per update, each followed by one tiny torch op
CPU_ROUNDS = 3  # alternating tight-loop windows of each way for its CPU per batch
LABELS = {"feed": "", "baseline": " (baseline)", "gpu": " (GPU way, host side)",
          "gpu-host-stacks": " (GPU way, host stacks)"}  # a table row's, after its batch


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, file=sys.stderr, flush=True)


class Learner:
    """About ``seconds`` per update of GIL-bound Python, calibrated alone (fixed work afterwards)."""

    def __init__(self, seconds: float) -> None:
        self.x = torch.zeros(16)
        # t(inner) = a + b * inner (a: the torch ops and the loop), from two timings, then refined once
        self.inner = 1
        a = self._timed()
        self.inner = 200
        b = (self._timed() - a) / 199
        # refined until a timing lands within 3% (a timing taken while other work held the core is too long,
        # and would leave the learner far shorter than asked)
        for _ in range(8):
            t = self._timed()
            if abs(t - seconds) <= 0.03 * seconds:
                break
            self.inner = max(1, round(self.inner + (seconds - t) / b))
        self.seconds = self._timed()

    def _timed(self) -> float:
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            self.update(None)
            times.append(time.perf_counter() - t0)
        return min(times)  # (the machine's cores are shared: the least is the learner's own time)

    def update(self, batch: Any) -> None:
        if batch is not None:
            _ = batch.obs.shape, batch.index.shape  # a real update starts from the batch's tensors
        x, inner = self.x, self.inner
        acc = 0
        for _ in range(STEPS):
            for j in range(inner):
                acc += j * j % 7
            x.add_(1.0)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def window(step: Callable[[], Any], seconds: float) -> float:
    """Calls per second of ``step`` over about ``seconds`` (after two untimed calls)."""
    step()
    step()
    n = 0
    t0 = time.perf_counter()
    while True:
        step()
        n += 1
        if time.perf_counter() - t0 >= seconds:
            return n / (time.perf_counter() - t0)


class NextTimer:
    """Wall and thread-CPU seconds spent in ``next(it)`` by the caller."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.windows: list[tuple[float, float]] = []  # each window's (updates/s, mean seconds in next())

    def next(self, it: Any) -> Any:
        c0, t0 = time.thread_time(), time.perf_counter()
        out = next(it)
        self.wall.append(time.perf_counter() - t0)
        self.cpu.append(time.thread_time() - c0)
        return out


def baseline_feed(root: str) -> Callable[..., Any]:
    """``device_batches`` of the checkout at ``root`` (its torch.py and prefetching iterator)."""
    import importlib.util

    import mmreplay.core.drawing as drawing

    def load(name: str, rel: str) -> Any:
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, rel))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    old_iterator = load("mmreplay.reading._baseline_prefetch", "mmreplay/reading/prefetch.py").BatchIterator
    old_torch = load("mmreplay._baseline_torch", "mmreplay/torch.py")

    def make(*args: Any, **kwargs: Any) -> Any:
        new_iterator = drawing.BatchIterator
        drawing.BatchIterator = old_iterator  # type: ignore[misc]
        try:
            return old_torch.device_batches(*args, **kwargs)
        finally:
            drawing.BatchIterator = new_iterator  # type: ignore[misc]

    return make


class _Unsteered:
    """``device_batches`` with the reader's helpers placed by the system's scheduler alone: not kept off the
    learner's CPU (``Crew._steer``), allowed on every CPU of the process while it runs."""

    def __init__(self, store: mr.ReplayStore, *args: Any, **kwargs: Any) -> None:
        from mmreplay.native import crew

        self._crew_module = crew
        self._getcpu = crew._getcpu
        crew._getcpu = None
        helpers = store._reader._crew  # (the store's reader and its helper threads)
        self._helpers = helpers
        if helpers is not None:
            for t in helpers._threads:
                os.sched_setaffinity(t.native_id, os.sched_getaffinity(0))
        self._it = device_batches(store, *args, **kwargs)

    def __next__(self) -> Any:
        return next(self._it)

    def close(self) -> None:
        self._it.close()
        self._crew_module._getcpu = self._getcpu
        if self._helpers is not None:
            self._helpers._off = -1  # (steered again at the next post)


class _MetaCopier(Copier):
    """A copier to PyTorch's meta device: every call a GPU feed makes on the host, no bytes moved (the host side
    of a feed to a GPU, on a machine without one)."""

    device = torch.device("meta")

    def copy(self, host: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return torch.empty(host.shape, dtype=host.dtype, device="meta"), None


def gpu_host_feed(store: mr.ReplayStore, b: int, posted: bool = True, host_stacks: bool = False) -> Any:
    """``device_batches``' GPU way (distinct frames into ring buffers, packed, sent, stacks gathered on the
    device) to the meta device; ``posted=False``: its distinct frames never posted to the reader's helpers
    (read by the prefetch thread or in ``next()``); ``host_stacks=True``: both stacks read into the ring
    buffers instead, sent as they are."""
    if not posted:
        store._post_frame_draw = lambda d, frame_buffer=None: None  # type: ignore[method-assign]
    try:
        return DeviceBatches(store, b, prefetch=2, host_stacks=host_stacks, copier=_MetaCopier())
    finally:
        if not posted:
            del store._post_frame_draw


COPY_LOOP = ("import sys, time\nimport numpy as np\na = np.ones(14 << 20, np.uint8)\nb = np.empty_like(a)\n"
             "t = time.time()\nwhile time.time() - t < float(sys.argv[1]):\n    np.copyto(b, a)\n")


def beside_a_copy(learner: Learner, rounds: int, seconds: float) -> tuple[float, float]:
    """The learner's updates/s alone and beside another process copying 14 MB buffers in a loop (what reading a
    B=256 batch a step does to the memory the learner's core shares), alternating; medians."""
    import subprocess

    alone: list[float] = []
    beside: list[float] = []
    for r in range(rounds):
        for with_copy in ((False, True) if r % 2 == 0 else (True, False)):
            child = subprocess.Popen([sys.executable, "-c", COPY_LOOP, str(seconds + 0.5)]) if with_copy else None
            time.sleep(0.2 if with_copy else 0.0)
            (beside if with_copy else alone).append(window(lambda: learner.update(None), seconds))
            if child is not None:
                child.wait()
    return statistics.median(alone), statistics.median(beside)


def learner_rates(store: mr.ReplayStore, b: int, learner: Learner, rounds: int, seconds: float,
                  baseline: Callable[..., Any] | None = None) -> tuple[dict[str, list[float]], dict[str, NextTimer]]:
    modes: tuple[str, ...] = ("alone", "sample", "batches2", "feed") + (("baseline",) if baseline else ()) + GPU_WAYS
    rates: dict[str, list[float]] = {m: [] for m in modes}
    timers = {m: NextTimer() for m in ("feed", "baseline") + GPU_WAYS}
    for r in range(rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            it: Any = None
            if m == "alone":
                def step() -> None:
                    learner.update(None)
            elif m == "sample":
                def step() -> None:
                    learner.update(to_tensors(store.sample(b), as_dict=False))
            elif m in GPU_WAYS:
                it = gpu_host_feed(store, b, posted=m != "gpu-unposted", host_stacks=m == "gpu-host-stacks")
                gpu_timer = timers[m]

                def step() -> None:
                    learner.update(gpu_timer.next(it))  # noqa: B023
            elif m == "batches2":
                it = store.batches(b, prefetch=2)

                def step() -> None:
                    learner.update(to_tensors(next(it), as_dict=False))  # noqa: B023 (used within the window)
            else:
                make = device_batches if m == "feed" else baseline
                assert make is not None
                it = make(store, b, "cpu", prefetch=2)
                timer = timers[m]

                def step() -> None:
                    learner.update(timer.next(it))  # noqa: B023
            calls = len(timers[m].wall) if m in timers else 0
            rates[m].append(window(step, seconds))
            if m in timers:  # this window's mean time in next(): the rest of a step is the learner's own
                timers[m].windows.append((rates[m][-1], float(np.mean(timers[m].wall[calls:]))))
            if it is not None:
                it.close()
        log(f"B={b} round {r}: " + ", ".join(f"{m} {rates[m][-1]:.0f}/s" for m in modes))
    return rates, timers


def commit_of(root: str) -> str:
    """The short commit id of the checkout at ``root`` ("?" where git cannot tell)."""
    import subprocess

    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


GPU_WAYS = ("gpu", "gpu-unposted", "gpu-host-stacks")


def modes_of(baseline: Any) -> tuple[str, ...]:
    return ("sample", "batches2", "feed") + (("baseline",) if baseline else ()) + GPU_WAYS


def cpu_per_1000(step: Callable[[], Any], n: int) -> float:
    for _ in range(3):
        step()
    c0 = _cpu()
    for _ in range(n):
        step()
    return (_cpu() - c0) / n * 1000


def cpprb_buffer(capacity: int, pool: np.ndarray, steps: int) -> Any:
    import cpprb

    env = {"obs": {"shape": (84, 84, 4), "dtype": np.uint8}, "act": {"dtype": np.int64}, "rew": {}, "done": {}}
    rb = cpprb.ReplayBuffer(capacity, env, next_of="obs", stack_compress="obs")
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 3001, size=steps // 100 + 2)
    npool = len(pool)
    stack = [pool[0]] * 4
    e, left = 0, int(lengths[0])
    for i in range(steps):
        obs = np.stack(stack, axis=-1)
        stack = stack[1:] + [pool[(i + 1) % npool]]
        left -= 1
        end = left == 0
        rb.add(obs=obs, act=int(rng.integers(6)), rew=0.0, next_obs=np.stack(stack, axis=-1), done=float(end))
        if end:
            rb.on_episode_end()
            stack = [pool[(i + 7) % npool]] * 4
            e += 1
            left = int(lengths[e % len(lengths)])
    return rb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.5, help="per window")
    ap.add_argument("--learner-ms", type=float, default=2.0)
    ap.add_argument("--batch", type=int, action="append", help="default: 32 and 256")
    ap.add_argument("--no-cpprb", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--baseline", metavar="DIR", help="also measure the feed of the checkout at DIR")
    ap.add_argument("--unsteered", action="store_true",
                    help="as the baseline: this feed with the helpers placed by the scheduler alone")
    args = ap.parse_args()
    if args.baseline and args.unsteered:
        ap.error("--baseline and --unsteered both name the baseline: pass one")
    baseline: Any = baseline_feed(os.path.abspath(args.baseline)) if args.baseline else None
    if args.unsteered:
        baseline = _Unsteered
    sizes = args.batch or [32, 256]
    load0 = os.getloadavg()[0]
    torch.set_num_threads(1)  # the learner's tiny ops: no intra-op pool
    pool = atari_pool()
    tmp = tempfile.mkdtemp(prefix="bench_feed_")
    try:
        path = os.path.join(tmp, "store")
        steps = int(args.capacity * 1.1)
        log(f"filling {steps:,} steps")
        fill_reference(path, args.capacity, pool)
        settle()
        store = mr.ReplayStore.open(path, "r", seed=0)
        learner = Learner(args.learner_ms / 1000)
        log(f"learner: {learner.seconds * 1e3:.2f} ms per update alone ({learner.inner} inner)")
        copy_alone, copy_beside = beside_a_copy(learner, max(3, args.rounds), args.seconds)
        log(f"learner alone {copy_alone:.0f}/s, beside a copy loop {copy_beside:.0f}/s")
        rows, gil, cpu_rows, split = [], [], [], []
        rb = None if args.no_cpprb else cpprb_buffer(args.capacity, pool, steps)
        for b in sizes:
            rates, timers = learner_rates(store, b, learner, args.rounds, args.seconds, baseline)
            ratio = {m: statistics.median(x / a for x, a in zip(rates[m], rates["alone"], strict=True))
                     for m in rates}
            rows.append([str(b), f"{statistics.median(rates['alone']):.0f}"]
                        + [f"{statistics.median(rates[m]):.0f} ({ratio[m]:.2f})" for m in modes_of(baseline)])
            for m in (("feed", "baseline") if baseline else ("feed",)) + ("gpu", "gpu-host-stacks"):
                wall = np.array(timers[m].wall) * 1e6
                cpu = np.array(timers[m].cpu) * 1e6
                gil.append([str(b) + LABELS[m], f"{np.median(wall):.0f}",
                            f"{np.percentile(wall, 90):.0f}", f"{np.median(cpu):.0f}", f"{np.percentile(cpu, 90):.0f}"])
            # where the feed's loss goes, window by window against the "alone" window of its round: a fed step is
            # next() plus the learner's own update, which may itself run slower beside the read (caches, memory)
            for m in ("feed", "gpu", "gpu-host-stacks"):
                parts = [(rate / alone, inside * alone, (1 / rate - inside) * alone)
                         for (rate, inside), alone in zip(timers[m].windows, rates["alone"], strict=True)]
                split.append([str(b) + LABELS[m]] + [f"{statistics.median(x[i] for x in parts):.3f}" for i in range(3)])
            wall = np.array(timers["feed"].wall) * 1e6
            cpu = np.array(timers["feed"].cpu) * 1e6
            n = max(200, 40_000 // b)
            it = device_batches(store, b, "cpu", prefetch=2)
            # the GPU feed's reading on the host: distinct frames into one reused buffer (pinned on a GPU machine)
            buf = np.empty((2 * b * 4 + 1, 84, 84), np.uint8)
            dit = store.batches(b, prefetch=2, frames="distinct",
                                frame_buffer=lambda shape, dtype: buf[:shape[0]])  # noqa: B023
            per_row: list[float] = []
            loops: dict[str, Callable[[], Any]] = {
                "feed": lambda: next(it),  # noqa: B023
                "sample": lambda: to_tensors(store.sample(b), as_dict=False),  # noqa: B023
                "distinct": lambda: per_row.append(len(next(dit).frames) / b)}  # noqa: B023
            if rb is not None:
                loops["cpprb"] = lambda: rb.sample(b)  # noqa: B023
            per_loop: dict[str, list[float]] = {k: [] for k in loops}
            for r in range(CPU_ROUNDS):  # (alternating: the machine's other work moves every window)
                for k in (list(loops) if r % 2 == 0 else list(loops)[::-1]):
                    per_loop[k].append(cpu_per_1000(loops[k], n))
            it.close()
            dit.close()
            feed, samp, distinct = (statistics.median(per_loop[k]) for k in ("feed", "sample", "distinct"))
            peer = statistics.median(per_loop["cpprb"]) if rb is not None else float("nan")
            cpu_rows.append([str(b), f"{feed:.2f}", f"{samp:.2f}", f"{distinct:.2f} ({np.mean(per_row):.2f})",
                             f"{peer:.2f}", f"{feed / peer:.2f}"])
            log(f"B={b}: ratios {ratio}; next() {np.median(wall):.0f} us wall, {np.median(cpu):.0f} us CPU; "
                f"CPU-s/1000: feed {feed:.2f}, sample {samp:.2f}, cpprb {peer:.2f}")
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    body = "\n\n".join([
        "## Device feed on the CPU (`device_batches(store, B, \"cpu\")`)",
        f"A stand-in learner spends {learner.seconds * 1e3:.1f} ms per update in GIL-bound Python (100 pure-Python"
        " steps each followed by a tiny torch op, the Python side of an eager update); updates/s alone and fed by"
        " each way, in brackets the median per-round ratio to alone (target for the feed: >= 0.95). Store: the"
        f" repository's Atari episodes, capacity {args.capacity:,}, stack 4, n-step 3, compressed; {args.rounds} rounds of"
        f" {args.seconds:g} s windows, alternating. Load average (1 min) {load0:.1f} at the start, {os.getloadavg()[0]:.1f}"
        f" at the end, on {os.cpu_count()} cores: where it exceeds the cores, every rate here is shared with other"
        " work, \"alone\" included, and the ratios carry that noise (ratios above 1 are noise).",
        table(["batch", "alone", "`sample()` + `to_tensors`", "`batches(2)` + `to_tensors`", "`device_batches` (feed)"]
              + (["feed (baseline)"] if baseline else []) + ["GPU way, host side", "GPU way, not posted",
                                                             "GPU way, host stacks"], rows)
        + "\n\nGPU way, host side: `DeviceBatches` with a copier to PyTorch's meta device (every call the feed makes"
          " for a GPU, no bytes moved: distinct frames into ring buffers, packed, \"sent\", stacks gathered);"
          " not posted: the same with its distinct frames never posted to the reader's helper threads (the"
          " prefetch thread reads them while the learner steps); host stacks: `host_stacks=True`, both stacks read"
          " by the reader straight into the ring buffers and sent as they are (8 frames a row, no gather), in the"
          " same windows."
        + (f"\n\nfeed (baseline): the feed of commit {commit_of(args.baseline)} (its `mmreplay/torch.py` and"
           " `mmreplay/reading/prefetch.py`, the rest of the package this one's), in the same windows."
           if args.baseline else "")
        + ("\n\nfeed (baseline): this feed with the reader's helper threads placed by the system's scheduler"
           " alone, not kept off the CPU of the thread that posts their reads (the learner's), in the same windows."
           if args.unsteered else ""),
        f"The learner alone, and beside another process copying 14 MB buffers in a loop on the other core (what"
        f" the reading of a B=256 batch each step puts on the memory the cores share), alternating: {copy_alone:.0f}"
        f" and {copy_beside:.0f} updates/s ({copy_beside / copy_alone:.2f}).",
        "Time the learner's thread spends in the feed's `next()` per batch (microseconds; thread CPU time bounds"
        " the GIL it holds there: the draw of batch i+2, joining the read of batch i and posting that of batch i+1 to"
        " the reader's helper threads, the batch's small columns and tensors; the frames are read by the helpers"
        " while the learner steps; the GPU way's host side also packs and \"sends\" batch i and gathers its stacks"
        " there, and posts batch i+1's distinct frames):",
        table(["batch", "wall median", "wall p90", "thread CPU median", "thread CPU p90"], gil),
        "Where the feed's loss goes: a fed step is `next()` plus the learner's own update. Per window, against"
        " the round's \"alone\" window (both in units of the learner's step alone, medians over rounds): the"
        " ratio; `next()`'s mean wall time; the rest of a fed step, the update itself (1.000: as fast as alone;"
        " above: slower when fed, its caches refilled after each `next()` and shared with the helpers' read; below:"
        " noise). The ratio is 1 / (next() + update).",
        table(["batch", "ratio", "`next()`", "update beside the read"], split),
        f"CPU-seconds (all threads, getrusage) per 1,000 batches in a tight loop, medians of {CPU_ROUNDS} alternating"
        " windows: the feed, a `sample()` loop (+"
        " `to_tensors`), and cpprb 11's 1-step `ReplayBuffer.sample()` with `stack_compress` (less work per row:"
        " no n-step window; numpy arrays); and the reading a GPU feed does on the host, `batches(frames=\"distinct\")`"
        " into one buffer (in brackets the distinct frames a row; the stacks hold 8):",
        table(["batch", "feed", "`sample()`", "distinct frames (frames a row)", "cpprb", "feed / cpprb"], cpu_rows),
    ])
    print(body)
    if not args.no_write:
        write_section("feed", body)


if __name__ == "__main__":
    main()
