"""Durability: the commit protocol, snapshots, loading, and reading a consistent commit.

A commit writes the state of the parts (the chunk log's table, the sampler's
state files, the sampling RNG, the user's metadata) and then replaces the
manifest atomically: the manifest is the commit (FORMAT.md). Data reaches the
disk before the manifest that refers to it, so after a crash ``open()`` finds
the last commit whole. After a disk error the store turns read-only: sampling
still works, writes raise, reopening gives the last commit.

Readers race the writer: the chunks a manifest lists may be retired by a newer
commit between reading the manifest and mapping the chunks. ``read_consistent``
is the one retry loop for that (used by ``open`` and ``refresh``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from .. import _inputs
from ..errors import CorruptStoreError, RateLimitTimeout, ReadOnlyStoreError, StoreIOError
from ..options import Schema
from ..sampling import Sampler
from ..storage.manifest import read_manifest, write_manifest
from . import snapshot
from .drawing import DrawState
from .index import Index
from .log import ChunkLog
from .ratelimit import RateLimiter, initial_files
from .statefiles import STATE_DIR, StateDir, checksums, load_state_file, referenced_files, remove_unreferenced

T = TypeVar("T")

# A reader retries while each failed attempt met a newer commit, for at most this long (a writer that commits
# and retires chunks faster than a reader maps a manifest's chunks, for all that time, is reported)
READ_PATIENCE = 30.0  # seconds
READ_PAUSE_MAX = 0.05  # seconds between attempts at most (doubling from 1 ms): a commit is a short write

@dataclass
class CommittedParts:
    """The parts whose state a commit records (replaced together when a reader refreshes). ``index`` is
    the log's (it lives as long as the log); a commit asks it for validity, not through the log."""

    log: ChunkLog
    index: Index
    sampler: Sampler
    draw_state: DrawState
    limiter: RateLimiter | None = None

    def counters(self, path: str, ids: Any, settle: bool) -> dict[str, Any]:
        """``ReplayStore.inspect()``'s counters (see there); ``settle``: finish background seals first."""
        log, prio = self.log, self.sampler.prioritized
        if settle:
            log.wait_sealed()
        out: dict[str, Any] = {"ring_positions": log.ring.positions, "chunks": len(log.chunks),
                               "rows": log.rows.tolist(), "holes": log.holes(),
                               "compressed_chunks": sorted(log.ring.compressed),
                               "rng": self.draw_state.rng.bit_generator.state}
        if self.limiter is not None:
            out["rate_limit"] = self.limiter.counts()
        if prio is not None:
            out.update(priority_total=prio.total_mass(), priority_slots=prio.positive_slots(),
                       priority_state=read_manifest(path).get("priorities"))
            if ids is not None:
                ids = _inputs.ids_array(ids)
                self.index.check_ids(ids)
                out["priority_masses"] = prio.masses(ids)
        return out


def read_consistent(path: str, attach: Callable[[dict[str, Any]], T], writer: bool) -> T:
    """``attach(manifest)`` for the store's current manifest, retrying while a concurrent writer retires
    chunks the manifest it read still listed (a reader only; a writer's own manifest cannot change): as long
    as each failure met a newer commit, for up to ``READ_PATIENCE`` seconds, with a growing pause between
    attempts (a writer committing in a loop leaves gaps a reader can use)."""
    start = time.monotonic()
    pause = 0.001
    first: int | None = None
    while True:
        manifest = read_manifest(path)
        try:
            return attach(manifest)
        except CorruptStoreError as exc:
            tried = int(manifest.get("generation", 0))
            generation = int(read_manifest(path).get("generation", 0))
            if writer or generation == tried:
                raise
            first = tried if first is None else first
            if time.monotonic() - start > READ_PATIENCE:
                raise CorruptStoreError(
                    f"{exc}. The store may be intact: its writer committed {generation - first} times"
                    f" (generations {first} to {generation}) in the {READ_PATIENCE:g} s this reader kept trying,"
                    " each retiring chunks the manifest before it named, faster than this reader maps them; commit"
                    " less often (or with a larger capacity) while readers open or refresh") from None
        time.sleep(pause)
        pause = min(2 * pause, READ_PAUSE_MAX)

