"""Chunk files of every column, mapped into one ring-shaped array per column.

A chunk is one ``.npy`` file per column, ``chunks/<name>.<column>.npy``,
each with ``chunk_size`` rows (all chunks share the one ``chunks/`` directory,
so making a new chunk durable costs one directory fsync). In the ring each
chunk gets a stride of ``rows_alloc`` rows (``chunk_size`` rounded up to 4096,
so every column's stride is whole pages); only the file's own pages are mapped. Chunk ``seq`` lives at ring position
``seq % positions``; row ``r`` of that chunk is element
``position * rows_alloc + r`` of the column's ring array. Only mapped chunks
may be indexed (the rest of the range is inaccessible reserved space).

Compressed frames (``schema.compression``): a sealed chunk's frames may instead come from its
compressed frame file (``framefile``), mapped read-only into a second reserved range with one stride
of ``cstride`` bytes (the largest such file, in whole pages) per ring position. ``frame_kind[pos]``
says where a position's frames are read from (``KIND_RAW``, ``KIND_LZ4``, or ``KIND_NONE``); the
obs column of a compressed chunk is not mapped at all, so frames must be read through
``FrameReader`` (``reading/reader.py``), never through ``arrays["obs"]`` directly.
"""

from __future__ import annotations

import functools
import os
import stat
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from ..errors import CorruptStoreError
from ..native import busguard
from ..native.busguard import COUNT, counter
from ..native.codes import KIND_LZ4, KIND_NONE, KIND_RAW
from ..options import Schema
from . import framefile, npyfile
from .files import fsync_file, open_regular
from .vmem import PAGE, VirtualRange

FLAGS_DTYPE = np.dtype("uint8")
REWARD_DTYPE = np.dtype("<f4")
ID_DTYPE = np.dtype("<i8")


@dataclass(frozen=True)
class Column:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @functools.cached_property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def columns_for(schema: Schema) -> tuple[Column, ...]:
    """The columns of a store, in manifest order (see FORMAT.md)."""
    cols = [
        Column("obs", schema.obs_shape, schema.obs_dtype),
        Column("action", schema.action_shape, schema.action_dtype),
        Column("reward", (), REWARD_DTYPE),
        Column("flags", (), FLAGS_DTYPE),
    ]
    cols += [Column("x_" + e.name, e.shape, e.dtype) for e in schema.extras]
    if schema.id_column:
        cols.append(Column("id", (), ID_DTYPE))
    return tuple(cols)


def chunk_name(seq: int) -> str:
    return f"{seq:012d}"


def chunk_file(root: str, name: str, column: str) -> str:
    """Path of one column file of chunk ``name`` (FORMAT.md: ``chunks/<name>.<column>.npy``)."""
    return os.path.join(root, "chunks", f"{name}.{column}.npy")


def compressed_file(root: str, name: str, codec: str) -> str:
    """Path of chunk ``name``'s compressed frames (FORMAT.md: ``chunks/<name>.obs.<codec>``)."""
    return os.path.join(root, "chunks", framefile.file_name(name, codec))


def chunk_files(root: str, entry: dict[str, Any], columns: list[str]) -> list[str]:
    """The files a manifest chunk entry refers to: one per column; a compressed chunk's frames in
    their compressed file instead of ``obs.npy``."""
    frames = entry.get("frames")
    return [compressed_file(root, str(entry["name"]), frames["codec"]) if col == "obs" and frames
            else chunk_file(root, str(entry["name"]), col) for col in columns]


def chunk_of_file(filename: str) -> str:
    """The chunk name a file under ``chunks/`` belongs to (``000000000042.obs.npy`` -> ``000000000042``)."""
    return filename.split(".", 1)[0]


def crc32_file_data(path: str) -> int:
    """CRC-32 of a chunk file's data region (everything after the header), read in blocks."""
    crc = 0
    with open(path, "rb") as f:
        f.seek(npyfile.HEADER_BYTES)
        while block := f.read(8 * 2**20):
            crc = zlib.crc32(block, crc)
    return crc


