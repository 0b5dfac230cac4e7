"""What a downloaded dataset may declare: sizes checked before anything is allocated, HDF5 paths that
stay inside the file.

A dataset's headers (a ``.npy`` header inside gzip, HDF5 dataspaces, zarr metadata) declare shapes
that the importer would otherwise allocate at once, and a compressed stream can inflate to ~1000x
its size. So, before reading:

- a row (one frame, action or extra) is at most ``MAX_ROW_BYTES`` (the store's own bound);
- a gzip (deflate) stream cannot inflate to more than ``MAX_DEFLATE_RATIO`` times its size, so a
  header declaring more than that is forged or truncated; the ``.npy`` header itself is read only up
  to a small bound (``_gznpy``), whatever length it declares;
- HDF5 datasets declare no more than their stored bytes can inflate to (``check_h5_dataset``), in
  chunks of at most ``MAX_CHUNK_BYTES``, stored in the file itself (no external raw storage, no
  virtual datasets) and reached through hard links or soft links inside the file, never an
  external link (``h5_get``);
- rows are read ``rows_per_piece`` at a time: a few tens of MB, whatever the frame size.

Every refusal is a ``DatasetError`` naming the file, the key, what it declares and the bound.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..options import MAX_ROW_BYTES
from ._common import PIECE
from .errors import DatasetError

MAX_DEFLATE_RATIO = 1032  # deflate's largest expansion: 258 bytes from a 2-bit code, ~1032:1
SLACK_BYTES = 16 << 20  # declared data not backed by stored bytes that is read anyway (e.g. a fill value)
MAX_CHUNK_BYTES = 256 << 20  # one HDF5/zarr chunk, decoded at once
PIECE_BYTES = 32 << 20  # rows handed over at a time, at most


def nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    """Bytes of an array of ``shape`` (Python ints: no int64 overflow for absurd shapes)."""
    return math.prod(int(s) for s in shape) * np.dtype(dtype).itemsize


def check_row(where: str, key: str, row_shape: tuple[int, ...], dtype: Any) -> int:
    """Bytes of one row of ``key``; refuse rows larger than a store can hold."""
    n = nbytes(row_shape, dtype)
    if n > MAX_ROW_BYTES:
        raise DatasetError(f"{where}: {key} declares rows of {tuple(row_shape)} {np.dtype(dtype)} ({n:,} bytes each);"
                           f" a store holds at most {MAX_ROW_BYTES:,} bytes per frame, action or extra")
    return n


def check_inflated(where: str, key: str, shape: tuple[int, ...], dtype: Any, stored: int, what: str) -> None:
    """A deflate stream of ``stored`` bytes cannot hold more than ~1032x that: refuse larger declarations."""
    declared = nbytes(shape, dtype)
    if declared > stored * MAX_DEFLATE_RATIO + SLACK_BYTES:
        raise DatasetError(
            f"{where}: {key} declares {tuple(shape)} {np.dtype(dtype)} ({declared:,} bytes), but {what} of"
            f" {stored:,} bytes holds at most ~{stored * MAX_DEFLATE_RATIO:,} bytes (deflate expands at most"
            f" {MAX_DEFLATE_RATIO}x); the header is forged or the data truncated")


def rows_per_piece(row_bytes: int, most: int = PIECE) -> int:
    """Rows read or handed over at a time: ``most``, or fewer for large rows (about ``PIECE_BYTES``)."""
    return max(1, min(most, PIECE_BYTES // max(row_bytes, 1)))


# -- HDF5 -----------------------------------------------------------------------------------------------
_MAX_SOFT_LINKS = 16


def _resolve(f: Any, path: str, where: str, depth: int = 0) -> str | None:
    """The hard-link path of ``path`` in file ``f`` (soft links followed inside the file), None if absent.

    Raises DatasetError for an external link (or any other link kind) on the way: it would open
    another file.
    """
    from h5py import h5l

    if depth > _MAX_SOFT_LINKS:
        raise DatasetError(f"{where}: soft links nest deeper than {_MAX_SOFT_LINKS} (a cycle?) at {path!r}")
    current = "/"
    for part in [p for p in path.split("/") if p]:
        parent = f[current]  # kept referenced while its link proxy is used (the proxy does not keep the id open)
        links = parent.id.links
        name = part.encode()
        if not links.exists(name):
            return None
        kind = links.get_info(name).type
        if kind == h5l.TYPE_HARD:
            current = current.rstrip("/") + "/" + part
        elif kind == h5l.TYPE_SOFT:
            target = links.get_val(name).decode()
            if not target.startswith("/"):
                target = current.rstrip("/") + "/" + target
            resolved = _resolve(f, target, where, depth + 1)
            if resolved is None:
                return None
            current = resolved
        else:
            what = "an external link (to another file)" if kind == h5l.TYPE_EXTERNAL else "a user-defined link"
            raise DatasetError(f"{where}: {current.rstrip('/')}/{part} is {what}; mmreplay reads only data stored"
                               " in the file itself (copy the linked data into the file, e.g. with h5copy)")
    return current


def h5_get(group: Any, name: str, where: str) -> Any:
    """``group[name]`` (None if absent) without following a link out of the file; datasets are checked
    with ``check_h5_dataset``."""
    import h5py

    path = _resolve(group.file, group.name.rstrip("/") + "/" + name, where)
    if path is None:
        return None
    obj = group.file[path]
    if isinstance(obj, h5py.Dataset):
        check_h5_dataset(obj, where, name)
    return obj


def h5_names(group: Any) -> list[str]:
    """The link names in ``group``, without resolving them."""
    return [n.decode() if isinstance(n, bytes) else n for n in group.id.__iter__()]


def check_h5_dataset(ds: Any, where: str, key: str) -> None:
    """A dataset stored in this file, in chunks of sane size, rows a store can hold, declaring no more than
    its stored bytes can inflate to."""
    if ds.is_virtual:
        raise DatasetError(f"{where}: dataset {key!r} is a virtual dataset (it maps other files); mmreplay reads"
                           " only data stored in the file itself")
    if ds.external:
        raise DatasetError(f"{where}: dataset {key!r} keeps its data in external files ({ds.external[0][0]!r}...);"
                           " mmreplay reads only data stored in the file itself")
    if ds.chunks is not None and nbytes(ds.chunks, ds.dtype) > MAX_CHUNK_BYTES:
        raise DatasetError(f"{where}: dataset {key!r} has chunks of {ds.chunks} {ds.dtype}"
                           f" ({nbytes(ds.chunks, ds.dtype):,} bytes); at most {MAX_CHUNK_BYTES:,} are supported")
    shape = tuple(ds.shape) if ds.shape is not None else ()
    check_row(where, f"dataset {key!r}", shape[1:], ds.dtype)
    check_inflated(where, f"dataset {key!r}", shape, ds.dtype, int(ds.id.get_storage_size()), "its stored data")
