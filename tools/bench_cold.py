"""Cold sampling: batches/s when the frames are not in the page cache.

Before every measurement every mapping is closed, each chunk file's pages are dropped with
posix_fadvise(POSIX_FADV_DONTNEED) and residency is checked with fincore (reported). All methods read the
same batches (32 rows, stack 4, n-step 3, drawn once with a fixed seed):

  (a) naive: each chunk file opened with numpy.load(mmap_mode="r") and the rows' frames copied with
      fancy indexing, chunk by chunk (default kernel readahead);
  (a2) the store's own gather with I/O requests disabled (one thread, MADV_RANDOM mapping);
  (b) the store: gather(ids), which requests every frame run of the batch at once (process_madvise
      WILLNEED) and copies with its reader threads; and store.batches(prefetch=2)-style overlap;
  (c) the device's limit for the same byte ranges: os.pread of every coalesced frame run from 16 threads.

    python tools/bench_cold.py                      # 300K-transition store (~2.1 GB)
    python tools/bench_cold.py --capacity 100000 --batches 100 --no-write
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import table, write_section  # noqa: E402

import mmreplay as mr  # noqa: E402
from mmreplay.bench import fill, frame_pool  # noqa: E402
from mmreplay.storage.npyfile import HEADER_BYTES  # noqa: E402
from mmreplay.storage.ring import chunk_file  # noqa: E402

FRAME = 84 * 84


def chunk_files(path: str) -> list[str]:
    """Every file under the store's ``chunks/``: each column's ``.npy`` and compressed frame files."""
    out = []
    for root, _, files in os.walk(os.path.join(path, "chunks")):
        out += [os.path.join(root, f) for f in files]
    return out


def drop_cache(path: str) -> float:
    """Drop the page cache of every chunk file; return the resident fraction fincore still reports."""
    files = chunk_files(path)
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    try:
        res = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", *files],
                             capture_output=True, text=True, check=True).stdout.split()
        resident = sum(int(x) for x in res[0::2])
        total = sum(int(x) for x in res[1::2])
        return resident / max(total, 1)
    except (OSError, subprocess.CalledProcessError):
        return float("nan")


def batch_runs(path: str, n_batches: int) -> tuple[list[np.ndarray], list[list[tuple[str, int, int]]]]:
    """Draw the batches once; for each, the ids and the coalesced (file, offset, length) runs of its frames."""
    ids_list, runs_list = [], []
    with mr.ReplayStore.open(path, mode="r", seed=123) as s:
        log = s._parts.log  # benchmark-only: the frame slots of the planned rows
        a = s.schema.rows_alloc
        for _ in range(n_batches):
            b = s.sample(32)
            ids_list.append(b.index.copy())
            plan = log.index.plan(log.index.slots_of(b.index))
            slots = np.unique(np.concatenate([plan.obs_slots.ravel(), plan.next_slots.ravel()]))
            breaks = np.flatnonzero(np.diff(slots) != 1) + 1
            runs = []
            for part in np.split(slots, breaks):
                seq = int(log.index.seq_of_pos[part[0] // a])
                name = chunk_file(path, log.chunks[seq - log.chunks[0].seq].name, "obs")
                runs.append((name, HEADER_BYTES + int(part[0] % a) * FRAME, len(part) * FRAME))
            runs_list.append(runs)
    return ids_list, runs_list


def naive(path: str, ids_list: list[np.ndarray]) -> float:
    """np.load(mmap_mode='r') per chunk file, frames copied by fancy indexing per chunk."""
    with mr.ReplayStore.open(path, mode="r") as s:
        log = s._parts.log
        a, rs = s.schema.rows_alloc, s.schema.rows_per_stream
        wanted = []
        for ids in ids_list:
            plan = log.index.plan(log.index.slots_of(ids))
            wanted.append(np.concatenate([plan.obs_slots.ravel(), plan.next_slots.ravel()]))
        names = {int(log.index.seq_of_pos[p]): c.name for c in log.chunks for p in [c.seq % log.ring.positions]}
        positions = log.ring.positions
    del rs
    maps: dict[int, np.ndarray] = {}
    t = time.perf_counter()
    for slots in wanted:
        out = np.empty((slots.size, 84, 84), np.uint8)
        pos = slots // a
        for p in np.unique(pos):
            seq = int([s for s in names if s % positions == p][0])
            m = maps.get(seq)
            if m is None:
                m = maps[seq] = np.load(chunk_file(path, names[seq], "obs"), mmap_mode="r")
            sel = pos == p
            out[sel] = m[slots[sel] % a]
    rate = len(wanted) / (time.perf_counter() - t)
    maps.clear()
    return rate


def store_gather(path: str, ids_list: list[np.ndarray], read_ahead: bool | str, threads: int | None) -> float:
    s = mr.ReplayStore.open(path, mode="r", read_threads=threads)
    s._reader.read_ahead = read_ahead  # benchmark-only switch: False for the (a2) baseline
    t = time.perf_counter()
    for ids in ids_list:
        s.gather(ids)
    rate = len(ids_list) / (time.perf_counter() - t)
    s.close()
    return rate


def store_overlapped(path: str, ids_list: list[np.ndarray]) -> float:
    """Like batches(prefetch=2): the next two batches are requested while the current one is copied."""
    s = mr.ReplayStore.open(path, mode="r")
    pool = ThreadPoolExecutor(1)
    t = time.perf_counter()
    futs = [pool.submit(s.gather, ids) for ids in ids_list[:2]]
    for i in range(len(ids_list)):
        futs[i].result()
        if i + 2 < len(ids_list):
            futs.append(pool.submit(s.gather, ids_list[i + 2]))
    rate = len(ids_list) / (time.perf_counter() - t)
    pool.shutdown()
    s.close()
    return rate


def raw_pread(runs_list: list[list[tuple[str, int, int]]], threads: int = 16) -> float:
    fds: dict[str, int] = {}
    for runs in runs_list:
        for name, _, _ in runs:
            if name not in fds:
                fds[name] = os.open(name, os.O_RDONLY)
    pool = ThreadPoolExecutor(threads)
    t = time.perf_counter()
    for runs in runs_list:
        list(pool.map(lambda r: os.pread(fds[r[0]], r[2], r[1]), runs))
    rate = len(runs_list) / (time.perf_counter() - t)
    pool.shutdown()
    for fd in fds.values():
        os.close(fd)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=300_000)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    loads = [os.getloadavg()[0]]
    scratch = tempfile.mkdtemp(prefix="mmreplay-cold-", dir=args.dir)
    path = os.path.join(scratch, "store")
    try:
        # raw frames: methods (a) and (c) read the obs.npy files directly (compressed stores:
        # tools/bench_compression.py)
        s = mr.ReplayStore.create(path, capacity=args.capacity, obs_shape=(84, 84), stack=4, n_step=3,
                                  compression=None)
        fill(s, args.capacity + args.capacity // 10, frame_pool())
        s.close()
        ids_list, runs_list = batch_runs(path, args.batches)
        methods = {
            "(a) naive np.load(mmap_mode='r') gather": lambda: naive(path, ids_list),
            "(a2) store gather without I/O requests, 1 thread": lambda: store_gather(path, ids_list, False, 1),
            "(b) store gather (default: requests all runs when reads are slow, 2 copy threads)":
                lambda: store_gather(path, ids_list, "auto", None),
            "(b') store gather, 2 batches ahead (as batches(prefetch=2))": lambda: store_overlapped(path, ids_list),
            "(c) raw pread of the same runs, 16 threads": lambda: raw_pread(runs_list),
        }
        rates: dict[str, list[float]] = {k: [] for k in methods}
        resident: list[float] = []
        for _ in range(args.rounds):
            for name, fn in methods.items():
                resident.append(drop_cache(path))
                rates[name].append(fn())
                print(f"{name}: {rates[name][-1]:,.1f} batches/s", flush=True)
        med = {k: float(np.median(v)) for k, v in rates.items()}
        a, c = med["(a) naive np.load(mmap_mode='r') gather"], med["(c) raw pread of the same runs, 16 threads"]
        b = med["(b) store gather (default: requests all runs when reads are slow, 2 copy threads)"]
        rows = [[k, f"{v:,.1f}", f"{v / a:.1f}x", f"{v / c:.2f}"] for k, v in med.items()]
        body = "\n".join([
            "## Cold sampling (frames not in the page cache)",
            "",
            f"Store of {args.capacity:,} Atari transitions ({os.path.basename(path)}), {args.batches} batches of 32",
            "(stack 4, n-step 3) drawn once; before each measurement all mappings closed, every chunk file",
            f"dropped with POSIX_FADV_DONTNEED (fincore residency afterwards: max {max(resident) * 100:.2f}%).",
            f"Medians of {args.rounds} rounds.",
            "",
            table(["method", "batches/s", "vs (a)", "vs (c)"], rows),
            "",
            f"Targets: (b) >= 4x (a): **{b / a:.1f}x**, {'met' if b >= 4 * a else 'not met'} ((c), raw parallel reads"
            f" of the same runs, is {c / a:.1f}x (a) on this disk); (b) >= 0.5x (c): **{b / c:.2f}**,"
            f" {'met' if b >= 0.5 * c else 'not met'}.",
            "",
            f"1-minute load average at the start and end: {loads[0]:.1f} and {os.getloadavg()[0]:.1f} (2 cores shared"
            " with other work).",
        ])
        if not args.no_write:
            write_section("cold", body)
        print(body)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
