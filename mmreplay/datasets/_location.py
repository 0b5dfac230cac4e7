"""Where a dataset lives: a local path, or an fsspec URL (``s3://``, ``gs://``, ``memory://``, ...).

``Location`` is the one small interface the readers and writers use: ``join``, ``exists``,
``isdir``, ``size``, ``glob``, ``open``, ``read_bytes``. Local paths go through ``os`` and
``open`` exactly as before; URLs through the fsspec filesystem their protocol names, built
from ``storage_options`` (credentials, ``endpoint_url``, ...). Remote files are opened for
streaming: sequential readers (gzip'd ``.npy``) read ahead in blocks of ``STREAM_BLOCK``,
HDF5 files (random access) through a cache of at most ``CACHE_BLOCKS`` blocks of
``RANDOM_BLOCK``, so memory stays bounded whatever the file's size; nothing is copied to
local disk first.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import stat
from typing import IO, Any

from .errors import DatasetError, DatasetNotFoundError

STREAM_BLOCK = 8 << 20  # bytes fetched at a time from a remote file read front to back
RANDOM_BLOCK = 4 << 20  # bytes per cached block of a remote file read at random (HDF5)
CACHE_BLOCKS = 16  # cached blocks per open remote HDF5 file: 64 MiB at most
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


def is_url(path: Any) -> bool:
    """A string naming a remote location (``protocol://...``, not ``file://``)."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


class Location:
    """A local path (``fs is None``) or a path on an fsspec filesystem."""

    def __init__(self, path: str, fs: Any = None) -> None:
        self.path = path
        self.fs = fs

    @classmethod
    def of(cls, src: Any, storage_options: dict[str, Any] | None = None) -> Location:
        """``src`` (a path, a URL or a ``Location``) as a ``Location``; ``storage_options`` configure a URL's
        filesystem. Raises ``ImportError`` naming the extra that adds a missing protocol (``[s3]``, ``[gcs]``)."""
        if isinstance(src, Location):
            return src
        p = os.fspath(src)
        if not is_url(p):
            if storage_options:
                raise ValueError(f"storage_options are for remote URLs (s3://, gs://, ...); {p!r} is a local path")
            return cls(os.path.expanduser(p[len("file://"):] if p.startswith("file://") else p))
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"storage_options: expected a dict, got {type(storage_options).__name__}")
        try:
            import fsspec
        except ImportError:
            raise ImportError(f"{p}: remote locations need fsspec: pip install 'mmreplay[s3]' (or '[gcs]')") from None
        protocol = p.split("://", 1)[0]
        try:
            fs, path = fsspec.core.url_to_fs(p, **(storage_options or {}))
        except ImportError as exc:
            extra = _EXTRAS.get(protocol)
            hint = f"pip install 'mmreplay[{extra}]'" if extra else f"install the fsspec filesystem for {protocol}://"
            raise ImportError(f"{p}: {exc}; {hint}") from None
        except ValueError as exc:
            raise ValueError(f"{p}: {exc}") from None
        return cls(path.rstrip("/"), fs)

    # -- naming ----------------------------------------------------------------------------------------
    @property
    def remote(self) -> bool:
        return self.fs is not None

    def __str__(self) -> str:
        return self.fs.unstrip_protocol(self.path) if self.fs is not None else self.path

    def __repr__(self) -> str:
        return f"Location({str(self)!r})"

    def __fspath__(self) -> str:
        if self.fs is not None:
            raise TypeError(f"{self} is a remote location, not a local path")
        return self.path

    def join(self, *parts: str) -> Location:
        return Location(posixpath.join(self.path, *parts) if self.fs is not None else os.path.join(self.path, *parts),
                        self.fs)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path) if self.fs is not None else os.path.basename(self.path)

    @property
    def parent(self) -> Location:
        return Location(posixpath.dirname(self.path) if self.fs is not None else os.path.dirname(self.path), self.fs)

    # -- looking ---------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.fs.exists(self.path) if self.fs is not None else os.path.exists(self.path)

    def isdir(self) -> bool:
        return self.fs.isdir(self.path) if self.fs is not None else os.path.isdir(self.path)

    def isfile(self) -> bool:
        return self.fs.isfile(self.path) if self.fs is not None else os.path.isfile(self.path)

    def size(self) -> int:
        try:
            return int(self.fs.size(self.path)) if self.fs is not None else os.stat(self.path).st_size
        except FileNotFoundError:
            raise DatasetNotFoundError(f"{self}: does not exist") from None

    def glob(self, pattern: str) -> list[Location]:
        """Entries of this directory whose names match ``pattern`` (fnmatch; no recursion), sorted."""
        if self.fs is None:
            try:
                names = os.listdir(self.path)
            except (FileNotFoundError, NotADirectoryError):
                return []
        else:
            try:
                names = [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.path, detail=False)]
            except (FileNotFoundError, NotADirectoryError):
                return []
        return [self.join(n) for n in sorted(names) if fnmatch.fnmatchcase(n, pattern)]

    # -- reading ---------------------------------------------------------------------------------------
    def open(self, mode: str = "rb", random_access: bool = False) -> IO[Any]:
        """The file, opened ``mode``. Remote reads stream in blocks (``random_access``: a bounded block cache)."""
        if self.fs is None:
            if "r" in mode and "+" not in mode:
                return os.fdopen(self._open_regular(), mode)
            return open(self.path, mode)  # noqa: SIM115 - the caller closes it
        if "r" not in mode:
            return self.fs.open(self.path, mode, block_size=STREAM_BLOCK)
        try:
            if random_access:
                return self.fs.open(self.path, mode, block_size=RANDOM_BLOCK, cache_type="blockcache",
                                    cache_options={"maxblocks": CACHE_BLOCKS})
            return self.fs.open(self.path, mode, block_size=STREAM_BLOCK, cache_type="readahead")
        except FileNotFoundError:
            raise FileNotFoundError(f"{self}: does not exist") from None

    def _open_regular(self) -> int:
        """A local file opened for reading: refused (``DatasetError``) unless a regular file, so a FIFO or a
        device (``/dev/zero``) neither blocks nor is read without end."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise DatasetNotFoundError(f"{self}: does not exist") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
            raise DatasetError(f"{self}: is {what}, expected a regular file of the dataset; not reading it")
        os.set_blocking(fd, True)
        return fd

    def read_bytes(self, most: int) -> bytes:
        """The whole file, refused if larger than ``most`` bytes (checked before it is read)."""
        if self.fs is None:
            fd = self._open_regular()
            with os.fdopen(fd, "rb") as f:
                n = os.fstat(fd).st_size
                if n > most:
                    raise DatasetError(f"{self}: {n:,} bytes, more than the {most:,} such a file can need; not"
                                       " reading it")
                data = f.read(most + 1)
            if len(data) > most:
                raise DatasetError(f"{self}: grew past {most:,} bytes while being read; not reading it")
            return data
        n = self.size()
        if n > most:
            raise DatasetError(f"{self}: {n:,} bytes, more than the {most:,} such a file can need; not reading it")
        with self.open("rb") as f:
            return f.read()

    def head(self, n: int) -> bytes:
        with self.open("rb") as f:
            return f.read(n)

    # -- writing ---------------------------------------------------------------------------------------
    def write_bytes(self, data: bytes) -> None:
        if self.fs is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "wb") as f:
                f.write(data)
        else:
            self.fs.pipe_file(self.path, data)

    def remove(self) -> None:
        """Delete this file or directory tree (what is there; nothing if absent)."""
        if self.fs is None:
            from ._common import remove_path

            remove_path(self.path)
        elif self.fs.exists(self.path):
            self.fs.rm(self.path, recursive=True)
