"""Where and how a store's in-RAM state is written: per-commit state files under ``state/``.

Components say *what* their state is (arrays, numbers); this module writes
arrays as plain ``.npy`` files named by the commit generation that wrote them
(``state/<name>.<generation:012d>.npy``), durably (temp file, fsync, rename,
fsync the directory), and removes the ones no manifest refers to any more.
Nothing is pickled.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .errors import CorruptStoreError
from .storage.manifest import fsync_dir

STATE_DIR = "state"


def write_array(root: str, name: str, generation: int, array: np.ndarray) -> str:
    """Write ``array`` durably; return its path relative to ``root`` (what the manifest records)."""
    rel = os.path.join(STATE_DIR, f"{name}.{generation:012d}.npy")
    path = os.path.join(root, rel)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))
    return rel


def read_table(root: str, rel: str, rows: int) -> np.ndarray:
    """Read a state file the manifest refers to: a float64 table of ``rows`` rows. Errors name the file."""
    path = os.path.join(root, rel)
    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CorruptStoreError(f"{path}: state file named by the manifest is missing") from None
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptStoreError(f"{path}: unreadable state file ({exc})") from None
    if arr.dtype != np.float64 or arr.ndim != 2 or arr.shape[0] != rows:
        raise CorruptStoreError(f"{path}: holds {arr.dtype}{list(arr.shape)}, expected float64[{rows}, n]")
    return arr


def priority_files(entry: dict[str, Any] | None) -> list[str]:
    """The state files a manifest's ``priorities`` entry refers to: the full file, then its deltas."""
    return [entry["file"], *entry.get("deltas", [])] if entry else []


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
