"""Compressed frame files: the frames of one sealed chunk, each compressed on its own.

Layout (integers little-endian; FORMAT.md "Compressed frame files" is the specification)::

    offset      size   content
    0           8      magic b"MMRFRAME"
    8           4      H: header size in bytes (a multiple of 16)
    12          H-12   JSON object padded with spaces: format_version, codec, dtype, shape, frames
    H           16 N   one record per frame: entry offset (u64, from the file's start),
                       entry length (u32), CRC-32C of the entry's bytes (u32)
    H + 16 N    ...    the entries, back to back
    size - 4    4      CRC-32C of every byte before it

An entry is the frame's raw bytes when its length equals the frame size (it did not shrink),
otherwise the frame in numcodecs' LZ4 framing (4-byte little-endian frame size, then an LZ4 block).
Records come first and entries are independent, so any frame can be read with two small reads.

Writing goes to ``<path>.tmp`` (fsynced, then renamed and the directory fsynced), so a complete file
at ``path`` is durable and a crash leaves at most a ``.tmp`` file, which the next writer deletes.
``encode``/``decode`` here use numcodecs' LZ4 (the reference path: tests, and stores opened where
numba is missing); the chunk sealer uses ``mmreplay.native.lz4_encode``, the batch reader
``mmreplay.native.lz4``.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from typing import Any

import google_crc32c
import numpy as np

from .. import codecs
from ..errors import CorruptStoreError
from ..native import jit_enabled
from .files import create_exclusive
from .manifest import fsync_dir

MAGIC = b"MMRFRAME"
VERSION = 1
RECORD = np.dtype([("offset", "<u8"), ("length", "<u4"), ("crc", "<u4")])
TRAILER = 4
# The sealer decodes every CHECK_EVERY-th frame it encoded (and the last) and compares it with the raw
# frame before the file is used: a cheap guard against an encoder bug (decoding every frame would cost a
# large share of the sealer's CPU: BENCHMARKS.md, "Figures behind the code"); the encoder itself is
# tested against python-lz4 and numcodecs.
CHECK_EVERY = 16
# A sealed chunk whose frames would not shrink by MIN_SAVING keeps its raw frame file (decoding
# would cost CPU for nothing), judged first on its first PROBE_FRAMES frames so that incompressible
# frames (noise) cost little encoding.
MIN_SAVING = 0.1
PROBE_FRAMES = 256
log = logging.getLogger(__name__)


def _header_json(codec: str, dtype: np.dtype, shape: tuple[int, ...], frames: int) -> bytes:
    return json.dumps({"format_version": VERSION, "codec": codec, "dtype": dtype.str, "shape": list(shape),
                       "frames": frames}, separators=(", ", ": ")).encode()


def header_size(codec: str, dtype: np.dtype, shape: tuple[int, ...], frames: int) -> int:
    return -(-(12 + len(_header_json(codec, dtype, shape, frames))) // 16) * 16


def header(codec: str, dtype: np.dtype, shape: tuple[int, ...], frames: int) -> bytes:
    body = _header_json(codec, dtype, shape, frames)
    size = header_size(codec, dtype, shape, frames)
    return MAGIC + size.to_bytes(4, "little") + body + b" " * (size - 12 - len(body))


def max_file_bytes(codec: str, dtype: np.dtype, shape: tuple[int, ...], frames: int) -> int:
    """The largest file ``frames`` frames can make (every entry stored raw)."""
    frame_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return header_size(codec, dtype, shape, frames) + frames * (RECORD.itemsize + frame_bytes) + TRAILER


def parse_header(path: str, head: bytes, codec: str, dtype: np.dtype, shape: tuple[int, ...],
                 frames: int) -> int:
    """Check a file's header against what the store expects; return the header size H."""
    if len(head) < 16 or head[:8] != MAGIC:
        raise CorruptStoreError(f"{path}: not an mmreplay compressed frame file (bad magic)")
    size = int.from_bytes(head[8:12], "little")
    if size % 16 or size > len(head):
        raise CorruptStoreError(f"{path}: bad header size {size}")
    try:
        meta = json.loads(head[12:size].decode("ascii"))
        got = (meta["codec"], np.dtype(meta["dtype"]), tuple(int(v) for v in meta["shape"]), int(meta["frames"]))
        version = int(meta["format_version"])
    except Exception as exc:  # any parse problem means a damaged header
        raise CorruptStoreError(f"{path}: unreadable compressed frame header ({exc})") from None
    if version > VERSION:
        raise CorruptStoreError(f"{path}: compressed frame format version {version}; this mmreplay reads"
                                f" up to {VERSION}: upgrade mmreplay")
    if got != (codec, dtype, tuple(shape), frames):
        raise CorruptStoreError(f"{path}: holds {got[3]} frames {got[1]}{list(got[2])} coded {got[0]!r}; the"
                                f" manifest expects {frames} frames {dtype}{list(shape)} coded {codec!r}")
    return size


