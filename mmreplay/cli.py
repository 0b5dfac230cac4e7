"""The ``mmreplay`` command line. Each group of commands lives in its own module and registers itself."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from .errors import MMReplayError, NotAStoreError
from .version import __version__

# Modules that add subcommands: each has ``register(subparsers, common_parent_parser)``.
COMMAND_MODULES = ("mmreplay.demo", "mmreplay.cli_store", "mmreplay.datasets.cli", "mmreplay.viz",
                   "mmreplay.cli_warmup")


def out(text: str = "") -> None:
    """Print a line of command output (stdout)."""
    sys.stdout.write(text + "\n")


def note(command: str, text: str) -> None:
    """A remark the user should read, on stderr beside the errors: ``mmreplay COMMAND: note: TEXT``."""
    sys.stderr.write(f"mmreplay {command}: note: {text}\n")


def progress(total: int, desc: str, quiet: bool, unit: str = "step") -> Any:
    """A tqdm progress bar on stderr (disabled by ``--quiet``)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=quiet, leave=False, file=sys.stderr)


def positive_int(text: str) -> int:
    """argparse ``type=``: an int >= 1 (argparse names the flag in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def unit_float(text: str) -> float:
    """argparse ``type=``: a number in [0, 1] (a discount)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {value:g}")
    return value


def require_store(path: str) -> None:
    """Refuse an existing directory without a manifest in command-line terms, before a store is opened."""
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "manifest.json")):
        raise NotAStoreError(f"{path}: not an mmreplay store or snapshot (no manifest.json); give the directory"
                             " of one (made by ReplayStore.create() in Python, by mmreplay import, or by"
                             " mmreplay demo)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmreplay", description="Disk-backed, memory-mapped experience replay.")
    p.add_argument("--version", action="version", version=f"mmreplay {__version__}")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bars")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, common)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(args.func(args))
    except (MMReplayError, OSError, ValueError, TypeError) as exc:
        sys.stderr.write(f"mmreplay {args.command}: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"mmreplay {args.command}: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
