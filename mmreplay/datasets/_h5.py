"""HDF5 datasets written front to back a whole chunk at a time, compressed on every core.

h5py compresses chunks in the calling thread. ``H5Column`` instead hands each full
chunk to a thread pool (zlib releases the GIL) and writes the results in order with
``write_direct_chunk``; the file's filter pipeline is the ordinary ``deflate`` one,
so any HDF5 reader decodes it. Other compressions (``lzf``, none) go through h5py.
"""

from __future__ import annotations

import os
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .._inputs import cast_losses
from .errors import DatasetError

COMPRESSIONS = ("gzip", "lzf", "none")


def dataset_options(compression: str | None, level: int | None) -> dict[str, Any]:
    """``create_dataset`` keyword arguments for ``compression`` (``"gzip"``, ``"lzf"``, ``None``)."""
    c = "none" if compression is None else str(compression).lower()
    if c == "none":
        return {}
    if c == "gzip":
        lv = 1 if level is None else int(level)
        if not 0 <= lv <= 9:
            raise ValueError(f"level: gzip levels are 0..9, got {level!r}")
        return {"compression": "gzip", "compression_opts": lv}
    if c == "lzf":
        return {"compression": "lzf"}
    raise ValueError(f"compression: expected one of {', '.join(COMPRESSIONS)} (or None), got {compression!r}")


def pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, os.cpu_count() or 1), thread_name_prefix="mmreplay-deflate")


class H5Column:
    """Append rows to a chunked HDF5 dataset (chunked along the first axis only)."""

    def __init__(self, ds: Any, executor: ThreadPoolExecutor, inflight: int = 8) -> None:
        self.ds = ds
        self.size = int(ds.shape[0])
        self.rows = int(ds.chunks[0]) if ds.chunks else max(1, self.size)
        self.executor = executor
        self.inflight = inflight
        self.direct = ds.chunks is not None and ds.compression in (None, "gzip") and not ds.shuffle
        self.level = int(ds.compression_opts) if ds.compression == "gzip" else None
        self.buf = np.zeros((self.rows, *ds.shape[1:]), ds.dtype)
        self.fill = 0
        self.base = 0
        self.pending: deque[tuple[int, Future[bytes] | None, bytes | None]] = deque()

    def append(self, values: np.ndarray) -> None:
        i = 0
        while i < len(values):
            take = min(len(values) - i, self.rows - self.fill)
            self.buf[self.fill:self.fill + take] = values[i:i + take]
            self.fill += take
            i += take
            if self.fill == self.rows:
                self._submit()

    def _submit(self) -> None:
        n = self.fill
        if not self.direct:
            self.ds[self.base:self.base + n] = self.buf[:n]
        else:
            if n < self.rows:
                self.buf[n:] = 0  # an edge chunk is stored whole
            raw = self.buf.tobytes()
            if self.level is None:
                self.pending.append((self.base, None, raw))
            else:
                self.pending.append((self.base, self.executor.submit(zlib.compress, raw, self.level), None))
            while len(self.pending) > self.inflight:
                self._write_one()
        self.base += n
        self.fill = 0

    def _write_one(self) -> None:
        base, fut, raw = self.pending.popleft()
        data = fut.result() if fut is not None else raw
        self.ds.id.write_direct_chunk((base,) + (0,) * (self.ds.ndim - 1), data)

    def close(self) -> None:
        if self.fill:
            self._submit()
        while self.pending:
            self._write_one()


def row_reader(ds: Any, where: str) -> Any:
    """``fetch(a, b)`` -> rows ``[a, b)`` of a dataset chunked along its first axis; errors name ``where``
    (the file's path or URL: h5py's filename of a remote file is its file object).

    Deflate-only (or unfiltered) chunks are read raw and inflated with zlib, which releases the
    GIL (h5py's own reads hold it), so a read-ahead thread really runs beside the consumer.
    Other layouts are read through h5py.
    """
    shape = tuple(ds.shape)
    raw_ok = (ds.chunks is not None and tuple(ds.chunks[1:]) == shape[1:] and ds.compression in (None, "gzip")
              and not ds.shuffle and not ds.fletcher32 and ds.scaleoffset is None)
    if not raw_ok:
        return lambda a, b: np.asarray(ds[a:b])
    rows = int(ds.chunks[0])
    tail = (0,) * (len(shape) - 1)
    deflate = ds.compression == "gzip"
    chunk_bytes = rows * int(np.prod(shape[1:], dtype=np.int64)) * ds.dtype.itemsize

    def inflate(raw: bytes, c: int, compressed: bool) -> bytes:
        """A chunk's data, never more than the chunk's size (a forged chunk cannot inflate further)."""
        data = zlib.decompressobj().decompress(raw, chunk_bytes + 1) if compressed else raw
        if len(data) != chunk_bytes:
            raise DatasetError(f"{where}: dataset {ds.name!r}: the chunk at row {c:,} holds {len(data):,}"
                               f" bytes{'+' if len(data) > chunk_bytes else ''}, expected {chunk_bytes:,}; the"
                               " file is damaged")
        return data

    def fetch(a: int, b: int) -> np.ndarray:
        out = np.empty((b - a, *shape[1:]), ds.dtype)
        for c in range(a // rows * rows, b, rows):
            try:
                mask, raw = ds.id.read_direct_chunk((c, *tail))
            except (KeyError, OSError, ValueError):  # e.g. a chunk never written: let h5py fill it
                lo, hi = max(a, c), min(b, c + rows)
                out[lo - a:hi - a] = ds[lo:hi]
                continue
            try:
                data = inflate(raw, c, deflate and not mask & 1)
            except zlib.error as exc:
                raise DatasetError(f"{where}: dataset {ds.name!r}: corrupt chunk at row {c:,}"
                                   f" ({exc})") from None
            chunk = np.frombuffer(data, ds.dtype).reshape((rows, *shape[1:]))
            lo, hi = max(a, c), min(b, c + rows)
            out[lo - a:hi - a] = chunk[lo - c:hi - c]
        return out

    return fetch


def read_rows(ds: Any, where: str, rows: Any = ()) -> np.ndarray:
    """``ds[rows]`` (all of it by default) as an array; a read h5py cannot make (a damaged chunk) raises
    ``DatasetError`` naming the file (``where``: its path or URL) and the dataset, where h5py's own error
    names neither."""
    try:
        return np.asarray(ds[rows])
    except OSError as exc:
        raise DatasetError(f"{where}: dataset {ds.name!r}: cannot be read ({exc}); the file is"
                           " damaged") from None


def exact(values: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """``values`` as ``dtype``, where the cast keeps every value (floats to a narrower float: rounded, never
    overflowing); else ``DatasetError``. A cast that would wrap integers or drop a fraction is what a damaged or
    mislabelled dataset looks like, never data to import."""
    dtype = np.dtype(dtype)
    if values.dtype == dtype:
        return values
    lost = cast_losses(values, dtype)
    out = values.astype(dtype)
    if values.dtype.kind in "biu" and dtype.kind == "f":  # (an integer must stay exact, not only finite)
        lost |= out.astype(values.dtype) != values
    if lost.any():
        raise DatasetError(f"{what}: values of dtype {values.dtype} that {dtype} cannot hold as they are (the dataset"
                           f" says {dtype}); the dataset is damaged or its dtypes do not match its description")
    return out