def check_open(path: str, fd: int, codec: str, dtype: np.dtype, shape: tuple[int, ...], frames: int,
               nbytes: int | None) -> tuple[int, int]:
    """Check an open file (header, and size against the manifest's ``nbytes``); return ``(H, size)``."""
    size = os.fstat(fd).st_size
    if nbytes is not None and size != nbytes:
        raise CorruptStoreError(f"{path}: file is {size} bytes, the manifest records {nbytes} (truncated or"
                                " extended)")
    if size > max_file_bytes(codec, dtype, shape, frames):
        raise CorruptStoreError(f"{path}: file is {size} bytes, more than {frames} frames can take")
    h = parse_header(path, os.pread(fd, min(size, 4096), 0), codec, dtype, shape, frames)
    if size < h + frames * RECORD.itemsize + TRAILER:
        raise CorruptStoreError(f"{path}: file is {size} bytes, too short for its {frames} frame records")
    table = os.pread(fd, frames * RECORD.itemsize, h)
    if len(table) != frames * RECORD.itemsize:
        raise CorruptStoreError(f"{path}: changed size while being read")
    check_records(path, np.frombuffer(table, RECORD), h)
    return h, size


def check_records(path: str, records: np.ndarray, h: int) -> None:
    """No record points before the data region (into the header or the record table), which FORMAT.md
    forbids; ``CorruptStoreError`` naming the first that does. Checked when a file is mapped (and by
    verify), because the batch kernels bound an entry by the file's record table start and its data end
    only (their arguments do not carry the frame count); such a file is refused whole. Records pointing
    past the data, or with a bad length, are refused by the readers frame by frame, so the other frames
    of a damaged file stay readable."""
    start = h + records.size * RECORD.itemsize
    off, length = records["offset"], records["length"].astype(np.int64)
    bad = off < start
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CorruptStoreError(f"{path}: frame {i} is damaged (its record points outside the data: offset"
                                f" {int(records['offset'][i])}, length {int(length[i])}, into the header or the"
                                f" record table; the data starts at {start}); restore the store from a copy")


# -- writing -------------------------------------------------------------------------------------------
def encode(frames: np.ndarray, codec: str) -> tuple[np.ndarray, np.ndarray]:
    """Reference encoder (numcodecs): ``(records, data)`` for frames ``(N, *shape)``; offsets from 0."""
    lz4 = codecs.REGISTRY[codec].reference()
    n = frames.shape[0]
    flat = np.ascontiguousarray(frames).reshape(n, -1).view(np.uint8)
    fb = flat.shape[1]
    parts, records = [], np.zeros(n, RECORD)
    at = 0
    for i in range(n):
        e = bytes(lz4.encode(flat[i]))
        if len(e) >= fb:
            e = flat[i].tobytes()
        parts.append(e)
        records[i] = (at, len(e), google_crc32c.value(e))
        at += len(e)
    return records, np.frombuffer(b"".join(parts), np.uint8)


