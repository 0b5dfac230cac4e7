"""What a batch costs in CPU, against cpprb, on an idle machine, pinned to one core, and beside busy processes.

mmreplay reads a batch in the calling thread and helper threads; cpprb copies in one thread. A rate alone
says how fast a batch comes on idle cores; what a training box cares about is the CPU a batch takes
when its cores are busy with environments and the learner. So each library runs in a long-lived process
of its own (tools/peers: the reference workload, 84x84 Atari frames, stack 4, n-step 3, capacity
100,000 by default, filled one transition at a time), and both are sampled in alternating one-second
windows, three ways:

- ``idle``: nothing else runs (beyond what the machine is doing anyway: the load is reported);
- ``pinned``: both processes limited to one core (``sched_setaffinity`` on every thread; mmreplay looks
  at its affinity every few hundred reads and stops sharing reads);
- ``busy``: two CPU-bound processes run on the machine's cores the whole time.

Each window gives batches/s and CPU-seconds per 1,000 batches (every thread of the process: user +
system time). Uniform ``sample()`` and prioritized ``sample()`` + ``update_priorities``; batch 32, 256 and
512; mmreplay's frames compressed (the default) and raw. Writes the ``cpu`` section of BENCHMARKS.md.

    python tools/bench_cpu.py                        # ~25 min
    python tools/bench_cpu.py --capacity 20000 --batches 32 --rounds 3 --no-write   # a quick look
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
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import table, write_section  # noqa: E402
from bench_peers import Child, Unit, ensure_venv, log, make_workload, start  # noqa: E402

CONDITIONS = ("idle", "pinned", "busy")
BUSY = "import time\nt = time.time()\nwhile time.time() - t < 7200: pass\n"


def pin(pid: int, cpus: set[int] | None) -> None:
    """Every thread of process ``pid`` onto ``cpus`` (None: all of this machine's)."""
    cpus = cpus or set(range(os.cpu_count() or 1))
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):
            pass


def windows(children: dict[str, Child], batch: int, rounds: int, seconds: float) -> dict[str, list[dict[str, Any]]]:
    """Alternating windows of each child (the order flips every round), after a half-length warm-up each."""
    names = list(children)
    for name in names:
        children[name].ask(f"sample {seconds / 2} {batch}")
    got: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            got[name].append(children[name].ask(f"sample {seconds} {batch}"))
    return got


def busy_processes(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]


def run_pair(kind: str, compression: str, python: str, scratch: str, workload: str, args: argparse.Namespace,
             rows: list[dict[str, Any]]) -> None:
    prio = kind == "prioritized"
    run_dir = tempfile.mkdtemp(prefix=f"{kind}-{compression}-", dir=scratch)
    cargs = argparse.Namespace(append_budget=args.append_budget, malloc="learner", mmreplay_compression=compression)
    children: dict[str, Child] = {}
    try:
        children["mmreplay"] = start(Unit("mmreplay", "", prio, args.capacity), sys.executable, run_dir, workload, cargs)
        children["cpprb"] = start(Unit("cpprb", args.variant, prio, args.capacity), python, run_dir, workload, cargs)
        for cond in CONDITIONS:
            busy: list[subprocess.Popen[bytes]] = []
            try:
                if cond == "pinned":
                    for c in children.values():
                        pin(c.proc.pid, {args.core})
                elif cond == "busy":
                    busy = busy_processes(args.busy)
                for batch in args.batches:
                    load = os.getloadavg()[0]
                    got = windows(children, batch, args.rounds, args.seconds)
                    mm, cp = got["mmreplay"], got["cpprb"]
                    ratio = statistics.median(a["rate"] / b["rate"] for a, b in zip(mm, cp, strict=True))
                    row = {"kind": kind, "compression": compression, "condition": cond, "batch": batch, "load": load,
                           "ratio": ratio,
                           **{f"{n}_{k}": statistics.median(w[k] for w in got[n])
                              for n in got for k in ("rate", "cpu_per_batch", "cpu_share")}}
                    rows.append(row)
                    if args.json:
                        with open(args.json, "w") as f:
                            json.dump(rows, f, indent=1)
                    log(f"  {kind} {compression} {cond} B={batch}: mmreplay {row['mmreplay_rate']:,.0f}/s "
                        f"({row['mmreplay_cpu_per_batch'] * 1e6:,.0f} us CPU), cpprb {row['cpprb_rate']:,.0f}/s "
                        f"({row['cpprb_cpu_per_batch'] * 1e6:,.0f} us CPU): x{ratio:.2f}")
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
                if cond == "pinned":
                    for c in children.values():
                        pin(c.proc.pid, None)
    finally:
        for c in children.values():
            c.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def limits(capacity: int, seconds: float = 1.0) -> dict[str, float]:
    """Where a compressed batch of 32 stands against its own limit, in this process, one thread: the LZ4
    decode rate of the frames a batch decodes, the copy rate of the same bytes (``np.copyto``), and a
    ``sample(32)``'s CPU time against the sum of its decode and copy time."""
    import mmreplay as mr
    from mmreplay.bench import fill, frame_pool, warm

    path = tempfile.mkdtemp(prefix="limits-")
    try:
        store = mr.ReplayStore.create(os.path.join(path, "s"), capacity=capacity, obs_shape=(84, 84), stack=4,
                                      n_step=3, seed=0, read_threads=1)
        pool = np.concatenate([np.load(os.path.join(os.path.dirname(__file__), "..", "tests", "data", "atari", g))
                               ["frames"][:512] for g in ("breakout.npz", "mspacman.npz", "pong.npz", "seaquest.npz")])
        fill(store, capacity + capacity // 10, pool if len(pool) else frame_pool())
        store.commit()
        warm(store)

        def rate(fn: Any) -> float:
            n, t0 = 0, time.process_time()
            while time.process_time() - t0 < seconds:
                fn()
                n += 1
            return (time.process_time() - t0) / n

        batch = store.sample(32)
        sample_s = rate(lambda: store.sample(32))
        reader = store._reader  # (a benchmark of the part: the kernel alone)
        plan = store._parts.log.index.plan(store._parts.log.index.slots_of(batch.index))
        distinct = np.unique(np.concatenate((plan.obs_slots.reshape(-1), plan.next_slots.reshape(-1))))
        decode_s = rate(lambda: reader.take(distinct))
        nbytes = distinct.size * 84 * 84
        src = np.random.default_rng(0).integers(0, 255, nbytes, np.uint8)
        dst = np.empty_like(src)
        copy_s = rate(lambda: np.copyto(dst, src))
        out_bytes = batch.obs.nbytes * 2
        rest = out_bytes - nbytes  # bytes of the output that are copies of a decoded frame
        store.close()
        return {"decode_gbs": nbytes / decode_s / 1e9, "copy_gbs": nbytes / copy_s / 1e9,
                "sample_us": sample_s * 1e6, "decode_us": decode_s * 1e6,
                "copy_us": copy_s * 1e6 * rest / nbytes, "distinct": distinct.size}
    finally:
        shutil.rmtree(path, ignore_errors=True)


LEARNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "learner_child.py")


