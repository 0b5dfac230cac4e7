"""mmreplay against the replay buffers people use instead, on the reference workload (BENCHMARKS.md).

84x84 uint8 frames, stack 4, n-step 3, gamma 0.99, batch 32, episodes of 100..3000 steps, each buffer
filled to 1.1x capacity one transition at a time. Peers: TorchRL (LazyMemmapStorage with RandomSampler /
PrioritizedSampler), cpprb (stack_compress; with Nstep, and 1-step with next_of) and Dopamine's in-RAM
circular buffers. Each runs in its own process and its own virtual environment, created here with pip
(cached under ~/.cache/mmreplay/bench-peers with --keep-venvs); none of them is a dependency of mmreplay.

Sampling rates are measured in alternating one-second windows against an mmreplay process of the same
kind (uniform or prioritized) that stays alive for the whole run, so each peer's ratio to mmreplay comes
from the same minutes of machine time; medians of --rounds windows. Writes the `peers` section of
BENCHMARKS.md.

    python tools/bench_peers.py --keep-venvs                      # 100K and 1M, all peers: ~35 min
    python tools/bench_peers.py --capacity 100000 --keep-venvs    # ~13 min (+3 min to create the venvs)
    python tools/bench_peers.py --capacity 20000 --peers cpprb --checkpoint none --no-write
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import ROOT, write_section  # noqa: E402
from peers.report import report  # noqa: E402

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "child.py")
ATARI = os.path.join(ROOT, "tests", "data", "atari")  # recorded by tools/record_atari.py
FRAME = 84 * 84
GB = 1e9

# What each peer's environment gets. torch only ever as 2.13.0 (a CPU build is on this machine's disk; an
# unpinned torch pulls a CUDA build). dopamine-rl declares TensorFlow, JAX, Gym, ALE, OpenCV and more, but
# its replay-memory modules import only tensorflow (for tf.io.gfile), gin and absl: install those, with
# the CPU-only TensorFlow build, and the package itself without its declared dependencies.
INSTALL = {
    "torchrl": [["torch==2.13.0", "torchrl==0.14.1", "tensordict==0.14.3"]],
    "cpprb": [["cpprb==11.0.0"]],
    "dopamine": [["--no-deps", "dopamine-rl==4.1.2"],
                 ["tensorflow-cpu==2.21.0", "gin-config==0.5.0", "absl-py==2.5.1"]],
}
VARIANTS = {"torchrl": [""], "cpprb": ["nstep", "1step"], "dopamine": [""]}


@dataclass
class Unit:
    """One buffer configuration in one process: (peer, variant, uniform or prioritized, capacity)."""

    peer: str
    variant: str
    prioritized: bool
    capacity: int
    info: dict[str, Any] = field(default_factory=dict)
    rates: list[float] = field(default_factory=list)
    mm_rates: list[float] = field(default_factory=list)
    minflt: list[float] = field(default_factory=list)  # minor page faults per batch, per window
    ckpt: dict[str, Any] | None = None
    skipped: str = ""
    ckpt_skipped: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.peer, self.variant

    @property
    def kind(self) -> str:
        return "prioritized" if self.prioritized else "uniform"


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, file=sys.stderr, flush=True)


# ---- resources -------------------------------------------------------------------------------------

def needs(u: Unit) -> dict[str, float]:
    """Bytes a unit needs at its peak: anonymous memory and disk, for the buffer and for its checkpoint."""
    cap, stack = u.capacity, 4 * FRAME
    if u.peer == "mmreplay":
        return {"ram": 0.3 * GB, "disk": 1.2 * cap * FRAME + 0.2 * GB, "ckpt_ram": 0.3 * GB, "ckpt_disk": 0.3 * GB}
    if u.peer == "torchrl":
        disk = cap * (2 * stack + 64)
        # dumps() copies the storage; loading into a fresh scratch directory copies it again
        return {"ram": 0.6 * GB, "disk": disk, "ckpt_ram": 0.6 * GB, "ckpt_disk": 2 * disk}
    if u.peer == "cpprb":
        ram = cap * (FRAME + (stack if u.variant == "nstep" else 0) + 64)
        # load_transitions() reads the expanded stacks (obs, and next_obs with Nstep) into memory
        expanded = cap * stack * (2 if u.variant == "nstep" else 1)
        return {"ram": ram, "disk": 0, "ckpt_ram": ram + expanded, "ckpt_disk": 0.1 * expanded}
    ram = cap * (FRAME + 16)  # dopamine
    return {"ram": ram, "disk": 0, "ckpt_ram": ram + 0.2 * GB, "ckpt_disk": 0.3 * ram}


def mem_available() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return float("inf")


def fits(u: Unit, scratch: str, page_cache_kept: float) -> tuple[str, str]:
    """Why the unit, or its checkpoint, cannot run here now ('' if it can)."""
    n = needs(u)
    free_disk = shutil.disk_usage(scratch).free
    avail = mem_available() - page_cache_kept
    why = ""
    if n["ram"] + 1.5 * GB > avail:
        why = f"needs ~{n['ram'] / GB:.1f} GB of RAM, {avail / GB:.1f} GB available"
    elif n["disk"] + 5 * GB > free_disk:
        why = f"needs ~{n['disk'] / GB:.1f} GB of disk, {free_disk / GB:.1f} GB free"
    ckpt = ""
    if not why and n["ckpt_ram"] + 1.5 * GB > avail:
        ckpt = f"loading it back needs ~{n['ckpt_ram'] / GB:.0f} GB of RAM, {avail / GB:.1f} GB available"
    elif not why and n["disk"] + n["ckpt_disk"] + 5 * GB > free_disk:
        ckpt = f"needs ~{(n['disk'] + n['ckpt_disk']) / GB:.0f} GB of disk, {free_disk / GB:.0f} GB free"
    return why, ckpt


# ---- environments ------------------------------------------------------------------------------------

def cache_root() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mmreplay",
                        "bench-peers")


def ensure_venv(peer: str, scratch: str, keep: bool) -> str:
    """The python of a virtual environment holding ``peer``: a cached one if it exists, else a new one
    (in the cache with ``keep``, in the scratch directory otherwise)."""
    spec = json.dumps(INSTALL[peer])
    tag = hashlib.sha256(spec.encode()).hexdigest()[:10]
    cached = os.path.join(cache_root(), f"{peer}-{tag}")
    marker = "installed.json"
    if os.path.exists(os.path.join(cached, marker)):
        return os.path.join(cached, "bin", "python")
    where = cached if keep else os.path.join(scratch, "venvs", peer)
    shutil.rmtree(where, ignore_errors=True)
    log(f"creating a virtual environment for {peer} in {where}")
    subprocess.run([sys.executable, "-m", "venv", where], check=True)
    python = os.path.join(where, "bin", "python")
    for args in INSTALL[peer]:
        out = subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", *args],
                             capture_output=True, text=True)
        if out.returncode:
            shutil.rmtree(where, ignore_errors=True)
            tail = "\n".join(line for line in out.stderr.splitlines() if "WARNING" not in line)[-1500:]
            raise RuntimeError(f"pip install {' '.join(args)} failed:\n{tail}")
    with open(os.path.join(where, marker), "w") as f:
        f.write(spec)
    return python


# ---- child processes ---------------------------------------------------------------------------------

class ChildError(RuntimeError):
    pass


class Child:
    def __init__(self, python: str, cfg: dict[str, Any], scratch: str):
        self.log_path = os.path.join(cfg["workdir"], "..", os.path.basename(cfg["workdir"]) + ".log")
        env = dict(os.environ, RL_WARNINGS="0", TF_CPP_MIN_LOG_LEVEL="3", PYTHONDONTWRITEBYTECODE="1",
                   TMPDIR=scratch)
        self.stderr = open(self.log_path, "w")
        self.proc = subprocess.Popen([python, CHILD, json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env,
                                     cwd=cfg["workdir"])

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                self.stderr.flush()
                with open(self.log_path) as f:
                    tail = f.read()[-1500:]
                raise ChildError(f"exited with {self.proc.returncode}: {tail}")
            if line.startswith("@@"):
                msg = json.loads(line[2:])
                if "error" in msg:
                    raise ChildError(msg["error"].splitlines()[0] + "\n" + msg.get("trace", ""))
                return msg

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            self.proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def start(u: Unit, python: str, run_dir: str, workload: str, args: argparse.Namespace,
          malloc: str | None = None) -> Child:
    name = f"{u.peer}-{u.variant or 'default'}-{u.kind}" + (f"-{malloc}" if malloc else "")
    workdir = os.path.join(run_dir, name)
    os.makedirs(workdir)
    cfg = {"peer": u.peer, "variant": u.variant, "prioritized": u.prioritized, "capacity": u.capacity,
           "steps": u.capacity + u.capacity // 10, "workload": workload, "workdir": workdir,
           "append_budget_s": args.append_budget, "seed": 0, "malloc": malloc or args.malloc,
           "compression": args.mmreplay_compression}
    t0 = time.time()
    child = Child(python, cfg, run_dir)
    u.info.update(child.read())  # versions
    u.info["filled"] = child.read()
    u.info["checked"] = child.read()
    f = u.info["filled"]
    log(f"  {name}: filled {f['steps']:,} in {time.time() - t0:.0f} s (append {f['append_per_s']:,.0f}/s), "
        f"RssAnon {f['rss_anon_mb']:,.0f} MB, disk {f['disk_bytes'] / GB:.2f} GB")
    return child


def measure_windows(u: Unit, child: Child, mm: Child | None, rounds: int, seconds: float) -> None:
    """Alternate sampling windows of the peer and of mmreplay (same kind), after one warm-up each."""
    if mm is not None:
        mm.ask("warm")  # its pages may have been evicted while a large peer filled
        mm.ask(f"sample {seconds / 2}")
    child.ask(f"sample {seconds / 2}")
    for r in range(rounds):
        if mm is not None and r % 2 == 1:
            u.mm_rates.append(mm.ask(f"sample {seconds}")["rate"])
        got = child.ask(f"sample {seconds}")
        u.rates.append(got["rate"])
        u.minflt.append(got["minflt"])
        if mm is not None and r % 2 == 0:
            u.mm_rates.append(mm.ask(f"sample {seconds}")["rate"])


def run_checkpoint(u: Unit, child: Child, run_dir: str) -> None:
    where = os.path.join(run_dir, f"ckpt-{u.peer}-{u.variant or 'default'}-{u.kind}")
    try:
        u.ckpt = child.ask(f"checkpoint {where}")
    finally:
        shutil.rmtree(where, ignore_errors=True)
    c = u.ckpt
    log(f"  checkpoint: save {c['save_s']:.2f} s, load {c['load_s']:.2f} s, {c['ckpt_bytes'] / GB:.3f} GB")


def run_capacity(cap: int, pythons: dict[str, str], scratch: str, workload: str,
                 args: argparse.Namespace) -> list[Unit]:
    run_dir = os.path.join(scratch, f"cap{cap}")
    os.makedirs(run_dir)
    units: list[Unit] = []
    mm: dict[bool, Child] = {}
    try:
        for prio in (False, True):
            u = Unit("mmreplay", "", prio, cap)
            why, _ = fits(u, scratch, 0)
            if why:
                raise RuntimeError(f"mmreplay at capacity {cap:,} {why}")
            mm[prio] = start(u, sys.executable, run_dir, workload, args)
            units.append(u)
        # the mmreplay store sampled next to a peer should stay in the page cache: keep its size out of
        # what a peer may take (the other one may be evicted; it is warmed again before its windows)
        mm_cache = 1.1 * cap * FRAME
        for peer in args.peers:
            for variant in VARIANTS[peer]:
                for prio in (False, True):
                    u = Unit(peer, variant, prio, cap)
                    units.append(u)
                    if peer not in pythons:
                        u.skipped = "not installed"
                        continue
                    u.skipped, u.ckpt_skipped = fits(u, scratch, mm_cache)
                    if u.skipped:
                        log(f"  skip {peer} {variant} {u.kind} at {cap:,}: {u.skipped}")
                        continue
                    run_unit(u, pythons[peer], mm[prio], run_dir, workload, args)
        for prio, child in mm.items():
            u = next(x for x in units if x.peer == "mmreplay" and x.prioritized == prio)
            u.rates = [r for x in units if x.peer != "mmreplay" and x.prioritized == prio for r in x.mm_rates]
            if not u.rates:  # no peer ran: measure mmreplay alone
                measure_windows(u, child, None, args.rounds, args.seconds)
            if args.checkpoint != "none":
                run_checkpoint(u, child, run_dir)
    finally:
        for child in mm.values():
            child.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return units


def run_unit(u: Unit, python: str, mm: Child, run_dir: str, workload: str, args: argparse.Namespace) -> None:
    child = None
    try:
        child = start(u, python, run_dir, workload, args)
        measure_windows(u, child, mm, args.rounds, args.seconds)
        log(f"  {u.kind} sampling: {statistics.median(u.rates):,.0f}/s, mmreplay in the same windows "
            f"{statistics.median(u.mm_rates):,.0f}/s")
        wanted = args.checkpoint == "all" or (args.checkpoint == "uniform" and not u.prioritized)
        # cpprb's save_transitions() writes transitions only (no priorities): the prioritized buffer's
        # checkpoint is the uniform one's
        if u.peer == "cpprb" and u.prioritized:
            u.ckpt_skipped = u.ckpt_skipped or "it would be the uniform buffer's: priorities are not saved"
        elif not wanted:
            u.ckpt_skipped = u.ckpt_skipped or f"--checkpoint {args.checkpoint}"
        if not u.ckpt_skipped:
            run_checkpoint(u, child, run_dir)
    except ChildError as exc:
        u.skipped = f"failed: {str(exc).strip().splitlines()[0][:300]}"
        log(f"  {u.peer} {u.variant} {u.kind}: {exc}")
    finally:
        if child is not None:
            child.close()
        name = f"{u.peer}-{u.variant or 'default'}-{u.kind}"
        shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)


def malloc_check(cap: int, pythons: dict[str, str], scratch: str, workload: str,
                 args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each buffer (uniform) sampled in a process left in a fresh process's allocator state and in one put
    in a learner's state (common.learner_malloc_state), in alternating windows: the measurement that shows
    the start-up step does what it should (page faults per batch gone, the rate of a long-running process)."""
    run_dir = os.path.join(scratch, f"malloc{cap}")
    os.makedirs(run_dir)
    out = []
    try:
        for peer, variant in [("mmreplay", "")] + [(p, v) for p in args.peers if p in pythons
                                                                  for v in VARIANTS[p]]:
            python = sys.executable if peer == "mmreplay" else pythons[peer]
            units = {m: Unit(peer, variant, False, cap) for m in ("fresh", "learner")}
            children: dict[str, Child] = {}
            try:
                for m, u in units.items():
                    children[m] = start(u, python, run_dir, workload, args, malloc=m)
                    children[m].ask(f"sample {args.seconds / 2}")
                for r in range(args.rounds):
                    for m in (("fresh", "learner") if r % 2 == 0 else ("learner", "fresh")):
                        got = children[m].ask(f"sample {args.seconds}")
                        units[m].rates.append(got["rate"])
                        units[m].minflt.append(got["minflt"])
            except ChildError as exc:
                log(f"  malloc check of {peer} {variant}: {exc}")
                continue
            finally:
                for c in children.values():
                    c.close()
            row = {"peer": peer, "variant": variant, "capacity": cap,
                   **{f"{m}_rate": statistics.median(u.rates) for m, u in units.items()},
                   **{f"{m}_minflt": statistics.median(u.minflt) for m, u in units.items()},
                   "ratio": statistics.median([b / a for a, b in zip(units["fresh"].rates, units["learner"].rates,
                                                                      strict=True)]),
                   "state": {m: u.info.get("malloc") for m, u in units.items()}}
            log(f"  malloc check {peer} {variant}: fresh {row['fresh_rate']:,.0f}/s ({row['fresh_minflt']:.0f} faults"
                f"/batch), learner {row['learner_rate']:,.0f}/s ({row['learner_minflt']:.0f}), x{row['ratio']:.2f}")
            out.append(row)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