def row_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of one image row, the encoder's "row above" candidate: ``(H, W)`` and ``(C, H, W)`` -> W,
    ``(H, W, C)`` with C <= 4 -> W * C; 0 for vectors."""
    if len(shape) < 2:
        return 0
    if len(shape) >= 3 and shape[-1] <= 4:
        return shape[-2] * shape[-1] * itemsize
    return shape[-1] * itemsize


def encode_native(raw: np.ndarray, count: int, frame_bytes: int, data_start: int, row: int = 0,
                  min_saving: float | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """The native encoder: ``(records, buffer)`` with entries at ``data_start..`` of ``buffer`` (whose
    first ``data_start`` bytes are left for the header and records). ``raw`` is the chunk's frame bytes;
    ``row`` the bytes of one image row (``row_bytes``), a hint for finding matches. With ``min_saving``,
    None when the entries would not be at least that fraction smaller than the frames (judged on the
    first ``PROBE_FRAMES`` frames, then on all)."""
    from ..native import lz4_encode

    buf = np.empty(data_start + count * frame_bytes + TRAILER, np.uint8)
    rec = np.empty((count, 2), np.int64)
    probe = min(count, PROBE_FRAMES) if min_saving is not None else count
    end = data_start
    for lo, hi in ((0, probe), (probe, count)):
        if hi > lo:
            end = lz4_encode.encode_frames(raw[lo * frame_bytes:hi * frame_bytes], hi - lo, frame_bytes, buf, end,
                                           rec[lo:hi], row)
        if min_saving is not None and end - data_start > (1 - min_saving) * hi * frame_bytes:
            return None
    bad = lz4_encode.check_frames(raw, count, frame_bytes, buf, rec, CHECK_EVERY)
    if bad >= 0:  # never store what does not decode back: fall back to the reference encoder
        raise RuntimeError(f"native LZ4 encoder produced a wrong entry for frame {bad}")
    records = np.zeros(count, RECORD)
    records["offset"] = rec[:, 0]
    records["length"] = rec[:, 1] & 0xFFFFFFFF
    records["crc"] = (rec[:, 1] >> 32) & 0xFFFFFFFF
    return records, buf[:end]


def write(path: str, raw: np.ndarray, count: int, dtype: np.dtype, shape: tuple[int, ...], codec: str,
          native: bool = True, min_saving: float | None = None, durable: bool = True) -> tuple[int, int] | None:
    """Write the compressed frame file of ``count`` frames (``raw``: their bytes, 1-D uint8) durably.
    ``durable=False``: the file and its directory entry are left for the caller to fsync.

    Returns ``(size, crc32c)`` of the file, or None (nothing written) when ``min_saving`` is given and
    the frames do not shrink by that fraction. Raises ``OSError`` (a full disk); nothing is left at
    ``path`` or ``path.tmp`` then.
    """
    native = native and jit_enabled()  # (NUMBA_DISABLE_JIT=1: the kernels cannot run)
    frame_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    head = header(codec, dtype, shape, count)
    data_start = len(head) + count * RECORD.itemsize
    body = None
    if native:
        try:
            got = encode_native(raw, count, frame_bytes, data_start, row_bytes(shape, dtype.itemsize), min_saving)
        except RuntimeError as exc:  # never expected; the reference encoder is slower but sure
            log.error("%s: %s; encoding with numcodecs instead", path, exc)
        else:
            if got is None:
                return None
            records, buf = got
            buf[:len(head)] = np.frombuffer(head, np.uint8)
            buf[len(head):data_start] = records.view(np.uint8)
            body = buf
    if body is None:
        records, data = encode(raw.reshape(count, *shape) if raw.dtype == dtype else
                               raw.view(dtype).reshape(count, *shape), codec)
        if min_saving is not None:  # judged as encode_native judges it: the first PROBE_FRAMES frames, then all
            sizes = np.cumsum(records["length"], dtype=np.int64)
            probe = min(count, PROBE_FRAMES)
            if any(sizes[n - 1] > (1 - min_saving) * n * frame_bytes for n in {probe, count} if n):
                return None
        records["offset"] += data_start
        body = np.concatenate([np.frombuffer(head, np.uint8), records.view(np.uint8), data])
    if native:
        from ..native.crc32c import crc32c

        crc = int(crc32c(body, 0, body.size))
    else:
        crc = google_crc32c.value(body.tobytes())
    tmp = path + ".tmp"
    fd = create_exclusive(tmp, 0o444)
    try:
        _write_all(fd, memoryview(body.data).cast("B"))
        _write_all(fd, memoryview(crc.to_bytes(4, "little")))
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
        if durable:
            fsync_dir(os.path.dirname(path))
    except BaseException:
        _unlink(tmp)
        raise
    return len(body) + TRAILER, crc


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- reading (reference) -------------------------------------------------------------------------------
def read_records(path: str, buf: np.ndarray | bytes, frames: int) -> np.ndarray:
    """The record table of a whole file held in ``buf``."""
    h = int.from_bytes(bytes(buf[8:12]), "little")
    if len(buf) < h + frames * RECORD.itemsize + TRAILER:
        raise CorruptStoreError(f"{path}: too short for its {frames} frame records")
    return np.frombuffer(buf, RECORD, count=frames, offset=h)


def decode_entry(path: str, entry: bytes, crc: int, frame_bytes: int, index: int) -> bytes:
    """One stored entry to the frame's bytes (numcodecs); ``CorruptStoreError`` naming ``path`` if damaged."""
    from numcodecs import LZ4

    if google_crc32c.value(entry) != crc:
        raise CorruptStoreError(f"{path}: frame {index} is damaged (its CRC-32C does not match)")
    if len(entry) == frame_bytes:
        return entry
    if len(entry) < 5 or int.from_bytes(entry[:4], "little") != frame_bytes:
        raise CorruptStoreError(f"{path}: frame {index} is damaged (bad size prefix)")
    try:
        out = bytes(LZ4().decode(entry))
    except Exception as exc:
        raise CorruptStoreError(f"{path}: frame {index} is damaged ({exc})") from None
    if len(out) != frame_bytes:
        raise CorruptStoreError(f"{path}: frame {index} is damaged (decodes to {len(out)} bytes)")
    return out


