"""Opening a chunk log from the manifest: the chunk table read and checked, the chunks mapped, the index
rebuilt from the retained chunks' flags (and id) columns, the open chunk's checksums compared.

``core/log.py`` keeps the log's own side of it (``ChunkLog.restore``: the mapping, the index's places and
counters, the streams' cursors in the open chunk); this module decides what the manifest says and
whether the files agree with it.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

import numpy as np

from ..errors import CorruptStoreError, StoreIOError
from ..options import Schema, initial_positions
from ..storage.files import copy_exclusive
from ..storage.manifest import fsync_dir
from ..storage.ring import columns_for
from ..storage.validate import check_files
from .layout import DISK_FLAGS, START
from .log import ChunkInfo, ChunkLog, RingListener
from .prefixcrc import PrefixCrc

_NONE = np.empty(0, np.int64)


def _frames_entry(c: dict[str, Any], schema: Schema) -> dict[str, Any] | None:
    """A manifest chunk entry's ``frames`` (compressed frame file), checked against the schema."""
    frames = c.get("frames")
    if frames is None:
        return None
    if not isinstance(frames, dict) or frames.get("codec") != schema.compression:
        raise ValueError(f"chunk {c.get('name')}: frames {frames!r} do not match the store's compression"
                         f" {schema.compression!r}")
    return {"codec": str(frames["codec"]), "bytes": int(frames["bytes"]), "crc32c": int(frames["crc32c"])}


def _prefix_entry(c: dict[str, Any], schema: Schema) -> dict[str, list[int]] | None:
    """An open chunk entry's ``prefix_crc32`` (absent in stores written before it existed): one CRC-32
    per stream for every column."""
    prefix = c.get("prefix_crc32")
    if prefix is None:
        return None
    out = {col.name: [int(v) for v in prefix[col.name]] for col in columns_for(schema)}
    if set(prefix) != set(out) or any(len(v) != schema.num_envs for v in out.values()):
        raise ValueError(f"chunk {c.get('name')}: prefix_crc32 does not list one checksum per env stream for"
                         f" exactly the columns {sorted(out)}")
    return out


