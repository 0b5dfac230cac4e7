"""Where and how the in-RAM state of a commit is written: state files under ``state/``.

Parts say *what* their state is (arrays, numbers, a manifest entry); this module
writes arrays as plain ``.npy`` files named by the commit generation that wrote
them (``state/<name>.<generation:012d>.npy``), durably (temp file, fsync,
rename, fsync the directory), reads them back with every problem named, and
removes the ones no manifest refers to any more. Nothing is pickled.

(These are per-commit state files, not the user's model checkpoints.)
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import numpy as np

from ..errors import CorruptStoreError
from ..storage.files import fsync_dir, write_npy_atomic

STATE_DIR = "state"


class StateDir:
    """The state files of one commit: ``generation`` under the store or snapshot directory ``root``."""

    def __init__(self, root: str, generation: int) -> None:
        self.root = root
        self.generation = generation
        self.written: dict[str, int] = {}  # relative path -> CRC-32 of the file, for the manifest

    def write(self, name: str, array: np.ndarray) -> str:
        """Write ``array`` durably; return its path relative to ``root`` (what the manifest records)."""
        rel = os.path.join(STATE_DIR, f"{name}.{self.generation:012d}.npy")
        self.written[rel] = write_npy_atomic(os.path.join(self.root, rel), array)
        return rel

    def read_table(self, rel: str, rows: int) -> np.ndarray:
        """Read a state file the manifest refers to: a float64 table of ``rows`` rows. Errors name the file."""
        path = os.path.join(self.root, rel)
        arr = load_state_file(path)
        if arr.dtype != np.float64 or arr.ndim != 2 or arr.shape[0] != rows:
            raise CorruptStoreError(f"{path}: holds {arr.dtype}{list(arr.shape)}, expected float64[{rows}, n]")
        return arr


def load_state_file(path: str) -> np.ndarray:
    """The array of a state file a manifest names (never unpickled); a missing or unreadable file is the
    corrupt-store error naming it."""
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CorruptStoreError(f"{path}: state file named by the manifest is missing") from None
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptStoreError(f"{path}: unreadable state file ({exc})") from None


def priority_files(entry: dict[str, Any] | None) -> list[str]:
    """The state files a manifest's ``priorities`` entry refers to: the full file, then its deltas."""
    return [entry["file"], *entry.get("deltas", [])] if entry else []


def referenced_files(doc: dict[str, Any]) -> list[str]:
    """Every state file a manifest body refers to (relative paths)."""
    validity = doc.get("validity") or {}
    return priority_files(doc.get("priorities")) + ([validity["file"]] if validity.get("file") else [])


def checksums(doc: dict[str, Any], earlier: dict[str, int], written: dict[str, int]) -> dict[str, int]:
    """The manifest's ``state_crc32``: the CRC-32 of every state file ``doc`` refers to, from the files
    just ``written`` or, for files an earlier commit wrote (a delta chain's base), from ``earlier``."""
    known = {**earlier, **written}
    return {rel: known[rel] for rel in referenced_files(doc) if rel in known}


def check_state_files(root: str, doc: dict[str, Any]) -> list[str]:
    """Problems with the state files a manifest refers to: missing, or not the bytes it recorded."""
    problems = []
    recorded = doc.get("state_crc32") or {}
    for rel in referenced_files(doc):
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            problems.append(f"{path}: state file named by the manifest is missing")
            continue
        want = recorded.get(rel)
        if want is not None:
            with open(path, "rb") as f:
                got = zlib.crc32(f.read())
            if got != want:
                problems.append(f"{path}: checksum {got:#010x} differs from the recorded {want:#010x}"
                                " (the file was modified or damaged)")
    return problems


def remove_unreferenced(root: str, keep: set[str]) -> None:
    """Delete state files (and temp leftovers) not in ``keep`` (paths relative to ``root``)."""
    base = os.path.join(root, STATE_DIR)
    removed = False
    for entry in os.listdir(base):
        if os.path.join(STATE_DIR, entry) not in keep:
            try:
                os.unlink(os.path.join(base, entry))
                removed = True
            except (FileNotFoundError, IsADirectoryError):
                pass
    if removed:
        fsync_dir(base)
