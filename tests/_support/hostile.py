"""Helpers for tests with forged stores: rewrite a manifest with a valid checksum, and watch which
paths an operation opens, writes, links or deletes (through Python's audit hooks)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import mmreplay as mr
from mmreplay.storage.manifest import write_manifest

PRIO = mr.Prioritized(alpha=0.6, beta=0.4)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# audit events whose arguments start with the path(s) they touch
_PATH_EVENTS = {
    "open": 1, "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.truncate": 1,
    "os.listdir": 1, "os.scandir": 1, "os.rename": 2, "os.link": 2, "os.symlink": 2, "shutil.rmtree": 1,
    "shutil.copyfile": 2, "os.utime": 1, "os.chown": 1,
}
_active: list[list[tuple[str, str]]] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _active or event not in _PATH_EVENTS:
        return
    for a in args[: _PATH_EVENTS[event]]:
        if isinstance(a, (str, bytes, os.PathLike)):
            _active[-1].append((event, os.fsdecode(a)))


sys.addaudithook(_hook)


@contextlib.contextmanager
def touched() -> Iterator[list[tuple[str, str]]]:
    """Record ``(event, path)`` for every path opened, listed, created, renamed, linked or removed."""
    log: list[tuple[str, str]] = []
    _active.append(log)
    try:
        yield log
    finally:
        _active.remove(log)


def outside(log: list[tuple[str, str]], *roots: str | os.PathLike[str], within: str | os.PathLike[str]) -> list:
    """The entries of ``log`` under ``within`` (the test's directory) that are not under one of ``roots``,
    comparing real paths (a symbolic link that leads out of a root counts as outside)."""
    base = os.path.realpath(within)
    allowed = [os.path.realpath(r) for r in roots]
    bad = []
    for event, p in log:
        real = os.path.realpath(p)
        if not (real == base or real.startswith(base + os.sep)):
            continue  # the interpreter's own files
        if not any(real == r or real.startswith(r + os.sep) for r in allowed):
            bad.append((event, p))
    return bad


def fingerprint(root: str | os.PathLike[str]) -> dict[str, tuple]:
    """Every file, directory and link under ``root``: its content hash, inode, mode and link target."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if os.path.islink(p):
                out[p] = ("link", os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[p] = ("file", hashlib.sha256(f.read()).hexdigest(), st.st_ino, st.st_mode, st.st_mtime_ns)
            else:
                out[p] = ("dir", st.st_mode)
    return out


def read_doc(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(os.path.join(path, "manifest.json")) as f:
        doc = json.load(f)
    doc.pop("checksum")
    return doc


def forge(path: str | os.PathLike[str], change: Callable[[dict[str, Any]], Any]) -> None:
    """Rewrite ``path``'s manifest with ``change(doc)`` applied and a correct checksum."""
    doc = read_doc(path)
    change(doc)
    write_manifest(os.fspath(path), doc)


def fill(path: str | os.PathLike[str], steps: int = 70, prio: Any = PRIO) -> mr.ReplayStore:
    """A committed store with sealed chunks, an open chunk and (prioritized) a priorities state file."""
    s = mr.ReplayStore.create(path, capacity=200, obs_shape=(4,), obs_dtype="int32", stack=2, n_step=2,
                              chunk_size=16, prioritized=prio, seed=3)
    s.reset(np.zeros(4, np.int32))
    for t in range(steps):
        s.step(t % 3, 1.0, np.full(4, t, np.int32), t % 20 == 19, False)
        if t % 20 == 19:
            s.reset(np.zeros(4, np.int32))
    if prio is not None:
        s.update_priorities(s.sampleable_ids()[:5], np.full(5, 3.0))
    s.commit()
    return s


# Peak RSS of this process (VmHWM): ru_maxrss would include the parent's at fork, kept across exec on Linux.
PEAK = ("def peak_kib():\n"
        "    return next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM:'))\n")


def run_limited(code: str, timeout: float = 60, address_space: int = 4 << 30,
                cpu_seconds: int = 20) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with this tree first on the path, its address space and its CPU
    time capped, so a regression (a bomb inflated, a loop over a declared size) fails the test — killed
    or MemoryError — instead of the machine. The CPU cap is a resource bound far above what a refusal
    needs (a fresh interpreter importing mmreplay takes ~1 s), not a speed target. ``peak_kib()`` in the
    code gives the interpreter's peak resident memory. The kernels' background warm-up is off there: what
    it compiles (tens of CPU seconds on a cold numba cache) is no part of the work bounded."""
    prelude = ("import os; os.environ['MMREPLAY_WARMUP'] = '0'\n"
               f"import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}));"
               f" resource.setrlimit(resource.RLIMIT_CPU, ({cpu_seconds}, {cpu_seconds}));"
               f" sys.path.insert(0, {REPO!r})\n{PEAK}")
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)
