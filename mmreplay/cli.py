"""The ``mmreplay`` command line: ``demo``, ``info``, ``bench`` (more commands live in their own modules)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import __version__
from .bench import disk_bytes, rss_anon_mb
from .errors import MMReplayError
from .store import ReplayStore
from .synthetic import atari_like_episodes

log = logging.getLogger("mmreplay")

Command = Callable[[argparse.Namespace], int]


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _progress(total: int, desc: str, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", disable=quiet, leave=False, file=sys.stderr)


def cmd_demo(args: argparse.Namespace) -> int:
    path = args.path or os.path.join(tempfile.mkdtemp(prefix="mmreplay-demo-"), "store")
    _out(f"mmreplay {__version__} demo: a replay store of generated Atari-like episodes (84x84 uint8 frames)")
    store = ReplayStore.create(path, capacity=args.capacity, obs_shape=(84, 84), stack=4, n_step=3, gamma=0.99,
                               extras={"log_prob": ((), "float32")}, seed=0)
    t0 = time.perf_counter()
    steps = 0
    episodes = 0
    with _progress(args.steps, "recording", args.quiet) as bar:
        for ep in atari_like_episodes(10**9, seed=1, min_len=100, max_len=800, time_limit=600):
            store.reset(ep.frames[0])
            for t in range(ep.length):
                store.step(ep.actions[t], ep.rewards[t], ep.frames[t + 1], ep.terminated and t == ep.length - 1,
                           ep.truncated and t == ep.length - 1, log_prob=np.float32(-1.79))
                steps += 1
            bar.update(ep.length)
            episodes += 1
            if steps >= args.steps:
                break
    t_write = time.perf_counter() - t0
    store.commit()
    t0 = time.perf_counter()
    n_batches = 200
    for _ in range(n_batches):
        batch = store.sample(32)
    t_sample = (time.perf_counter() - t0) / n_batches
    lo, hi = store.id_range
    _out(f"  wrote {steps} transitions in {episodes} episodes at {steps / t_write:,.0f} steps/s -> {path}")
    _out(f"  ids {lo}..{hi - 1} retained (capacity {store.capacity}); {len(store)} sampleable now")
    _out(f"  sample(32): obs {batch.obs.shape} {batch.obs.dtype}, next_obs {batch.next_obs.shape},"
         f" reward {batch.reward.dtype}, discount {batch.discount.dtype}; {t_sample * 1e6:,.0f} us per batch")
    _out(f"  first row: id {batch.index[0]}, action {batch.action[0]}, 3-step reward {batch.reward[0]:.3f},"
         f" discount {batch.discount[0]:.4f}, terminated {bool(batch.terminated[0])}")
    _out(f"  disk {disk_bytes(path) / 2**20:,.1f} MiB, anonymous memory of this process {rss_anon_mb():,.0f} MB")
    store.close()
    with ReplayStore.open(path, mode="r") as again:
        _out(f"  reopened read-only: {len(again)} sampleable, same ids {again.id_range == (lo, hi)}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    with ReplayStore.open(args.path, mode="r") as s:
        sch = s.schema
        lo, hi = s.id_range
        _out(f"store       {s.path}")
        _out(f"obs         {sch.obs_shape} {sch.obs_dtype}, stack {sch.stack}, pad {sch.pad!r}")
        _out(f"action      {sch.action_shape} {sch.action_dtype}")
        _out(f"n-step      {sch.n_step}, gamma {sch.gamma}")
        _out(f"extras      {', '.join(f'{e.name} {e.shape} {e.dtype}' for e in sch.extras) or '-'}")
        _out(f"envs        {sch.num_envs}")
        _out(f"capacity    {sch.capacity} transitions, chunk {sch.chunk_size} slots")
        _out(f"ids         {lo}..{hi - 1} retained ({hi - lo}), {len(s)} sampleable")
        _out(f"disk        {disk_bytes(s.path) / 2**20:,.1f} MiB")
        _out(f"generation  {s.generation}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import quick_bench

    for line in quick_bench(args.capacity, args.path, quiet=args.quiet):
        _out(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmreplay", description="Disk-backed, memory-mapped experience replay.")
    p.add_argument("--version", action="version", version=f"mmreplay {__version__}")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bars")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", parents=[common], help="build a store from generated Atari-like episodes, sample it, summarize")
    d.add_argument("path", nargs="?", help="where to create the store (default: a new temporary directory)")
    d.add_argument("--steps", type=int, default=5000)
    d.add_argument("--capacity", type=int, default=4000)
    d.set_defaults(func=cmd_demo)
    i = sub.add_parser("info", parents=[common], help="schema, counters and size of a store")
    i.add_argument("path")
    i.set_defaults(func=cmd_info)
    b = sub.add_parser("bench", parents=[common], help="a quick run of the reference workload at small capacity")
    b.add_argument("--capacity", type=int, default=20_000)
    b.add_argument("--path", help="scratch directory (default: a temporary directory, removed afterwards)")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(args.func(args))
    except (MMReplayError, OSError, ValueError, TypeError) as exc:
        sys.stderr.write(f"mmreplay {args.command}: error: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
