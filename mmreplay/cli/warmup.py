"""``mmreplay warmup``: compile every native kernel into numba's cache ahead of the first batch."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from ..native import warmup
from .main import out, progress


def cmd_warmup(args: argparse.Namespace) -> int:
    if not warmup.available():
        out("numba does not compile here (not installed, or NUMBA_DISABLE_JIT=1): nothing to compile (mmreplay"
            " runs its numpy paths)")
        return 0
    t = time.perf_counter()
    with progress(len(warmup.KERNELS), "compiling", args.quiet, unit="kernel") as bar:
        done = warmup.compile_all(lambda c: bar.update(1))
    seconds = time.perf_counter() - t
    sigs = sum(c.signatures for c in done)
    loaded = sum(c.from_cache for c in done)
    if args.verbose:
        for c in done:
            out(f"  {c.kernel:<36} {c.signatures} signature(s), {c.from_cache} from the cache, {c.seconds:.2f} s")
    out(f"{len(done)} kernels, {sigs} signatures ({sigs - loaded} compiled, {loaded} already in the cache)"
        f" in {seconds:.1f} s")
    where = "NUMBA_CACHE_DIR" if os.environ.get("NUMBA_CACHE_DIR") else "numba's default; set NUMBA_CACHE_DIR to move it"
    out(f"cache: {warmup.cache_dir()} ({where})")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    w = sub.add_parser("warmup", parents=[common], help="compile the native kernels into numba's cache now, so that"
                       " the first sample() of every later process loads them instead of compiling",
                       description="Compile every native kernel for the argument types mmreplay calls it with"
                       " and store the machine code in numba's cache (NUMBA_CACHE_DIR when set). Run it once per"
                       " machine or container image, as the user and with the NUMBA_CACHE_DIR the training"
                       " runs will have.")
    w.add_argument("--verbose", action="store_true", help="a line per kernel: signatures and seconds")
    w.set_defaults(func=cmd_warmup)
