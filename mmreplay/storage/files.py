"""Durable file writes: the one place that knows how a file or a directory entry is made durable.

``write_atomic`` replaces a file so that a crash leaves the old or the new one (temp file in the same
directory, fsync, ``os.replace``, fsync the directory); ``fsync_file``/``fsync_dir`` make an existing
file's data or a directory's entries durable.

Every file of a store is opened here without following a symbolic link at its last component and
without blocking on a FIFO (``open_regular``: ``O_NOFOLLOW | O_NONBLOCK``, then ``fstat`` must say a
regular file), and temp files are created with ``O_EXCL`` after removing whatever has their name, so
a link planted in the store can neither lead a read or a write outside it nor make a call block.

Work that is renamed into place when complete (an import's store, an export's output, a loaded snapshot)
is built under a hidden ``temp_sibling`` name that says which host and process made it, so a later run
removes what a killed one left (``remove_stale_siblings``).
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import zlib

import numpy as np

from ..errors import CorruptStoreError

log = logging.getLogger(__name__)

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}


def kind(mode: int) -> str:
    """What a file mode says a path is, in words."""
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


def open_regular(path: str, flags: int = os.O_RDONLY, what: str = "file", mode: int = 0o644) -> int:
    """A descriptor of ``path``, which must be a regular file itself: a symbolic link (even one leading to a
    file inside the store), a FIFO or a device is refused with ``CorruptStoreError`` before anything is read
    or written through it, and opening never blocks. ``FileNotFoundError`` and other ``OSError`` pass."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptStoreError(f"{path}: is a symbolic link, expected the store's {what} (a regular file);"
                                    " nothing is read or written through it: remove the link and restore the"
                                    " file from a copy of the store") from None
        if exc.errno == errno.ENXIO:  # a FIFO opened for writing without a reader
            raise CorruptStoreError(f"{path}: is a FIFO, expected the store's {what} (a regular file); remove"
                                    " it and restore the file from a copy of the store") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptStoreError(f"{path}: is {kind(st.st_mode)}, expected the store's {what} (a regular"
                                    " file); remove it and restore the file from a copy of the store")
        if flags & os.O_NONBLOCK == 0:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, most: int, what: str = "file") -> bytes:
    """The whole of ``path`` (a regular file, see ``open_regular``), refused with ``CorruptStoreError`` when
    it holds more than ``most`` bytes (checked before reading: a sparse or endless file is not read)."""
    fd = open_regular(path, os.O_RDONLY, what)
    try:
        size = os.fstat(fd).st_size
        if size > most:
            raise CorruptStoreError(f"{path}: {size:,} bytes, more than the {most:,} a {what} can hold; the file"
                                    " is damaged or not the store's: restore it from a copy of the store")
        parts, got = [], 0
        while got <= most:
            part = os.read(fd, min(1 << 24, most + 1 - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
        if got > most:
            raise CorruptStoreError(f"{path}: grew past the {most:,} bytes a {what} can hold while being read")
        return b"".join(parts)
    finally:
        os.close(fd)


def create_exclusive(path: str, mode: int = 0o644, what: str = "temporary file") -> int:
    """A new file at ``path`` opened for writing, created by this call: whatever had the name (a leftover
    of a crash, or a planted link) is removed first, never followed (``O_EXCL | O_NOFOLLOW``)."""
    for _ in range(2):
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            try:
                os.unlink(path)  # removes a link itself, never its target
            except IsADirectoryError:
                break
            except FileNotFoundError:
                pass
            except PermissionError:
                break
    raise CorruptStoreError(f"{path}: cannot be created (something that is not a file has the name of this"
                            f" {what}); remove it")


def copy_exclusive(src: str, dst: str, mode: int = 0o644) -> None:
    """Copy ``src`` (a regular file, not followed if a link) to a new file ``dst`` created by this call
    (``create_exclusive``: a link planted at ``dst`` is removed, never written through); fsynced."""
    fd_in = open_regular(src, os.O_RDONLY)
    try:
        fd = create_exclusive(dst, mode)
        try:
            with open(fd_in, "rb", closefd=False) as fin, open(fd, "wb", closefd=False) as fout:
                while block := fin.read(8 << 20):
                    fout.write(block)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(dst)
            except OSError:
                pass
            raise
        os.close(fd)
    finally:
        os.close(fd_in)


def fsync_file(path: str) -> None:
    """Make a file's data (and metadata) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make a directory's entries (creations, renames, deletions) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes | memoryview) -> int:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file.

    Returns the CRC-32 of ``data`` (what a manifest records to check the file later)."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = create_exclusive(tmp)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)
    return zlib.crc32(data)


def write_npy_atomic(path: str, array: np.ndarray) -> int:
    """``write_atomic`` of an array as a plain ``.npy`` file (never pickled); returns its CRC-32."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return write_atomic(path, buf.getbuffer())


# -- temporary siblings --------------------------------------------------------------------------------
def _host_tag() -> str:
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def temp_sibling(final: str, what: str) -> str:
    """A hidden temporary name next to ``final`` that names its maker (host and pid), so a later run can
    tell a leftover of a killed process from a live one's (``remove_stale_siblings``)."""
    parent, name = os.path.split(final)
    return os.path.join(parent, f".{name}.{what}-{_host_tag()}-{os.getpid()}-{secrets.token_hex(4)}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_stale_siblings(final: str, kinds: tuple[str, ...], made_by: str) -> list[str]:
    """Delete the temporary siblings of ``final`` of the ``kinds`` given (``temp_sibling``'s ``what``) left by
    a process of this host that no longer runs (killed with SIGKILL, or the machine lost power): they are
    never renamed into place, and would stay for ever. A sibling of a live process, or of another host
    sharing the directory, is left alone. Returns the paths removed."""
    parent, name = os.path.split(os.path.abspath(final))
    pattern = re.compile(re.escape(f".{name}.") + f"(?:{'|'.join(kinds)})-" + _host_tag() + r"-(\d{1,10})-[0-9a-f]{8}")
    try:
        entries = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for entry in entries:
        m = pattern.fullmatch(entry)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        remove_path(os.path.join(parent, entry))
        removed.append(os.path.join(parent, entry))
    if removed:
        log.warning("removed %d leftover(s) of killed %s next to %s: %s", len(removed), made_by, final,
                    ", ".join(os.path.basename(p) for p in removed))
    return removed


def remove_path(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
