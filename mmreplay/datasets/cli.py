"""Dataset commands: ``mmreplay export`` and ``mmreplay import``."""

from __future__ import annotations

import argparse
import os
import re
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
    from ..cli.main import note, out, progress, require_store
    from . import export
    from ._common import check_output_apart

    require_store(args.path)
    target = args.out
    if args.format == "minari":
        if args.dataset_id is None:
            raise ValueError("--format minari needs --dataset-id NAMESPACE/NAME-vN (e.g. --dataset-id"
                             f" mmreplay/pong/random-v0): the dataset is written to {args.out}/<dataset id>")
        target = os.path.join(args.out, args.dataset_id)
    elif args.dataset_id is not None:
        raise ValueError(f"--dataset-id is for --format minari; leave it out with --format {args.format}")
    if "://" not in args.path and "://" not in target:  # before "add --overwrite", which would delete the store
        check_output_apart(args.path, os.path.expanduser(target))
    if os.path.lexists(os.path.expanduser(target)) and not args.overwrite:
        raise FileExistsError(f"{target} already exists; remove it, choose another output, or add --overwrite to"
                              " replace it")
    if args.next_observations and args.format not in ("hdf5", "d4rl"):
        raise ValueError(f"--next-observations is for --format hdf5/d4rl; --format {args.format} keeps every"
                         " observation already")
    options: dict[str, Any] = {}
    for name in ("dataset_id", "level", "chunk_frames"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.compression is not None:
        options["compression"] = None if args.compression == "none" else args.compression
    if args.next_observations:
        options["next_observations"] = True
    try:
        result = export(args.path, args.out, format=args.format, overwrite=args.overwrite,
                        progress=lambda total, desc: progress(total, desc, args.quiet, unit="frame"), **options)
    except ValueError as exc:  # an option the format refuses: its message names the keyword, say the flag
        text = str(exc)
        for name in options:
            if text.startswith(f"{name}: "):
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} {getattr(args, name)}: {text[len(name) + 2:]} (--format"
                                 f" {args.format})") from None
        raise
    out(f"exported {result.summary()}")
    out(f"took {result.seconds:.1f} s")
    if result.format == "hdf5" and not result.extra.get("next_observations"):
        dropped = _final_observations_dropped(result.path, result.episodes)
        if dropped:
            note("export", f"the D4RL layout holds observations o_0..o_(T-1) of each episode, so the final"
                 f" observations of {dropped:,} episode(s) are not in {result.path}. Imported back, terminated rows"
                 f" get a zero next_obs (their discount is 0) and rows that would bootstrap from a truncated"
                 f" episode's final observation are not sampleable. To keep them, export again with"
                 f" --next-observations (adds a next_observations dataset: about twice the frame bytes).")
    return 0


def _final_observations_dropped(path: str, episodes: int) -> int:
    """Exported episodes whose final observation the D4RL file lacks (those not already missing in the store)."""
    import h5py

    with h5py.File(path, "r") as f:
        already = len(f.attrs.get("final_missing_episodes", ()))
    return episodes - already


def cmd_import(args: argparse.Namespace) -> int:
    from ..cli.main import out, progress
    from . import detect_format, import_dataset
    from ._importing import ArgumentRefused

    _check_import_paths(args)
    if os.path.exists(os.path.join(args.src, "manifest.json")):
        raise ValueError(f"{args.src} is an mmreplay store already, not a dataset: there is nothing to import (mmreplay"
                         f" info {args.src} describes it; mmreplay export writes it as a dataset)")
    if args.suffixes is not None:
        fmt = args.format or detect_format(args.src)
        if fmt != "dqn-replay":
            raise ValueError(f"--suffixes picks Dopamine checkpoints (--format dqn-replay); {args.src} is a {fmt}"
                             " dataset: leave --suffixes out")
    options: dict[str, Any] = {}
    if args.suffixes is not None:
        options["suffixes"] = args.suffixes
    if args.dataset_id is not None:
        options["dataset_id"] = args.dataset_id
    try:
        store = import_dataset(args.src, args.path, format=args.format, stack=args.stack, n_step=args.n_step,
                               gamma=args.gamma, pad=args.pad, capacity=args.capacity, chunk_size=args.chunk_size,
                               seed=args.seed,
                               progress=lambda total, desc: progress(total, desc, args.quiet, unit="frame"), **options)
    except ArgumentRefused as exc:  # the store's message names the keyword: say the flag
        flag = "--" + exc.argument.replace("_", "-")
        given = getattr(args, exc.argument)
        if given is None:  # the source's value, or the default taken from it
            raise ValueError(f"{exc}; give {flag} to choose another value") from None
        said = re.fullmatch(rf"{exc.argument}(?:=\S+)? (.*)", exc.reason, re.S)  # "stack=9 is ...": "--stack 9 is ..."
        raise ValueError(f"{flag} {given} {said.group(1)}" if said else f"{flag} {given}: {exc.reason}") from None
    with store:
        t = store.episodes()
        sch = store.schema
        lo, hi = store.id_range
        out(f"imported {args.src} -> {store.path}")
        out(f"episodes    {len(t):,} ({int(t.complete.sum()):,} complete, {int(t.head_lost.sum()):,} without their"
            f" start, {int((~t.ended).sum()):,} running)")
        out(f"transitions {hi - lo:,} ({'ids ' + f'{lo}..{hi - 1}' if hi > lo else 'none retained'}),"
            f" {len(store):,} sampleable")
        out(f"sampling    stack {sch.stack}, n-step {sch.n_step}, gamma {sch.gamma}, pad {sch.pad!r}")
        src = store.metadata.get("source", {})
        if src.get("format") == "dqn-replay":
            out(f"source      Dopamine checkpoints {src.get('suffixes')}: stack_size {src.get('stack_size')},"
                f" update_horizon {src.get('update_horizon')}; rewards as stored (clipped by Dopamine's runner);"
                f" terminal also marks the time limit: {src.get('terminal_marks_time_limit')}")
    return 0


