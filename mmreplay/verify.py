"""Integrity check of a store or snapshot directory: every problem found, each naming its file.

Unlike ``open()``, which refuses a store it cannot use, ``verify_store`` keeps
going and reports everything: the manifest, every chunk file's presence,
header, size and (sealed chunks) CRC-32 (compressed frame files: their CRC-32C,
every frame decoded, and the CRC-32 of the decoded frames), the open chunk's
committed rows against the CRC-32 the last commit recorded for each column and
stream (``prefix_crc32``; rows written after the commit are not part of the
store and are not checked), the transition counts recorded per chunk against
the flags actually stored, the state files, and finally whether the store opens
and its priorities cover exactly the sampleable transitions.
It reads every byte of the store: its cost is O(data).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .core.durability import read_consistent
from .core.layout import START, stream_offsets, stream_runs
from .core.prefixcrc import crc32_rows, stream_extents
from .core.statefiles import check_state_files
from .errors import CorruptStoreError, MMReplayError, ReadOnlyStoreError
from .options import Schema
from .storage import framefile, npyfile
from .storage.ring import FLAGS_DTYPE, chunk_file, columns_for, compressed_file, crc32_file_data
from .storage.validate import check_files


class _Found(CorruptStoreError):
    """The problems found against one commit. A ``CorruptStoreError``, so that ``read_consistent`` checks
    again when a live writer committed meanwhile: a newer commit deletes the files of the chunks it retired
    and the state files it replaced, which the commit being checked still lists."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def verify_store(path: str) -> list[str]:
    """Return the problems found in the store or snapshot at ``path`` (an empty list: all good).

    Only problems seen against a commit that was still the last one once they were found are reported
    (checked again a bounded number of times while a writer keeps committing, as ``open()`` does)."""

    def check(doc: dict[str, Any]) -> list[str]:
        try:
            problems = _verify_commit(path, doc)
        except OSError as exc:  # a file the commit lists, unreadable (or deleted by a newer commit)
            problems = [str(exc)]
        if problems:
            raise _Found(problems)
        return problems

    try:
        return read_consistent(path, check, writer=False)
    except _Found as found:
        return found.problems
    except (MMReplayError, OSError) as exc:
        return [str(exc)]


def _verify_commit(path: str, doc: dict[str, Any]) -> list[str]:
    """The problems of the store at ``path`` against its commit ``doc`` (a damaged manifest or a file it
    names that cannot be used at all: raised)."""
    check_files(path, doc)
    mpath = os.path.join(path, "manifest.json")
    try:
        schema = Schema.from_json(doc["schema"])
        chunks = doc["chunks"]
        raw_rows, next_id = doc["rows"], int(doc["next_id"])
        rows = np.array(raw_rows if isinstance(raw_rows, list) else [raw_rows] * schema.num_envs, np.int64)
    except (KeyError, TypeError, ValueError) as exc:
        return [f"{mpath}: unreadable schema or counters ({exc!r})"]
    problems: list[str] = []
    rs = schema.rows_per_stream
    shape_rows = schema.chunk_size
    expected_first = int(chunks[0]["first_id"]) if chunks else next_id
    for i, c in enumerate(chunks):
        if i and int(c["seq"]) != int(chunks[i - 1]["seq"]) + 1:
            problems.append(f"{mpath}: chunk {c['seq']} does not follow chunk {chunks[i - 1]['seq']}")
        if int(c["first_id"]) != expected_first:
            problems.append(f"{mpath}: chunk {c['seq']} has first_id {c['first_id']} but the chunks before it end"
                            f" at id {expected_first}")
        expected_first = int(c["first_id"]) + int(c["n_transitions"])
        readable = True
        for col in columns_for(schema):
            fpath = chunk_file(path, str(c.get("name")), col.name)
            if col.name == "obs" and c.get("frames"):
                problems += _verify_frames(path, c, schema)
                continue
            try:
                npyfile.check(fpath, col.dtype, (shape_rows, *col.shape))
            except MMReplayError as exc:
                problems.append(str(exc))
                readable = False
                continue
            if c["sealed"]:
                want = (c.get("crc32") or {}).get(col.name)
                got = crc32_file_data(fpath)
                if want is None:
                    problems.append(f"{fpath}: sealed chunk without a recorded checksum")
                elif got != want:
                    problems.append(f"{fpath}: checksum {got:#010x} differs from the recorded {want:#010x}"
                                    " (the file was modified or damaged)")
        if readable:
            flags_path = chunk_file(path, str(c.get("name")), "flags")
            flags = npyfile.map_data(flags_path, FLAGS_DTYPE, (shape_rows,))
            fill = c.get("rows")  # rows of each stream in the chunk (format 1: every stream wrote every row)
            used = np.clip(rows - int(c["seq"]) * rs, 0, rs) if fill is None else np.asarray(fill, np.int64)
            extents = stream_extents(rs, schema.num_envs, c.get("extents"))
            try:
                offsets = [stream_offsets(rs, extents[s], int(used[s])) for s in range(schema.num_envs)]
            except (IndexError, TypeError, ValueError) as exc:
                problems.append(f"{mpath}: chunk {c['seq']}: rows {used.tolist()} do not fit its extents ({exc})")
                continue
            n_tx = sum(int(np.count_nonzero((flags[o] & START) == 0)) for o in offsets)
            if n_tx != int(c["n_transitions"]):
                problems.append(f"{flags_path}: holds {n_tx} transitions, the manifest"
                                f" records {c['n_transitions']}")
            del flags
            if not c["sealed"] and c.get("prefix_crc32") is not None:  # absent in stores written before it
                problems += _verify_prefix(path, c, schema, extents, used)
    if chunks and expected_first != next_id:
        problems.append(f"{mpath}: chunks end at id {expected_first}, next_id is {next_id}")
    problems += check_state_files(path, doc)
    if not problems:
        problems += _open_check(path)
    return problems


