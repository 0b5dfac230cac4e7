"""Store commands: ``info``, ``verify``, ``bench``."""

from __future__ import annotations

import argparse
import datetime
import json
import os
from typing import Any

import numpy as np

from ..bench import disk_bytes
from ..errors import NotAStoreError, StoreNotFoundError
from ..options import Schema
from ..storage.manifest import read_manifest
from ..store import ReplayStore
from ..verify import verify_store
from .main import out, positive_int, require_store


def cmd_info(args: argparse.Namespace) -> int:
    if "://" not in args.path and not os.path.exists(args.path):  # URLs: remote zarr datasets
        raise StoreNotFoundError(f"{args.path}: no such store, snapshot or dataset")
    try:
        s = ReplayStore.open(args.path, mode="r")
    except NotAStoreError:
        # a dataset (zarr, HDF5, Minari, DQN replay) rather than a store
        from ..datasets import DatasetError, describe

        try:
            lines = describe(args.path)
        except DatasetError as exc:
            raise NotAStoreError(f"{args.path}: neither an mmreplay store (no manifest.json) nor a dataset that"
                                 f" mmreplay reads ({exc})") from None
        for line in lines:
            out(line)
        return 0
    with s:
        sch = s.schema
        lo, hi = s.id_range
        doc = read_manifest(args.path)
        kind = "snapshot" if "snapshot_of" in doc else "store"
        out(f"{kind:11s} {os.path.abspath(s.path)}")
        out(f"obs         {sch.obs_shape} {sch.obs_dtype}, stack {sch.stack}, pad {sch.pad!r}")
        out(f"action      {sch.action_shape} {sch.action_dtype}")
        out(f"n-step      {sch.n_step}, gamma {sch.gamma}")
        out(f"extras      {', '.join(f'{e.name} {e.shape} {e.dtype}' for e in sch.extras) or '-'}")
        out(f"envs        {sch.num_envs}")
        out(f"prioritized {_prioritized(s)}")
        out(f"frames      {_frames(sch, doc['chunks'])}")
        out(f"capacity    {sch.capacity:,} transitions; chunks of {sch.chunk_size:,} slots,"
            f" {len(doc['chunks'])} retained")
        out(f"ids         {id_span(lo, hi)}, {len(s):,} sampleable")
        tab = s.episodes()
        out(f"episodes    {len(tab):,} ({int(tab.complete.sum()):,} complete)")
        out(f"disk        {disk_bytes(s.path) / 2**20:,.1f} MiB")
        when = datetime.datetime.fromtimestamp(float(doc.get("committed_at", 0))).isoformat(timespec="seconds")
        out(f"commit      generation {doc.get('generation')} at {when}")
        if s.metadata:
            out(f"metadata    {json.dumps(s.metadata, sort_keys=True)}")
        if "snapshot_of" in doc:
            out(f"saved from  {doc['snapshot_of']['path']} (its commit {doc['snapshot_of']['store_generation']})")
        for snap in doc.get("snapshots") or []:
            state = "present" if os.path.exists(os.path.join(snap["path"], "manifest.json")) else "gone"
            out(f"snapshot    {snap['path']} (generation {snap['generation']}, {state})")
    return 0


def id_span(lo: int, hi: int) -> str:
    """The retained ids ``lo..hi-1`` in words: ``0..299 retained (300)``, or none yet."""
    if hi <= lo:
        return f"none retained (next id {hi:,})"
    return f"{lo:,}..{hi - 1:,} retained ({hi - lo:,})"


def _frames(sch: Schema, chunks: list[dict[str, Any]]) -> str:
    """How the committed chunks hold their frames: raw, or the codec with how much it saved."""
    if sch.compression is None:
        return "raw (compression=None)"
    coded = [c for c in chunks if c.get("frames")]
    sealed = sum(1 for c in chunks if c.get("sealed"))
    text = f"{sch.compression}: {len(coded)} of {sealed} sealed chunks compressed (the open chunk stays raw)"
    if coded:
        raw = len(coded) * sch.chunk_size * int(np.prod(sch.obs_shape)) * np.dtype(sch.obs_dtype).itemsize
        text += f", {raw / max(1, sum(int(c['frames']['bytes']) for c in coded)):.1f}x smaller"
    return text


def _prioritized(s: ReplayStore) -> str:
    """The prioritized options with the committed beta (``store.beta`` is annealed and saved by commit)."""
    p = s.schema.prioritized
    if p is None:
        return "- (uniform sampling)"
    return (f"alpha {p.alpha:g}, beta {s.beta:g} (committed; {p.beta:g} at create), eps {p.eps:g};"
            f" max priority {s.max_priority:.4g}")


def cmd_verify(args: argparse.Namespace) -> int:
    require_store(args.path)
    problems = verify_store(args.path)
    for p in problems:
        out(f"PROBLEM  {p}")
    if problems:
        out(f"{args.path}: {len(problems)} problem(s) found")
        return 1
    out(f"{args.path}: ok (manifest, every chunk file's size and checksum, transition counts, state files)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench import MIN_CAPACITY, quick_bench

    if args.capacity < MIN_CAPACITY:
        raise ValueError(f"--capacity {args.capacity:,}: expected at least {MIN_CAPACITY:,} transitions. A smaller"
                         " store's frames fit in the CPU's caches and hold a few episodes at most, so its"
                         " figures (efficiency against memcpy among them) say nothing about a replay buffer;"
                         f" use --capacity {MIN_CAPACITY:,} or more (the default is 20,000)")
    for line in quick_bench(args.capacity, args.path, quiet=args.quiet):
        out(line)
    return 0



def register(sub: Any, common: argparse.ArgumentParser) -> None:
    i = sub.add_parser("info", parents=[common], help="schema, counters and size of a store or snapshot; episodes,"
                       " steps, returns and shapes of a dataset (zarr, D4RL HDF5, Minari, DQN replay)")
    i.add_argument("path", help="a store or snapshot directory, or a dataset: an mmreplay zarr directory, a D4RL"
                   " HDF5 file, a Minari dataset directory, or a directory of Dopamine replay checkpoints")
    i.set_defaults(func=cmd_info)
    v = sub.add_parser("verify", parents=[common], help="check every file of a store or snapshot; exit 1 on problems",
                       description="Check a store's or snapshot's manifest, every chunk file's size and checksum"
                       " (the open chunk's committed rows included), transition counts and state files. Prints"
                       " each problem found and exits 1 if there is any.")
    v.add_argument("path", help="a store or snapshot directory")
    v.set_defaults(func=cmd_verify)
    b = sub.add_parser("bench", parents=[common], help="a quick run of the reference workload at small capacity",
                       description="Append, sample(32) and memory figures of the reference workload (84x84 uint8"
                       " frames, stack 4, n-step 3, gamma 0.99, episodes of 100..3000 steps, batches of 32) at a"
                       " small capacity. The full benchmarks are scripts in tools/ (see BENCHMARKS.md).")
    b.add_argument("--capacity", type=positive_int, default=20_000,
                   help="store capacity in transitions (default: 20000); at least 10000; the store is filled to 1.1x it,"
                        " about 71 MB of frames per 10,000 transitions, deleted afterwards")
    b.add_argument("--path", help="scratch directory (default: a temporary directory, removed afterwards)")
    b.set_defaults(func=cmd_bench)
