"""sb3-extra-buffers' CompressedReplayBuffer beside mmreplay.sb3.ReplayBuffer: memory and rates.

sb3-extra-buffers keeps every transition in RAM, each whole 4x84x84 stack compressed on its own (its
example's method, "rle-jit"). Each buffer is filled in its own process (so RssAnon, anonymous resident
memory from /proc/self/status, is its own) with --fill transitions of the recorded Atari episodes (the
VecFrameStack-style stream of tools/bench_sb3.py), then add() and sample(32) (CPU tensors) are timed.
Not installed by any extra: ``pip install --no-deps sb3-extra-buffers`` (it needs only SB3).

    python tools/peers/sb3_extra.py --capacity 1000000 --fill 200000
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))


def child(kind: str, capacity: int, fill: int, seconds: float, work: str) -> dict:
    import torch

    torch.set_num_threads(1)
    from bench_sb3 import Frames, rss_anon, spaces_

    obs_space, act_space = spaces_()
    frames = Frames()
    rows = [frames.next() for _ in range(1000)]  # prepared before the baseline: not the buffer's memory
    base = rss_anon()
    if kind == "sb3-extra-buffers":
        from sb3_extra_buffers.compressed import CompressedReplayBuffer, find_buffer_dtypes

        dtypes = find_buffer_dtypes(obs_shape=obs_space.shape, elem_dtype=obs_space.dtype,
                                    compression_method="rle-jit")
        buf = CompressedReplayBuffer(capacity, obs_space, act_space, device="cpu", dtypes=dtypes,
                                     compression_method="rle-jit", handle_timeout_termination=False,
                                     optimize_memory_usage=True)
    else:
        import mmreplay.sb3 as msb3

        buf = msb3.ReplayBuffer(capacity, obs_space, act_space, device="cpu", path=os.path.join(work, "store"),
                                handle_timeout_termination=False, optimize_memory_usage=True)
    t0 = time.perf_counter()
    for i in range(fill):
        buf.add(*rows[i % len(rows)])
    fill_s = time.perf_counter() - t0
    buf.sample(32)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            buf.sample(32)
        n += 10
    sample_rate = n / (time.perf_counter() - t0)
    from importlib.metadata import version

    out = {"kind": kind, "version": version("sb3-extra-buffers" if kind != "mmreplay" else "stable-baselines3"),
           "capacity": capacity, "fill": fill, "rss_anon": rss_anon() - base,
           "add_rate": fill / fill_s, "sample_rate": sample_rate}
    if kind == "mmreplay":
        buf.close(commit=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--fill", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--write", action="store_true", help="write the sb3-extra section of BENCHMARKS.md")
    ap.add_argument("--child")
    ap.add_argument("--work")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.capacity, args.fill, args.seconds, args.work)))
        return
    from _report import table, write_section

    rows = []
    for kind in ("sb3-extra-buffers", "mmreplay"):
        work = tempfile.mkdtemp(prefix="sb3-extra-")
        try:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--work", work, "--capacity",
                   str(args.capacity), "--fill", str(args.fill), "--seconds", str(args.seconds)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{kind}: failed\n{out.stderr[-2000:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            name = kind if kind == "mmreplay" else f"sb3-extra-buffers {r['version']} (`rle-jit`)"
            rows.append([name, f"{r['rss_anon'] / 1e9:.2f}", f"{r['rss_anon'] / r['fill']:.0f}", f"{r['add_rate']:.0f}",
                         f"{r['sample_rate']:.0f}"])
            print(f"{kind}: capacity {r['capacity']:,}, {r['fill']:,} added: RssAnon {r['rss_anon'] / 1e9:.2f} GB "
                  f"({r['rss_anon'] / r['fill']:.0f} B a transition), add {r['add_rate']:.0f}/s, "
                  f"sample(32) {r['sample_rate']:.0f}/s")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if args.write and len(rows) == 2:
        write_section("sb3-extra", "\n\n".join([
            "## Stable-Baselines3: mmreplay against sb3-extra-buffers (compressed, in RAM)",
            f"Capacity {args.capacity:,}, {args.fill:,} transitions of the recorded Atari episodes added"
            " (VecFrameStack-style 4x84x84 stacks, `optimize_memory_usage=True`); each buffer in its own process."
            " RssAnon beyond the process's before the buffer; add/s over the whole fill; sample(32)/s (CPU"
            f" tensors) in one {args.seconds:g} s window after it (not alternated: a rough rate).",
            table(["buffer", "RssAnon GB", "bytes a transition", "add/s", "sample(32)/s"], rows)]))


if __name__ == "__main__":
    main()
