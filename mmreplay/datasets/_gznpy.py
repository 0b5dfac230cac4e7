"""Gzip'd ``.npy`` files read as a stream of rows, never whole.

Dopamine writes each replay column with ``np.save`` into a ``GzipFile``: 7 GB of
frames per observation file in the DQN Replay Dataset. ``GzNpy`` parses the
``.npy`` header with numpy's own header reader (no pickle: object dtypes are
refused; a header longer than numpy writes is refused before it is read), checks
that the declared shape fits what the gzip file can hold (deflate expands at most
~1032x) and then inflates only as many bytes as the rows asked for, across as many
gzip members as the file holds (``cat a.gz b.gz`` is one stream);
``read_value(most=)`` refuses a small file declaring more than it should hold.
``RowBlocks`` does that in a background thread (zlib releases the GIL), handing
over blocks of rows through a short queue, so decompression overlaps the
consumer's work and memory stays at a few blocks.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._bounds import check_inflated, check_row
from ._location import Location
from .errors import DatasetError, DatasetNotFoundError

_READ = 1 << 20  # compressed bytes read from the file at a time
# the most one header read may ask for: numpy refuses headers past 10,000 bytes unless told otherwise
_HEADER_MOST = 1 << 16


class GzNpy:
    """One gzip'd ``.npy`` file: ``shape``, ``dtype``, then ``read_rows``/``skip_rows`` front to back.

    ``key`` names the array in error messages (e.g. ``"$store$_observation"``). Raises
    ``DatasetNotFoundError`` (missing file) or ``DatasetError`` (not gzip, not ``.npy``, object
    dtype, truncated or corrupt data), each naming the file.
    """

    def __init__(self, path: Location | str, key: str) -> None:
        loc = Location.of(path)
        self.path = str(loc)
        self.key = key
        try:
            self._f = loc.open("rb")  # a local file, or a remote one streamed in blocks
        except FileNotFoundError:
            raise DatasetNotFoundError(f"{loc}: missing ({key})") from None
        try:
            if self._f.read(2) != b"\x1f\x8b":
                raise DatasetError(f"{path}: not a gzip file ({key}); expected a gzip'd .npy file as Dopamine writes")
            self._f.seek(0)
            self._dz = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self._in = b""
            self._eof = False  # the last gzip member ended (its CRC and length were checked by zlib)
            self.shape, self.dtype = self._header()
            self.row_shape = tuple(self.shape[1:])
            self.row_bytes = check_row(self.path, key, self.row_shape, self.dtype)
            check_inflated(self.path, key, self.shape, self.dtype, loc.size(), "a gzip file")
        except BaseException:
            self._f.close()
            raise
        self.rows = int(self.shape[0]) if self.shape else 1  # a 0-d array is read as one row
        self.pos = 0  # rows consumed

    # -- header ---------------------------------------------------------------------------------------
    def read(self, n: int) -> bytes:
        """File-like read of the inflated stream (used by numpy's header parser).

        A header declares its own length (up to 4 GiB in a version 2 header), which numpy's parser
        reads before checking it: larger reads than any header numpy writes or reads by default are
        refused before anything is allocated.
        """
        if n > _HEADER_MOST:
            raise DatasetError(f"{self.path}: not a .npy file inside the gzip stream ({self.key}): its header"
                               f" declares {n:,} bytes; expected at most {_HEADER_MOST:,} as np.save writes")
        buf = bytearray(n)
        got = self._inflate_into(memoryview(buf))
        return bytes(buf[:got])

    def _header(self) -> tuple[tuple[int, ...], np.dtype]:
        fmt = np.lib.format
        try:
            version = fmt.read_magic(self)  # type: ignore[arg-type]
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(self)  # type: ignore[arg-type]
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = fmt.read_array_header_2_0(self)  # type: ignore[arg-type]
            else:
                raise ValueError(f"unsupported .npy version {version}")
        except DatasetError:
            raise
        except (ValueError, SyntaxError, EOFError, OSError, zlib.error) as exc:
            raise DatasetError(f"{self.path}: not a .npy file inside the gzip stream ({self.key}): {exc}") from None
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise DatasetError(f"{self.path}: holds Python objects ({self.key}, dtype {dtype}); reading it would"
                               " need unpickling, which mmreplay never does")
        if fortran and len(shape) > 1:
            raise DatasetError(f"{self.path}: Fortran-ordered array ({self.key}); expected C order as np.save writes")
        return tuple(int(s) for s in shape), dtype

    # -- data -----------------------------------------------------------------------------------------
    def _inflate_into(self, mv: memoryview) -> int:
        pos = 0
        need = len(mv)
        while pos < need and not self._eof:
            data = self._in or self._f.read(_READ)
            self._in = b""
            if not data:
                break  # the file ended inside a gzip member: truncated
            try:
                out = self._dz.decompress(data, need - pos)
            except zlib.error as exc:
                raise DatasetError(f"{self.path}: corrupt gzip data ({self.key}): {exc}") from None
            mv[pos:pos + len(out)] = out
            pos += len(out)
            self._in = self._dz.unconsumed_tail
            if self._dz.eof:  # end of a gzip member: another may follow
                self._next_member()
        return pos

    def _next_member(self) -> None:
        """After a member's end: start the next one, or end the stream at the end of the file. Zero bytes
        between or after members are skipped (padding); any other bytes that do not start a gzip member are
        damage, refused as Python's gzip refuses them."""
        # the bytes past the member are in unused_data; unconsumed_tail may hold the same bytes again
        # (a decompress limited by max_length that reached the member's end), so it is not added
        rest = self._dz.unused_data.lstrip(b"\0")
        while len(rest) < 2:  # decide on the magic only once two bytes are there, reading on if needed
            more = self._f.read(_READ)
            if not more:
                break
            rest = (rest + more).lstrip(b"\0")
        if rest[:2] == b"\x1f\x8b":
            self._dz = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self._in = rest
        elif rest:
            raise DatasetError(f"{self.path}: bytes after a gzip member that start no other ({self.key}:"
                               f" {bytes(rest[:8])!r}...); expected another member or the end of the file. The"
                               " file is damaged (Python's gzip refuses it too): copy it again from its source")
        else:
            self._in = b""
            self._eof = True

    def read_into(self, out: np.ndarray) -> None:
        """Fill ``out`` (``n`` rows, C-contiguous, this file's row shape and dtype) with the next rows."""
        n = len(out)
        if self.pos + n > self.rows:
            raise ValueError(f"{self.path}: asked for rows up to {self.pos + n}, the array has {self.rows}")
        mv = out.reshape(-1).view(np.uint8).data
        got = self._inflate_into(mv)
        if got < len(mv):
            done = self.pos + got // max(self.row_bytes, 1)
            raise DatasetError(f"{self.path}: truncated ({self.key}): the data ends after {done:,} of"
                               f" {self.rows:,} rows")
        self.pos += n

    def read_rows(self, n: int) -> np.ndarray:
        out = np.empty((n, *self.row_shape), self.dtype)
        self.read_into(out)
        return out

    def read_all(self) -> np.ndarray:
        """The remaining rows (for the small columns), checking that the stream ends with them."""
        out = self.read_rows(self.rows - self.pos)
        self.check_end()
        return out

    def read_value(self, most: int) -> np.ndarray:
        """The whole array in its own shape (for the small files: counters, ranges), which must declare at
        most ``most`` elements: checked before anything is inflated."""
        count = math.prod(self.shape)
        if count > most:
            raise DatasetError(f"{self.path}: {self.key} declares {self.shape} {self.dtype} ({count:,} values);"
                               f" expected at most {most:,}: the file is not what Dopamine writes")
        return self.read_all().reshape(self.shape)

    def skip_rows(self, n: int, block: int = 1 << 24) -> None:
        scratch = np.empty(max(1, min(n * max(self.row_bytes, 1), block)), np.uint8)
        left = n * self.row_bytes
        while left:
            take = min(left, scratch.size)
            got = self._inflate_into(scratch[:take].data)
            if got < take:
                raise DatasetError(f"{self.path}: truncated ({self.key}): the data ends before row"
                                   f" {self.pos + n:,} of {self.rows:,}")
            left -= take
        self.pos += n

    def check_end(self) -> None:
        """After the last row: the gzip stream must end there (its CRC is checked by zlib)."""
        extra = bytearray(1)
        if self._inflate_into(memoryview(extra)):
            raise DatasetError(f"{self.path}: more data than its .npy header declares ({self.key})")
        if not self._eof:
            raise DatasetError(f"{self.path}: truncated ({self.key}): the gzip stream ends without its trailer")

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> GzNpy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RowBlocks:
    """Rows ``[lo, hi)`` of a gzip'd ``.npy`` file as blocks of at most ``block`` rows, inflated ahead in a thread.

    Iterate it once; ``close()`` (or leaving a ``with`` block) stops the thread early.
    """

    _END = object()

    def __init__(self, path: Location | str, key: str, lo: int, hi: int, block: int = 1024, depth: int = 3) -> None:
        self.path, self.key, self.lo, self.hi, self.block = path, key, lo, hi, max(1, block)
        self._q: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mmreplay-inflate", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            with GzNpy(self.path, self.key) as gz:
                if self.hi > gz.rows:
                    raise DatasetError(f"{self.path}: has {gz.rows:,} rows ({self.key}), rows up to {self.hi:,}"
                                       " were expected")
                step = max(1, (64 << 20) // max(gz.row_bytes, 1))
                for a in range(0, self.lo, step):  # skipping can take seconds: stay stoppable
                    if self._stop.is_set():
                        return
                    gz.skip_rows(min(step, self.lo - a))
                pos = self.lo
                while pos < self.hi and not self._stop.is_set():
                    n = min(self.block, self.hi - pos)
                    if not self._put(gz.read_rows(n)):
                        return
                    pos += n
                if pos == gz.rows:
                    gz.check_end()
            self._put(self._END)
        except BaseException as exc:  # handed to the consumer
            self._put(exc)

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            item = self._q.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self._q.get_nowait()
        self._thread.join()

    def __enter__(self) -> RowBlocks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
