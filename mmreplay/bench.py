"""The reference workload, as functions the CLI (``mmreplay bench``) and ``tools/`` benchmarks share.

84x84 uint8 frames, stack 4, n-step 3, gamma 0.99, episodes of 100..3000
steps, batches of 32. Frames come from a pool of generated Atari-like frames
so that generating them does not count against the append rate.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from .options import Prioritized
from .store import ReplayStore
from .synthetic import atari_like_episodes

OBS = (84, 84)
BATCH = 32
# ``mmreplay bench`` refuses smaller capacities: below ~71 MB of frames the store sits in the CPU's caches
# (sampling then "beats" memcpy of 256 MB) and holds a few of the 100..3000-step episodes at most.
MIN_CAPACITY = 10_000


def frame_pool(size: int = 2048, seed: int = 0, obs_shape: tuple[int, ...] = OBS) -> np.ndarray:
    """Frames to cycle through: generated Atari-like ones, or random bytes for other shapes."""
    if obs_shape != OBS:
        return np.random.default_rng(seed).integers(0, 256, (size, *obs_shape), dtype=np.uint8)
    frames = []
    for ep in atari_like_episodes(10**9, seed=seed, min_len=300, max_len=300):
        frames.append(ep.frames)
        if sum(len(f) for f in frames) >= size:
            break
    return np.concatenate(frames)[:size]


def rss_anon_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def disk_bytes(path: str) -> int:
    """Bytes of disk the files under ``path`` occupy (allocated blocks; a hard-linked file counts once:
    snapshots hard-link the sealed chunks of their store)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for root, _, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def fill(store: ReplayStore, steps: int, pool: np.ndarray, seed: int = 0,
         progress: Any = None) -> float:
    """Append ``steps`` transitions in episodes of 100..3000 steps; returns transitions per second."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(100, 3001, size=steps // 100 + 2)
    actions = rng.integers(0, 6, size=steps)
    rewards = (rng.random(steps) < 0.02).astype(np.float64)
    npool = len(pool)
    store.reset(pool[0])
    e, left = 0, int(lengths[0])
    t0 = time.perf_counter()
    for i in range(steps):
        left -= 1
        end = left == 0
        store.step(int(actions[i]), float(rewards[i]), pool[(i + 1) % npool], end, False)
        if end:
            store.reset(pool[(i + 7) % npool])
            e += 1
            left = int(lengths[e % len(lengths)])
        if progress is not None and i % 4096 == 0:
            progress.update(min(4096, steps - i))
    return steps / (time.perf_counter() - t0)


def warm(store: ReplayStore) -> None:
    """Touch every mapped page so page tables are populated (what a long-running learner sees)."""
    store._parts.log.ring.touch()  # benchmark-only access to the mapped ring


def memcpy_bandwidth(nbytes: int = 256 * 2**20, repeat: int = 5) -> float:
    """Plain memory-copy bandwidth (bytes/s) of a large ``np.copyto``: best of ``repeat``."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    best = 0.0
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, nbytes / (time.perf_counter() - t))
    return best


def sample_rate(store: ReplayStore, seconds: float = 1.0, update: bool = False) -> float:
    """Batches of 32 per second (with ``update_priorities`` after each when ``update``)."""
    rng = np.random.default_rng(1)
    store.sample(BATCH)
    n = 0
    t0 = time.perf_counter()
    while True:
        b = store.sample(BATCH)
        if update:
            store.update_priorities(b.index, rng.random(BATCH) + 0.01)
        n += 1
        if n % 16 == 0 and time.perf_counter() - t0 >= seconds:
            return n / (time.perf_counter() - t0)


