"""Snapshots: consistent copies of a store that cost O(one chunk + index), not O(data).

A snapshot directory has a store's layout (``manifest.json``, ``chunks/``,
``state/``), so it can also be opened read-only as a store. Sealed chunks are
immutable, so they are hard-linked (copied only across filesystems); the open
chunk is copied under a generation-specific name; the manifest is written
last. Saving again into the same directory writes the new generation beside
the old one and switches by replacing the manifest, then removes what only the
old generation used: a crash at any moment leaves the old or the new snapshot.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import time
from typing import Any

from ..errors import MMReplayError, NotAStoreError, StoreNotFoundError
from ..options import Schema
from ..storage.files import copy_exclusive, remove_stale_siblings, temp_sibling
from ..storage.manifest import MANIFEST, fsync_dir, read_manifest
from ..storage.ring import chunk_files, chunk_of_file, columns_for
from ..storage.validate import check_dirs, check_files
from .statefiles import referenced_files

SNAPSHOT_KEY = "snapshot_of"


def link_or_copy(src: str, dst: str) -> None:
    """Hard-link ``src`` to ``dst`` (replacing another file there); copy when links cannot cross filesystems."""
    if os.path.exists(dst):
        if os.path.samefile(src, dst):
            return
        os.unlink(dst)
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        copy_file(src, dst)


def copy_file(src: str, dst: str) -> None:
    """Copy to a new inode and make it durable."""
    tmp = dst + ".tmp"
    copy_exclusive(src, tmp)  # never through a link planted at the temp name
    os.replace(tmp, dst)


def existing_generation(snapshot_dir: str) -> int:
    """Generation of the snapshot in ``snapshot_dir`` (0 if none). Refuses a directory that holds something
    else, so saving never overwrites a foreign directory."""
    if not os.path.exists(snapshot_dir):
        return 0
    if not os.path.isdir(snapshot_dir):
        raise NotAStoreError(f"save(): {snapshot_dir} is a file; give a new directory or an earlier snapshot")
    check_dirs(snapshot_dir)  # files are written and deleted under chunks/ and state/: never through a link
    if not os.path.exists(os.path.join(snapshot_dir, MANIFEST)):
        entries = set(os.listdir(snapshot_dir)) - {"chunks", "state"}
        if entries:
            raise NotAStoreError(f"save(): {snapshot_dir} is not empty and not a snapshot; give a new directory")
        return 0
    doc = read_manifest(snapshot_dir, what="snapshot")
    if SNAPSHOT_KEY not in doc:
        raise NotAStoreError(f"save(): {snapshot_dir} is a store, not a snapshot; give another directory")
    return int(doc["generation"])


def write_snapshot_chunks(store_root: str, snapshot_dir: str, chunks: list[dict[str, Any]], columns: list[str],
                          generation: int) -> list[dict[str, Any]]:
    """Link sealed chunks and copy the open one into ``snapshot_dir``; return the chunk entries to list."""
    out = []
    base = os.path.join(snapshot_dir, "chunks")
    os.makedirs(base, exist_ok=True)
    for c in chunks:
        name = c["name"]
        # The open chunk is copied under a new name; so is a sealed one whose name holds another file: one of the
        # generation being replaced (another store's, or this one's before a crash reused the name), which stays
        # as it is until the new manifest is written
        if not c["sealed"] or _taken(chunk_files(store_root, c, columns), chunk_files(snapshot_dir, c, columns)):
            name = _free_name(snapshot_dir, c, columns, generation)
        pairs = zip(chunk_files(store_root, c, columns), chunk_files(snapshot_dir, dict(c, name=name), columns),
                    strict=True)
        for src, dst in pairs:
            if c["sealed"]:
                link_or_copy(src, dst)  # compressed frame files too: sealed files are never modified
            else:
                copy_file(src, dst)
        out.append(dict(c, name=name))
    fsync_dir(base)
    return out


def _free_name(snapshot_dir: str, c: dict[str, Any], columns: list[str], generation: int) -> str:
    """A name for chunk ``c`` in ``snapshot_dir`` of this generation that no file there has (a file of that
    name is the previous generation's, or a failed save's leftover: never replaced)."""
    seq = c["name"].split("g")[0]
    for k in range(1000):
        name = f"{seq}g{generation:06d}{'' if k == 0 else f'{k:03d}'}"
        if name != c["name"] and not any(os.path.lexists(p) for p in chunk_files(snapshot_dir, dict(c, name=name),
                                                                                 columns)):
            return name
    raise FileExistsError(f"save(): {snapshot_dir}/chunks holds a file under every name tried for chunk {seq};"
                          " give a new directory")


def _taken(sources: list[str], targets: list[str]) -> bool:
    """Whether a target name holds a file other than its source (not the same inode)."""
    return any(os.path.lexists(dst) and not (os.path.exists(dst) and os.path.samefile(src, dst))
               for src, dst in zip(sources, targets, strict=True))


def remove_unlisted(root: str, chunk_names: set[str], state_files: set[str]) -> None:
    """Delete chunk files and state files a directory's manifest no longer refers to."""
    base = os.path.join(root, "chunks")
    for filename in os.listdir(base) if os.path.isdir(base) else []:
        if chunk_of_file(filename) not in chunk_names:
            try:
                os.unlink(os.path.join(base, filename))
            except (FileNotFoundError, IsADirectoryError, PermissionError):
                shutil.rmtree(os.path.join(base, filename), ignore_errors=True)
    state = os.path.join(root, "state")
    for name in os.listdir(state) if os.path.isdir(state) else []:
        if os.path.join("state", name) not in state_files:
            try:
                os.unlink(os.path.join(state, name))
            except (FileNotFoundError, IsADirectoryError):
                pass


