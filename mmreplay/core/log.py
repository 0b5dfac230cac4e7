"""The chunk log: chunk files + chunk table + in-RAM index, kept consistent.

It owns the rules of the append-only log: rows are written only into the
newest (open) chunk; a full chunk is sealed (checksummed, made
read-only); capacity is enforced by retiring whole old chunks; the ring of
mapped chunks grows if short episodes make chunks hold fewer transitions
than planned. It knows nothing about episodes' user-facing rules or sampling.

Compressed stores: the background sealer also writes a sealed chunk's
compressed frame file (under its final name only when complete).
The writer's thread then switches the chunk's frames to that file (after
background readers finish) at the next roll, commit, save or close. The raw
frame file goes at once if no commit lists the chunk, otherwise at the first
commit that lists it compressed (the rule of retired chunks: the last commit
always stays restorable).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import CorruptStoreError
from ..options import Schema
from ..storage import npyfile
from ..storage.manifest import fsync_dir
from ..storage.ring import ChunkRing, chunk_files, chunk_name
from .index import Index
from .layout import Geometry
from .prefixcrc import PrefixCrc, damage_error, first_damage, stream_extents


@dataclass
class ChunkInfo:
    seq: int
    name: str  # prefix of its files under chunks/
    first_id: int  # id of the first transition whose next frame is in this chunk
    n_transitions: int  # transitions whose next frame is in this chunk
    sealed: bool = False
    crc32: dict[str, int] | None = None
    frames: dict[str, Any] | None = None  # a compressed chunk's frame file: {codec, bytes, crc32c}
    committed: bool = field(default=False, compare=False)  # listed in the last committed manifest
    rows: list[int] | None = None  # rows of each stream it holds; set when sealed

    def to_json(self, fill: list[int] | None, extents: list[list[int]] | None,
                prefix_crc32: dict[str, list[int]] | None = None) -> dict[str, Any]:
        """The manifest entry; ``fill``: the open chunk's current rows per stream; ``extents``: each
        stream's extents in row order, when not laid out as home sections; ``prefix_crc32``: the open
        chunk's checksums of those rows (``core/prefixcrc.py``)."""
        out = {"seq": self.seq, "name": self.name, "first_id": self.first_id, "n_transitions": self.n_transitions,
               "sealed": self.sealed, "crc32": self.crc32, "rows": self.rows if fill is None else fill}
        if extents is not None:
            out["extents"] = extents
        if prefix_crc32 is not None:
            out["prefix_crc32"] = prefix_crc32
        if self.frames is not None:
            out["frames"] = self.frames
        return out


logger = logging.getLogger(__name__)
MAX_SEALING = 4  # full chunks whose background seal may be in flight at once


class RingListener(Protocol):
    """What the log tells the parts that keep per-slot state or read the ring in the background."""

    def before_unmap(self) -> None:
        """A chunk is about to be unmapped or remapped: background readers must finish first."""

    def slots_cleared(self, slots: np.ndarray) -> None:
        """These slots stopped being sampleable (their chunk, or their stack history, was retired)."""

    def ring_resized(self, size: int, moves: list[tuple[slice, slice]]) -> None:
        """The ring grew to ``size`` slots; ``moves`` are (old slots, new slots) of each retained chunk."""