class Durability:
    """Commits, snapshots and the failure state of one open store directory."""

    def __init__(self, path: str, schema: Schema, manifest: dict[str, Any]) -> None:
        self.path = path
        self.schema = schema
        self.failed: BaseException | None = None
        self.state_incomplete = False  # a disk error in the store's own files (not a snapshot's)
        self.adopt(manifest)

    def adopt(self, manifest: dict[str, Any]) -> None:
        """Take the commit counters of ``manifest`` (after open or refresh)."""
        self.generation = int(manifest.get("generation", 0))
        self.committed_at = float(manifest.get("committed_at", 0.0))
        self.snapshots: list[dict[str, Any]] = list(manifest.get("snapshots") or [])
        self.validity: dict[str, Any] | None = manifest.get("validity")  # the committed validity record
        self.rate_counts: dict[str, Any] | None = manifest.get("rate_limit")  # the committed rate-limit counts
        self.state_crcs: dict[str, int] = dict(manifest.get("state_crc32") or {})

    # -- failures --------------------------------------------------------------------------------------
    def fail(self, exc: OSError, doing: str, in_store: bool = True) -> StoreIOError:
        """Turn the store read-only after a disk error; the error to raise. ``in_store=False``: the error was
        outside the store's own files (writing a snapshot), whose state stays whole to save again."""
        self.failed = exc
        self.state_incomplete |= in_store
        return StoreIOError(exc.errno, f"{doing} in {self.path} failed: {exc.strerror or exc}; the store is now"
                            " read-only (sampling still works); free space or fix the disk, then reopen it")

    def check_can_save(self) -> None:
        """Refuse ``save()`` from a forked child's inherited writer, and after a disk error in the store's own
        files (its state since the last commit may be incomplete: a chunk sealed without its checksum)."""
        if isinstance(self.failed, ReadOnlyStoreError) or self.state_incomplete:
            self.check_not_failed()

    def check_not_failed(self) -> None:
        if isinstance(self.failed, ReadOnlyStoreError):
            raise self.failed
        if self.failed is not None:
            raise ReadOnlyStoreError(
                f"the store {self.path} turned read-only after a disk error ({self.failed}); free space or fix"
                " the disk, then reopen it: it reopens at its last commit")

    # -- commit ----------------------------------------------------------------------------------------
    def body(self, parts: CommittedParts, generation: int, root: str, metadata: dict[str, Any],
             delta: bool = False) -> dict[str, Any]:
        """The manifest body describing the parts' current state (state files written under ``root``;
        ``delta``: a commit in place, whose state may build on the files of earlier commits)."""
        files = StateDir(root, generation)
        # the counts first: a damaged counters file or a stopped holder of their lock refuses the commit
        # before any state file is written
        rate = parts.limiter.state() if parts.limiter is not None and parts.limiter.writer else None
        body = {"generation": generation, "committed_at": time.time(), "schema": self.schema.to_json(),
                "metadata": metadata, "snapshots": self.snapshots,
                "priorities": parts.sampler.save_state(files, delta),
                **parts.draw_state.state(parts.index), **parts.log.manifest_body()}
        validity = self.validity_entry(parts.index, files, in_place=delta)
        if validity is not None:
            body["validity"] = validity
        if rate is not None:
            body["rate_limit"] = rate
        elif self.rate_counts is not None:  # a reader's snapshot: the counts of the commit it holds
            body["rate_limit"] = self.rate_counts
        body["state_crc32"] = checksums(body, self.state_crcs if delta else {}, files.written)
        return body

    def validity_entry(self, index: Index, files: StateDir, in_place: bool) -> dict[str, Any] | None:
        """The manifest's ``validity`` record (FORMAT.md): what ``clear()`` removed and the ranges of ids
        ``invalidate()`` took out of sampling. A commit in place with no change since the last one keeps
        the committed record and its file; otherwise the ranges are written afresh (O(retained ids))."""
        if in_place and not index.validity_changed:
            return self.validity
        ranges = index.invalid_ranges()
        if ranges.size == 0 and index.clear_id == 0:
            return None
        row = index.clear_row
        # one count when every stream had written as many rows (what format 2 readers take), else a list
        cleared_row = int(row[0]) if (row == row[0]).all() else row.tolist()
        return {"cleared_below": int(index.clear_id), "cleared_row": cleared_row,
                "invalid_ids": int((ranges[:, 1] - ranges[:, 0]).sum()),
                "file": files.write("invalid", ranges) if ranges.size else None}

    def commit(self, parts: CommittedParts, metadata: dict[str, Any]) -> None:
        """Make the parts' state the durable resume point, in place (O(open chunk + changes))."""
        parts.log.ring.check_intact(most=64)  # a file truncated under the store: refused before it is read
        try:
            parts.log.sync_open_chunk()
            gen = self.generation + 1
            body = self.body(parts, gen, self.path, metadata, delta=True)
            # the body's checksums read the mappings (and seals reaped here read them in the sealer): none
            # may have read zeros past a truncated file's end (the SIGBUS guard, ``ChunkRing.check_faults``)
            parts.log.ring.check_faults()
            write_manifest(self.path, body)
        except RateLimitTimeout:
            raise  # nothing was written: the store stays writable
        except OSError as exc:
            raise self.fail(exc, "committing") from exc
        self.generation, self.committed_at = gen, body["committed_at"]
        self.validity, self.rate_counts = body.get("validity"), body.get("rate_limit")
        self.state_crcs = body["state_crc32"]
        parts.index.validity_committed()
        parts.sampler.saved(body["priorities"])
        parts.log.after_commit()
        remove_unreferenced(self.path, set(referenced_files(body)))

    def save(self, parts: CommittedParts, snapshot_dir: str, metadata: dict[str, Any], keep: int | None,
             reader: bool = False) -> str:
        """Write a consistent snapshot of the parts' state to ``snapshot_dir``; return its absolute path.

        A disk error leaves no partial snapshot (a new directory is removed; an existing snapshot keeps
        its previous generation, whose files are untouched) and turns the store read-only.
        """
        target = os.path.abspath(snapshot_dir)
        gen = snapshot.existing_generation(target) + 1
        new_dir = not os.path.exists(target)
        try:
            parts.log.wait_sealed()  # (an error here is the store's own: a chunk's seal)
        except OSError as exc:
            raise self.fail(exc, "sealing a chunk") from exc
        try:
            os.makedirs(os.path.join(target, STATE_DIR), exist_ok=True)
            body = self.body(parts, gen, target, metadata)
            try:
                parts.log.ring.check_faults()  # the body's checksums read the mappings: as in commit()
            except CorruptStoreError:
                _undo_snapshot(target, new_dir, gen)
                raise
            columns = [c.name for c in parts.log.ring.columns]
            body["chunks"] = snapshot.write_snapshot_chunks(self.path, target, body["chunks"], columns, gen)
            saved_at = time.time()
            body[snapshot.SNAPSHOT_KEY] = {"path": os.path.abspath(self.path),
                                           "store_generation": self.generation, "saved_at": saved_at}
            write_manifest(target, body)
        except OSError as exc:
            _undo_snapshot(target, new_dir, gen)
            if reader and isinstance(exc, FileNotFoundError) and str(exc.filename).startswith(self.path + os.sep):
                # not a disk error: a file of the reader's commit that the writer's later commit removed
                raise StoreIOError(exc.errno, f"save() of a reader of {self.path}: {exc.filename}, which this reader's"
                                   f" commit (generation {self.generation}) lists, was removed by a later commit of"
                                   " the writer; refresh() this reader, then save again") from exc
            raise self.fail(exc, f"saving a snapshot to {target}", in_store=False) from exc
        snapshot.remove_unlisted(target, {c["name"] for c in body["chunks"]}, set(referenced_files(body)))
        self.snapshots = [s for s in self.snapshots if s["path"] != target][-15:]
        self.snapshots.append({"path": target, "generation": gen, "saved_at": saved_at})
        if keep is not None:
            snapshot.prune_siblings(target, keep)
        return target