# ---- workload -----------------------------------------------------------------------------------------

def make_workload(path: str, steps: int, frames: str) -> str:
    """The frame pool and the seeded episode lengths, actions and rewards every peer is fed."""
    if frames == "atari" and os.path.isdir(ATARI):
        games = sorted(n for n in os.listdir(ATARI) if n.endswith(".npz"))
        pool = np.concatenate([np.load(os.path.join(ATARI, g))["frames"][:2048 // len(games)] for g in games])
        source = "real Atari frames (" + ", ".join(g[:-4] for g in games) + ", from tests/data/atari)"
    else:
        from mmreplay.bench import frame_pool

        pool = frame_pool()
        source = "generated Atari-like frames (mmreplay.bench.frame_pool)"
    rng = np.random.default_rng(0)
    np.savez(path, pool=pool, lengths=rng.integers(100, 3001, size=steps // 100 + 2),
             actions=rng.integers(0, 6, size=steps), rewards=(rng.random(steps) < 0.02).astype(np.float32))
    return source


# ---- main ---------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, action="append", help="repeatable; default 100000 and 1000000")
    ap.add_argument("--peers", default="torchrl,cpprb,dopamine",
                    help="comma-separated, among torchrl, cpprb, dopamine (mmreplay always runs)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary directory); emptied after")
    ap.add_argument("--no-write", action="store_true", help="print only, do not update BENCHMARKS.md")
    ap.add_argument("--keep-venvs", action="store_true",
                    help=f"create the peers' virtual environments in {cache_root()} and keep them")
    ap.add_argument("--checkpoint", choices=["uniform", "all", "none"], default="all",
                    help="which buffers get the save/load measurement (default all)")
    ap.add_argument("--rounds", type=int, default=5, help="sampling windows per buffer (default 5)")
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one sampling window (default 1 s)")
    ap.add_argument("--append-budget", type=float, default=60.0,
                    help="seconds of one-at-a-time appends before a peer with batched adds gets the rest in "
                         "batches (TorchRL; default 60)")
    ap.add_argument("--json", default=None, help="also write every measurement to this JSON file")
    ap.add_argument("--frames", choices=["atari", "synthetic"], default="atari",
                    help="frame pool: real Atari frames from tests/data/atari (default) or generated ones")
    ap.add_argument("--malloc", choices=["learner", "fresh"], default="learner",
                    help="allocator state of every buffer process: a long-running learner's (default: one 16 MB "
                         "block allocated and freed at start-up) or a fresh process's")
    ap.add_argument("--malloc-check", type=int, default=20_000, metavar="CAPACITY",
                    help="first measure each buffer in both allocator states at this capacity (0: skip)")
    ap.add_argument("--mmreplay-compression", choices=["auto", "none"], default="auto",
                    help="frames of mmreplay's stores: LZ4-compressed sealed chunks (auto, the default for "
                         "images) or raw (none); the section written is 'peers' or 'peers-raw'")
    ap.add_argument("--section", default=None,
                    help="BENCHMARKS.md section to write (default: 'peers', or 'peers-raw' with raw frames)")
    args = ap.parse_args()
    args.peers = [p for p in args.peers.split(",") if p]
    bad = [p for p in args.peers if p not in INSTALL]
    if bad:
        ap.error(f"--peers: unknown {bad}; choose among {sorted(INSTALL)}")
    caps = args.capacity or [100_000, 1_000_000]
    t_start = time.time()
    loads = [os.getloadavg()[0]]
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="mmreplay-peers-", dir=args.dir)
    try:
        workload = os.path.join(scratch, "workload.npz")
        source = make_workload(workload, max(caps) + max(caps) // 10, args.frames)
        pythons: dict[str, str] = {}
        installed: dict[str, str] = {}
        failed: dict[str, str] = {}
        for peer in args.peers:
            try:
                pythons[peer] = ensure_venv(peer, scratch, args.keep_venvs)
                installed[peer] = pythons[peer]
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                failed[peer] = str(exc)
                log(f"{peer} could not be installed: {exc}")
        malloc_rows: list[dict[str, Any]] = []
        if args.malloc_check:
            log(f"allocator state check at {args.malloc_check:,}")
            malloc_rows = malloc_check(args.malloc_check, pythons, scratch, workload, args)
        units: list[Unit] = []
        for cap in caps:
            log(f"capacity {cap:,}")
            units += run_capacity(cap, pythons, scratch, workload, args)
        for u in units:
            if u.skipped == "not installed":
                u.skipped = "could not be installed: " + failed.get(u.peer, "")[:200]
        loads.append(os.getloadavg()[0])
        body = report(units, source, {p: INSTALL[p] for p in installed}, args, (time.time() - t_start) / 60, loads,
                      malloc_rows)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"units": [u.__dict__ for u in units], "malloc_check": malloc_rows}, f, indent=1, default=str)
    if not args.no_write:
        write_section(args.section or ("peers" if args.mmreplay_compression == "auto" else "peers-raw"), body)
    print(body)


if __name__ == "__main__":
    main()