def _check_import_paths(args: argparse.Namespace) -> None:
    """``src`` and ``path`` of ``mmreplay import`` checked in command-line terms before anything is read (the
    rules of ``_importing.check_store_path``)."""
    from ._location import is_url

    src, fmt = args.src, args.format
    if is_url(args.path):
        raise ValueError(f"path {args.path} is a URL, but a store is a local directory (only src may be a URL);"
                         " give a local path for the store")
    if os.path.islink(os.path.abspath(os.path.expanduser(args.path))):
        raise ValueError(f"path {args.path} is a symbolic link (to {os.readlink(args.path)}), and a store is never"
                         f" reached through a link; give the directory it points to ({os.path.realpath(args.path)})"
                         " or a new path")
    if os.path.exists(args.path) and (not os.path.isdir(args.path) or os.listdir(args.path)):
        raise FileExistsError(f"path {args.path} already exists and is not an empty directory; give a new path"
                              " for the store (import never writes into an existing store)")
    if "://" in src:  # a remote dataset: its reader checks it
        return
    if not os.path.exists(src):
        raise FileNotFoundError(f"src {src}: no such file or directory; give the dataset to import (a D4RL HDF5"
                                " file, or a zarr, Minari or DQN replay directory)")
    if fmt in ("hdf5", "d4rl"):
        if os.path.isdir(src):
            raise ValueError(f"src {src} is a directory, but --format {fmt} reads one HDF5 file: give the .hdf5"
                             f" file as src, or leave --format out to detect what {src} holds")
        import h5py

        if not h5py.is_hdf5(src):
            raise ValueError(f"src {src} is not an HDF5 file (--format {fmt} reads a D4RL-layout .hdf5 file):"
                             f" give one, or leave --format out to detect what {src} holds")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    from ..cli.main import non_negative_int, positive_int, unit_float

    e = sub.add_parser("export", parents=[common], help="write a store's complete episodes as a dataset",
                       description="Write the complete episodes of a store (as of its last commit) as a zarr v3"
                       " dataset, a D4RL-layout HDF5 file, or a Minari dataset under a datasets root."
                       " --format zarr (default) keeps everything, final observations included."
                       " --format hdf5 and --format d4rl are the same thing (two names for one HDF5 file in the"
                       " D4RL layout: observations, actions, rewards, terminals, timeouts, infos/<extra>); that"
                       " layout has no row for an episode's final observation, so it is dropped unless you add"
                       " --next-observations. --format minari writes <OUT>/<--dataset-id>/data/ for Minari.")
    e.add_argument("path", help="the store")
    e.add_argument("out", help="output: a directory (zarr), a file (hdf5), or a Minari datasets root (minari)")
    e.add_argument("--format", default="zarr", choices=[*EXPORT_FORMATS, "d4rl"],
                   help="zarr (default; lossless), hdf5 = d4rl (one HDF5 file in the D4RL layout), minari")
    e.add_argument("--dataset-id", help="minari: the dataset id, e.g. mmreplay/pong/random-v0 (required)")
    e.add_argument("--compression", help="zarr: zstd (default), blosc-zstd, blosc-lz4, gzip, none;"
                   " hdf5/minari: gzip (default), lzf, none")
    e.add_argument("--level", type=int, help="compression level")
    e.add_argument("--chunk-frames", type=positive_int, help="frames per chunk (zarr 32, hdf5/minari 64)")
    e.add_argument("--next-observations", action="store_true",
                   help="hdf5/d4rl: also write next_observations, which keeps each episode's final observation")
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
    i.add_argument("--stack", type=positive_int, help="frames per state (default: the source's, else 1)")
    i.add_argument("--n-step", type=positive_int, help="n-step returns (default: the source's, else 1)")
    i.add_argument("--gamma", type=unit_float, help="discount (default: the source's, else 0.99)")
    i.add_argument("--pad", choices=["zeros", "first"], help="stack padding (default: the source's, else zeros)")
    i.add_argument("--capacity", type=positive_int, help="transitions kept (default: all of the source's)")
    i.add_argument("--chunk-size", type=positive_int, help="frame slots per chunk file (default: ~16 MB of frames)")
    i.add_argument("--seed", type=non_negative_int, default=0, help="sampling seed of the new store (default: 0)")
    i.set_defaults(func=cmd_import)
