"""Dataset commands: ``mmreplay export`` and ``mmreplay import``."""

from __future__ import annotations

import argparse
from typing import Any

from . import EXPORT_FORMATS, IMPORT_FORMATS


def _suffixes(text: str) -> list[int]:
    """``"1,2,5-7"`` -> ``[1, 2, 5, 6, 7]``."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected checkpoint numbers like 1,2,5-7, got {text!r}") from None
    return out


def cmd_export(args: argparse.Namespace) -> int:
    from ..cli import out, progress
    from . import export

    options: dict[str, Any] = {}
    for name in ("dataset_id", "level", "chunk_frames"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.compression is not None:
        options["compression"] = None if args.compression == "none" else args.compression
    if args.next_observations:
        options["next_observations"] = True
    result = export(args.path, args.out, format=args.format, overwrite=args.overwrite,
                    progress=lambda total, desc: progress(total, desc, args.quiet, unit="frame"), **options)
    out(f"exported {result.summary()}")
    out(f"took {result.seconds:.1f} s")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from ..cli import out, progress
    from . import import_dataset

    options: dict[str, Any] = {}
    if args.suffixes is not None:
        options["suffixes"] = args.suffixes
    if args.dataset_id is not None:
        options["dataset_id"] = args.dataset_id
    store = import_dataset(args.src, args.path, format=args.format, stack=args.stack, n_step=args.n_step,
                           gamma=args.gamma, pad=args.pad, capacity=args.capacity, chunk_size=args.chunk_size,
                           seed=args.seed, progress=lambda total, desc: progress(total, desc, args.quiet, unit="frame"),
                           **options)
    with store:
        t = store.episodes()
        sch = store.schema
        lo, hi = store.id_range
        out(f"imported {args.src} -> {store.path}")
        out(f"episodes    {len(t):,} ({int(t.complete.sum()):,} complete, {int(t.head_lost.sum()):,} without their"
            f" start, {int((~t.ended).sum()):,} running)")
        out(f"transitions {hi - lo:,} (ids {lo}..{hi - 1}), {len(store):,} sampleable")
        out(f"sampling    stack {sch.stack}, n-step {sch.n_step}, gamma {sch.gamma}, pad {sch.pad!r}")
        src = store.metadata.get("source", {})
        if src.get("format") == "dqn-replay":
            out(f"source      Dopamine checkpoints {src.get('suffixes')}: stack_size {src.get('stack_size')},"
                f" update_horizon {src.get('update_horizon')}; rewards as stored (clipped by Dopamine's runner);"
                f" terminal also marks the time limit: {src.get('terminal_marks_time_limit')}")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    e = sub.add_parser("export", parents=[common], help="write a store's complete episodes as a dataset",
                       description="Write the complete episodes of a store (as of its last commit) as a zarr v3"
                       " dataset, a D4RL-layout HDF5 file, or a Minari dataset under a datasets root.")
    e.add_argument("path", help="the store")
    e.add_argument("out", help="output: a directory (zarr), a file (hdf5), or a Minari datasets root (minari)")
    e.add_argument("--format", default="zarr", choices=[*EXPORT_FORMATS, "d4rl"])
    e.add_argument("--dataset-id", help="minari: the dataset id, e.g. mmreplay/pong/random-v0 (required)")
    e.add_argument("--compression", help="zarr: zstd (default), blosc-zstd, blosc-lz4, gzip, none;"
                   " hdf5/minari: gzip (default), lzf, none")
    e.add_argument("--level", type=int, help="compression level")
    e.add_argument("--chunk-frames", type=int, help="frames per chunk (zarr 32, hdf5/minari 64)")
    e.add_argument("--next-observations", action="store_true", help="hdf5: also write next_observations")
    e.add_argument("--overwrite", action="store_true", help="replace an existing output")
    e.set_defaults(func=cmd_export)
    i = sub.add_parser("import", parents=[common], help="build a store from a dataset",
                       description="Build a store from the DQN Replay Dataset (Dopamine checkpoints), a D4RL HDF5"
                       " file, a Minari dataset or an mmreplay zarr dataset, streaming.")
    i.add_argument("src", help="the dataset (a directory or file; a Minari datasets root with --dataset-id)")
    i.add_argument("path", help="the new store (must not exist, or be an empty directory)")
    i.add_argument("--format", choices=[*IMPORT_FORMATS], help="default: detected from SRC")
    i.add_argument("--suffixes", type=_suffixes, help="dqn-replay: checkpoint numbers, e.g. 1,2,5-7 (default: all)")
    i.add_argument("--dataset-id", help="minari: the dataset id under the root SRC")
    i.add_argument("--stack", type=int, help="frames per state (default: the source's, else 1)")
    i.add_argument("--n-step", type=int, help="n-step returns (default: the source's, else 1)")
    i.add_argument("--gamma", type=float, help="discount (default: the source's, else 0.99)")
    i.add_argument("--pad", choices=["zeros", "first"], help="stack padding (default: the source's, else zeros)")
    i.add_argument("--capacity", type=int, help="transitions kept (default: all of the source's)")
    i.add_argument("--chunk-size", type=int, help="frame slots per chunk file (default: ~16 MB of frames)")
    i.add_argument("--seed", type=int, default=0, help="sampling seed of the new store")
    i.set_defaults(func=cmd_import)