def learner(workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """A DQN-style loop (sample 32, a small one-thread PyTorch update) on mmreplay and on an in-RAM numpy ring,
    each in its own process, in alternating windows, beside ``args.busy`` CPU-bound processes."""
    procs = {k: subprocess.Popen([sys.executable, LEARNER, k, str(args.capacity), workload], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True) for k in ("mmreplay", "numpy")}

    def ask(k: str, cmd: str | None) -> dict[str, Any]:
        p = procs[k]
        assert p.stdin is not None and p.stdout is not None
        if cmd:
            p.stdin.write(cmd + "\n")
            p.stdin.flush()
        while True:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"learner child {k} exited with {p.wait()}")
            if line.startswith("@@"):
                return dict(json.loads(line[2:]))

    busy: list[subprocess.Popen[bytes]] = []
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in procs}
    try:
        for k in procs:
            ask(k, None)  # ready
        busy = busy_processes(args.busy)
        load = os.getloadavg()[0]
        for k in procs:
            ask(k, f"run {args.seconds / 2}")
        for r in range(args.rounds):
            for k in (("mmreplay", "numpy") if r % 2 == 0 else ("numpy", "mmreplay")):
                got[k].append(ask(k, f"run {args.seconds}"))
    finally:
        for p in busy:
            p.kill()
            p.wait()
        for p in procs.values():
            if p.stdin is not None:
                p.stdin.write("quit\n")
                p.stdin.flush()
            p.wait(timeout=120)
    ratio = statistics.median(a["rate"] / b["rate"] for a, b in zip(got["mmreplay"], got["numpy"], strict=True))
    out = {f"{k}_{q}": statistics.median(w[q] for w in got[k]) for k in got for q in ("rate", "cpu_share")}
    log(f"learner beside {args.busy} busy processes: mmreplay {out['mmreplay_rate']:,.0f} steps/s, numpy ring "
        f"{out['numpy_rate']:,.0f} steps/s: x{ratio:.2f}")
    return {"ratio": ratio, "load": load, **out}