def _undo_snapshot(target: str, new_dir: bool, generation: int) -> None:
    """Remove what a failed save wrote: the whole directory if it made it, else the files the previous
    generation's manifest does not list (an empty directory it was given is emptied again)."""
    if new_dir:
        shutil.rmtree(target, ignore_errors=True)
        return
    try:
        old = read_manifest(target, what="snapshot") if generation > 1 else None
    except (OSError, ValueError):
        return  # cannot tell what is old: leave everything (the old manifest still names its files)
    if old is None:
        for name in os.listdir(target):
            if name in ("chunks", STATE_DIR) or name.startswith("manifest.json.tmp"):
                full = os.path.join(target, name)
                shutil.rmtree(full, ignore_errors=True) if os.path.isdir(full) else os.unlink(full)
        return
    snapshot.remove_unlisted(target, {c["name"] for c in old.get("chunks", [])}, set(referenced_files(old)))
    for name in os.listdir(target):
        if name.startswith("manifest.json.tmp"):
            os.unlink(os.path.join(target, name))


def create_store(path: str, schema: Schema, seed: int, metadata: dict[str, Any]) -> None:
    """Make ``path`` (new, or an empty directory) an empty store: generation 0, nothing written.

    A failure leaves nothing behind (what was made is removed), so a corrected retry can succeed.
    """
    existed = os.path.isdir(path)
    if os.path.exists(path):
        if not existed:
            raise ValueError(f"create(): {path} is a file; give a new or empty directory")
        if os.listdir(path):
            if os.path.exists(os.path.join(path, "manifest.json")):
                raise ValueError(f"create(): {path} already holds an mmreplay store; continue it with"
                                 f" ReplayStore.open({path!r}), or give a new or empty directory")
            raise ValueError(f"create(): {path} is not empty and not an mmreplay store; give a new or empty"
                             " directory")
    body = {"generation": 0, "committed_at": time.time(), "schema": schema.to_json(), "rows": 0,
            "next_id": 0, "chunks": [], "rng": np.random.default_rng(seed).bit_generator.state,
            "metadata": metadata}
    try:
        os.makedirs(os.path.join(path, "chunks"), exist_ok=True)
        os.makedirs(os.path.join(path, STATE_DIR), exist_ok=True)
        if schema.rate_limit is not None:
            initial_files(path)
        write_manifest(path, body)
    except BaseException:
        if existed:
            for name in os.listdir(path):
                full = os.path.join(path, name)
                shutil.rmtree(full, ignore_errors=True) if os.path.isdir(full) else os.unlink(full)
        else:
            shutil.rmtree(path, ignore_errors=True)
        raise