def _verify_prefix(path: str, c: dict, schema: Schema, extents: list[list[int]], used: np.ndarray) -> list[str]:
    """The open chunk's committed rows of every column and stream against the commit's ``prefix_crc32``."""
    runs = [stream_runs(schema.rows_per_stream, extents[s], 0, int(used[s])) for s in range(schema.num_envs)]
    problems = []
    for col in columns_for(schema):
        fpath = chunk_file(path, str(c["name"]), col.name)
        data = npyfile.map_data(fpath, col.dtype, (schema.chunk_size, *col.shape))
        for s, want in enumerate(c["prefix_crc32"][col.name]):
            got = crc32_rows(data, 0, runs[s])
            if got != want:
                problems.append(f"{fpath}: the committed rows of stream {s} in this open chunk ({int(used[s]):,} rows)"
                                f" have checksum {got:#010x}, which differs from the recorded {want:#010x}"
                                " (the file was modified or damaged)")
        del data
    return problems


def _verify_frames(path: str, c: dict, schema: Schema) -> list[str]:
    """A compressed chunk's frame file: its bytes against the manifest, every frame decoded, and the
    decoded frames against the CRC-32 recorded for the raw frames when the chunk was sealed."""
    frames = c["frames"]
    fpath = compressed_file(path, str(c.get("name")), str(frames.get("codec")))
    if frames.get("codec") != schema.compression:
        return [f"{fpath}: coded {frames.get('codec')!r}, the store's compression is {schema.compression!r}"]
    return framefile.verify_file(fpath, frames, schema.obs_dtype, schema.obs_shape, schema.chunk_size,
                                 (c.get("crc32") or {}).get("obs"))


def _open_check(path: str) -> list[str]:
    """Open read-only and cross-check the index with the priorities, and the rate limit's counters with
    their check. Counters this user may not write cannot be mapped for counting (a read-only copy of a
    store): their check is left to whoever samples from the store, and the rest is verified all the same."""
    from .store import ReplayStore

    try:
        with ReplayStore.open(path, mode="r") as s:
            parts = s._parts  # (verify and the store are one part: see ARCHITECTURE.md)
            prio = parts.sampler.prioritized
            if prio is not None:
                n = len(s)
                positive = prio.positive_slots()
                if positive != n:
                    return [f"{path}: {positive} transitions carry priority mass, {n} are sampleable"]
            if parts.limiter is not None:
                try:
                    parts.limiter.counts()  # checks the counters under their lock
                except ReadOnlyStoreError:
                    pass
    except (MMReplayError, OSError) as exc:
        return [str(exc)]
    return []