def report(rows: list[dict[str, Any]], lim: dict[str, float] | None, args: argparse.Namespace, minutes: float,
           learn: dict[str, Any] | None = None) -> str:
    out = ["## CPU cost: a batch against cpprb, idle, pinned to one core, beside busy processes", "",
           f"Capacity {args.capacity:,}, the reference workload (real Atari frames, stack 4, n-step 3), mmreplay "
           f"against cpprb's {'n-step' if args.variant == 'nstep' else '1-step'} buffer, each in its own long-lived "
           f"process, sampled in alternating {args.seconds:g} s windows ({args.rounds} each; medians). "
           "*CPU/1k* is CPU-seconds per 1,000 batches (every thread of the process, user + system). "
           "*pinned*: both processes on one core; *busy*: two CPU-bound processes running beside them "
           f"the whole time. Run took {minutes:.0f} min.", ""]
    for kind in ("uniform", "prioritized"):
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        what = "`sample()`" if kind == "uniform" else "`sample()` + `update_priorities()`"
        out += [f"**{kind.capitalize()}** ({what}):", ""]
        body = []
        for r in sel:
            per_row = r["batch"] > 32
            unit = "rows/s" if per_row else "batches/s"
            mult = r["batch"] if per_row else 1
            body.append([r["compression"], r["condition"], str(r["batch"]), f"{r['load']:.1f}",
                         f"{r['mmreplay_rate'] * mult:,.0f} {unit}", f"{r['mmreplay_cpu_per_batch'] * 1e3:,.2f}",
                         f"{r['cpprb_rate'] * mult:,.0f} {unit}", f"{r['cpprb_cpu_per_batch'] * 1e3:,.2f}",
                         f"**{r['ratio']:.2f}**",
                         f"{r['cpprb_cpu_per_batch'] / r['mmreplay_cpu_per_batch']:.2f}"])
        out += [table(["frames", "machine", "B", "load", "mmreplay", "CPU/1k", "cpprb", "CPU/1k",
                       "rate ratio", "CPU ratio (cpprb/mmreplay)"], body), ""]
    if lim:
        out += [f"Compressed frames against their limit (one thread, batch 32, {lim['distinct']:.0f} distinct frames "
                f"decoded): LZ4 decode {lim['decode_gbs']:.1f} GB/s, `np.copyto` {lim['copy_gbs']:.1f} GB/s; a "
                f"`sample(32)` takes {lim['sample_us']:.0f} us of CPU against {lim['decode_us']:.0f} us decoding + "
                f"{lim['copy_us']:.0f} us copying the rest of its output "
                f"({lim['sample_us'] / (lim['decode_us'] + lim['copy_us']):.2f}x their sum; the rest is drawing, "
                "planning and assembling the batch).", ""]
    if learn:
        out += [f"A DQN-style loop (`tools/peers/learner_child.py`: `sample(32)`, then a small one-thread PyTorch "
                f"update) beside {args.busy} CPU-bound processes (load {learn['load']:.1f}): mmreplay "
                f"{learn['mmreplay_rate']:,.0f} steps/s using {learn['mmreplay_cpu_share']:.2f} CPU, the same loop on "
                f"an in-RAM numpy ring (`np.take` of the stacks, no episode handling) {learn['numpy_rate']:,.0f} "
                f"steps/s using {learn['numpy_cpu_share']:.2f} CPU: **{learn['ratio']:.2f}x**.", ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--batches", default="32,256,512", help="batch sizes (default 32,256,512)")
    ap.add_argument("--kinds", default="uniform,prioritized")
    ap.add_argument("--compression", default="auto,none", help="mmreplay's frames: auto (compressed), none (raw)")
    ap.add_argument("--variant", choices=["nstep", "1step"], default="nstep",
                    help="cpprb's buffer: with Nstep (the same rows as mmreplay's), or 1-step")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound processes in the busy condition (default 2)")
    ap.add_argument("--core", type=int, default=0, help="the core of the pinned condition")
    ap.add_argument("--append-budget", type=float, default=20.0)
    ap.add_argument("--keep-venvs", action="store_true")
    ap.add_argument("--no-limits", action="store_true", help="skip the decode/copy limit measurement")
    ap.add_argument("--learner", action="store_true", help="also the DQN-style loop against a numpy ring")
    ap.add_argument("--only-learner", action="store_true", help="only the DQN-style loop")
    ap.add_argument("--json", default=None, help="also write every row to this JSON file, as it is measured")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    t0 = time.time()
    scratch = tempfile.mkdtemp(prefix="mmreplay-cpu-")
    rows: list[dict[str, Any]] = []
    try:
        workload = os.path.join(scratch, "workload.npz")
        make_workload(workload, args.capacity + args.capacity // 10, "atari")
        lim = learn = None
        if not args.only_learner:
            python = ensure_venv("cpprb", scratch, args.keep_venvs)
            for compression in args.compression.split(","):
                for kind in args.kinds.split(","):
                    log(f"{kind}, mmreplay frames {compression}")
                    run_pair(kind, compression, python, scratch, workload, args, rows)
            lim = None if args.no_limits else limits(min(args.capacity, 50_000))
        if args.learner or args.only_learner:
            try:
                learn = learner(workload, args)
            except (RuntimeError, OSError) as exc:  # the rest of the run is still worth its report
                log(f"the learner loop failed: {exc}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    body = report(rows, lim, args, (time.time() - t0) / 60, learn)
    if not args.no_write:
        write_section("cpu", body)
    print(body)


if __name__ == "__main__":
    main()
