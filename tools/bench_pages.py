"""What the pages under the frames cost a raw-frame read: the store's file mapping against anonymous copies.

A store's raw frames are its chunk files mapped from the page cache (4 KiB pages: one TLB entry per page,
and a frame of 7 KiB spans two or three of them); an in-RAM buffer such as cpprb's is NumPy memory, which
NumPy asks to back with 2 MiB pages (transparent huge pages, where the system allows them on request). This
measures the same batches' stacks read by the same kernel (``lz4.gather_pairs``, one thread, pinned to one
CPU) from four copies of the frames: the store's mapping, an anonymous copy with huge pages, one without, and a
file holding the same bytes written in large writes. The difference between the first two is what the pages
cost. The last one shows whether the page cache itself can serve 2 MiB pages: a kernel whose file system
keeps large folios (ext4 and XFS on recent Linux) fills a large write with them and maps them whole into a
mapping aligned to 2 MiB, where pages written a row at a time (as a store's writer writes them) stay 4 KiB.

    python tools/bench_pages.py [--capacity 100000] [--batch 32 --batch 256] [--rounds 8] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import fill_reference, table, write_section  # noqa: E402

import mmreplay as mr  # noqa: E402
from mmreplay.native import lz4  # noqa: E402
from mmreplay.native.codes import KIND_RAW  # noqa: E402


def huge_pages(on: bool) -> None:
    """Whether NumPy asks for huge pages for its next large allocations (its default: yes)."""
    np._core.multiarray._set_madvise_hugepage(on)  # type: ignore[attr-defined]


def smaps_kib(field: str) -> int:
    """The process's ``field`` (e.g. ``AnonHugePages``, ``FilePmdMapped``) in KiB."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def written_whole(copy: np.ndarray, path: str) -> np.ndarray:
    """``copy``'s bytes in a new file at ``path``, written in 64 MiB writes, mapped read-only."""
    step = 64 << 20
    with open(path, "wb") as f:
        for at in range(0, copy.size, step):
            f.write(copy[at:at + step].data)
    return np.memmap(path, np.uint8, "r", shape=copy.shape)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--batch", type=int, action="append", help="default: 32 and 256")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=0.7, help="per window")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    sizes = args.batch or [32, 256]
    cpu = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {cpu})
    load0 = os.getloadavg()[0]
    tmp = tempfile.mkdtemp(prefix="bench_pages_")
    rows = []
    try:
        path = os.path.join(tmp, "store")
        fill_reference(path, args.capacity, compression=None)
        with mr.ReplayStore.open(path, "r", seed=0, read_threads=1) as st:
            reader, index = st._reader, st._index
            kernel_args = list(reader._kernel_args())
            raw, kind, rows_alloc, fb = kernel_args[0], kernel_args[3], kernel_args[6], kernel_args[8]
            assert reader._ring is not None and raw is not None and kind is not None
            mapped = reader._ring.schema.chunk_size * fb  # (of a position's stride of rows_alloc rows)

            # each raw chunk's mapped bytes in the reservation (the rest of it is not mapped)
            spans = [(pos * rows_alloc * fb, pos * rows_alloc * fb + mapped)
                     for pos in range(kind.size) if kind[pos] == KIND_RAW]

            def anon(huge: bool) -> np.ndarray:
                """A copy of the mapped chunks' frames."""
                huge_pages(huge)
                try:
                    copy = np.zeros_like(raw)
                finally:
                    huge_pages(True)
                for a, b in spans:
                    copy[a:b] = raw[a:b]
                return copy

            before = smaps_kib("AnonHugePages")
            ways = {"file mapping": raw, "anonymous, huge pages": anon(True)}
            huge_kib = smaps_kib("AnonHugePages") - before
            ways["anonymous, 4 KiB pages"] = anon(False)
            for a, b in spans:  # (every page of the store's chunks mapped in, to count how)
                int(raw[a:b:4096].sum())
            store_pmd_kib = smaps_kib("FilePmdMapped")
            ways["file written whole"] = written_whole(ways["anonymous, huge pages"], os.path.join(tmp, "whole"))
            rng = np.random.default_rng(0)
            for b in sizes:
                plans = [index.plan(index.draw_uniform(rng, index.oldest_id, index.next_id - 10, b)[1])
                         for _ in range(64)]
                pairs = [p.stacks for p in plans if p.stacks is not None]  # (2, b, k): obs and next stacks' slots
                assert len(pairs) == len(plans)
                out = np.empty((2, b, 4, 84, 84), np.uint8).reshape(-1).view(np.uint8)
                for frames in ways.values():  # (warm: every copy's pages touched by these batches)
                    for pair in pairs:
                        lz4.gather_pairs(pair[0], pair[1], 0, b, out, frames, *kernel_args[1:])
                pmd_kib = smaps_kib("FilePmdMapped") - store_pmd_kib  # (the whole file's pages read so far)
                times: dict[str, list[float]] = {k: [] for k in ways}
                for r in range(args.rounds):
                    for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                        frames = ways[name]
                        n, c0 = 0, time.thread_time()
                        end = time.perf_counter() + args.seconds
                        while time.perf_counter() < end:
                            pair = pairs[n % len(pairs)]
                            lz4.gather_pairs(pair[0], pair[1], 0, b, out, frames, *kernel_args[1:])
                            n += 1
                        times[name].append(1e6 * (time.thread_time() - c0) / n)
                base = statistics.median(times["file mapping"])
                rows.append([str(b)] + [f"{statistics.median(v):.0f} ({statistics.median(v) / base:.2f})"
                                        for v in times.values()])
                print(f"B={b}: " + ", ".join(f"{k} {[round(x) for x in v]}" for k, v in times.items()), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    body = "\n\n".join([
        "### The pages under raw frames",
        f"Thread CPU per batch (us) of one read of a batch's two stacks (`lz4.gather_pairs`, one thread pinned to CPU"
        f" {cpu}) from a raw-frame store of capacity {args.capacity:,} (the repository's Atari frames, stack 4, n-step 3),"
        " from its file mapping (the page cache's 4 KiB pages) and from two anonymous copies of the same frames, one"
        f" with 2 MiB pages ({huge_kib / 1024:.0f} MiB of it backed by huge pages) and one without, and from a file"
        " holding the same bytes, written in 64 MiB writes and mapped whole (page-cache pages mapped 2 MiB at a time"
        f" after the reads: {pmd_kib / 1024:.0f} MiB of that file, {store_pmd_kib / 1024:.0f} MiB of the store's chunks,"
        " whose pages its writer filled a row at a time); medians of"
        f" {args.rounds} alternating {args.seconds:g} s windows, in brackets against the file mapping. Load average (1"
        f" min) {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.",
        table(["batch"] + list(ways), rows),
    ])
    print(body)
    if not args.no_write:
        write_section("pages", body)


if __name__ == "__main__":
    main()