def open_log(root: str, schema: Schema, body: dict[str, Any], writable: bool, listener: RingListener) -> ChunkLog:
    """Map the committed chunks and rebuild the index from their flags (and id) columns."""
    mpath = os.path.join(root, "manifest.json")
    check_files(root, body, schema)  # plain files only, no links; state files as FORMAT.md says
    n_env, rs = schema.num_envs, schema.rows_per_stream
    try:
        entries = body["chunks"]
        chunks = [ChunkInfo(int(c["seq"]), str(c["name"]), int(c["first_id"]), int(c["n_transitions"]),
                            bool(c["sealed"]), c["crc32"], _frames_entry(c, schema), committed=True)
                  for c in entries]
        raw_rows = body["rows"]
        rows = np.array(raw_rows if isinstance(raw_rows, list) else [raw_rows] * n_env, np.int64)
        next_id = int(body["next_id"])
        fills = [c.get("rows") for c in entries]
        extents = [c.get("extents") for c in entries]
        streams = body.get("streams")
        tails = None if streams is None else np.array(
            [[bool(e), int(p), bool(x)] for e, p, x in streams], np.int64).reshape(-1, 3)
        heads = None if body.get("head_epos") is None else np.array(body["head_epos"], np.int64)
        prefix = _prefix_entry(entries[-1], schema) if entries and not chunks[-1].sealed else None
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptStoreError(f"{mpath}: malformed chunk table ({exc!r})") from None
    if rows.shape != (n_env,) or (tails is not None and tails.shape[0] != n_env):
        raise CorruptStoreError(f"{mpath}: rows or streams do not have one entry per env stream ({n_env})")
    if any(c.frames is not None and not c.sealed for c in chunks):
        raise CorruptStoreError(f"{mpath}: an open chunk is listed with compressed frames")
    seqs = [c.seq for c in chunks]
    if seqs != list(range(seqs[0], seqs[0] + len(seqs))) if seqs else rows.any():
        raise CorruptStoreError(f"{mpath}: chunk table is not a run of consecutive chunks ({seqs[:5]}...)")
    if all(f is None for f in fills):
        # format version 1: every stream wrote every row; chunk c holds rows c*R .. c*R + R - 1
        fill = np.array([[rs] * n_env if c.sealed else (rows - c.seq * rs).tolist() for c in chunks],
                        np.int64).reshape(-1, n_env)
    else:
        try:
            fill = np.array(fills, np.int64).reshape(len(chunks), n_env)
        except (TypeError, ValueError):
            raise CorruptStoreError(f"{mpath}: chunk rows {fills[:3]}... are not one count per env stream") from None
    # Each stream's rows are consecutive across its sections: the oldest chunk's first rows follow.
    first = np.zeros((len(chunks), n_env), np.int64)
    if chunks:
        first[:] = rows - np.cumsum(fill[::-1], axis=0)[::-1]
    if (fill < 0).any() or (fill.sum(axis=1) > schema.chunk_size).any() or (first < 0).any():
        raise CorruptStoreError(f"{mpath}: chunk rows {fill.tolist()[:3]}... do not fit chunks of"
                                f" {schema.chunk_size} rows, or add up to more than the {rows.tolist()} rows written")
    for c, f in zip(chunks, fill, strict=True):
        c.rows = f.tolist() if c.sealed else None
    # The writer's own positions (it may use all of them: it grows before opening a chunk that would not
    # fit), so that slots, and with them the order prioritized and uniform draws see, are the same.
    positions = max(initial_positions(schema), len(chunks), int(body.get("ring_positions", 0)))
    try:
        log = ChunkLog(root, schema, writable, positions, listener)
    except (MemoryError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.ENOMEM:
            raise
        raise CorruptStoreError(
            f"{mpath}: its schema (capacity {schema.capacity:,}, frames {schema.obs_shape} {schema.obs_dtype}) needs more"
            f" memory or address space than this process may have ({exc}); if the store is yours, raise the"
            " limit (ulimit -v) or open it on a larger machine, otherwise the manifest was forged") from None
    crc = None if prefix is None else PrefixCrc(chunks[-1].seq, fill[-1].tolist(), prefix)
    try:
        if writable and chunks and not chunks[-1].sealed:
            try:
                _private_open_chunk(log, chunks[-1])
            except OSError as exc:  # (a full disk: the copy of the open chunk)
                raise StoreIOError(exc.errno, f"opening {root} for writing: its open chunk could not be given a"
                                   f" private copy ({exc.strerror or exc}); free space, or open it read-only"
                                   " (mode='r')") from exc
        log.restore(chunks, rows, first, fill, extents, next_id, crc)
        log.initial_valid = _rebuild_index(log, first, fill, tails, heads)
        log.resume_writing()
        if crc is not None:
            log.check_prefix()
    except BaseException:
        log.close()
        raise
    return log

def _private_open_chunk(log: ChunkLog, info: ChunkInfo) -> None:
    """Give the open chunk's files a fresh inode if anything else may share them (a snapshot's hard
    link made after it was sealed in a run that then crashed) or they were sealed read-only."""
    for col in columns_for(log.schema):
        path = log.ring.file_path(info.name, col)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise CorruptStoreError(f"{path}: chunk file is missing") from None
        if st.st_nlink > 1 or not st.st_mode & stat.S_IWUSR:
            tmp = path + ".tmp"
            copy_exclusive(path, tmp)  # never through a link planted at the temp name
            os.replace(tmp, path)
    fsync_dir(os.path.join(log.root, "chunks"))

def _rebuild_index(log: ChunkLog, first: np.ndarray, fill: np.ndarray, tails: np.ndarray | None,
                   heads: np.ndarray | None = None) -> np.ndarray:
    """Rebuild the index from the retained chunks' flags column (committed rows only).

    ``first``/``fill``: (chunks, streams) first row and rows of every section. Ids come from the id
    column (stores with several streams), else from counting transitions in write order: row order
    for one stream, (row, stream) order for a store written by format 1 (streams in lockstep).
    """
    idx, n_env = log.index, log.schema.num_envs
    if not log.chunks:
        return idx.rebuild([(0, _NONE, _NONE.astype(np.uint8), _NONE)] * n_env, tails)
    head = log.chunks[0]
    arrays, geo = log.ring.arrays, idx.geo
    per_stream = []
    for s in range(n_env):
        parts = [geo.stream_slots(c.seq, s, int(f)) for c, f in zip(log.chunks, fill[:, s], strict=True)]
        slots = np.concatenate(parts) if parts else np.empty(0, np.int64)
        per_stream.append((int(first[0, s]), slots, arrays["flags"][slots] & DISK_FLAGS))
    n_tx = sum(int(np.count_nonzero((f & START) == 0)) for _, _, f in per_stream)
    if n_tx != log.next_id - head.first_id:
        raise CorruptStoreError(
            f"{log.ring.file_path(head.name, log.ring.columns[3])} and later: the flags columns hold {n_tx}"
            f" transitions, the manifest counts {log.next_id - head.first_id}; the chunk files are damaged")
    if log.schema.id_column:
        ids = [arrays["id"][slots] for _, slots, _ in per_stream]
        _check_ids(log, per_stream, ids, head)
    elif n_env == 1:
        f = per_stream[0][2]
        tx = (f & START) == 0
        ids = [np.where(tx, head.first_id + np.cumsum(tx) - 1, -1)]
    else:  # streams in lockstep: ids in (row, stream) order
        flags = np.stack([f for _, _, f in per_stream], axis=1)
        tx = (flags & START) == 0
        order = np.where(tx, head.first_id + np.cumsum(tx.ravel()).reshape(tx.shape) - 1, -1)
        ids = [order[:, s] for s in range(n_env)]
    return idx.rebuild([(r0, sl, f, i) for (r0, sl, f), i in zip(per_stream, ids, strict=True)],
                                     tails, heads)

def _check_ids(log: ChunkLog, per_stream: list[tuple[int, np.ndarray, np.ndarray]], ids: list[np.ndarray],
               head: ChunkInfo) -> None:
    """The id column names every retained transition exactly once, and nothing on START rows."""
    where = f"{log.ring.file_path(head.name, log.ring.columns[-1])} and later"
    got = []
    for (_, _, f), i in zip(per_stream, ids, strict=True):
        if ((i >= 0) != ((f & START) == 0)).any():
            raise CorruptStoreError(f"{where}: the id column disagrees with the flags; the chunk files are damaged")
        got.append(i[i >= 0])
    all_ids = np.concatenate(got) - head.first_id
    span = log.next_id - head.first_id
    if all_ids.size and (all_ids.min() < 0 or all_ids.max() >= span or
                         (np.bincount(all_ids, minlength=span) != 1).any()):
        raise CorruptStoreError(f"{where}: the id column does not number the transitions {head.first_id}.."
                                f"{log.next_id - 1} once each; the chunk files are damaged")
