"""Write a benchmark's section into BENCHMARKS.md (between markers, replacing the previous run); the repository's
Atari frames the benchmarks read, and the store they fill with them."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import sys
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "BENCHMARKS.md")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB RAM"
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), {mem}, Linux {platform.release()}, Python {platform.python_version()}"


def command() -> str:
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])


def write_section(name: str, body: str) -> None:
    """Replace the ``name`` section of BENCHMARKS.md (or append it) with ``body``."""
    stamp = datetime.date.today().isoformat()
    block = (f"<!-- {name}:begin -->\n{body.rstrip()}\n\nMeasured {stamp} on {machine()}.\n"
             f"Command: `{command()}`\n<!-- {name}:end -->")
    text = open(BENCHMARKS).read() if os.path.exists(BENCHMARKS) else "# Benchmarks\n"
    pattern = re.compile(rf"<!-- {re.escape(name)}:begin -->.*?<!-- {re.escape(name)}:end -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    with open(BENCHMARKS, "w") as f:
        f.write(text)


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def atari_pool() -> np.ndarray:
    """The frames of the repository's recorded Atari games (tests/data/atari), end to end."""
    games = ("pong", "breakout", "seaquest", "mspacman")
    return np.concatenate([np.load(os.path.join(ROOT, "tests", "data", "atari", g + ".npz"))["frames"] for g in games])


def fill_reference(path: str, capacity: int, pool: np.ndarray | None = None, **create: Any) -> None:
    """Create the benchmarks' store at ``path``: the repository's Atari episodes (``pool``, default
    ``atari_pool()``) cycled into episodes by ``mmreplay.bench.fill``, 84x84 frames, stack 4, n-step 3, filled to
    1.1x ``capacity`` (the ring has wrapped); ``create``: more ``ReplayStore.create`` options."""
    import mmreplay as mr
    from mmreplay.bench import fill

    with mr.ReplayStore.create(path, capacity=capacity, obs_shape=(84, 84), stack=4, n_step=3, **create) as w:
        fill(w, int(capacity * 1.1), atari_pool() if pool is None else pool)


def settle() -> None:
    """Before measuring a store just filled: wait for the kernels it compiles (or loads from numba's cache) in
    the background, whose thread takes turns with the measured one on the GIL, and write the pages the fill
    dirtied to the disk now rather than while the measurement runs."""
    from mmreplay.native.warmup import BACKGROUND

    for thread in list(BACKGROUND.threads.values()):
        thread.join()
    os.sync()
