"""What every peer process of ``tools/bench_peers.py`` shares: the workload, the measurements, the protocol.

Runs inside each peer's own virtual environment, so it needs only the standard library and numpy.

A child is started as ``python child.py CONFIG_JSON``. It builds its buffer, fills it (timing only the
buffer's add calls), checks a few sampled batches against the workload, and then answers commands read
from stdin, one per line, each answered by one JSON line on stdout prefixed with ``@@``:

    sample SECONDS   -> {"rate": batches per second, "minflt": minor page faults per batch}
                        (prioritized: sample(32) + update_priorities(32))
    checkpoint DIR   -> save to DIR, drop the buffer, load it back, check a batch; timings and bytes
    quit
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import sys
import time
import traceback
from typing import Any

import numpy as np

OBS = (84, 84)
STACK = 4
N_STEP = 3
GAMMA = 0.99
BATCH = 32
ALPHA, BETA = 0.6, 0.4


def emit(**fields: Any) -> None:
    sys.stdout.write("@@" + json.dumps(fields) + "\n")
    sys.stdout.flush()


def rss_anon_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def disk_usage(paths: list[str], skip: set[tuple[int, int]] | None = None) -> tuple[int, set[tuple[int, int]]]:
    """Allocated bytes (st_blocks) of the files under ``paths``, each inode counted once (hard links),
    leaving out the inodes in ``skip``. Returns the bytes and the inodes seen."""
    seen: set[tuple[int, int]] = set()
    total = 0
    skip = skip or set()
    for top in paths:
        files = [top] if os.path.isfile(top) else [os.path.join(r, n) for r, _, ns in os.walk(top) for n in ns]
        for p in files:
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen or key in skip:
                continue
            seen.add(key)
            total += st.st_blocks * 512
    return total, seen


class Workload:
    """The reference workload: episodes of 100..3000 steps over a pool of frames, all terminated.

    Transition t (global, in write order) belongs to episode e at position p. Observation p of episode e
    is pool frame ``(start[e] + e + p) % len(pool)`` (an episode of L steps has L + 1 observations).
    """

    def __init__(self, path: str, steps: int):
        with np.load(path) as z:
            self.pool = np.ascontiguousarray(z["pool"])
            lengths = z["lengths"].astype(np.int64)
            self.actions = z["actions"][:steps].astype(np.int64)
            self.rewards = z["rewards"][:steps].astype(np.float64)
        self.steps = steps
        ends = np.cumsum(lengths)
        n_ep = int(np.searchsorted(ends, steps)) + 1
        self.lengths = lengths[:n_ep]
        self.starts = np.concatenate([[0], ends[:n_ep - 1]])
        self.zero = np.zeros(OBS, np.uint8)

    def frame_id(self, e: np.ndarray | int, p: np.ndarray | int) -> np.ndarray:
        return (np.asarray(self.starts)[e] + e + p) % len(self.pool)

    def episode_of(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        e = np.searchsorted(self.starts, t, side="right") - 1
        return e, t - self.starts[e]

    def complete(self, e: np.ndarray) -> np.ndarray:
        """Whether episode e ended within the steps written."""
        return self.starts[e] + self.lengths[e] <= self.steps

    def stacks(self, e: np.ndarray, p: np.ndarray) -> np.ndarray:
        """Zero-padded stacks (B, k, 84, 84) of observation p of episodes e."""
        q = p[:, None] + np.arange(-STACK + 1, 1)[None, :]
        out = self.pool[self.frame_id(e[:, None], np.maximum(q, 0))]
        out[q < 0] = 0
        return out

    def expected(self, t: np.ndarray, n_step: int = N_STEP) -> dict[str, np.ndarray]:
        """What a correct n-step batch row for transition t holds (the row semantics of the README, "What a sampled row means")."""
        e, p = self.episode_of(t)
        left = self.lengths[e] - p
        m = np.minimum(n_step, left)
        terminal = (m == left) & self.complete(e)
        reward = np.zeros(t.size)
        for i in range(n_step):
            inside = i < m
            reward += np.where(inside, GAMMA ** i * self.rewards[np.minimum(t + i, self.steps - 1)], 0.0)
        return {"obs": self.stacks(e, p), "next_obs": self.stacks(e, p + m), "reward": reward,
                "terminal": terminal, "m": m}

    def pending(self) -> int:
        """Transitions of the last episode written so far, 0 if it ended."""
        last = len(self.starts) - 1
        return 0 if self.complete(np.array([last]))[0] else int(self.steps - self.starts[last])

    def last_written(self, slots: np.ndarray, capacity: int, written: int) -> np.ndarray:
        """For ring slots of a buffer that wrote transitions 0..written-1 in order: the transition in each."""
        return slots + capacity * ((written - 1 - slots) // capacity)


class Stacker:
    """Rolling zero-padded frame stack, as a frame-stacking env wrapper would hand it to a buffer."""

    def __init__(self, last_axis: bool):
        self.last_axis = last_axis
        self.frames: list[np.ndarray] = []

    def reset(self, frame: np.ndarray) -> np.ndarray:
        zero = np.zeros_like(frame)
        self.frames = [zero] * (STACK - 1) + [frame]
        return self.current()

    def push(self, frame: np.ndarray) -> np.ndarray:
        self.frames = self.frames[1:] + [frame]
        return self.current()

    def current(self) -> np.ndarray:
        return np.stack(self.frames, axis=-1 if self.last_axis else 0)


def fill(peer: Any, wl: Workload, budget_s: float) -> dict[str, Any]:
    """Append the workload one transition at a time, timing only the peer's add calls.

    Preparing each call's input (stacked arrays, tensordicts) is not timed: an env wrapper makes it.
    The very first add call is not timed either (TorchRL allocates its storage there; the others did
    at construction). A peer with ``add_batch`` whose one-at-a-time adds have taken ``budget_s`` gets
    the remainder in batches of 256, reported separately.
    """
    pool, rewards, actions = wl.pool, wl.rewards, wl.actions
    stacker = Stacker(peer.stack_last) if peer.needs_stacks else None
    clock = time.perf_counter
    spent = batched_s = 0.0
    timed = n_batched = 0
    first, batching = True, False
    ops: list[tuple[str, Any]] = []
    e, left = -1, 0
    obs_frame = pool[0]
    obs_stack = next_stack = None
    for t in range(wl.steps):
        if left == 0:
            e += 1
            left = int(wl.lengths[e])
            obs_frame = pool[wl.frame_id(e, 0)]
            if stacker is not None:
                obs_stack = stacker.reset(obs_frame)
            x = peer.prep_reset(obs_frame, obs_stack)
            if x is not None and batching:
                ops.append(("reset", x))
            elif x is not None:
                c = clock()
                peer.add_reset(x)
                if not first:
                    spent += clock() - c
                first = False
        next_frame = pool[wl.frame_id(e, int(wl.lengths[e]) - left + 1)]
        if stacker is not None:
            next_stack = stacker.push(next_frame)
        left -= 1
        end = left == 0
        x = peer.prep_step(int(actions[t]), float(rewards[t]), obs_frame, next_frame, obs_stack, next_stack,
                           end, False)
        if batching:
            n_batched += 1
            ops.append(("step", x))
            if end:
                ops.append(("end", None))
            if len(ops) >= 256:
                c = clock()
                peer.add_batch(ops)
                batched_s += clock() - c
                ops = []
        else:
            c = clock()
            peer.add(x)
            if end:
                peer.end_episode()
            if not first:
                spent += clock() - c
                timed += 1
            first = False
            if spent > budget_s and hasattr(peer, "add_batch"):
                batching = True
        obs_frame, obs_stack = next_frame, next_stack
    if ops:
        c = clock()
        peer.add_batch(ops)
        batched_s += clock() - c
    out: dict[str, Any] = {"append_per_s": timed / spent, "append_timed_steps": timed}
    if n_batched:
        out["batched_steps"] = n_batched
        out["batched_per_s"] = n_batched / batched_s
    return out


def check(peer: Any, wl: Workload, batches: int = 64) -> dict[str, Any]:
    """Sample ``batches`` batches and compare every row with the workload. Mismatches are counted, not
    raised: some peers differ on purpose (padding, n-step flags), which the report describes."""
    stats = {"rows": 0, "obs_bad": 0, "next_bad": 0, "reward_err": 0.0, "terminal_rows": 0,
             "terminal_flag_bad": 0, "terminal_next_bad": 0}
    shapes: dict[str, list[int]] = {}
    draw = getattr(peer, "sample_for_check", peer.sample)
    for _ in range(batches):
        raw = draw()
        got = peer.normalize(raw)
        shapes = {k: list(v.shape) for k, v in peer.shapes(raw).items()}
        t = peer.ids(raw, wl)
        exp = wl.expected(t, peer.n_step)
        stats["rows"] += t.size
        stats["obs_bad"] += int((got["obs"] != exp["obs"]).reshape(t.size, -1).any(1).sum())
        stats["reward_err"] = max(stats["reward_err"], float(np.abs(got["reward"] - exp["reward"]).max()))
        term = exp["terminal"]
        stats["terminal_rows"] += int(term.sum())
        stats["terminal_flag_bad"] += int((got["terminal"] != term).sum())
        next_bad = (got["next_obs"] != exp["next_obs"]).reshape(t.size, -1).any(1)
        stats["next_bad"] += int((next_bad & ~term).sum())
        stats["terminal_next_bad"] += int((next_bad & term).sum())
    stats["shapes"] = shapes
    return stats


def sample_rate(peer: Any, seconds: float, prioritized: bool, rng: np.random.Generator,
                batch: int = BATCH) -> dict[str, float]:
    """Batches per second over ``seconds``, the CPU seconds the process used per batch meanwhile (every thread
    of it: user and system time), and the minor page faults per batch (outputs that the allocator had to map
    afresh show up there: hundreds per 1.8 MB batch)."""
    prios = rng.random((64, batch)) + 0.01
    n = 0
    clock = time.perf_counter
    draw = peer.sample if batch == BATCH else (lambda: peer.sample(batch))
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = clock()
    while True:
        raw = draw()
        if prioritized:
            peer.update(raw, prios[n % 64])
        n += 1
        if n % 8 == 0 and clock() - t0 >= seconds:
            wall = clock() - t0
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            return {"rate": n / wall, "cpu_per_batch": cpu / n, "cpu_share": cpu / wall,
                    "minflt": (after.ru_minflt - before.ru_minflt) / n}


def learner_malloc_state(nbytes: int = 16 * 2**20) -> bool:
    """Put glibc's allocator in the state of a long-running learner, as every buffer process does first.

    glibc serves a request above its mmap threshold (128 KB at start-up) with a fresh mmap and unmaps it
    on free(); freeing such a block also raises the threshold to its size (up to 32 MB), after which
    requests of that size come from the heap and freed memory is kept for reuse. A long-running learner
    has long since freed blocks of its batch's size; a benchmark process that just started has not, so
    each of its ~1.8 MB batch outputs costs a new mapping, a page fault per page written and the zeroing
    of every page (cpprb's sample() runs at half its rate or less for that alone; see BENCHMARKS.md). Allocating and freeing one 16 MB block
    at start-up does what the learner's history did. Returns whether it could (glibc found).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        block = libc.malloc(nbytes)
        if not block:
            return False
        libc.free(block)
        return True
    except (OSError, AttributeError):
        return False


def checkpoint(peer: Any, wl: Workload, where: str) -> dict[str, Any]:
    live, inodes = disk_usage(peer.data_paths())
    c = time.perf_counter()
    extra = peer.save(where) or {}
    save_s = time.perf_counter() - c
    ckpt_bytes, _ = disk_usage([where], skip=inodes)
    peer.drop()
    c = time.perf_counter()
    peer.load(where)
    load_s = time.perf_counter() - c
    out = {"save_s": save_s, "load_s": load_s, "ckpt_bytes": ckpt_bytes, "live_bytes": live,
           "after_load": check(peer, wl, batches=2), **extra}
    if hasattr(peer, "load_inplace"):
        out["load_inplace_s"] = peer.load_inplace(where)
        out["after_load_inplace"] = check(peer, wl, batches=2)
    return out


def run(peer_cls: Any, cfg: dict[str, Any]) -> None:
    malloc = "learner" if cfg.get("malloc_ready") else "fresh"
    np.random.seed(cfg.get("seed", 0))
    base = rss_anon_mb()
    wl = Workload(cfg["workload"], cfg["steps"])
    peer = peer_cls(cfg)
    emit(event="versions", versions=peer.versions(), rss_anon_base_mb=base, malloc=malloc)
    filled = fill(peer, wl, cfg.get("append_budget_s", 60.0))
    rss = rss_anon_mb()
    disk, _ = disk_usage(peer.data_paths())
    emit(event="filled", rss_anon_mb=rss, disk_bytes=disk, steps=wl.steps, **filled)
    peer.warm()
    emit(event="checked", **check(peer, wl))
    rng = np.random.default_rng(1)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        try:
            if cmd == "sample":
                seconds, _, batch = arg.partition(" ")
                emit(**sample_rate(peer, float(seconds), cfg["prioritized"], rng, int(batch or BATCH)))
            elif cmd == "warm":
                peer.warm()
                emit(ok=True)
            elif cmd == "checkpoint":
                emit(**checkpoint(peer, wl, arg))
            elif cmd == "quit":
                break
            else:
                emit(error=f"unknown command {cmd!r}")
        except Exception as exc:  # report and keep serving: the parent decides
            emit(error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-2000:])
    peer.close()
