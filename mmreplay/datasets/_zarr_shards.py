"""Reading the shards of a zarr array directly (local or remote), as ``export_zarr`` lays them out.

zarr-python spends Python time on every inner chunk, and holds the GIL for much of it, which
slows the thread that writes the imported store (BENCHMARKS.md, "Figures behind the code"). For arrays whose layout is the
simple one mmreplay writes (a regular grid along the first axis, ``sharding_indexed`` with the
index at the end checked by CRC-32C, inner codecs ``bytes`` + one of zstd/gzip/blosc or none)
``shard_reader`` returns a reader that decodes the chunks itself; for anything else it returns
None and the caller reads through zarr.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ._location import Location
from .errors import DatasetError, DatasetNotFoundError

_ABSENT = np.iinfo(np.uint64).max


def _zstd_content_size(raw: bytes) -> int | None:
    """The Frame_Content_Size of a zstd frame header (RFC 8878 3.1.1.1), None when the frame does not say."""
    if len(raw) < 6 or raw[:4] != b"\x28\xb5\x2f\xfd":
        return None
    fhd = raw[4]
    single = bool(fhd & 0x20)
    fcs_bytes = (1 if single else 0, 2, 4, 8)[fhd >> 6]
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    if not fcs_bytes or len(raw) < pos + fcs_bytes:
        return None
    size = int.from_bytes(raw[pos:pos + fcs_bytes], "little")
    return size + 256 if fcs_bytes == 2 else size


def _decoder(codecs: list[dict[str, Any]]) -> Callable[[bytes, int], bytes] | None:
    """``decode(raw, n)`` for the inner codecs mmreplay writes, or None. It never produces more than the
    chunk's ``n`` bytes, whatever the compressed data claims (a forged chunk cannot inflate further), and
    raises ``ValueError`` when the data does not decode to exactly ``n`` bytes."""
    from numcodecs import Zstd
    from numcodecs.blosc import Blosc

    names = [c.get("name") for c in codecs]
    if not names or names[0] != "bytes" or codecs[0].get("configuration", {}).get("endian", "little") != "little":
        return None
    rest = codecs[1:]
    if not rest:
        return lambda raw, n: raw
    if len(rest) != 1:
        return None
    name = str(rest[0].get("name"))

    def gzip(raw: bytes, n: int) -> bytes:
        try:
            return zlib.decompressobj(32 + zlib.MAX_WBITS).decompress(raw, n + 1)  # gzip or zlib header
        except zlib.error as exc:
            raise ValueError(str(exc)) from None

    def zstd(raw: bytes, n: int) -> bytes:
        size = _zstd_content_size(raw)
        if size is not None and size != n:
            raise ValueError(f"the zstd frame holds {size:,} bytes")
        return bytes(Zstd().decode(raw, out=np.empty(n, np.uint8)))

    def blosc(raw: bytes, n: int) -> bytes:
        size = int.from_bytes(raw[4:8], "little") if len(raw) >= 16 else -1  # the blosc header's nbytes
        if size != n:
            raise ValueError(f"the blosc buffer holds {size:,} bytes")
        return bytes(Blosc().decode(raw, out=np.empty(n, np.uint8)))

    return {"gzip": gzip, "zstd": zstd, "blosc": blosc}.get(name)


def _layout(array: Any) -> tuple[dict[str, Any], list[int], dict[str, Any]] | None:
    """(metadata, chunk grid, sharding configuration) of an array laid out as ``export_zarr`` writes it,
    else None."""
    try:
        meta = array.metadata.to_dict()
        grid = meta["chunk_grid"]["configuration"]["chunk_shape"]
        (shard,) = meta["codecs"]
        cfg = shard["configuration"]
        ok = (meta.get("zarr_format") == 3 and meta["chunk_grid"]["name"] == "regular"
              and meta["chunk_key_encoding"] == {"name": "default", "configuration": {"separator": "/"}}
              and not meta.get("storage_transformers") and shard["name"] == "sharding_indexed"
              and cfg.get("index_location", "end") == "end" and list(grid[1:]) == list(array.shape[1:])
              and list(cfg["chunk_shape"][1:]) == list(array.shape[1:])
              and [c.get("name") for c in cfg["index_codecs"]] == ["bytes", "crc32c"])
    except (KeyError, TypeError, ValueError):
        return None
    return (meta, grid, cfg) if ok else None


def _shard_key(directory: Location, s: int, ndim: int) -> Location:
    return directory.join("c", str(s), *["0"] * (ndim - 1))


def check_objects(array: Any, root: Location, where: str) -> None:
    """Every shard object of an array in ``export_zarr``'s layout exists (FORMAT.md: every chunk is written,
    also all-zero ones), so a dataset that lost an object (an interrupted copy) is refused with
    ``DatasetError`` instead of being read as zarr's fill value. One listing of the array's directory (or
    prefix); arrays in other layouts are left to zarr (nothing tells a lost chunk from an omitted empty one)."""
    got = _layout(array)
    rows = int(array.shape[0])
    if got is None or rows == 0:
        return
    shard_rows = int(got[1][0])
    expected = -(-rows // shard_rows)
    directory = root.join(*array.path.split("/"))
    tail = ["0"] * (len(array.shape) - 1)
    if directory.fs is None:
        base = os.path.join(directory.path, "c")
        try:
            names = os.listdir(base)
        except (FileNotFoundError, NotADirectoryError):
            names = []
        found = [int(n) for n in names if n.isdigit() and os.path.isfile(os.path.join(base, n, *tail))]
    else:
        prefix = directory.path.rstrip("/") + "/c/"
        try:
            paths = [str(p) for p in directory.fs.find(prefix)]
        except FileNotFoundError:
            paths = []
        found = []
        for p in paths:
            head, _, rest = p[len(prefix):].partition("/") if p.startswith(prefix) else ("", "", "")
            if head.isdigit() and rest == "/".join(tail):
                found.append(int(head))
    have = np.zeros(expected, bool)
    have[[f for f in found if f < expected]] = True
    missing = np.flatnonzero(~have).tolist()
    if missing:
        raise DatasetError(
            f"{where}: array {array.path!r} lacks {len(missing)} of its {expected} shard object(s) (first:"
            f" {_shard_key(directory, missing[0], len(array.shape))}); the dataset is incomplete (an interrupted"
            " copy or upload?): its rows would read as zeros. Copy the dataset again, or export it afresh")


def shard_reader(array: Any, root: Location) -> Callable[[int, int], np.ndarray] | None:
    """``fetch(a, b)`` -> rows ``[a, b)`` of ``array`` (stored under the group at ``root``, a local directory or
    a remote prefix: one read per shard), or None."""
    got = _layout(array)
    if got is None:
        return None
    meta, grid, cfg = got
    decode = _decoder(cfg["codecs"])
    if decode is None or not root.isdir():
        return None
    import google_crc32c

    directory = root.join(*array.path.split("/"))
    shard_rows, chunk_rows = int(grid[0]), int(cfg["chunk_shape"][0])
    per_shard = shard_rows // chunk_rows
    row_shape, dtype, size = tuple(array.shape[1:]), np.dtype(array.dtype), int(array.shape[0])
    chunk_bytes = chunk_rows * int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
    cache: dict[str, Any] = {"shard": -1}
    # a shard holds its chunks, each at most its raw size plus a codec's few bytes of framing, and the index
    most = per_shard * (chunk_bytes + 4096) + per_shard * 16 + 4

    def load(s: int) -> tuple[bytes, np.ndarray]:
        if cache["shard"] != s:
            path = _shard_key(directory, s, 1 + len(row_shape))
            try:
                blob = path.read_bytes(most)
            except (FileNotFoundError, DatasetNotFoundError):
                raise DatasetError(f"{path}: shard object is missing; the dataset is incomplete (an interrupted"
                                   " copy?): copy it again, or export it afresh") from None
            n = per_shard * 16
            raw, crc = blob[-n - 4:-4], blob[-4:]
            if len(raw) != n or np.uint32(google_crc32c.value(raw)).astype("<u4").tobytes() != crc:
                raise DatasetError(f"{path}: shard index checksum mismatch; the file is damaged")
            index = np.frombuffer(raw, "<u8").reshape(per_shard, 2)
            cache.update(shard=s, blob=blob, index=index)
        return cache["blob"], cache["index"]

    def fetch(a: int, b: int) -> np.ndarray:
        out = np.empty((b - a, *row_shape), dtype)
        for c in range(a // chunk_rows, -(-b // chunk_rows)):
            blob, index = load(c // per_shard)
            off, n = (int(v) for v in index[c % per_shard])
            lo, hi = max(a, c * chunk_rows), min(b, (c + 1) * chunk_rows, size)
            if off == _ABSENT:
                raise DatasetError(f"{directory}: chunk {c} is absent from its shard (every chunk of an mmreplay"
                                   " dataset is written); the dataset is damaged: copy it again, or export it afresh")
            try:
                data = decode(blob[off:off + n], chunk_bytes)
            except (ValueError, RuntimeError) as exc:
                raise DatasetError(f"{directory}: chunk {c} does not decode to its {chunk_bytes:,} bytes ({exc})") from None
            if len(data) != chunk_bytes:
                raise DatasetError(f"{directory}: chunk {c} decodes to {len(data)} bytes, expected {chunk_bytes}")
            rows = np.frombuffer(data, dtype).reshape((chunk_rows, *row_shape))
            out[lo - a:hi - a] = rows[lo - c * chunk_rows:hi - c * chunk_rows]
        return out

    return fetch
