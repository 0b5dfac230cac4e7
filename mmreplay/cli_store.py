"""Store commands: ``info``, ``bench`` (and ``verify`` once integrity checks exist)."""

from __future__ import annotations

import argparse
from typing import Any

from .bench import disk_bytes
from .cli import out
from .store import ReplayStore


def cmd_info(args: argparse.Namespace) -> int:
    with ReplayStore.open(args.path, mode="r") as s:
        sch = s.schema
        lo, hi = s.id_range
        out(f"store       {s.path}")
        out(f"obs         {sch.obs_shape} {sch.obs_dtype}, stack {sch.stack}, pad {sch.pad!r}")
        out(f"action      {sch.action_shape} {sch.action_dtype}")
        out(f"n-step      {sch.n_step}, gamma {sch.gamma}")
        out(f"extras      {', '.join(f'{e.name} {e.shape} {e.dtype}' for e in sch.extras) or '-'}")
        out(f"envs        {sch.num_envs}")
        out(f"capacity    {sch.capacity} transitions, chunk {sch.chunk_size} slots")
        out(f"ids         {lo}..{hi - 1} retained ({hi - lo}), {len(s)} sampleable")
        out(f"disk        {disk_bytes(s.path) / 2**20:,.1f} MiB")
        out(f"generation  {s.generation}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import quick_bench

    for line in quick_bench(args.capacity, args.path, quiet=args.quiet):
        out(line)
    return 0



def register(sub: Any, common: argparse.ArgumentParser) -> None:
    i = sub.add_parser("info", parents=[common], help="schema, counters and size of a store")
    i.add_argument("path")
    i.set_defaults(func=cmd_info)
    b = sub.add_parser("bench", parents=[common], help="a quick run of the reference workload at small capacity")
    b.add_argument("--capacity", type=int, default=20_000)
    b.add_argument("--path", help="scratch directory (default: a temporary directory, removed afterwards)")
    b.set_defaults(func=cmd_bench)