def json_dict(value: Any) -> dict[str, Any]:
    """A JSON-serializable dict given by the user (``metadata``), as a copy; ``TypeError`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"metadata must be a dict, got {type(value).__name__}")
    try:
        return dict(json.loads(json.dumps(value)))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata must be JSON-serializable: {exc}") from None


def load_snapshot(snapshot_dir: str, path: str) -> None:
    """Restore a snapshot into a new (or empty) working directory ``path`` (links where possible)."""
    doc = snapshot.read_snapshot(snapshot_dir)
    snapshot.materialize(snapshot_dir, doc, path)


def restore_validity(root: str, manifest: dict[str, Any], index: Index) -> None:
    """Apply a commit's ``validity`` record to an index just rebuilt from the chunks (stores written before
    the record existed have none: nothing was invalidated)."""
    entry = manifest.get("validity")
    if not entry:
        return
    ranges = np.empty((0, 2), np.int64)
    try:
        rel, clear_id = entry.get("file"), int(entry["cleared_below"])
        raw = entry["cleared_row"]
        clear_row: Any = [int(v) for v in raw] if isinstance(raw, list) else int(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptStoreError(f"{root}/manifest.json: malformed validity record ({exc!r})") from None
    if rel:
        path = os.path.join(root, rel)
        ranges = load_state_file(path)
        if ranges.dtype != np.int64 or ranges.ndim != 2 or ranges.shape[1] != 2:
            raise CorruptStoreError(f"{path}: holds {ranges.dtype}{list(ranges.shape)}, expected int64[k, 2]")
        if (ranges[:, 0] >= ranges[:, 1]).any() or (ranges[1:, 0] < ranges[:-1, 1]).any() or (ranges < 0).any():
            raise CorruptStoreError(f"{path}: the invalidated id ranges must be sorted, disjoint, non-empty"
                                    " [lo, hi) pairs of ids >= 0; the file is damaged")
    index.apply_validity(ranges, clear_id, clear_row)
