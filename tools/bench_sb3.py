"""mmreplay.sb3.ReplayBuffer against Stable-Baselines3's own ReplayBuffer on Atari frames.

Three measurements, each in a fresh process so that its RssAnon (anonymous resident memory, from
/proc/self/status) is its own:

- memory: a buffer of --capacity transitions (Atari: 4x84x84 uint8 stacks from VecFrameStack) filled
  with --fill transitions of the recorded episodes in tests/data/atari: RssAnon and the store's disk,
  and the time of SB3's save_replay_buffer (a pickle) of it. SB3's own buffer is constructed at the same
  capacity, and what happens is recorded (here: numpy cannot allocate it).
- rates: at --rate-capacity (where SB3's buffer fits in RAM) both buffers in one process are filled, then
  add(), sample(32) (CPU tensors) and DQN's pattern (4 add() then a sample(32)) are timed in alternating
  windows of --seconds, --rounds each; the table gives medians, the ratio mmreplay / SB3 (above 1:
  mmreplay faster) and the CPU each call took (the calling thread's, the whole process's).

Writes the `sb3` section of BENCHMARKS.md. Example: python tools/bench_sb3.py --fill 200000

--compare OTHER (with --rates-only): the rates part run --runs times from each tree in turn (OTHER, a checkout
of another version, first, then this one, alternating), each run in its own process with its own SB3 buffer;
prints one row per run (load at its start, add() rates, ratio and the range of its pairs, CPU per add) and
writes nothing. --busy N starts N processes that only spin (`while True: pass`) beside the runs, as other
work on a shared machine would, and stops them at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))
GB = 1e9
K = 4
WHAT = ("add", "sample", "train")  # what the rates windows time (train: 4 add() then a sample(32), as DQN)


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def du(path: str) -> int:
    total = 0
    for d, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(d, name)).st_blocks * 512
            except OSError:
                pass
    return total


class Frames:
    """The recorded Atari episodes as an endless VecFrameStack-style stream (zero-padded 4-frame stacks)."""

    def __init__(self) -> None:
        self.eps = []
        for game in ("pong", "breakout", "seaquest", "mspacman"):
            d = np.load(os.path.join(ROOT, "tests", "data", "atari", game + ".npz"))
            frames, starts = d["frames"], list(d["episode_starts"]) + [len(d["frames"])]
            for a, b in zip(starts[:-1], starts[1:], strict=True):
                self.eps.append(frames[a:b])
        self.e, self.t = 0, 0
        self.rng = np.random.default_rng(0)

    def stack(self, ep: np.ndarray, t: int) -> np.ndarray:
        out = np.zeros((K, 84, 84), np.uint8)
        lo = max(0, t - K + 1)
        out[K - (t - lo + 1):] = ep[lo:t + 1]
        return out

    def next(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        ep = self.eps[self.e]
        t = self.t
        last = t + 2 == len(ep)
        obs, nxt = self.stack(ep, t)[None], self.stack(ep, t + 1)[None]
        out = (obs, nxt, np.array([int(self.rng.integers(6))]), np.array([1.0], np.float32), np.array([last]),
               [{"TimeLimit.truncated": False}])
        self.t += 1
        if last:
            self.e, self.t = (self.e + 1) % len(self.eps), 0
        return out


def spaces_():
    from gymnasium import spaces

    return spaces.Box(0, 255, (K, 84, 84), np.uint8), spaces.Discrete(6)


def child_memory(capacity: int, fill: int, workdir: str) -> dict:
    import torch

    torch.set_num_threads(1)
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer

    import mmreplay.sb3 as msb3

    obs_space, act_space = spaces_()
    out: dict = {"capacity": capacity, "fill": fill}
    try:
        SB3Buffer(capacity, obs_space, act_space, device="cpu", handle_timeout_termination=False,
                  optimize_memory_usage=True)
        out["sb3"] = "allocated"
    except (MemoryError, ValueError) as exc:
        out["sb3"] = f"{type(exc).__name__}: {exc}"
    base = rss_anon()
    buf = msb3.ReplayBuffer(capacity, obs_space, act_space, device="cpu", path=os.path.join(workdir, "store"))
    frames = Frames()
    t0 = time.perf_counter()
    for _ in range(fill):
        buf.add(*frames.next())
    out["fill_s"] = time.perf_counter() - t0
    buf.sample(32)
    out["rss_anon"] = rss_anon()
    out["rss_anon_base"] = base
    t0 = time.perf_counter()
    with open(os.path.join(workdir, "buffer.pkl"), "wb") as f:
        pickle.dump(buf, f, protocol=pickle.HIGHEST_PROTOCOL)  # what save_replay_buffer does
    out["save_s"] = time.perf_counter() - t0
    out["pickle_bytes"] = os.path.getsize(os.path.join(workdir, "buffer.pkl"))
    out["disk"] = du(os.path.join(workdir, "store"))
    buf.close(commit=False)
    return out


def child_rates(capacity: int, rounds: int, seconds: float, workdir: str) -> dict:
    import torch

    torch.set_num_threads(1)
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer

    import mmreplay.sb3 as msb3

    obs_space, act_space = spaces_()
    sb3 = SB3Buffer(capacity, obs_space, act_space, device="cpu")
    mine = msb3.ReplayBuffer(capacity, obs_space, act_space, device="cpu", path=os.path.join(workdir, "store"))
    frames = Frames()
    rows = [frames.next() for _ in range(2000)]  # prepared once: the windows time add() only
    for b in (sb3, mine):
        for i in range(capacity):
            b.add(*rows[i % len(rows)])
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[tuple[float, float]]] = {}  # (calling thread, whole process) CPU seconds per call
    pos = {"sb3": 0, "mmreplay": 0}

    def window(name: str, b, what: str) -> tuple[float, float, float]:
        n, t0, c0, p0 = 0, time.perf_counter(), time.thread_time(), time.process_time()
        while time.perf_counter() - t0 < seconds:
            if what == "add":
                for _ in range(50):
                    b.add(*rows[pos[name] % len(rows)])
                    pos[name] += 1
                n += 50
            elif what == "sample":
                for _ in range(10):
                    b.sample(32)
                n += 10
            else:  # DQN's train_freq=4: four adds, then a sample(32); n counts the adds
                for _ in range(10):
                    for _ in range(4):
                        b.add(*rows[pos[name] % len(rows)])
                        pos[name] += 1
                    b.sample(32)
                n += 40
        return (n / (time.perf_counter() - t0), (time.thread_time() - c0) / n, (time.process_time() - p0) / n)

    for what in WHAT:
        window("sb3", sb3, what), window("mmreplay", mine, what)  # warm-up
        for r in range(rounds):
            order = [("sb3", sb3), ("mmreplay", mine)] if r % 2 == 0 else [("mmreplay", mine), ("sb3", sb3)]
            for name, b in order:
                rate, thread, proc = window(name, b, what)
                rates.setdefault(f"{name} {what}", []).append(rate)
                cpu.setdefault(f"{name} {what}", []).append((thread, proc))
    mine.close(commit=False)
    return {"capacity": capacity, "rates": rates, "cpu": cpu}


def run_child(kind: str, args: argparse.Namespace, root: str = ROOT) -> dict:
    work = tempfile.mkdtemp(prefix="bench-sb3-", dir=args.dir)
    try:
        cmd = [sys.executable, os.path.join(root, "tools", "bench_sb3.py"), "--child", kind, "--work", work]
        for a in ("capacity", "fill", "rate_capacity", "rounds", "seconds"):
            cmd += [f"--{a.replace('_', '-')}", str(getattr(args, a))]
        env = dict(os.environ, PYTHONPATH=root)
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise SystemExit(f"{kind} child failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def add_row(name: str, load: float, rates: dict) -> list[str]:
    """One --compare row: the add() windows of a rates run."""
    r, cpu = rates["rates"], rates["cpu"]
    ratios = [a / b for a, b in zip(r["mmreplay add"], r["sb3 add"], strict=True)]
    us = {k: [statistics.median(c[i] for c in cpu[f"{k} add"]) * 1e6 for i in (0, 1)] for k in ("sb3", "mmreplay")}
    return [name, f"{load:.1f}", f"{statistics.median(r['sb3 add']):,.0f}", f"{statistics.median(r['mmreplay add']):,.0f}",
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
            f"{us['sb3'][0]:.1f}", f"{us['mmreplay'][0]:.1f} / {us['mmreplay'][1]:.1f}"]


def compare(args: argparse.Namespace) -> None:
    """--compare: the rates part from the other tree and this one in turn (see the module's docstring)."""
    other = os.path.abspath(args.compare)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    rows = []
    try:
        if busy:
            time.sleep(5)  # the load average catches up a little
        for _ in range(args.runs):
            for name, root in (("other", other), ("this", ROOT)):
                load = os.getloadavg()[0]
                rows.append(add_row(name, load, run_child("rates", args, root)))
                print(" | ".join(rows[-1]), flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    from _report import table

    print(f"\nother = {other}, capacity {args.rate_capacity:,}, {args.rounds} windows of {args.seconds:g} s,"
          f" {args.busy} busy processes beside, {os.cpu_count()} cores\n")
    print(table(["run", "load", "add() SB3", "add() mmreplay", "ratio (pairs)", "CPU us SB3",
                 "CPU us mmreplay (thread / process)"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000, help="buffer size for memory (default 1M)")
    ap.add_argument("--fill", type=int, default=1_000_000, help="transitions added for memory (default 1M)")
    ap.add_argument("--rate-capacity", type=int, default=20_000,
                    help="buffer size (and fill) for the rates, where SB3's buffer fits in RAM (default 20K)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--dir", default=None, help="where the stores go (default: the temporary directory)")
    ap.add_argument("--no-write", action="store_true", help="print, do not write BENCHMARKS.md")
    ap.add_argument("--rates-only", action="store_true", help="run the rates part alone and print it (writes nothing)")
    ap.add_argument("--compare", default=None, metavar="OTHER",
                    help="with --rates-only: alternate runs of OTHER (another checkout) and this tree; print, write nothing")
    ap.add_argument("--runs", type=int, default=2, help="--compare: runs of each tree (default 2)")
    ap.add_argument("--busy", type=int, default=0, help="--compare: processes spinning beside the runs (default 0)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "memory":
        print(json.dumps(child_memory(args.capacity, args.fill, args.work)))
        return
    if args.child == "rates":
        print(json.dumps(child_rates(args.rate_capacity, args.rounds, args.seconds, args.work)))
        return
    load0 = os.getloadavg()[0]
    if args.compare is not None:
        if not args.rates_only:
            ap.error("--compare needs --rates-only (it compares the rates part only)")
        compare(args)
        return
    if args.busy:
        ap.error("--busy goes with --compare")
    if args.rates_only:
        print(json.dumps(run_child("rates", args)))
        return
    mem = run_child("memory", args)
    print(json.dumps(mem), flush=True)
    rates = run_child("rates", args)
    print(json.dumps(rates), flush=True)
    from _report import table, write_section

    r, cpu = rates["rates"], rates["cpu"]
    med = {k: statistics.median(v) for k, v in r.items()}
    rows = []
    for what, unit in (("add", "add()/s"), ("sample", "sample(32)/s"), ("train", "4 add() + sample(32), add()/s")):
        ratios = [a / b for a, b in zip(r[f"mmreplay {what}"], r[f"sb3 {what}"], strict=True)]
        us = {name: [statistics.median(c[i] for c in cpu[f"{name} {what}"]) * 1e6 for i in (0, 1)]
              for name in ("sb3", "mmreplay")}
        rows.append([unit, f"{med[f'sb3 {what}']:,.0f}", f"{med[f'mmreplay {what}']:,.0f}",
                     f"{statistics.median(ratios):.2f}", f"{us['sb3'][0]:.1f} / {us['sb3'][1]:.1f}",
                     f"{us['mmreplay'][0]:.1f} / {us['mmreplay'][1]:.1f}"])
    body = (
        "## Stable-Baselines3: `mmreplay.sb3.ReplayBuffer` against SB3's `ReplayBuffer` (Atari frames)\n\n"
        f"Atari observations as SB3's `VecFrameStack` gives them (4x84x84 uint8), the recorded episodes of\n"
        f"`tests/data/atari`. Memory: a buffer of {mem['capacity']:,} transitions filled with {mem['fill']:,}.\n\n"
        + table(["buffer", "capacity", "filled", "RssAnon", "disk", "save_replay_buffer"], [
            ["SB3 `ReplayBuffer` (`optimize_memory_usage=True`)", f"{mem['capacity']:,}", "-",
             f"cannot be built: `{mem['sb3']}`", "-", "-"],
            ["`mmreplay.sb3.ReplayBuffer`", f"{mem['capacity']:,}", f"{mem['fill']:,}",
             f"{mem['rss_anon'] / GB:.2f} GB (of which {mem['rss_anon_base'] / GB:.2f} GB before the buffer:"
             " Python, torch, SB3)", f"{mem['disk'] / GB:.2f} GB",
             f"{mem['save_s']:.2f} s ({mem['pickle_bytes']:,} bytes)"]])
        + f"\n\nRates at a capacity where SB3's buffer fits ({rates['capacity']:,}, filled), in one process,"
        f" {len(r['sb3 add'])} alternating windows of {args.seconds:g} s each; ratio = mmreplay / SB3 per pair of"
        " windows, median. CPU: microseconds of CPU per call (per add() in the last row), of the calling thread /"
        " of the whole process (mmreplay's background threads: the seal of full chunks (checksums, LZ4, fsync),"
        " the reader's helpers), medians of the windows:\n\n"
        + table(["", "SB3", "mmreplay", "ratio", "SB3 CPU us", "mmreplay CPU us"], rows)
        + f"\n\nLoad average (1 min) {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on"
        f" {os.cpu_count()} cores: above the core count, other processes shared the machine and the rates are"
        " noisy; the memory and disk figures are not affected.")
    print(body)
    if not args.no_write:
        write_section("sb3", body)


if __name__ == "__main__":
    main()
