"""Compressed frames on the reference workload: disk, warm / cold / memory-limited sampling, append rate,
and the LZ4 decoder against numcodecs and python-lz4 (BENCHMARKS.md "Compressed frames").

Frames: the real Atari frames of tests/data/atari (pong, breakout, seaquest, mspacman, 20,776 frames),
made into episodes of 100..3000 steps (uniform): each episode is a run of consecutive frames of one game
(from a random start, wrapping inside that game), shifted by a random (dy, dx) in [-8, 8]^2 (np.roll)
and XORed with a random byte. Every episode's pages differ from every other's while each frame keeps
the compressibility of a real frame (rolls move the runs, XOR with one byte keeps them runs). The
writer walks a pool of 131,072 such frames (~85 episodes) in a cycle.

Two stores get the same steps: the default (compression="auto": LZ4) and a raw one
(compression=None); they are filled in alternating blocks so both append rates see the same machine.
Then, all in one run:

- disk bytes (allocated blocks) of each store after close;
- warm sample(32): both stores open, every page touched, 0.5 s windows alternated, medians, and the
  process's CPU time per batch;
- cold: every mapping closed, every file of the store dropped from the page cache
  (POSIX_FADV_DONTNEED, checked with fincore), a fresh reader process draws a fixed number of batches;
- memory-limited: the same fresh reader moved into a new cgroup (v1 memory controller, page cache
  counted) limited to --limit-gib, sampling for --limited-seconds; reported over the whole run and over
  its second half (steady state);
- decoders, one thread: the frames of one chunk decoded by the numba kernel (into one buffer), by
  numcodecs.LZ4().decode per frame and by lz4.block.decompress per frame.

    python tools/bench_compression.py                       # 1M transitions (~7 GB raw store + ~0.8 GB)
    python tools/bench_compression.py --capacity 100000 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import table, write_section  # noqa: E402

import mmreplay as mr  # noqa: E402
from mmreplay.bench import BATCH, disk_bytes, rss_anon_mb, sample_rate  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATARI = os.path.join(ROOT, "tests", "data", "atari")
GAMES = ("pong", "breakout", "seaquest", "mspacman")
CGROUP_V1 = "/sys/fs/cgroup/memory"


# -- frames --------------------------------------------------------------------------------------------
class Episodes:
    """Episodes of real Atari frames, varied per episode (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.games = []
        for g in GAMES:
            with np.load(os.path.join(ATARI, g + ".npz")) as d:
                self.games.append(d["frames"])
        sizes = np.array([len(f) for f in self.games], np.float64)
        self.p = sizes / sizes.sum()
        self.rng = np.random.default_rng(seed)

    def next(self) -> np.ndarray:
        """One episode's frames: (T + 1, 84, 84), T in 100..3000."""
        rng = self.rng
        game = self.games[int(rng.choice(len(self.games), p=self.p))]
        n = int(rng.integers(100, 3001)) + 1
        idx = (int(rng.integers(len(game))) + np.arange(n)) % len(game)
        frames = np.roll(game[idx], tuple(int(v) for v in rng.integers(-8, 9, 2)), axis=(1, 2))
        frames ^= np.uint8(rng.integers(256))
        return frames


class SealerClock:
    """CPU time (``time.thread_time``) the background sealer spends per chunk, per store (benchmark-only:
    wraps ``ChunkLog._seal``)."""

    def __init__(self) -> None:
        from mmreplay.core.log import ChunkLog

        self.cpu: dict[str, list[float]] = {}
        real = ChunkLog._seal

        def timed(log: ChunkLog, seq: int) -> Any:
            t = time.thread_time()
            try:
                return real(log, seq)
            finally:
                self.cpu.setdefault(log.root, []).append(time.thread_time() - t)

        ChunkLog._seal = timed  # type: ignore[method-assign]


def frame_pool(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``size`` frames of consecutive varied episodes, and a mask of the frames that start one."""
    eps = Episodes(seed)
    frames = np.empty((size, 84, 84), np.uint8)
    starts = np.zeros(size, np.bool_)
    at = 0
    while at < size:
        ep = eps.next()[: size - at]
        frames[at:at + len(ep)] = ep
        starts[at] = True
        at += len(ep)
    return frames, starts


def fill_pair(stores: dict[str, mr.ReplayStore], steps: int, block: int, seed: int,
              pool: int = 131_072) -> dict[str, float]:
    """The same steps into every store, alternating blocks of ``block`` steps; transitions/s per store
    (time in reset()/step() plus the wait for the block's last background seals to end), and the writer
    thread's CPU time per step. Frames come from a pool of varied episodes walked in a cycle (per-frame
    compression does not care that a frame's content comes back ~every ``pool`` steps, and the
    benchmark's own memory stays at the pool)."""
    frames, starts = frame_pool(pool, seed)
    rng = np.random.default_rng(seed + 1)
    spent = dict.fromkeys(stores, 0.0)
    cpu = dict.fromkeys(stores, 0.0)  # the writer thread's own CPU time in reset()/step()
    for s in stores.values():
        s.reset(frames[0])
    p, done = 0, 0
    while done < steps:
        n = min(block, steps - done)
        # the block's inputs, made before any store is timed: (frame, action, reward, end), or (frame,)
        # for a reset
        plan: list[tuple] = []
        for _ in range(n):
            p = (p + 1) % pool
            end = bool(starts[(p + 1) % pool])
            plan.append((p, int(rng.integers(6)), float(rng.random() < 0.02), end))
            if end:
                p = (p + 1) % pool
                plan.append((p,))
        for name, s in stores.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            for item in plan:
                if len(item) == 1:
                    s.reset(frames[item[0]])
                else:
                    s.step(item[1], item[2], frames[item[0]], item[3], False)
            cpu[name] += time.thread_time() - c0
            s._parts.log.wait_sealed()  # benchmark-only: the block's seals are charged to it, not to the next block
            spent[name] += time.perf_counter() - t0
        done += n
        print(f"\r  filled {done:,}/{steps:,}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {k: steps / v for k, v in spent.items()} | {k + "_cpu_per_step": v / steps for k, v in cpu.items()}


def warm_rates(stores: dict[str, mr.ReplayStore], windows: int) -> dict[str, float]:
    """sample(32) in 0.5 s windows alternated between the stores: median batches/s, median ratio of
    neighbouring windows (default / raw), and the process's CPU time per batch (all its threads: a
    measure other processes' load barely moves)."""
    rates: dict[str, list[float]] = {k: [] for k in stores}
    cpu: dict[str, list[float]] = {k: [] for k in stores}
    for _ in range(windows):
        for k, s in stores.items():
            c0 = time.process_time()
            rate = sample_rate(s, 0.5)
            n = max(1, round(rate * 0.5))
            rates[k].append(rate)
            cpu[k].append((time.process_time() - c0) / n)
    out = {k: float(np.median(v)) for k, v in rates.items()}
    out["ratio"] = float(np.median(np.array(rates["default"]) / np.array(rates["raw"])))
    out |= {k + "_cpu_us": float(np.median(v)) * 1e6 for k, v in cpu.items()}
    return out


# -- page cache ----------------------------------------------------------------------------------------
def store_files(path: str) -> list[str]:
    return [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]


def drop_cache(path: str) -> float:
    """Drop every file of the store from the page cache; the resident fraction fincore reports after."""
    files = store_files(path)
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", *files],
                             capture_output=True, text=True, check=True).stdout.split()
        return sum(int(x) for x in out[0::2]) / max(1, sum(int(x) for x in out[1::2]))
    except (OSError, subprocess.CalledProcessError):
        return float("nan")


class Cgroup:
    """A child of this process's cgroup-v1 memory group with a limit (page cache counted); removed on exit."""

    def __init__(self, limit_bytes: int) -> None:
        with open("/proc/self/cgroup") as f:
            mine = next(line.split(":", 2)[2].strip() for line in f if line.split(":")[1] == "memory")
        self.path = os.path.join(CGROUP_V1 + mine, f"mmreplay-bench-{os.getpid()}-{time.monotonic_ns()}")
        os.mkdir(self.path)
        with open(os.path.join(self.path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit_bytes))

    def enter(self) -> None:
        """Move the calling process into the group (used as a child's preexec_fn)."""
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def stat(self, key: str) -> int:
        with open(os.path.join(self.path, "memory.stat")) as f:
            return next(int(line.split()[1]) for line in f if line.split()[0] == key)

    def close(self) -> None:
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def cgroup_available() -> str | None:
    """None if a limited reader can be run here, else why not."""
    if os.geteuid() != 0:
        return "not root: run as root, or start the reader yourself in a memory-limited cgroup"
    if not os.path.isdir(CGROUP_V1):
        return f"no cgroup v1 memory controller at {CGROUP_V1}"
    return None


def reader(path: str, seconds: float, batches: int) -> None:
    """The reader process (``--reader``): opens the store, samples, prints JSON."""
    from mmreplay.reading.reader import native_kernels

    kernels = native_kernels()  # numba's import and cached machine code: once per process, not per batch
    if kernels is not None:
        empty = np.zeros((0, 4), np.int64)
        ro = np.zeros(8, np.uint8)
        ro.flags.writeable = False  # the ring's mappings are read-only arrays: the same signature
        lz4 = kernels[0]
        args = (ro, ro, ro.view(np.int64), np.zeros(1, np.int8), np.zeros(1, np.int64), np.zeros(1, np.int64), 1, 0, 1)
        lz4.gather_pairs(empty, empty, 0, 0, np.zeros(8, np.uint8), *args)
        lz4.gather(np.zeros(0, np.int64), np.zeros(8, np.uint8), *args)
    t0 = time.perf_counter()
    s = mr.ReplayStore.open(path, mode="r", seed=5)
    opened = time.perf_counter() - t0
    marks, n = [], 0
    t0 = time.perf_counter()
    while (batches and n < batches) or (not batches and time.perf_counter() - t0 < seconds):
        s.sample(BATCH)
        n += 1
        if n % 16 == 0:
            marks.append((n, time.perf_counter() - t0))
    total = time.perf_counter() - t0
    half = [m for m in marks if m[1] >= total / 2]
    second = (n - half[0][0]) / (total - half[0][1]) if half and total > half[0][1] else float("nan")
    print(json.dumps({"batches": n, "seconds": total, "rate": n / total, "second_half": second,
                      "open_s": opened, "rss_anon_mb": rss_anon_mb(),
                      "majflt": int(open("/proc/self/stat").read().split()[11])}))
    s.close()


def run_reader(path: str, seconds: float = 0.0, batches: int = 0, cgroup: Cgroup | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--reader", path, "--seconds", str(seconds),
           "--batches", str(batches)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True,
                         preexec_fn=cgroup.enter if cgroup else None)
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- decoders ------------------------------------------------------------------------------------------
def decoder_rates(frames: np.ndarray, scratch: str, rounds: int = 7) -> dict[str, float]:
    """MB/s of decoded frames, one thread, best of ``rounds`` (alternated)."""
    from numcodecs import LZ4

    try:
        import lz4.block as lz4_block
    except ImportError:  # python-lz4 is not a dependency: its row is left out
        lz4_block = None

    from mmreplay.native import lz4 as kernels
    from mmreplay.native.codes import KIND_LZ4
    from mmreplay.storage import framefile

    n, fb = frames.shape[0], frames[0].nbytes
    path = os.path.join(scratch, "frames.obs.lz4")
    framefile.write(path, frames.reshape(-1), n, frames.dtype, frames.shape[1:], "lz4")
    buf = framefile.read_file(path)
    padded = buf.base if buf.base is not None else buf
    head = int.from_bytes(buf[8:12].tobytes(), "little")
    records = framefile.read_records(path, buf, n)
    entries = [buf[r["offset"]:r["offset"] + r["length"]].tobytes() for r in records]
    out = np.empty(n * fb, np.uint8)
    args = (np.zeros(8, np.uint8), padded, padded.view(np.int64), np.array([KIND_LZ4], np.int8),
            np.array([head], np.int64), np.array([buf.size - framefile.TRAILER], np.int64), n, 0, fb)
    slots = np.arange(n, dtype=np.int64)
    codec = LZ4()

    def numba_kernel() -> None:
        err, _ = kernels.gather(slots, out, *args)
        assert err == 0

    def numcodecs_per_frame() -> None:
        for e in entries:
            if len(e) != fb:
                codec.decode(e)

    def python_lz4_per_frame() -> None:
        for e in entries:
            if len(e) != fb:
                lz4_block.decompress(e)

    fns = {"numba kernel (CRC-32C checked, into one buffer)": numba_kernel,
           "numcodecs LZ4().decode per frame (new bytes each)": numcodecs_per_frame}
    if lz4_block is not None:
        fns["python-lz4 lz4.block.decompress per frame (new bytes each)"] = python_lz4_per_frame
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    assert np.array_equal(out.reshape(frames.shape), frames)
    os.unlink(path)
    return {k: frames.nbytes / v / 1e6 for k, v in best.items()} | {"ratio": frames.nbytes / buf.size}


# -- main ----------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None, help="where to put the stores (default: a temporary directory)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold-batches", type=int, default=200)
    ap.add_argument("--limit-gib", type=float, default=2.0)
    ap.add_argument("--limited-seconds", type=float, default=40.0)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--reader", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--batches", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reader:
        reader(args.reader, args.seconds, args.batches)
        return
    if not os.path.isdir(ATARI):
        sys.exit(f"{ATARI} is missing: the benchmark needs the real Atari frames")
    scratch = tempfile.mkdtemp(prefix="mmreplay-compression-", dir=args.dir)
    paths = {"default": os.path.join(scratch, "default"), "raw": os.path.join(scratch, "raw")}
    try:
        body = run(args, paths)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not args.no_write:
        write_section("compression", body)
    print(body)


def run(args: argparse.Namespace, paths: dict[str, str]) -> str:
    cap = args.capacity
    load0 = os.getloadavg()[0]
    kw = dict(capacity=cap, obs_shape=(84, 84), stack=4, n_step=3, gamma=0.99)
    stores = {"default": mr.ReplayStore.create(paths["default"], **kw),
              "raw": mr.ReplayStore.create(paths["raw"], compression=None, **kw)}
    assert stores["default"].compression == "lz4" and stores["raw"].compression is None
    steps = cap + cap // 10
    clock = SealerClock()
    append = fill_pair(stores, steps, block=-(-steps // 4), seed=0)
    sealer = {k: float(np.median(clock.cpu.get(stores[k].path, [float("nan")]))) for k in stores}
    print(f"append/s {append}", file=sys.stderr)
    rss = rss_anon_mb()
    for s in stores.values():
        s.commit()
        s._parts.log.ring.touch()  # benchmark-only: every page mapped and cached (warm)
    warm_med = warm_rates(stores, args.rounds * 4)
    print(f"warm {warm_med}", file=sys.stderr)
    for s in stores.values():
        s.close()
    disk = {k: disk_bytes(p) for k, p in paths.items()}
    obs_disk = {k: sum(os.stat(f).st_blocks * 512 for f in store_files(p) if ".obs." in f)
                for k, p in paths.items()}
    # cold: a fresh reader process after every file of the store left the page cache
    cold: dict[str, list[float]] = {k: [] for k in paths}
    resident = []
    for _ in range(args.rounds):
        for k, p in paths.items():
            resident.append(drop_cache(p))
            cold[k].append(run_reader(p, batches=args.cold_batches)["rate"])
    cold_med = {k: float(np.median(v)) for k, v in cold.items()}
    print(f"cold {cold_med}", file=sys.stderr)
    # memory-limited reader
    why_not = cgroup_available()
    limited: dict[str, dict] = {}
    if why_not is None:
        for k, p in paths.items():
            resident.append(drop_cache(p))
            group = Cgroup(int(args.limit_gib * 2**30))
            try:
                limited[k] = run_reader(p, seconds=args.limited_seconds, cgroup=group)
            finally:
                group.close()
            print(f"limited {k} {limited[k]}", file=sys.stderr)
    # decoders, on 2,048 frames of the benchmark's episodes
    eps = Episodes(7)
    frames = np.concatenate([eps.next() for _ in range(3)])[:2048]
    dec = decoder_rates(frames, os.path.dirname(paths["raw"]))
    load1 = os.getloadavg()[0]
    return report(args, cap, append, rss, warm_med, disk, obs_disk, cold_med, resident, limited, why_not, dec,
                  (load0, load1), sealer, stores["default"].schema.chunk_size)


def report(args: argparse.Namespace, cap: int, append: dict[str, float], rss: float, warm: dict[str, float],
           disk: dict[str, int], obs_disk: dict[str, int], cold: dict[str, float], resident: list[float],
           limited: dict[str, dict], why_not: str | None, dec: dict[str, float],
           load: tuple[float, float], sealer: dict[str, float], chunk: int) -> str:
    def ok(good: bool) -> str:
        return "met" if good else "**not met**"

    gb = {k: v / 1e9 for k, v in disk.items()}
    rows = [["disk after close, GB (frames alone)", f"{gb['default']:.3f} ({obs_disk['default'] / 1e9:.3f})",
             f"{gb['raw']:.3f} ({obs_disk['raw'] / 1e9:.3f})", f"{disk['raw'] / disk['default']:.1f}x smaller",
             f"<= 1.0 GB (aim 0.5): {ok(gb['default'] <= 1.0)}"],
            ["step() appends/s (same steps, alternating blocks)", f"{append['default']:,.0f}",
             f"{append['raw']:,.0f}", f"{append['default'] / append['raw']:.2f}",
             f">= 50,000/s: {ok(append['default'] >= 50_000)}"],
            ["writer thread CPU per step(), us", f"{append['default_cpu_per_step'] * 1e6:.1f}",
             f"{append['raw_cpu_per_step'] * 1e6:.1f}",
             f"{append['default_cpu_per_step'] / append['raw_cpu_per_step']:.2f}", ""],
            ["warm sample(32) batches/s (median of windows; ratio: median of paired windows)",
             f"{warm['default']:,.0f}", f"{warm['raw']:,.0f}", f"{warm['ratio']:.2f}",
             f">= 0.8x raw: {ok(warm['ratio'] >= 0.8)}"],
            ["warm sample(32) CPU per batch, us (process, all threads)", f"{warm['default_cpu_us']:,.0f}",
             f"{warm['raw_cpu_us']:,.0f}", f"{warm['raw_cpu_us'] / warm['default_cpu_us']:.2f}", ""],
            [f"cold sample(32) batches/s ({args.cold_batches} batches, fresh process)", f"{cold['default']:,.1f}",
             f"{cold['raw']:,.1f}", f"{cold['default'] / cold['raw']:.1f}x", "(reported)"]]
    if limited:
        d, r = limited["default"], limited["raw"]
        rows.append([f"{args.limit_gib:g} GiB cgroup, sample(32) batches/s over {args.limited_seconds:g} s",
                     f"{d['rate']:,.0f}", f"{r['rate']:,.0f}", f"{d['rate'] / r['rate']:.1f}x",
                     f">= 4x raw: {ok(d['rate'] >= 4 * r['rate'])}; >= 0.5x raw warm ({0.5 * warm['raw']:,.0f}):"
                     f" {ok(d['rate'] >= 0.5 * warm['raw'])}"])
        rows.append([f"{args.limit_gib:g} GiB cgroup, second half only (steady state)", f"{d['second_half']:,.0f}",
                     f"{r['second_half']:,.0f}", f"{d['second_half'] / r['second_half']:.1f}x", ""])
    lines = [
        "## Compressed frames",
        "",
        f"Reference workload at {cap:,} transitions (84x84 uint8, stack 4, n-step 3, batch 32, episodes of",
        "100..3000 steps, filled to 1.1x capacity) written twice in one run: the default store",
        "(`compression=\"auto\"`: sealed chunks' frames LZ4-compressed per frame) and a raw one",
        "(`compression=None`). Frames: the real Atari frames of `tests/data/atari` (4 games, 20,776",
        "frames) as episodes of consecutive frames of one game from a random start, each episode rolled",
        "by a random (dy, dx) in [-8, 8]^2 and XORed with a random byte (pages differ between episodes,",
        "each frame keeps a real frame's compressibility; the writer walks a pool of 131,072 such frames",
        "in a cycle). Appends: the same steps in alternating blocks of 25% of the run, timed from the",
        "block's first step() until its last chunk's background seal has finished. Warm: both stores",
        f"open, every page touched, 0.5 s windows alternated {args.rounds * 4} times. Cold: every file",
        "dropped from the page cache",
        f"(POSIX_FADV_DONTNEED; fincore residency after: max {max(resident) * 100:.2f}%), then a fresh reader",
        f"process draws {args.cold_batches} batches; medians of {args.rounds} rounds, alternated. Limited: the same",
        f"fresh reader started inside a new cgroup-v1 memory group limited to {args.limit_gib:g} GiB (page cache",
        "and the interpreter count), files dropped first.",
        "",
        table(["", "default (lz4)", "raw", "default / raw", "target"], rows),
        "",
        "Ratios move with the machine's load: decoding and sealing need CPU where a raw store copies",
        "memory, so when other processes take the cores the default store loses more; compare runs at",
        "similar load averages (given at the end).",
        "",
    ]
    if why_not:
        lines += [f"Memory-limited reader not run: {why_not}.", ""]
    if limited:
        lines += [f"Limited readers: RssAnon {limited['default']['rss_anon_mb']:.0f} / "
                  f"{limited['raw']['rss_anon_mb']:.0f} MB, major faults {limited['default']['majflt']:,} / "
                  f"{limited['raw']['majflt']:,} (default / raw).", ""]
    per_chunk_s = chunk / 50_000
    writer, sealing = append["default_cpu_per_step"], sealer["default"] / chunk
    lines += [f"CPU time per appended step (thread CPU time, whatever the load): writer thread"
              f" {writer * 1e6:.1f} us, sealer {sealing * 1e6:.1f} us (the default store; the sealer runs"
              f" beside the writer, without the GIL). With a core each and no other process competing, that"
              f" bounds appends at ~{1 / max(writer, sealing):,.0f}/s; in this run the 1-minute load average"
              f" was {load[0]:.1f} / {load[1]:.1f} on 2 cores.", "",
              f"Sealer CPU per chunk of {chunk:,} frames (median, thread CPU time): default"
              f" {sealer['default'] * 1e3:.0f} ms (fsync and CRC-32 of the small columns, LZ4-encode, decode"
              f" check of every 16th frame, write + fsync), raw {sealer['raw'] * 1e3:.0f} ms (fsync and CRC-32 of every column); at"
              f" 50,000 steps/s a chunk fills every {per_chunk_s * 1e3:.0f} ms, so the default store's sealer"
              f" needs {sealer['default'] / per_chunk_s * 100:.0f}% of a second core. Encoding and checking run"
              " without the GIL (numba nogil kernels; the writes and fsyncs release it too).", "",
              f"Writer RssAnon after filling both stores: {rss:.0f} MB.", "",
              "LZ4 decoding, one thread, 2,048 frames of these episodes (compression ratio"
              f" {dec['ratio']:.1f}x), best of 7:", "",
              table(["decoder", "MB/s of frames"], [[k, f"{v:,.0f}"] for k, v in dec.items() if k != "ratio"]),
              "",
              f"Load average (1 min) when the run started / ended: {load[0]:.1f} / {load[1]:.1f} on"
              f" {os.cpu_count()} cores."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