def decode_frames(path: str, buf: np.ndarray | bytes, index: np.ndarray, frames: int, frame_bytes: int,
                  data_end: int | None = None) -> np.ndarray:
    """Frames ``index`` of a whole file held in ``buf`` as ``(len(index), frame_bytes)`` uint8 (reference)."""
    records = read_records(path, buf, frames)
    h = int.from_bytes(bytes(buf[8:12]), "little")
    end = len(buf) - TRAILER if data_end is None else data_end
    out = np.empty((len(index), frame_bytes), np.uint8)
    for j, i in enumerate(np.asarray(index).tolist()):
        off, length, crc = (int(v) for v in records[i].tolist())
        if off < h + frames * RECORD.itemsize or length < 1 or length > frame_bytes or off + length > end:
            raise CorruptStoreError(f"{path}: frame {i} is damaged (its record points outside the data)")
        out[j] = np.frombuffer(decode_entry(path, bytes(buf[off:off + length]), crc, frame_bytes, i), np.uint8)
    return out


def file_name(name: str, codec: str) -> str:
    """File name of chunk ``name``'s compressed frames under ``chunks/``."""
    return f"{name}.obs.{codecs.REGISTRY[codec].suffix}"


def describe(codec: str, size: int, crc: int) -> dict[str, Any]:
    """The manifest's ``frames`` entry of a compressed chunk."""
    return {"codec": codec, "bytes": size, "crc32c": crc}


# -- whole files (verify) ------------------------------------------------------------------------------
def read_file(path: str) -> np.ndarray:
    """A whole file as uint8, padded with zeros to a multiple of 8 bytes (so it can be viewed as int64)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = np.zeros(-(-size // 8) * 8, np.uint8)
        got = f.readinto(memoryview(buf.data)[:size])
    if got != size:
        raise CorruptStoreError(f"{path}: changed size while being read")
    return buf[:size]


def decode_all(path: str, buf: np.ndarray, frames: int, frame_bytes: int, native: bool = True) -> np.ndarray:
    """Every frame of a whole file (``read_file``) as ``(frames, frame_bytes)`` uint8; raises
    ``CorruptStoreError`` naming the first damaged frame."""
    h = int.from_bytes(bytes(buf[8:12]), "little")
    end = buf.size - TRAILER
    if not native or not jit_enabled():  # (NUMBA_DISABLE_JIT=1: the kernels cannot run)
        return decode_frames(path, buf, np.arange(frames), frames, frame_bytes, end)
    from ..native import codes, lz4

    padded = buf.base if buf.base is not None and buf.base.size % 8 == 0 else np.concatenate(
        [buf, np.zeros(-buf.size % 8, np.uint8)])
    out = np.empty((frames, frame_bytes), np.uint8)
    err, slot = lz4.gather(np.arange(frames, dtype=np.int64), out.reshape(-1), np.zeros(8, np.uint8), padded,
                           padded.view(np.int64), np.array([codes.KIND_LZ4], np.int8), np.array([h], np.int64),
                           np.array([end], np.int64), frames, 0, frame_bytes)
    if err:
        raise CorruptStoreError(f"{path}: frame {slot} is damaged ({codes.ERRORS.get(int(err), err)})")
    return out


def verify_file(path: str, entry: dict[str, Any], dtype: np.dtype, shape: tuple[int, ...], frames: int,
                raw_crc32: int | None = None) -> list[str]:
    """Problems of a compressed frame file against its manifest ``entry``: presence, header, size, the
    CRC-32C of its bytes, every frame decoding (with its CRC-32C), and (``raw_crc32``, if the manifest
    recorded one) the CRC-32 of the decoded frames."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return [f"{path}: compressed frame file is missing"]
    try:
        check_open(path, fd, str(entry.get("codec")), dtype, shape, frames, int(entry["bytes"]))
    except CorruptStoreError as exc:
        return [str(exc)]
    finally:
        os.close(fd)
    buf = read_file(path)
    crc = google_crc32c.value(buf[:-TRAILER].tobytes())
    if crc != int(entry["crc32c"]):
        return [f"{path}: checksum {crc:#010x} differs from the recorded {int(entry['crc32c']):#010x} (the file"
                " was modified or damaged)"]
    if int.from_bytes(buf[-TRAILER:].tobytes(), "little") != crc:
        return [f"{path}: its trailing checksum differs from its contents"]
    frame_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    try:
        decoded = decode_all(path, buf, frames, frame_bytes)
    except CorruptStoreError as exc:
        return [str(exc)]
    if raw_crc32 is not None and zlib.crc32(decoded.data) != raw_crc32:
        return [f"{path}: the decoded frames' CRC-32 differs from the recorded CRC-32 of the raw frames"]
    return []
