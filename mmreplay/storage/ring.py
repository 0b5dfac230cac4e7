"""Chunk files of every column, mapped into one ring-shaped array per column.

A chunk is one ``.npy`` file per column, ``chunks/<name>.<column>.npy``,
each with ``chunk_size`` rows (all chunks share the one ``chunks/`` directory,
so making a new chunk durable costs one directory fsync). In the ring each
chunk gets a stride of ``rows_alloc`` rows (``chunk_size`` rounded up to 4096,
so every column's stride is whole pages); only the file's own pages are mapped. Chunk ``seq`` lives at ring position
``seq % positions``; row ``r`` of that chunk is element
``position * rows_alloc + r`` of the column's ring array. Only mapped chunks
may be indexed (the rest of the range is inaccessible reserved space).
"""

from __future__ import annotations

import functools
import os
import stat
import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptStoreError
from ..options import Schema
from . import npyfile
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


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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

    def file_path(self, name: str, col: Column) -> str:
        return chunk_file(self.root, name, col.name)

    def delete_files(self, name: str) -> None:
        """Unlink a chunk's files (mappings of them, here or in readers, stay valid until unmapped)."""
        for col in self.columns:
            try:
                os.unlink(self.file_path(name, col))
            except FileNotFoundError:
                pass

    # -- chunk lifecycle --------------------------------------------------------------------------------
    def create_chunk(self, seq: int) -> str:
        """Create (preallocated) files for a new chunk and map them writable. Returns the directory name."""
        name = chunk_name(seq)
        try:
            for col in self.columns:
                npyfile.create(self.file_path(name, col), col.dtype, (self.schema.chunk_size, *col.shape))
            fsync_path(os.path.join(self.root, "chunks"))
            self.map_chunk(seq, name, writable=True)
        except BaseException:
            if seq in self.mapped:
                self.unmap_chunk(seq)
            self.delete_files(name)
            raise
        return name

    def map_chunk(self, seq: int, name: str, writable: bool) -> None:
        if len(self.mapped) >= self.positions or (seq % self.positions) in {s % self.positions for s in self.mapped}:
            raise RuntimeError(f"ring position of chunk {seq} is taken")  # guarded by the caller
        pos = seq % self.positions
        for col in self.columns:
            path = self.file_path(name, col)
            try:
                fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
            except FileNotFoundError:
                raise CorruptStoreError(f"{path}: chunk file is missing") from None
            try:
                npyfile.check(path, col.dtype, (self.schema.chunk_size, *col.shape), fd)
                # Only the file's pages are mapped; the rest of the chunk's stride stays reserved.
                # Slots never index rows at or past chunk_size, so nothing reads beyond the file.
                self._ranges[col.name].map_file(pos * self._chunk_bytes(col), fd, npyfile.HEADER_BYTES,
                                                self._file_bytes(col), writable)
            finally:
                os.close(fd)
        self.mapped[seq] = name
        if writable:
            self._rw.add(seq)

    def unmap_chunk(self, seq: int) -> None:
        pos = seq % self.positions
        for col in self.columns:
            cb = self._chunk_bytes(col)
            self._ranges[col.name].release(pos * cb, cb)
        del self.mapped[seq]
        self._rw.discard(seq)

    def sync_chunk(self, seq: int) -> None:
        """Write the chunk's dirty pages to disk: ``fsync`` of each column file.

        Pages dirtied through a shared mapping are tracked by the page cache (write-notify
        faults), so ``fsync`` on the file covers them; no separate ``msync`` is needed.
        """
        name = self.mapped[seq]
        for col in self.columns:
            fsync_path(self.file_path(name, col))

    def protect_chunk(self, seq: int) -> None:
        """Make a full chunk's mappings read-only: nothing may write a sealed chunk again."""
        pos = seq % self.positions
        for col in self.columns:
            self._ranges[col.name].protect_readonly(pos * self._chunk_bytes(col), self._file_bytes(col))
        self._rw.discard(seq)

    def finish_seal(self, seq: int) -> dict[str, int]:
        """fsync a protected chunk, mark its files read-only and return each column's CRC-32.

        Thread-safe with respect to the writer as long as the chunk stays mapped: it only reads.
        """
        self.sync_chunk(seq)
        name = self.mapped[seq]
        pos = seq % self.positions
        crcs = {}
        for col in self.columns:
            view = self._ranges[col.name].bytes_view(pos * self._chunk_bytes(col), self.schema.chunk_size * col.row_bytes)
            crcs[col.name] = zlib.crc32(view.data)
            os.chmod(self.file_path(name, col), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        return crcs

    def resize(self, positions: int) -> None:
        """Move to a ring with more positions: every mapped chunk is remapped at ``seq % positions``."""
        mapped, rw = dict(self.mapped), set(self._rw)
        self.close()
        self._allocate(positions)
        for seq, name in sorted(mapped.items()):
            self.map_chunk(seq, name, writable=seq in rw)

    def close(self) -> None:
        self.arrays = {}
        for rng in self._ranges.values():
            rng.close()
        self._ranges = {}
        self.mapped = {}
        self._rw = set()
