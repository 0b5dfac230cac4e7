"""The manifest: the store's commit record, a small JSON file replaced atomically.

Writing: temp file in the same directory, fsync, ``os.replace``, fsync the
directory. Reading checks the format name, the version and a CRC-32 over the
canonical JSON of the body, so a torn, truncated or foreign file is an error
that names the file, never a silently different store.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

from ..errors import CorruptStoreError, FormatVersionError, NotAStoreError, StoreNotFoundError

FORMAT_NAME = "mmreplay-store"
# 1: frames raw (``obs.npy`` chunk files). 2: the schema names a compression codec; sealed chunks may
# keep their frames in compressed frame files. A store with raw frames is still written as version 1,
# so older mmreplay versions keep reading it; a compressed one needs a reader of version >= 2.
FORMAT_VERSION = 2
RAW_FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def format_version(body: dict[str, Any]) -> int:
    """The version a manifest body is written with: the lowest that describes it."""
    return FORMAT_VERSION if (body.get("schema") or {}).get("compression") else RAW_FORMAT_VERSION


def write_manifest(directory: str, body: dict[str, Any], name: str = MANIFEST) -> None:
    body = dict(body, format=FORMAT_NAME, format_version=format_version(body))
    doc = dict(body, checksum=zlib.crc32(_canonical(body)))
    write_atomic(os.path.join(directory, name), _readable(doc))


def _readable(doc: dict[str, Any]) -> bytes:
    """One top-level key per line, each value compact: readable, and written by json's C encoder
    (``indent=`` would switch to its pure-Python one, ~25 ms for a 1M-transition store's chunk list)."""
    lines = [f"{json.dumps(k)}: {json.dumps(doc[k], sort_keys=True, separators=(', ', ': '))}" for k in sorted(doc)]
    return ("{\n " + ",\n ".join(lines) + "\n}\n").encode()


def read_manifest(directory: str, name: str = MANIFEST, what: str = "store") -> dict[str, Any]:
    """Read and check a manifest. Raises StoreNotFoundError, NotAStoreError, CorruptStoreError, FormatVersionError."""
    if not os.path.isdir(directory):
        if os.path.exists(directory):
            raise NotAStoreError(f"{directory}: is a file, not an mmreplay {what} directory")
        raise StoreNotFoundError(f"{directory}: no such {what} directory")
    path = os.path.join(directory, name)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise NotAStoreError(
            f"{directory}: not an mmreplay {what} (no {name}); create one with ReplayStore.create()") from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptStoreError(f"{path}: manifest is not valid JSON ({exc}); the file is damaged or truncated") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise NotAStoreError(f"{path}: not an mmreplay manifest (format {doc.get('format') if isinstance(doc, dict) else None!r})")
    version = doc.get("format_version")
    if not isinstance(version, int):
        raise CorruptStoreError(f"{path}: manifest has no integer format_version")
    if version > FORMAT_VERSION:
        raise FormatVersionError(
            f"{path}: written by format version {version}, this mmreplay reads up to {FORMAT_VERSION};"
            " upgrade mmreplay to open it")
    checksum = doc.pop("checksum", None)
    if checksum != zlib.crc32(_canonical(doc)):
        raise CorruptStoreError(f"{path}: manifest checksum mismatch; the file was modified or damaged")
    return doc