def efficiency(store: ReplayStore, rounds: int = 3, seconds: float = 1.0, update: bool = False) -> dict[str, float]:
    """Warm sampling efficiency: obs+next_obs bytes/s of sample(32) over memcpy bandwidth, same run.

    Bandwidth and sampling are measured alternately ``rounds`` times; the medians are reported.
    With ``update``, each batch is followed by ``update_priorities`` of its 32 ids.
    """
    row_bytes = 2 * store.schema.stack * store.schema.frame_bytes
    rates, bws = [], []
    for _ in range(rounds):
        bws.append(memcpy_bandwidth())
        rates.append(sample_rate(store, seconds, update))
    rate, bw = float(np.median(rates)), float(np.median(bws))
    return {"batches_per_s": rate, "sample_gbps": rate * BATCH * row_bytes / 1e9, "memcpy_gbps": bw / 1e9,
            "efficiency": rate * BATCH * row_bytes / bw}


def reference_workload(capacity: int, path: str | None = None, prioritized: Prioritized | None = None,
                       quiet: bool = True, obs_shape: tuple[int, ...] = OBS) -> dict[str, Any]:
    """Fill a store of ``capacity`` to 1.1x capacity and measure it. Deletes what it wrote.

    The store is ``path/store`` (``path``: a temporary directory when None); an existing one is refused,
    since the store is deleted afterwards. Prioritized stores are measured with ``update_priorities`` after
    every batch.
    """
    if path is not None and os.path.lexists(os.path.join(path, "store")):
        raise FileExistsError(f"{os.path.join(path, 'store')} already exists; the benchmark creates its store there"
                              " and deletes it afterwards, so it never uses an existing one: give a scratch"
                              " directory (mmreplay bench --path) without a 'store' in it")
    scratch = path or tempfile.mkdtemp(prefix="mmreplay-bench-")
    where = os.path.join(scratch, "store")
    pool = frame_pool(obs_shape=obs_shape)
    from tqdm import tqdm

    try:
        store = ReplayStore.create(where, capacity=capacity, obs_shape=obs_shape, stack=4, n_step=3, gamma=0.99,
                                   prioritized=prioritized)
        steps = capacity + capacity // 10
        with tqdm(total=steps, desc="append", disable=quiet, leave=False) as bar:
            append = fill(store, steps, pool, progress=bar)
        len(store)
        rss_fill = rss_anon_mb()
        store.commit()
        warm(store)
        eff = efficiency(store, update=prioritized is not None)
        out: dict[str, Any] = {"capacity": capacity, "append_per_s": append, "rss_anon_mb": rss_fill,
                               "disk_bytes": disk_bytes(where), "sampleable": len(store), **eff}
        store.close()
        return out
    finally:
        if path is None:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            shutil.rmtree(where, ignore_errors=True)


def scratch_dir(path: str) -> None:
    """Refuse a ``mmreplay bench --path`` that is not a directory and cannot be made one (it, or the nearest
    of its parents that exists, is a file), before any work is done."""
    there = os.path.abspath(path)
    while not os.path.lexists(there):
        there = os.path.dirname(there)
    if not os.path.isdir(there):
        what = "is not a directory" if there == os.path.abspath(path) else f"cannot be made: {there} is not a directory"
        raise ValueError(f"--path {path}: {what}; give a directory for the benchmark's scratch files (made if"
                         " missing), or leave --path out to use a temporary one")


def quick_bench(capacity: int, path: str | None, quiet: bool = False) -> Iterator[str]:
    if path is not None:
        scratch_dir(path)
    r = reference_workload(capacity, path, quiet=quiet)
    yield f"reference workload at capacity {capacity:,} (84x84 uint8, stack 4, n-step 3, batch 32)"
    yield f"  append          {r['append_per_s']:,.0f} transitions/s"
    yield (f"  sample(32)      {r['batches_per_s']:,.0f} batches/s = {r['sample_gbps']:.2f} GB/s of obs+next_obs"
           f" (memcpy {r['memcpy_gbps']:.2f} GB/s, efficiency {r['efficiency']:.2f})")
    yield f"  RssAnon         {r['rss_anon_mb']:,.0f} MB after filling"
    yield f"  disk            {r['disk_bytes'] / 1e9:,.3f} GB"