class ChunkLog:
    """Chunk files, chunk table and index of one store directory.

    ``listener`` hears of retirements, ring growth and unmapping (see ``RingListener``).
    """

    def __init__(self, root: str, schema: Schema, writable: bool, positions: int, listener: RingListener) -> None:
        self.root = root
        self.schema = schema
        self.writable = writable
        self.listener = listener
        self.rows_per_stream = schema.rows_per_stream
        self.ring = ChunkRing(root, schema, positions, writable)
        geo = Geometry(schema.num_envs, self.rows_per_stream, schema.rows_alloc, positions)
        self.index = Index(geo, schema.stack, schema.n_step, schema.pad, schema.gamma)
        self.chunks: deque[ChunkInfo] = deque()
        self.retained_tx = 0
        self.to_delete: list[str] = []  # retired chunks still listed in the last commit
        self.raw_to_delete: list[str] = []  # raw frame files of compressed chunks the last commit lists raw
        self.initial_valid = np.empty(0, np.int64)  # sampleable slots found when the index was rebuilt
        self.open_base = -1  # slot of (stream 0, first row) of the open chunk, -1 if none is mapped writable
        # Per stream, where its rows go in the open chunk, as functions of its row count (so a written row
        # changes nothing but the index's ``rows``): row r goes to slot ``run_base + r`` while
        # ``r < run_end`` (the end of its current extent); its first row in the open chunk is ``open_first``.
        n = schema.num_envs
        self._run_base = np.zeros(n, np.int64)
        self._run_end = np.zeros(n, np.int64)
        self._open_first = np.zeros(n, np.int64)
        self._base0 = self._end0 = self._rows0 = 0  # stream 0's, as Python ints (the one-stream hot path)
        self._all = np.arange(n, dtype=np.int64)
        self.obs_fd = -1  # the open chunk's frame file: frames are written with pwrite (see write_frame)
        self.frame_bytes = schema.frame_bytes
        self._executor: ThreadPoolExecutor | None = None
        # Background seals in flight, oldest first (one sealer thread: they finish in this order).
        self._sealing: deque[tuple[ChunkInfo, Future[tuple[dict[str, int], dict[str, Any] | None]]]] = deque()
        self._queued: list[tuple[Callable[..., None], tuple[Any, ...]]] = []  # _in_background work not yet handed
        # Chunk files were created or renamed (a seal's compressed frame file) since the chunks directory
        # was last fsynced: ``wait_sealed`` syncs it once, before any manifest can name them.
        self._dir_unsynced = False
        # Chunks whose seal was reaped but whose files are not fsynced yet (``wait_sealed`` does it): a seal
        # does not wait for the disk, most chunks are retired before any commit names them, and the kernel
        # writes their pages back meanwhile (the fsyncs at a commit then find little to do).
        self._unsynced: list[ChunkInfo] = []
        self._prefix: PrefixCrc | None = None  # the open chunk's running checksums, as of the last commit

    # -- counters --------------------------------------------------------------------------------------
    @property
    def rows(self) -> np.ndarray:
        """Frame rows written, per stream."""
        return self.index.rows

    @property
    def next_id(self) -> int:
        return self.index.next_id

    @property
    def oldest_id(self) -> int:
        return self.index.oldest_id

    @property
    def open_chunk(self) -> ChunkInfo | None:
        return self.chunks[-1] if self.chunks and not self.chunks[-1].sealed else None

    def holes(self) -> int:
        """Slots of the retained sealed chunks that hold no row (extents sealed part-filled, or never taken)."""
        per_chunk = self.schema.num_envs * self.rows_per_stream
        return sum(per_chunk - sum(c.rows or ()) for c in self.chunks if c.sealed)

    # -- writing ---------------------------------------------------------------------------------------
    # A row goes into its stream's current extent of the open chunk. A stream whose extent is full takes
    # another free extent of the chunk; the chunk rolls when none is left (core/layout.py, FORMAT.md).
    @property
    def fill(self) -> np.ndarray:
        """Rows of each stream in the open chunk."""
        return self.index.rows - self._open_first

    def prepare_row(self) -> int:
        """Slot of the next row of stream 0 (stores with one stream), making room first if needed."""
        r = self._rows0
        if r >= self._end0:
            self._make_room(self._all[:1])
        return self._base0 + r

    def prepare_rows(self) -> np.ndarray:
        """Slots of the next row of every stream (a batched call), making room first if needed."""
        rows = self.index.rows
        if (rows >= self._run_end).any():
            self._make_room(self._all)
        return self._run_base + rows

    def prepare_run(self, s: int) -> tuple[int, int]:
        """(slot of stream ``s``'s next row, rows that fit in consecutive slots from there)."""
        r = int(self.index.rows[s])
        if r >= self._run_end[s]:
            self._make_room(self._all[s:s + 1])
        return int(self._run_base[s]) + r, int(self._run_end[s]) - r

    def _make_room(self, streams: np.ndarray) -> None:
        """Give every stream of ``streams`` whose extent is full a new one, rolling if too few are free."""
        rows = self.index.rows
        need = streams[rows[streams] >= self._run_end[streams]]
        if self.open_base < 0 or self.index.geo.free_extents(self.chunks[-1].seq) < need.size:
            self._roll()
            need = streams
        idx, seq = self.index, self.chunks[-1].seq
        extent = idx.geo.extent
        for s in need.tolist():
            r = int(rows[s])
            self._run_base[s] = idx.take_extent(seq, s, r) - r
            self._run_end[s] = r + extent
        self._base0, self._end0 = int(self._run_base[0]), int(self._run_end[0])

    def finish_row(self, n_transitions: int) -> None:
        """Account for one row of every stream written, holding ``n_transitions`` transitions."""
        self._rows0 = self.index.append_row(n_transitions)
        self.chunks[-1].n_transitions += n_transitions
        self.retained_tx += n_transitions

    def finish_run(self, s: int, n_rows: int, n_transitions: int) -> None:
        """Account for ``n_rows`` rows of stream ``s`` written, holding ``n_transitions`` transitions."""
        self._rows0 = self.index.append_run(s, n_rows, n_transitions)
        self.chunks[-1].n_transitions += n_transitions
        self.retained_tx += n_transitions

    def write_frames(self, slot: int, frames: np.ndarray) -> None:
        """Write consecutive frames (C-contiguous, the obs dtype) of one section at ``slot`` with one ``pwrite``."""
        view = frames.data.cast("B")
        offset = npyfile.HEADER_BYTES + (slot % self.schema.rows_alloc) * self.frame_bytes
        while view.nbytes:
            n = os.pwrite(self.obs_fd, view, offset)
            view, offset = view[n:], offset + n

    def write_frame(self, slot: int, frame: np.ndarray) -> None:
        """Write one frame of the open chunk through the file (``pwrite``), not the mapping.

        The first store into each page of a fresh shared mapping costs a page fault; writing
        through the file descriptor costs one system call per frame instead, which is cheaper for
        frames of a few pages (BENCHMARKS.md "Figures behind the code"). The mapping sees the data at once: both share the
        page cache.
        """
        offset = npyfile.HEADER_BYTES + (slot % self.schema.rows_alloc) * self.frame_bytes
        os.pwrite(self.obs_fd, frame.data, offset)

    def _open_writable(self, info: ChunkInfo) -> None:
        self._close_fd()
        self.open_base = (info.seq % self.ring.positions) * self.schema.rows_alloc
        self.obs_fd = os.open(self.ring.file_path(info.name, self.ring.columns[0]), os.O_RDWR)

    def _close_fd(self) -> None:
        if self.obs_fd >= 0:
            os.close(self.obs_fd)
        self.obs_fd = -1
        self.open_base = -1

    def _roll(self) -> None:
        """Retire what capacity allows, open the next chunk, seal the full one before it.

        Ordered so that a failure (a full disk when creating the new chunk's files) leaves a
        consistent log: the full chunk stays the open one and no half-made chunk is listed.
        """
        seq = self.chunks[-1].seq + 1 if self.chunks else 0
        # Seals may lag behind by a few chunks (a slow fsync or a busy core must not stall step());
        # a chunk is never unmapped or remapped while its seal still reads it.
        self._reap(block=len(self._sealing) >= MAX_SEALING)
        self.listener.before_unmap()
        cap, hist = self.schema.capacity, self.schema.stack * self.schema.num_envs
        # The new chunk (no transitions yet) counts as newer than every retained one.
        while self.chunks and self.retained_tx - self.chunks[0].n_transitions - hist >= cap:
            if any(info is self.chunks[0] for info, _ in self._sealing):
                self._reap(block=True)
            self._retire_oldest()
        if len(self.chunks) + 1 > self.ring.positions:
            self._reap(block=True)
            self._grow()
        # The new files' directory entries (and the compressed frame file the seal below renames into
        # place) are made durable by one fsync of the directory in ``wait_sealed``, which every commit and
        # snapshot calls before its manifest names the chunk: not one per roll and one per seal (each
        # waits for the disk: milliseconds), most of them for chunks retired before any commit.
        self.ring.create_chunk(seq, sync_dir=False)
        self._dir_unsynced = True
        full = self.chunks[-1] if self.chunks and not self.chunks[-1].sealed else None
        if full is not None:
            self._close_fd()
            self.ring.protect_chunk(full.seq)
            full.sealed = True
            self._prefix = None  # sealing checksums the whole files
            fill = self.fill
            full.rows = fill.tolist()
            self.index.seal_chunk(full.seq, fill)
        self.chunks.append(ChunkInfo(seq, chunk_name(seq), self.next_id, 0))
        self.index.add_chunk(seq, self.index.rows.copy())
        self._open_first[:] = self.index.rows
        self._run_end[:] = self.index.rows  # no stream has an extent of the new chunk yet
        self._end0 = int(self._run_end[0])
        self._open_writable(self.chunks[-1])
        if full is not None:
            # checksum (+ compression) of the full chunk run beside the writer (all release the
            # GIL); whatever needs the result or unmaps the chunk (commit, save, close, retiring or
            # growing) waits first.
            queued, self._queued = self._queued, []  # (the deletions of this roll go with the seal: one hand-off)
            self._sealing.append((full, self._sealer().submit(self._seal, full.seq, queued)))

    def _seal(self, seq: int, before: list[tuple[Callable[..., None], tuple[Any, ...]]]
              ) -> tuple[dict[str, int], dict[str, Any] | None]:
        """The background part of sealing (the sealer thread): CRCs, and the compressed frame file; ``before``:
        the ``_in_background`` work queued since the last seal, done first.

        A disk error (``OSError``) propagates: the store turns read-only. A chunk whose frames do not
        shrink enough, or anything else going wrong while compressing, leaves the chunk raw, its frames
        made durable and checksummed like a raw store's.
        """
        for work, args in before:
            work(*args)
        crcs = self.ring.finish_seal(seq)
        if not self.ring.codec:
            return crcs, None
        try:
            frames = self.ring.compress_chunk(seq)
        except OSError:
            raise
        except Exception:
            logger.exception("compressing chunk %s failed; its frames stay raw", self.ring.mapped.get(seq))
            frames = None
        if frames is None:  # raw it stays (it failed, or it would not shrink): durable and checksummed
            return {**crcs, **self.ring.finish_seal_frames(seq)}, None
        return crcs, frames

    def _retire_oldest(self) -> None:
        info = self.chunks.popleft()
        self.retained_tx -= info.n_transitions
        cleared = self.index.retire(info.seq, self.chunks[0].first_id if self.chunks else self.next_id)
        self.listener.slots_cleared(cleared)
        self.ring.unmap_chunk(info.seq)
        if info.committed:
            self.to_delete.append(info.name)  # the last commit still needs it
        else:
            self._in_background(self.ring.delete_files, info.name)  # no commit ever listed it

    def _grow(self) -> None:
        """More ring positions (short episodes put fewer transitions in each chunk than planned)."""
        positions = self.ring.positions + max(2, self.ring.positions // 4)
        self.ring.resize(positions)
        moves = self.index.resize(positions)
        self.listener.ring_resized(self.index.size, moves)
        if self.obs_fd >= 0:
            self.open_base = (self.chunks[-1].seq % positions) * self.schema.rows_alloc

    # -- durability ------------------------------------------------------------------------------------
    def _sealer(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmreplay-seal")
        return self._executor

    def wait_sealed(self) -> None:
        """Finish the background seals of full chunks (raises the first OSError, if any); a compressed
        chunk's frames are read from its compressed file from then on. The other work handed to the
        sealer thread (``_in_background``: deletions) is finished too; then the files of the retained chunks
        sealed since the last call are fsynced, and the chunks directory if a chunk file was created or
        renamed since (a manifest names only durable files)."""
        self._reap(block=True)
        queued, self._queued = self._queued, []
        for work, args in queued:  # (the sealer thread is idle now: nothing to run beside)
            work(*args)
        # a retired chunk's files are deleted, or were synced by the commit that lists it
        retained = {id(c) for c in self.chunks}
        for info in self._unsynced:
            if id(info) in retained:
                self.ring.sync_sealed(info.name, info.frames is not None)
        self._unsynced = []
        if self._dir_unsynced:
            self.ring.sync_dir()
            self._dir_unsynced = False

    def _reap(self, block: bool) -> None:
        """Take the results of the background seals that finished (``block``: of all, waiting)."""
        while self._sealing and (block or self._sealing[0][1].done()):
            info, fut = self._sealing.popleft()
            info.crc32, frames = fut.result()
            self._unsynced.append(info)
            if frames is not None:
                self._use_compressed(info, frames)

    def _use_compressed(self, info: ChunkInfo, frames: dict[str, Any]) -> None:
        self.listener.before_unmap()  # no background copy may be reading the raw frames we unmap
        self.ring.use_compressed(info.seq, int(frames["bytes"]))
        info.frames = frames
        if info.committed:
            self.raw_to_delete.append(info.name)  # the last commit reads the raw file
        else:
            self._in_background(self.ring.delete_raw_frames, info.name)  # no commit ever listed it

    def _in_background(self, work: Callable[..., None], *args: Any) -> None:
        """Run ``work`` in the sealer thread: deleting files no commit lists (freeing their page cache takes
        milliseconds that step() should not wait for). It is queued and handed over with the next seal (one
        hand-off per roll: each wakes the thread, which then competes for the GIL), or run by ``wait_sealed``
        (and so by every commit, snapshot and ``close``): a manifest names only durable files, and a writer
        reopening the store may create chunks of the same names."""
        self._queued.append((work, args))

    def sync_open_chunk(self) -> None:
        """Make everything written so far durable: the pending seal and the open chunk."""
        self.wait_sealed()
        if self.chunks and not self.chunks[-1].sealed:
            self.ring.sync_chunk(self.chunks[-1].seq)

    def manifest_body(self) -> dict[str, Any]:
        """The chunk table and counters of a manifest (a commit's, or a snapshot's). Extends the open
        chunk's checksums over the rows written since the last call: O(those rows)."""
        fill = self.fill.tolist()
        ended, episode_pos, lost = self.index.stream_state()
        geo = self.index.geo
        rows = self.rows
        # one count while the streams are in format 1's layout (what format 1 and 2 readers take), else a list
        listed: Any = int(rows[0]) if geo.lockstep and (rows == rows[0]).all() else rows.tolist()
        entries = [c.to_json(None, geo.extents_of(c.seq)) if c.sealed else
                   c.to_json(fill, geo.extents_of(c.seq), self._prefix_crc(c, fill)) for c in self.chunks]
        return {"rows": listed, "next_id": self.next_id, "chunks": entries,
                "ring_positions": self.ring.positions,
                "streams": [[bool(e), int(p), bool(x)] for e, p, x in zip(ended, episode_pos, lost, strict=True)],
                "head_epos": self.index.head_episode_pos().tolist()}

    def _prefix_crc(self, c: ChunkInfo, fill: list[int]) -> dict[str, list[int]]:
        """The open chunk ``c``'s ``prefix_crc32``: the running checksums extended to ``fill`` rows per stream."""
        n, rs = self.schema.num_envs, self.rows_per_stream
        p = self._prefix
        if p is None or p.seq != c.seq:  # a new chunk, or a store whose last commit recorded none
            p = self._prefix = PrefixCrc.empty(c.seq, [col.name for col in self.ring.columns], n)
        base = (c.seq % self.ring.positions) * self.schema.rows_alloc
        p.extend(self.ring.arrays, base, rs, stream_extents(rs, n, self.index.geo.extents_of(c.seq)), fill)
        return p.to_json()

    def check_prefix(self) -> None:
        """At open: the open chunk's committed rows against the checksums the last commit recorded."""
        p, c = self._prefix, self.chunks[-1]
        if p is None or p.seq != c.seq:  # the last commit recorded no checksums (an older writer)
            return
        n, rs = self.schema.num_envs, self.rows_per_stream
        bad = first_damage(p, self.ring.arrays, (c.seq % self.ring.positions) * self.schema.rows_alloc, rs,
                           stream_extents(rs, n, self.index.geo.extents_of(c.seq)))
        if bad is not None:
            name, s, got, want = bad
            col = next(col for col in self.ring.columns if col.name == name)
            raise damage_error(self.ring.file_path(c.name, col), s, p.rows[s], got, want)

    def after_commit(self) -> None:
        """The manifest listing the current chunks is durable: drop retired chunks the old one needed."""
        for name in self.to_delete:
            self.ring.delete_files(name)
        for name in self.raw_to_delete:
            self.ring.delete_raw_frames(name)
        if self.to_delete or self.raw_to_delete:
            fsync_dir(os.path.join(self.root, "chunks"))
        self.to_delete = []
        self.raw_to_delete = []
        for c in self.chunks:
            c.committed = True

    # -- restoring (``core/restore.py`` reads the manifest and rebuilds the index; these set the log's side) ----
    def restore(self, chunks: list[ChunkInfo], rows: np.ndarray, first: np.ndarray, fill: np.ndarray,
                extents: list[Any], next_id: int, prefix: PrefixCrc | None) -> None:
        """Map the committed ``chunks``, give the index their places and the counters, and set each stream's
        cursor in the open chunk. ``first``/``fill``: (chunks, streams) first row and rows of every section;
        ``prefix``: the open chunk's checksums the commit recorded (``check_prefix`` compares them)."""
        if prefix is not None:  # the commit's checksums continue (computed afresh at the next commit if none)
            self._prefix = prefix
        self.chunks = deque(chunks)
        self.retained_tx = sum(c.n_transitions for c in chunks)
        for c in chunks:
            self.ring.map_chunk(c.seq, c.name, writable=self.writable and not c.sealed,
                                compressed_bytes=None if c.frames is None else int(c.frames["bytes"]))
        try:
            for c, f0, f, ext in zip(chunks, first, fill, extents, strict=True):
                self.index.restore_chunk(c.seq, f0, f, ext, c.sealed)
        except (IndexError, TypeError, ValueError) as exc:
            raise CorruptStoreError(f"{os.path.join(self.root, 'manifest.json')}: chunk extents do not fit the"
                                    f" chunks ({exc})") from None
        self.index.restored()
        self.index.restore_counters(rows, next_id, chunks[0].first_id if chunks else next_id)
        self._rows0 = int(rows[0])
        if chunks and not chunks[-1].sealed:
            self._open_first[:] = rows - fill[-1]
            self._run_end[:] = rows
            geo, e = self.index.geo, self.index.geo.extent
            pos = chunks[-1].seq % geo.positions
            for s in range(self.schema.num_envs):  # where each stream's next row goes in the open chunk
                x = int(geo.current[s])
                if x >= 0:
                    used = int(fill[-1][s]) - (int(np.count_nonzero(geo.owner[pos] == s)) - 1) * e
                    self._run_base[s] = pos * self.schema.rows_alloc + x * e - (int(rows[s]) - used)
                    self._run_end[s] = int(rows[s]) - used + e
            self._base0, self._end0 = int(self._run_base[0]), int(self._run_end[0])

    def resume_writing(self) -> None:
        """After ``restore`` (and the index's rebuild): a writable log writes on into its open chunk."""
        if self.writable and self.chunks and not self.chunks[-1].sealed:
            self._open_writable(self.chunks[-1])

    def remove_strays(self) -> None:
        """Delete chunk files the manifest does not list (a crashed run's leftovers, temp copies)."""
        base = os.path.join(self.root, "chunks")
        columns = [col.name for col in self.ring.columns]
        # exactly the files the manifest refers to: a compressed chunk's raw frame file goes too, and
        # so does a compressed file the manifest does not list (a crash before the commit that would)
        keep = {os.path.basename(p) for c in self.chunks for p in chunk_files(self.root, c.to_json(None, None), columns)}
        removed = False
        for filename in os.listdir(base):
            if filename not in keep:
                try:
                    os.unlink(os.path.join(base, filename))
                except (FileNotFoundError, IsADirectoryError, PermissionError):
                    shutil.rmtree(os.path.join(base, filename), ignore_errors=True)
                removed = True
        if removed:
            fsync_dir(base)

    def forked(self) -> None:
        """In a forked child: the sealer thread and its seals are the parent's. They are dropped, never waited
        for (they would never finish here): the child's ``close()`` and exit must not hang on them. Chunks
        whose seal was in flight stay readable through their raw frames; the child writes nothing (the
        store refuses writes in a child, ``ReplayStore``)."""
        self._executor = None
        self._sealing.clear()
        self._queued = []
        self._unsynced = []
        self._dir_unsynced = False

    def close(self, failed: bool = False) -> None:
        """Finish the background seals and release everything. ``failed``: a disk error already turned the
        store read-only and was reported; a seal still queued then may fail the same way, and that is not
        raised again (the last commit never depends on a seal: it lists the chunk's raw files)."""
        try:
            self.wait_sealed()
        except OSError:
            if not failed:
                raise
        finally:
            if self._executor is not None:
                self._executor.shutdown()
            self._close_fd()
            self.ring.close()
