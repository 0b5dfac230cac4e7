"""The ``mmreplay`` command line. Each group of commands lives in its own module and registers itself."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import MMReplayError, NotAStoreError, StoreNotFoundError
from ..version import __version__

# Modules that add subcommands: each has ``register(subparsers, common_parent_parser)``.
COMMAND_MODULES = ("mmreplay.cli.demo", "mmreplay.cli.store", "mmreplay.datasets.cli", "mmreplay.cli.viz",
                   "mmreplay.cli.warmup")


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


def _int_from(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type=``: an int >= 1 (argparse names the flag in its error)."""
    return _int_from(text, 1)


def non_negative_int(text: str) -> int:
    """argparse ``type=``: an int >= 0 (a seed)."""
    return _int_from(text, 0)


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
    """Refuse a missing path, or an existing directory without a manifest, in command-line terms, before a
    store is opened."""
    if "://" not in path and not os.path.lexists(path):
        raise StoreNotFoundError(f"{path}: no such store or snapshot (the path does not exist); give the"
                                 " directory of one (mmreplay demo DIR makes one to try)")
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "manifest.json")):
        raise NotAStoreError(f"{path}: not an mmreplay store or snapshot (no manifest.json); give the directory"
                             " of one (made by ReplayStore.create() in Python, by mmreplay import, or by"
                             " mmreplay demo)")


def output_file(flag: str, path: str, suffix: str = ".png") -> None:
    """Refuse an output file ``path`` given with ``flag`` that cannot be written, before any work is done."""
    where = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a directory; give a file name ending in {suffix}, e.g."
                         f" {flag} {os.path.join(path, 'sample' + suffix)}")
    if not path.lower().endswith(suffix):
        raise ValueError(f"{flag} {path}: expected a file name ending in {suffix}")
    if not os.path.isdir(where):
        raise ValueError(f"{flag} {path}: the directory {where} does not exist; create it first or give a path"
                         " in an existing directory")
    if not os.access(where, os.W_OK):
        raise ValueError(f"{flag} {path}: the directory {where} is not writable; give a path in a directory"
                         " you can write to")


_ERRNO = re.compile(r"\[Errno -?\d+\] ")


def describe(exc: BaseException, command: str) -> str:
    """An exception as a command-line message: an OS error as ``PATH: what`` (no ``[Errno N]``), and without
    a leading ``COMMAND:`` that the ``mmreplay COMMAND: error:`` prefix already says."""
    if isinstance(exc, OSError) and exc.strerror:
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        text = f"{where}: {exc.strerror}" if where else exc.strerror
    else:
        text = str(exc)
    text = _ERRNO.sub("", text)
    prefix = f"{command}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def _stdout_closed() -> int:
    """What a command does when its reader went away (``mmreplay info S | head``): nothing more to say, the
    exit status of a process killed by SIGPIPE (128 + 13), as the other commands of a pipeline end."""
    try:  # the interpreter's final flush of stdout must not fail again and print a warning
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a file (captured): nothing will flush into the closed pipe
    return 128 + signal.SIGPIPE


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
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, inside the try, rather than at exit
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except (MMReplayError, OSError, ValueError, TypeError) as exc:
        sys.stderr.write(f"mmreplay {args.command}: error: {describe(exc, args.command)}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"mmreplay {args.command}: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
