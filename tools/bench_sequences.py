"""Sequence sampling cost against capacity: ``sample_sequences(32, 80)`` on stores of 100K and 1M.

Atari data shape: 84x84 uint8 frames (real ones, from tests/data/atari), stack 4, episodes of 100..3000
steps, each store filled to 1.1x its capacity through ``step()``. Per-call times of the two stores are
measured in alternating windows in the same run (medians of ``--rounds`` windows), so the ratio 1M/100K
compares the same minutes of machine time: O(B x L) means a ratio near 1. Uniform stores (strict and
not), then prioritized stores (each batch followed by ``update_priorities`` with ``sequence_priority``,
untimed). Also: the cost of a strict draw whose starts rarely fit (the exact pass), and, with
``--torchrl``, TorchRL's ``SliceSampler`` on the same episodes (``tools/peers/peer_torchrl_slices.py``,
in its own virtual environment, made as ``tools/bench_peers.py`` makes it). Writes the ``sequences``
section of BENCHMARKS.md.

    python tools/bench_sequences.py --torchrl          # ~25 min, ~17 GB of disk at its peak
    python tools/bench_sequences.py --capacity 20000 --capacity 200000 --rounds 3 --no-write
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
from _report import ROOT, table, write_section  # noqa: E402

import mmreplay as mr  # noqa: E402
from mmreplay.bench import disk_bytes, fill, warm  # noqa: E402

ATARI = os.path.join(ROOT, "tests", "data", "atari")
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "peer_torchrl_slices.py")
B, L, STACK = 32, 80, 4
GB = 1e9


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def atari_pool() -> np.ndarray:
    """2048 real Atari frames: the first 512 of each recorded game."""
    games = sorted(n for n in os.listdir(ATARI) if n.endswith(".npz"))
    return np.ascontiguousarray(np.concatenate([np.load(os.path.join(ATARI, g))["frames"][:2048 // len(games)]
                                                for g in games]))


def build(path: str, capacity: int, pool: np.ndarray, prioritized: bool) -> mr.ReplayStore:
    store = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(84, 84), stack=STACK, n_step=3,
                                  prioritized=mr.Prioritized(alpha=0.6, beta=0.4) if prioritized else None, seed=0)
    t0 = time.perf_counter()
    rate = fill(store, capacity + capacity // 10, pool)
    store.commit()
    if prioritized:  # spread the priorities, as a trained learner's would be
        ids = store.sampleable_ids()
        store.update_priorities(ids, np.random.default_rng(0).gamma(1.0, size=ids.size) + 0.01)
    warm(store)
    log(f"  {capacity:,}{' prioritized' if prioritized else ''}: filled in {time.perf_counter() - t0:.0f} s"
        f" ({rate:,.0f} steps/s), {len(store):,} sampleable, {disk_bytes(path) / GB:.2f} GB")
    return store


def window(store: mr.ReplayStore, seconds: float, strict: bool, update: bool) -> float:
    """Mean seconds per ``sample_sequences(B, L)`` over a window (priority updates between calls untimed)."""
    rng = np.random.default_rng(1)
    spent, n = 0.0, 0
    t_end = time.perf_counter() + seconds
    seq = None
    while time.perf_counter() < t_end or n < 3:
        del seq  # the previous batch's buffer can be reused
        t = time.perf_counter()
        seq = store.sample_sequences(B, L, strict=strict)
        spent += time.perf_counter() - t
        n += 1
        if update:
            td = np.abs(rng.standard_normal(seq.mask.shape))
            store.update_priorities(seq.index, mr.sequence_priority(td, seq.mask))
    return spent / n


def alternate(stores: dict[int, mr.ReplayStore], rounds: int, seconds: float, strict: bool,
              update: bool) -> dict[int, float]:
    """Median per-call seconds of each store, windows alternating between them (after one warm-up each)."""
    caps = sorted(stores)
    for c in caps:
        window(stores[c], seconds / 2, strict, update)
    times: dict[int, list[float]] = {c: [] for c in caps}
    for r in range(rounds):
        for c in (caps if r % 2 == 0 else caps[::-1]):
            times[c].append(window(stores[c], seconds, strict, update))
    return {c: statistics.median(v) for c, v in times.items()}


def rare_strict(store: mr.ReplayStore, length: int, calls: int = 5) -> tuple[float, float]:
    """Seconds per strict draw of B starts of ``length`` steps (starts and row plan, no frame copy), and the
    share of sampleable starts that fit (benchmark-only access to the store's parts)."""
    idx = store._parts.log.index
    ids = store.sampleable_ids()
    share = float(idx.sequence_fits(idx.slots_of(ids), length).mean())
    t = time.perf_counter()
    for _ in range(calls):
        try:
            store._draw_sequences(B, length, True, None)
        except mr.NotSampleableError:  # none fits: found out by the same exact pass
            pass
    return (time.perf_counter() - t) / calls, share


class TorchRL:
    """The TorchRL peer process (tools/peers/peer_torchrl_slices.py in the TorchRL virtual environment)."""

    def __init__(self, python: str, cfg: dict[str, Any]) -> None:
        self.log = open(os.path.join(cfg["workdir"], "peer.log"), "w")
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", RL_WARNINGS="0")
        self.proc = subprocess.Popen([python, PEER, json.dumps(cfg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env, cwd=cfg["workdir"])

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.log.flush()
                with open(self.log.name) as f:
                    raise RuntimeError(f"the TorchRL peer exited: {f.read()[-1500:]}")
            if line.startswith("@@"):
                msg = json.loads(line[2:])
                if "error" in msg:
                    raise RuntimeError(msg["error"] + "\n" + msg.get("trace", ""))
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
            self.proc.wait(timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def torchrl_python(scratch: str) -> str:
    from bench_peers import ensure_venv  # the environment bench_peers.py makes (cached with --keep-venvs)

    return ensure_venv("torchrl", scratch, keep=True)


def fits_torchrl(capacity: int, scratch: str) -> str:
    """Why a TorchRL store of ``capacity`` cannot run here now ('' if it can): its frames and its
    mmreplay twin should both stay in the page cache, and the disk keep 5 GB spare."""
    need = 1.1 * capacity * 84 * 84
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    free = shutil.disk_usage(scratch).free
    if 2 * need + 2 * GB > avail:
        return f"needs ~{2 * need / GB:.1f} GB of page cache, {avail / GB:.1f} GB available"
    if need + 5 * GB > free:
        return f"needs ~{need / GB:.1f} GB of disk, {free / GB:.1f} GB free"
    return ""


def compare_torchrl(store: mr.ReplayStore, capacity: int, pool: np.ndarray, scratch: str, rounds: int,
                    seconds: float) -> dict[str, Any]:
    """TorchRL's SliceSampler and mmreplay in alternating windows on the same episodes."""
    why = fits_torchrl(capacity, scratch)
    if why:
        return {"skipped": why}
    python = torchrl_python(scratch)
    workdir = os.path.join(scratch, "torchrl")
    os.makedirs(workdir)
    np.save(os.path.join(workdir, "pool.npy"), pool)
    cfg = {"capacity": capacity, "steps": capacity + capacity // 10, "pool": os.path.join(workdir, "pool.npy"),
           "workdir": workdir, "batch": B, "length": L, "stack": STACK, "seed": 0}
    peer = TorchRL(python, cfg)
    try:
        out: dict[str, Any] = dict(peer.read())  # versions
        out.update(peer.read())  # filled
        log(f"  TorchRL filled {cfg['steps']:,} steps in {out['fill_s']:.0f} s, {out['disk_bytes'] / GB:.2f} GB")
        results: dict[str, Any] = {}
        for variant in ("frames", "stacked"):
            peer.ask(f"sample {variant} {seconds / 2}")
            window(store, seconds / 2, False, False)
            mm, tr = [], []
            for r in range(rounds):
                if r % 2:
                    mm.append(window(store, seconds, False, False))
                tr.append(peer.ask(f"sample {variant} {seconds}")["per_call_s"])
                if not r % 2:
                    mm.append(window(store, seconds, False, False))
            results[variant] = {"torchrl": statistics.median(tr), "mmreplay": statistics.median(mm)}
            log(f"  TorchRL {variant}: {1 / results[variant]['torchrl']:.1f} batches/s, mmreplay in the same"
                f" windows {1 / results[variant]['mmreplay']:.1f}")
        out["results"] = results
        return out
    finally:
        peer.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, action="append", help="exactly two; default 100000 and 1000000")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir on the disk measured)")
    ap.add_argument("--torchrl", action="store_true", help="also run TorchRL's SliceSampler (its own venv)")
    ap.add_argument("--no-prioritized", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="print only, do not update BENCHMARKS.md")
    args = ap.parse_args()
    caps = sorted(args.capacity or [100_000, 1_000_000])
    if len(caps) != 2:
        ap.error("give --capacity exactly twice (a small and a large store)")
    scratch = tempfile.mkdtemp(prefix="mmreplay-bench-seq-", dir=args.dir)
    pool = atari_pool()
    frame_mb = B * (L + 1) * STACK * 84 * 84 / 1e6
    rows: list[list[str]] = []
    rare: list[list[str]] = []
    peer: dict[str, Any] = {}
    try:
        for prio in ([False] if args.no_prioritized else [False, True]):
            kind = "prioritized" if prio else "uniform"
            log(f"{kind} stores")
            stores = {c: build(os.path.join(scratch, f"{kind}-{c}"), c, pool, prio) for c in caps}
            for strict in (False, True):
                t = alternate(stores, args.rounds, args.seconds, strict, prio)
                ratio = t[caps[1]] / t[caps[0]]
                big = t[caps[1]]
                log(f"  {kind} strict={strict}: {t[caps[0]] * 1e3:.1f} ms vs {big * 1e3:.1f} ms, ratio {ratio:.3f}")
                rows.append([kind + (", strict" if strict else ""), f"{t[caps[0]] * 1e3:.1f}", f"{big * 1e3:.1f}",
                             f"**{ratio:.2f}**", f"{1 / big:.1f}", f"{frame_mb / big:,.0f}"])
            if not prio:
                for c in caps:
                    for length in (L, 2900):
                        s, share = rare_strict(stores[c], length)
                        rare.append([f"{c:,}", str(length), f"{share:.4f}", f"{s * 1e3:.1f}"])
                        log(f"  strict draw L={length} at {c:,}: {s * 1e3:.1f} ms ({share:.4f} of starts fit)")
                if args.torchrl:
                    small, large = caps
                    for c in (large, small):  # the largest that fits
                        peer = compare_torchrl(stores[c], c, pool, scratch, args.rounds, args.seconds)
                        peer["capacity"] = c
                        if "skipped" not in peer:
                            break
                        log(f"  TorchRL at {c:,} skipped: {peer['skipped']}")
            for c, store in stores.items():
                store.close()
                shutil.rmtree(os.path.join(scratch, f"{kind}-{c}"), ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    body = report(caps, rows, rare, peer, frame_mb, args)
    if not args.no_write:
        write_section("sequences", body)
    print(body)


def report(caps: list[int], rows: list[list[str]], rare: list[list[str]], peer: dict[str, Any], frame_mb: float,
           args: argparse.Namespace) -> str:
    small, large = caps
    lines = [
        "## Sequences: `sample_sequences(32, 80)` against capacity",
        "",
        f"Real Atari frames (tests/data/atari), 84x84 uint8, stack 4, episodes of 100..3000 steps; stores of"
        f" {small:,} and {large:,} filled to 1.1x capacity through `step()`. A batch returns {frame_mb:.1f} MB of"
        " stacked frames (`obs` (32, 81, 4, 84, 84)). Per-call times are medians of"
        f" {args.rounds} windows of {args.seconds:g} s alternating between the two stores in the same run"
        " (prioritized: `update_priorities(seq.index, sequence_priority(...))` after each call, untimed).",
        "",
        table(["draw", f"ms/call at {small:,}", f"ms/call at {large:,}", "ratio", f"batches/s at {large:,}",
               f"MB/s of frames at {large:,}"], rows),
        "",
        "Target: ratio <= 1.2 (the work per call is O(batch x length), whatever the capacity).",
        "",
        "Strict draws whose starts rarely fit: starts and row plan only (no frame copy). With L = 2900 almost"
        " no start has 2900 steps left in its episode; the proposals run out and one exact pass over the"
        " sampleable set finds the few that do, so that case costs O(capacity):",
        "",
        table(["capacity", "L", "share of starts that fit", "ms per strict draw of 32"], rare),
    ]
    if peer:
        lines += ["", "### Next to TorchRL's SliceSampler", ""]
        if "skipped" in peer:
            lines.append(f"TorchRL skipped: {peer['skipped']}.")
        else:
            res = peer["results"]
            v = peer.get("versions", {})
            lines += [
                f"TorchRL {v.get('torchrl', '?')} (tensordict {v.get('tensordict', '?')}, torch {v.get('torch', '?')})"
                f" at capacity {peer['capacity']:,}: a `ReplayBuffer` over `LazyMemmapStorage` holding one 84x84"
                " frame per step (what a frame-stacking-free store keeps; stacked states would need 4x the disk),"
                f" `SliceSampler(num_slices=32, slice_len={L + 1}, traj_key='episode', strict_length=False)`, the"
                " same episodes and frames. `frames`: the slices as TorchRL returns them (32 x 81 single frames);"
                " `stacked`: the same plus building the (32, 81, 4, 84, 84) stacks mmreplay returns (zero"
                " padding at episode starts, as `pad='zeros'`). mmreplay in windows alternating with TorchRL's:",
                "",
                table(["variant", "TorchRL ms/call", "mmreplay ms/call (same windows)", "mmreplay / TorchRL speed"],
                      [[k, f"{r['torchrl'] * 1e3:.1f}", f"{r['mmreplay'] * 1e3:.1f}",
                        f"{r['torchrl'] / r['mmreplay']:.2f}x"] for k, r in res.items()]),
                "",
                f"TorchRL's storage: {peer['disk_bytes'] / GB:.2f} GB on disk, filled in {peer['fill_s']:.0f} s"
                " (`extend` in blocks of 1000 steps).",
            ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