_M = TypeVar("_M", bound=Callable[..., Any])


def fault_checked(method: _M) -> _M:
    """A method of an object whose ``_ring`` it reads or writes through: a read or write that went past a
    truncated file's end (patched with zeros by the SIGBUS guard; a write went nowhere) raises
    ``CorruptStoreError`` instead of returning, also when the method failed on the zeros it found.
    ``check_faults`` inlined: this runs for every batch and every step."""

    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            ring = self._ring
            if counter[COUNT] != ring.faults_seen:
                ring.check_faults()

    return cast(_M, checked)

class ChunkRing:
    """Maps chunk files into per-column virtual ranges and gives ring-shaped numpy views."""

    def __init__(self, root: str, schema: Schema, positions: int, writable: bool) -> None:
        self.root = root
        self.schema = schema
        self.columns = columns_for(schema)
        self.rows_alloc = schema.rows_alloc
        self.writable = writable
        self.positions = 0
        self.mapped: dict[int, str] = {}  # seq -> chunk directory name
        self._rw: set[int] = set()  # chunks mapped writable (the open chunk)
        self._ranges: dict[str, VirtualRange] = {}
        self.arrays: dict[str, np.ndarray] = {}
        self.codec = schema.compression
        self.compressed: dict[int, int] = {}  # seq -> file size, chunks whose frames come from their compressed file
        self.frame_bytes = schema.frame_bytes
        self.cstride = 0
        if self.codec:
            self.cstride = -(-framefile.max_file_bytes(self.codec, schema.obs_dtype, schema.obs_shape,
                                                        schema.chunk_size) // PAGE) * PAGE
        self._crange: VirtualRange | None = None
        # (seq, column) -> (path, inode, size) of every mapped file, for ``check_intact``
        self._files: dict[tuple[int, str], tuple[str, int, int]] = {}
        self._check_at = 0  # where check_intact(most) goes on among the sealed chunks' files
        # The SIGBUS guard (``native/busguard.py``): its slots for this ring's ranges, the fault count as of
        # the last look (-1 once damaged; hot paths compare ``busguard.counter[COUNT]`` with it themselves and
        # call ``check_faults`` only when they differ), and, once a read faulted in a range, what to raise.
        self._guard_slots: list[int] = []
        self.faults_seen = busguard.count()
        self._damage: str | None = None
        self._allocate(positions)

    # -- geometry ---------------------------------------------------------------------------------------
    def _chunk_bytes(self, col: Column) -> int:
        """The ring's stride per chunk for a column (whole pages)."""
        return self.rows_alloc * col.row_bytes

    def _file_bytes(self, col: Column) -> int:
        """The mapped extent of a chunk file's data: its rows, rounded up to whole pages."""
        return -(-self.schema.chunk_size * col.row_bytes // PAGE) * PAGE

    def _allocate(self, positions: int) -> None:
        self.positions = positions
        for col in self.columns:
            rng = VirtualRange(positions * self._chunk_bytes(col))
            self._ranges[col.name] = rng
            self.arrays[col.name] = rng.array(col.dtype, (positions * self.rows_alloc, *col.shape), self.writable)
        # What the frame kernels read: per position its kind, and (compressed) where its record table
        # starts and its data ends in the file; the raw frames and the compressed files as flat bytes.
        self.frame_kind = np.full(positions, KIND_NONE, np.int8)
        self.comp_table = np.zeros(positions, np.int64)
        self.comp_end = np.zeros(positions, np.int64)
        self.raw_frames = self._ranges["obs"].array(np.dtype(np.uint8), (positions * self._chunk_bytes(self.columns[0]),),
                                                    False)
        if self.codec:
            self._crange = VirtualRange(positions * self.cstride)
            self.comp_bytes = self._crange.array(np.dtype(np.uint8), (positions * self.cstride,), False)
        else:
            self.comp_bytes = np.zeros(8, np.uint8)
        self.comp_words = self.comp_bytes.view(np.int64)
        for rng in [*self._ranges.values(), *([self._crange] if self._crange is not None else [])]:
            self._guard_slots.append(busguard.register(rng.addr, rng.nbytes, self.writable))

    def file_path(self, name: str, col: Column) -> str:
        return chunk_file(self.root, name, col.name)

    def compressed_path(self, name: str) -> str:
        if not self.codec:
            raise ValueError("this store keeps its frames raw")
        return compressed_file(self.root, name, self.codec)

    def delete_files(self, name: str) -> None:
        """Unlink a chunk's files (mappings of them, here or in readers, stay valid until unmapped)."""
        paths = [self.file_path(name, col) for col in self.columns]
        for path in paths + ([self.compressed_path(name)] if self.codec else []):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def delete_raw_frames(self, name: str) -> None:
        """Unlink a compressed chunk's raw frame file (once no commit refers to it)."""
        try:
            os.unlink(self.file_path(name, self.columns[0]))
        except FileNotFoundError:
            pass

    # -- chunk lifecycle --------------------------------------------------------------------------------
    def create_chunk(self, seq: int, sync_dir: bool = True) -> str:
        """Create (preallocated) files for a new chunk and map them writable. Returns the directory name.
        ``sync_dir=False``: the caller makes the new directory entries durable (``sync_dir()``) before a
        manifest names the chunk."""
        name = chunk_name(seq)
        try:
            for col in self.columns:
                npyfile.create(self.file_path(name, col), col.dtype, (self.schema.chunk_size, *col.shape))
            if sync_dir:
                self.sync_dir()
            self.map_chunk(seq, name, writable=True)
        except BaseException:
            if seq in self.mapped:
                self.unmap_chunk(seq)
            self.delete_files(name)
            raise
        return name

    def sync_dir(self) -> None:
        """fsync the chunks directory (the names of the files created in it)."""
        fsync_file(os.path.join(self.root, "chunks"))

    def map_chunk(self, seq: int, name: str, writable: bool, compressed_bytes: int | None = None) -> None:
        """Map chunk ``seq``'s files; with ``compressed_bytes`` (the manifest's size of its compressed frame
        file) its frames come from that file and its raw frame file is not needed."""
        if len(self.mapped) >= self.positions or (seq % self.positions) in {s % self.positions for s in self.mapped}:
            raise RuntimeError(f"ring position of chunk {seq} is taken")  # guarded by the caller
        pos = seq % self.positions
        for col in self.columns:
            if col.name == "obs" and compressed_bytes is not None:
                self._map_compressed(seq, name, compressed_bytes)
                continue
            path = self.file_path(name, col)
            try:
                fd = open_regular(path, os.O_RDWR if writable else os.O_RDONLY, "chunk file")
            except FileNotFoundError:
                raise CorruptStoreError(f"{path}: chunk file is missing") from None
            try:
                npyfile.check(path, col.dtype, (self.schema.chunk_size, *col.shape), fd)
                self._note_file(seq, col.name, path, fd)
                # Only the file's pages are mapped; the rest of the chunk's stride stays reserved.
                # Slots never index rows at or past chunk_size, so nothing reads beyond the file.
                self._ranges[col.name].map_file(pos * self._chunk_bytes(col), fd, npyfile.HEADER_BYTES,
                                                self._file_bytes(col), writable)
            finally:
                os.close(fd)
        if compressed_bytes is None:
            self.frame_kind[pos] = KIND_RAW
        self.mapped[seq] = name
        if writable:
            self._rw.add(seq)

    def _map_compressed(self, seq: int, name: str, nbytes: int) -> None:
        if self._crange is None:
            raise CorruptStoreError(f"{self.root}: the manifest lists compressed frames for chunk {name}, but"
                                    " its schema has no compression")
        pos = seq % self.positions
        path = self.compressed_path(name)
        try:
            fd = open_regular(path, os.O_RDONLY, "compressed frame file")
        except FileNotFoundError:
            raise CorruptStoreError(f"{path}: compressed frame file is missing") from None
        try:
            head, size = framefile.check_open(path, fd, self.codec or "", self.schema.obs_dtype, self.schema.obs_shape,
                                              self.schema.chunk_size, nbytes)
            self._note_file(seq, "obs", path, fd)
            self._crange.map_file(pos * self.cstride, fd, 0, -(-size // PAGE) * PAGE, False)
        finally:
            os.close(fd)
        self.comp_table[pos] = head
        self.comp_end[pos] = size - framefile.TRAILER
        self.frame_kind[pos] = KIND_LZ4
        self.compressed[seq] = size

    def _note_file(self, seq: int, column: str, path: str, fd: int) -> None:
        st = os.fstat(fd)
        self._files[(seq, column)] = (path, st.st_ino, st.st_size)

    def check_faults(self) -> None:
        """Raise ``CorruptStoreError`` when a read or write through this ring's mappings since the last call
        went past the end of a file (truncated by another process): the SIGBUS guard patched it with zeros,
        so what was read is not the data. Call it after every read or write through the mappings, before
        using the result; once raised it raises again at every call (the store stays damaged). Costs one
        integer comparison while no fault happened in the process."""
        if counter[COUNT] != self.faults_seen:
            self._faulted()

    def _faulted(self) -> None:
        if self._damage is None:
            now, addresses = busguard.since(self.faults_seen)
            if addresses is None:  # more faults than the log keeps: look at every file instead
                self.faults_seen = now
                try:
                    self._stat_files(list(self._files))
                except CorruptStoreError as exc:
                    self._damage, self.faults_seen = str(exc), -1
                    raise
                return
            for address in addresses:
                where = self._file_at(address)
                if where is not None:
                    self._damage = self._damage_message(where)
                    break
            else:
                self.faults_seen = now  # faults in other stores' mappings
                return
            self.faults_seen = -1  # every later check comes here and raises
        raise CorruptStoreError(self._damage)

    def _file_at(self, address: int) -> str | None:
        """The path of the mapped file holding ``address``, or None when it is not in this ring."""
        spans = [(rng, self._chunk_bytes(col), col.name) for col in self.columns
                 if (rng := self._ranges.get(col.name)) is not None]
        if self._crange is not None:
            spans.append((self._crange, self.cstride, "obs"))
        for rng, stride, column in spans:
            if rng.addr <= address < rng.addr + rng.nbytes and stride:
                pos = (address - rng.addr) // stride
                for seq in self.mapped:
                    if seq % self.positions == pos and (seq, column) in self._files:
                        return self._files[(seq, column)][0]
                return f"{self.root} (a chunk no longer mapped)"
        return None

    def _damage_message(self, path: str) -> str:
        try:
            size = f"{os.stat(path).st_size:,} bytes"
        except OSError:
            size = "a size unknown"
        return (f"{path}: truncated (now {size}) while this process had it mapped: a read or write past its new"
                " end found no data (without the SIGBUS guard the process would have died). Another process"
                " changed a file of the store: stop every process using the store, run `mmreplay verify"
                f" {self.root}` and restore the store from a copy or a snapshot")

    def check_intact(self, most: int | None = None) -> None:
        """Refuse (``CorruptStoreError``) when a mapped file was truncated since it was mapped (by another
        process: reading its mapping past the new end would kill this one with SIGBUS). One ``stat`` per
        file checked: the open chunk's every time, then ``most`` others (None: all) in turn, so a commit
        costs O(1) here and every file is checked within a bounded number of commits. A file whose path
        now names another inode (a writer retired or replaced it) is not this store's to judge: the
        mapping keeps the old inode whole."""
        self.check_faults()
        keys = list(self._files)
        first = [k for k in keys if k[0] in self._rw]
        rest = [k for k in keys if k[0] not in self._rw]
        if most is not None and len(rest) > most:
            start = self._check_at % len(rest)
            rest = (rest + rest)[start:start + most]
            self._check_at = start + most
        self._stat_files(first + rest)

    def _stat_files(self, keys: list[tuple[int, str]]) -> None:
        for key in keys:
            path, ino, size = self._files[key]
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if st.st_ino == ino and st.st_size < size:
                raise CorruptStoreError(
                    f"{path}: truncated to {st.st_size:,} bytes while this store had it mapped ({size:,} expected);"
                    " another process changed a file of the store, and reading it now would crash this one"
                    " (SIGBUS). Stop every process using the store, run `mmreplay verify"
                    f" {self.root}` and restore the store from a copy or a snapshot")

    def unmap_chunk(self, seq: int) -> None:
        pos = seq % self.positions
        for col in self.columns:
            self._files.pop((seq, col.name), None)
        for col in self.columns:
            cb = self._chunk_bytes(col)
            self._ranges[col.name].release(pos * cb, cb)
        if self.compressed.pop(seq, None) is not None and self._crange is not None:
            self._crange.release(pos * self.cstride, self.cstride)
        self.frame_kind[pos] = KIND_NONE
        del self.mapped[seq]
        self._rw.discard(seq)

    # -- compressed frames ------------------------------------------------------------------------------
    def compress_chunk(self, seq: int) -> dict[str, Any] | None:
        """Write the compressed frame file of sealed chunk ``seq`` (durably) and return its manifest entry,
        or None when its frames do not shrink enough (``framefile.MIN_SAVING``): it stays raw.

        Runs in the background sealer: it only reads the chunk's mapped raw frames. Raises ``OSError``
        (a full disk); nothing is left behind then. Neither the file nor its name is durable yet: the
        caller fsyncs both (``sync_sealed``, ``sync_dir``) before a manifest names it.
        """
        if not self.codec:
            raise ValueError("this store keeps its frames raw")
        name = self.mapped[seq]
        cb = self._chunk_bytes(self.columns[0])
        start = (seq % self.positions) * cb
        raw = self.raw_frames[start:start + self.schema.chunk_size * self.frame_bytes]
        got = framefile.write(self.compressed_path(name), raw, self.schema.chunk_size, self.schema.obs_dtype,
                              self.schema.obs_shape, self.codec, min_saving=framefile.MIN_SAVING, durable=False)
        return None if got is None else framefile.describe(self.codec, *got)

    def use_compressed(self, seq: int, nbytes: int) -> None:
        """Read sealed chunk ``seq``'s frames from its compressed file from now on, and unmap its raw frames.

        Nothing may be reading the raw frames meanwhile (the caller waits for background readers first).
        """
        pos = seq % self.positions
        self._map_compressed(seq, self.mapped[seq], nbytes)  # (its entry replaces the raw file's)
        cb = self._chunk_bytes(self.columns[0])
        self._ranges["obs"].release(pos * cb, cb)

    def name_at(self, slot: int) -> str:
        """The chunk name holding ``slot`` (for error messages), or ``"?"``."""
        pos = slot // self.rows_alloc
        for seq, name in self.mapped.items():
            if seq % self.positions == pos:
                return name
        return "?"

    def frames_file(self, slot: int) -> str:
        """Path of the file ``slot``'s frame is read from (for error messages)."""
        name = self.name_at(slot)
        pos = slot // self.rows_alloc
        if 0 <= pos < self.positions and self.frame_kind[pos] == KIND_LZ4:
            return self.compressed_path(name)
        return self.file_path(name, self.columns[0])

    def read_ahead_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """Address ranges ``(starts, ends)`` of every compressed frame file and every small column file
        mapped (not raw frames): what a cold reader of a compressed store reads ahead."""
        spans = []
        for seq in sorted(self.mapped):
            pos = seq % self.positions
            if seq in self.compressed:
                spans.append((self.comp_bytes.ctypes.data + pos * self.cstride, self.compressed[seq]))
            for col in self.columns[1:]:
                cb = self._chunk_bytes(col)
                spans.append((self.arrays[col.name].ctypes.data + pos * cb, self._file_bytes(col)))
        starts = np.array([a for a, _ in spans], np.int64)
        return starts, starts + np.array([n for _, n in spans], np.int64)

    def touch(self) -> None:
        """Read one byte per page of every mapped file (benchmarks: page tables populated, pages cached)."""
        for seq in list(self.mapped):
            pos = seq % self.positions
            for col in self.columns:
                if col.name == "obs" and seq in self.compressed:
                    span = self.comp_bytes[pos * self.cstride:pos * self.cstride + self.compressed[seq]]
                else:
                    cb = self._chunk_bytes(col)
                    span = self._ranges[col.name].bytes_view(pos * cb, self._file_bytes(col))
                span[::PAGE].sum()

    def sync_chunk(self, seq: int, frames: bool = True) -> None:
        """Write the chunk's dirty pages to disk: ``fsync`` of each column file (``frames=False``: all but
        the raw frames).

        Pages dirtied through a shared mapping are tracked by the page cache (write-notify
        faults), so ``fsync`` on the file covers them; no separate ``msync`` is needed.
        """
        name = self.mapped[seq]
        for col in self.columns if frames else self.columns[1:]:
            fsync_file(self.file_path(name, col))

    def protect_chunk(self, seq: int) -> None:
        """Make a full chunk's mappings read-only: nothing may write a sealed chunk again."""
        pos = seq % self.positions
        for col in self.columns:
            self._ranges[col.name].protect_readonly(pos * self._chunk_bytes(col), self._file_bytes(col))
        self._rw.discard(seq)

    def finish_seal(self, seq: int) -> dict[str, int]:
        """Checksum a protected chunk: mark its files read-only and return each column's CRC-32. Its files
        are made durable later, by ``sync_sealed`` (before a manifest names the chunk sealed).

        In a compressed store the raw frames are left out (not fsynced, no CRC-32): the commit that
        lists the sealed chunk lists its compressed frame file, which is durable and checksummed itself
        (and checked to decode to these frames), so the raw file is only ever read until then; it is
        usually deleted before its dirty pages reach the disk.
        Thread-safe with respect to the writer as long as the chunk stays mapped: it only reads.
        """
        name = self.mapped[seq]
        pos = seq % self.positions
        crcs = {}
        for col in self.columns[1:] if self.codec else self.columns:
            view = self._ranges[col.name].bytes_view(pos * self._chunk_bytes(col), self.schema.chunk_size * col.row_bytes)
            crcs[col.name] = zlib.crc32(view.data)
            os.chmod(self.file_path(name, col), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        return crcs

    def sync_sealed(self, name: str, compressed: bool) -> None:
        """fsync the files of sealed chunk ``name`` that a manifest will name: every column but a compressed
        store's raw frames (``finish_seal_frames`` syncs those of a chunk left raw), and its compressed frame
        file (``compressed``). It need not be mapped any more."""
        for col in self.columns[1:] if self.codec else self.columns:
            fsync_file(self.file_path(name, col))
        if compressed:
            fsync_file(self.compressed_path(name))

    def finish_seal_frames(self, seq: int) -> dict[str, int]:
        """``finish_seal`` for the raw frames alone (a compressed store whose chunk could not be compressed)."""
        col = self.columns[0]
        fsync_file(self.file_path(self.mapped[seq], col))
        cb = self._chunk_bytes(col)
        view = self._ranges[col.name].bytes_view((seq % self.positions) * cb, self.schema.chunk_size * col.row_bytes)
        os.chmod(self.file_path(self.mapped[seq], col), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        return {col.name: zlib.crc32(view.data)}

    def resize(self, positions: int) -> None:
        """Move to a ring with more positions: every mapped chunk is remapped at ``seq % positions``."""
        mapped, rw, compressed = dict(self.mapped), set(self._rw), dict(self.compressed)
        self.close()
        self._allocate(positions)
        for seq, name in sorted(mapped.items()):
            self.map_chunk(seq, name, writable=seq in rw, compressed_bytes=compressed.get(seq))

    def close(self) -> None:
        self.arrays = {}
        for slot in self._guard_slots:  # before unmapping: the addresses may be reused by other mappings
            busguard.unregister(slot)
        self._guard_slots = []
        for rng in self._ranges.values():
            rng.close()
        if self._crange is not None:
            self._crange.close()
            self._crange = None
        self._ranges = {}
        self.mapped = {}
        self.compressed = {}
        self._files = {}
        self._rw = set()