def read_snapshot(snapshot_dir: str) -> dict[str, Any]:
    """Read and check a snapshot's manifest (a clear error for anything that is not a complete snapshot)."""
    if not os.path.isdir(snapshot_dir):
        raise StoreNotFoundError(f"{snapshot_dir}: no such snapshot directory")
    if not os.path.exists(os.path.join(snapshot_dir, MANIFEST)):
        raise NotAStoreError(f"{snapshot_dir}: not a complete snapshot (no {MANIFEST}; a save that did not"
                             " finish leaves none)")
    doc = read_manifest(snapshot_dir, what="snapshot")
    if SNAPSHOT_KEY not in doc:
        raise NotAStoreError(f"{snapshot_dir}: a store, not a snapshot; open it with ReplayStore.open()")
    check_files(snapshot_dir, doc)
    return doc


def materialize(snapshot_dir: str, doc: dict[str, Any], path: str) -> None:
    """Build a working store in ``path`` (new or empty) from a snapshot: links where possible, the
    manifest written last, everything built under a temporary name and renamed into place."""
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise ValueError(f"load(): {path} is not empty; give a new or empty directory")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    remove_stale_siblings(path, ("loading",), "loads")
    tmp = temp_sibling(os.path.abspath(path), "loading")
    try:
        os.makedirs(os.path.join(tmp, "chunks"))
        os.makedirs(os.path.join(tmp, "state"))
        columns = [col.name for col in columns_for(Schema.from_json(doc["schema"]))]
        for c in doc["chunks"]:
            for src, dst in zip(chunk_files(snapshot_dir, c, columns), chunk_files(tmp, c, columns), strict=True):
                link_or_copy(src, dst)
        fsync_dir(os.path.join(tmp, "chunks"))
        for rel in referenced_files(doc):
            link_or_copy(os.path.join(snapshot_dir, rel), os.path.join(tmp, rel))
        from ..storage.manifest import write_manifest

        body = {k: v for k, v in doc.items() if k not in ("format", "format_version", SNAPSHOT_KEY)}
        body["loaded_from"] = {"path": os.path.abspath(snapshot_dir), "generation": doc["generation"],
                               "at": time.time()}
        write_manifest(tmp, body)
        if os.path.isdir(path):
            os.rmdir(path)
        os.replace(tmp, path)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_TRAILING_DIGITS = re.compile(r"\d+$")


def prune_snapshots(prefix: str, keep: int, *, of: str | os.PathLike[str] | None = None) -> list[str]:
    """Keep the ``keep`` newest snapshots named ``prefix`` followed by digits only; remove the others.

    ``prefix`` is a path whose last part is the name's stem: ``"ckpt/replay-"`` matches
    ``ckpt/replay-000300`` and ``ckpt/replay-`` itself, never ``ckpt/replay-best`` or
    ``ckpt/replay-2023-final`` (``"ckpt/"``: names of digits only). Only directories holding a
    readable snapshot manifest count (anything else is left alone); with ``of``, only snapshots of
    the store at that path (their manifest's ``snapshot_of.path``). Newest = latest ``saved_at``. Each removal renames the directory first, so
    an interrupted prune never leaves a half-deleted directory that still looks like a snapshot.
    Returns the removed paths.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep: expected an int >= 1, got {keep!r}")
    prefix = os.fspath(prefix)
    parent = os.path.dirname(os.path.abspath(prefix)) or "."
    stem = "" if prefix.endswith(os.sep) else os.path.basename(prefix)
    pattern = re.compile(re.escape(stem) + r"\d*" if stem else r"\d+")  # "ckpt/": names of digits only
    store = None if of is None else os.path.abspath(os.fspath(of))
    found = []
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        full = os.path.join(parent, name)
        if not pattern.fullmatch(name) or os.path.islink(full) or not os.path.isdir(full):
            continue
        try:
            doc = read_snapshot(full)
        except (MMReplayError, ValueError, OSError):
            continue
        if store is not None and doc[SNAPSHOT_KEY].get("path") != store:
            continue
        found.append((float(doc[SNAPSHOT_KEY].get("saved_at", 0.0)), full))
    found.sort()
    removed = []
    for _, full in found[:-keep]:
        trash = os.path.join(parent, f".{os.path.basename(full)}.removing-{os.getpid()}")
        os.replace(full, trash)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(full)
    if removed:
        fsync_dir(parent)
    return removed


def sibling_prefix(snapshot_dir: str) -> str:
    """``ckpt/replay-000300`` -> ``ckpt/replay-``: the stem ``save(keep=)`` prunes by (then digits only)."""
    return _TRAILING_DIGITS.sub("", os.path.abspath(snapshot_dir).rstrip("/"))


def prune_siblings(snapshot_dir: str, keep: int) -> list[str]:
    """What ``save(snapshot_dir, keep=N)`` prunes: the snapshots named like ``snapshot_dir`` (its stem, then
    digits only) that are snapshots of the same store as ``snapshot_dir``; the ``keep`` newest stay."""
    doc = read_snapshot(snapshot_dir)
    return prune_snapshots(sibling_prefix(snapshot_dir), keep, of=doc[SNAPSHOT_KEY]["path"])
