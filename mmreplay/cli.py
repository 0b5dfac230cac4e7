"""The ``mmreplay`` command line. Each group of commands lives in its own module and registers itself."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .errors import MMReplayError

# Modules that add subcommands: each has ``register(subparsers, common_parent_parser)``.
COMMAND_MODULES = ("mmreplay.demo", "mmreplay.cli_store", "mmreplay.datasets.cli", "mmreplay.viz")


def out(text: str = "") -> None:
    """Print a line of command output (stdout)."""
    sys.stdout.write(text + "\n")


def progress(total: int, desc: str, quiet: bool, unit: str = "step") -> Any:
    """A tqdm progress bar on stderr (disabled by ``--quiet``)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=quiet, leave=False, file=sys.stderr)


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
