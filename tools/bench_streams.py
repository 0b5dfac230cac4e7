"""What env streams that advance apart cost: disk (holes in sealed sections) and sampling.

Streams written by ``extend(env=i)`` blocks advance apart; a chunk then rolls when one stream's
section is full and the others are sealed part-filled (FORMAT.md, "Rows, streams and the layout
inside a chunk"). This measures, for a 4-stream store:

- slots per transition (disk and ring capacity used per stored transition; 1.0 + the share of
  START rows is the least possible) for streams in lockstep (batched ``step()``), round-robin blocks
  of several sizes, streams at 2:1 rates, and one writing stream of four; next to it what padding
  the other streams (the alternative design) would cost: every block of one stream writes a row
  for each of the N streams, N slots per transition;
- the cost on sampling: ``sample(32)`` batches/s and the row plan of a batch, for the same
  transitions written in lockstep and written in round-robin blocks (rows map to slots by a binary
  search once sections have holes), alternating in the same run.

    python tools/bench_streams.py             # writes the beyond-streams section of BENCHMARKS.md
    python tools/bench_streams.py --no-write

Everything written goes to a scratch directory that is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import table, write_section  # noqa: E402

import mmreplay as mr  # noqa: E402

N_ENV = 4
OBS = (84, 84)


def _store(path: str, capacity: int) -> mr.ReplayStore:
    return mr.ReplayStore.create(path, capacity=capacity, obs_shape=OBS, num_envs=N_ENV, stack=4, n_step=3,
                                 chunk_size=4096 * N_ENV // 4)


def fill(path: str, capacity: int, how: str, block: int, total: int, seed: int = 0) -> mr.ReplayStore:
    """``total`` transitions in episodes of ~500 steps, written ``how``: lockstep, blocks, 2:1, one."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 255, size=(256, *OBS), dtype=np.uint8)
    s = _store(path, capacity)
    if how == "lockstep":
        s.reset(pool[:N_ENV])
        for t in range(total // N_ENV):
            term = rng.random(N_ENV) < 1 / 500
            s.step(np.zeros(N_ENV, np.int64), np.ones(N_ENV), pool[(t + np.arange(N_ENV)) % 256], term,
                   np.zeros(N_ENV, np.bool_))
        return s
    for env in range(N_ENV):
        s.reset(pool[env], env=env)
    weights = {"blocks": [1] * N_ENV, "2:1": [2, 2, 1, 1], "one": [1, 0, 0, 0]}[how]
    order = [e for e in range(N_ENV) for _ in range(weights[e])]
    done, t = 0, 0
    while done < total:
        env = order[t % len(order)]
        t += 1
        n = min(block, total - done)
        term = np.zeros(n, np.bool_)
        end = rng.random() < n / 500
        term[-1] = end
        s.extend(np.zeros(n, np.int64), np.ones(n), pool[(t + np.arange(n)) % 256], term, np.zeros(n, np.bool_),
                 env=env)
        if end:
            s.reset(pool[t % 256], env=env)
        done += n
    return s


def slots_per_transition(s: mr.ReplayStore) -> tuple[float, float]:
    """(slots of the retained sealed chunks per transition they hold, share of those slots that are holes)."""
    sealed = [c for c in s._parts.log.chunks if c.sealed]  # the chunk table (a benchmark may look inside)
    slots = len(sealed) * s.schema.chunk_size
    tx = sum(c.n_transitions for c in sealed)
    return slots / max(tx, 1), s.inspect()["holes"] / max(slots, 1)


def sampling(s: mr.ReplayStore, seconds: float) -> tuple[float, float]:
    """(sample(32) batches/s, microseconds per batch row plan)."""
    s.sample(32)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        s.sample(32)
        n += 1
    rate = n / (time.perf_counter() - t0)
    idx = s._parts.log.index
    ids = s.sampleable_ids()
    rng = np.random.default_rng(1)
    batches = [idx.slots_of(ids[rng.integers(0, ids.size, 32)]) for _ in range(2000)]
    t0 = time.perf_counter()
    for b in batches:
        idx.plan(b)
    return rate, (time.perf_counter() - t0) / len(batches) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    n = args.transitions
    scratch = tempfile.mkdtemp(prefix="mmreplay-bench-streams-", dir=args.dir)
    load_before = os.getloadavg()[0]
    disk_rows, samp = [], {"lockstep": [], "blocks": []}
    try:
        cases = [("lockstep (batched step())", "lockstep", 1), ("round-robin blocks of 16", "blocks", 16),
                 ("round-robin blocks of 256", "blocks", 256), ("round-robin blocks of 1024", "blocks", 1024),
                 ("blocks of 256, streams at 2:1 rates", "2:1", 256), ("blocks of 256, one stream of 4 writes", "one", 256)]
        for label, how, block in cases:
            path = os.path.join(scratch, how + str(block))
            s = fill(path, n, how, block, n)
            per, holes = slots_per_transition(s)
            pad = "1.0" if how == "lockstep" else f"{N_ENV:.1f}"
            disk_rows.append([label, f"{per:.3f}", f"{holes:.1%}", pad])
            print(disk_rows[-1], flush=True)
            s.close()
            shutil.rmtree(path)
        stores = {how: fill(os.path.join(scratch, "s-" + how), n, how, 256, n) for how in ("lockstep", "blocks")}
        for r in range(args.rounds):
            for how in ("lockstep", "blocks") if r % 2 == 0 else ("blocks", "lockstep"):
                samp[how].append(sampling(stores[how], 1.0))
        for s in stores.values():
            s.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()[0]
    rows = [[how, f"{max(r for r, _ in v):,.0f}", f"{min(p for _, p in v):.0f}"] for how, v in samp.items()]
    body = "\n".join([
        "### Env streams that advance apart: disk and sampling",
        "",
        f"A store of {N_ENV} env streams (84x84 uint8, stack 4, n-step 3, chunks of 1,024 rows per stream),",
        f"{n:,} transitions in episodes of ~500 steps, written in lockstep (batched `step()`) or by `extend(env=i)`",
        "blocks. *Slots per transition*: slots of the retained sealed chunks per transition they hold",
        "(disk and ring capacity; START rows make the least possible ~1.002 here); *holes*: the share of those",
        "slots left empty because a chunk rolled while other streams' sections were part-filled. *Padding*: what",
        "the alternative design (one row of every stream per write, padding rows for the others) would use.",
        "",
        table(["written as", "slots per transition", "holes", "padding design"], disk_rows),
        "",
        f"Sampling the same transitions written in lockstep and in round-robin blocks of 256 (best of {args.rounds}"
        " alternating 1 s windows; the row plan of a batch of 32 averaged over 2,000 batches):",
        "",
        table(["written as", "sample(32) batches/s", "row plan us/batch"], rows),
        "",
        f"Load average (1 min) when the run started / ended: {load_before:.1f} / {load_after:.1f} on"
        f" {os.cpu_count()} cores.",
    ])
    if not args.no_write:
        write_section("beyond-streams", body)
    print(body)


if __name__ == "__main__":
    main()
