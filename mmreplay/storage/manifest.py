"""The manifest: the store's commit record, a small JSON file replaced atomically.

Writing: temp file in the same directory, fsync, ``os.replace``, fsync the
directory. Reading checks the format name, the version and a CRC-32 over the
canonical JSON of the body, so a torn, truncated or foreign file is an error
that names the file, never a silently different store; then every field
(``validate.check_body``), since a forged manifest's CRC can be recomputed.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

from ..errors import CorruptStoreError, FormatVersionError, NotAStoreError, StoreNotFoundError
from .files import fsync_dir, read_regular, write_atomic
from .validate import check_body

__all__ = ["read_manifest", "write_manifest", "fsync_dir", "write_atomic", "MANIFEST"]

FORMAT_NAME = "mmreplay-store"
# 1: frames raw in obs.npy chunk files. 2: any of compressed frame files (the schema
# names a codec), a validity record (invalidate/clear), a rate limit. 3: env streams written apart (rows per
# stream, extents). A store that uses none of them is still written as version 1, so older mmreplay
# versions keep reading it.
FORMAT_VERSION = 3  # the newest version this code reads (and writes, when a store needs it)
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 29  # far above a 100M-transition store's chunk list; a larger file is not read


def version_needed(body: dict[str, Any]) -> int:
    """The oldest format version that reads ``body`` right: 3 when its env streams were written apart
    (``rows`` is then one count per stream; older readers would misplace rows and ids); 2 when the schema
    names a compression codec (version-1 readers cannot read compressed frame files), when it holds a
    validity record (they would sample invalidated transitions) or a rate limit (their processes would
    not count)."""
    if isinstance(body.get("rows"), list):
        return 3
    schema = body.get("schema")
    if body.get("validity") or (isinstance(schema, dict) and (schema.get("rate_limit") or schema.get("compression"))):
        return 2
    return 1


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def write_manifest(directory: str, body: dict[str, Any], name: str = MANIFEST) -> None:
    body = dict(body, format=FORMAT_NAME, format_version=version_needed(body))
    doc = dict(body, checksum=zlib.crc32(_canonical(body)))
    write_atomic(os.path.join(directory, name), _readable(doc))


def _readable(doc: dict[str, Any]) -> bytes:
    """One top-level key per line, each value compact: readable, and written by json's C encoder
    (``indent=`` would switch to its pure-Python one, slow for a large store's chunk list; BENCHMARKS.md,
    "Figures behind the code")."""
    lines = [f"{json.dumps(k)}: {json.dumps(doc[k], sort_keys=True, separators=(', ', ': '))}" for k in sorted(doc)]
    return ("{\n " + ",\n ".join(lines) + "\n}\n").encode()


def read_manifest(directory: str, name: str = MANIFEST, what: str = "store") -> dict[str, Any]:
    """Read and check a manifest: its checksum, then every field (names that become paths, types, ranges).

    Raises StoreNotFoundError, NotAStoreError, CorruptStoreError, FormatVersionError.
    """
    if not os.path.isdir(directory):
        if os.path.exists(directory):
            raise NotAStoreError(f"{directory}: is a file, not an mmreplay {what} directory")
        raise StoreNotFoundError(f"{directory}: no such {what} directory")
    path = os.path.join(directory, name)
    try:
        raw = read_regular(path, MAX_MANIFEST_BYTES, "manifest")
    except FileNotFoundError:
        raise NotAStoreError(
            f"{directory}: not an mmreplay {what} (no {name}); create one with ReplayStore.create()") from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptStoreError(f"{path}: manifest is not valid JSON ({exc}); the file is damaged or truncated") from None
    except RecursionError:
        raise CorruptStoreError(f"{path}: manifest nests values too deeply to be a manifest; the file is damaged"
                                " or forged") from None
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
    try:
        canonical = _canonical(doc)
    except (ValueError, RecursionError):  # nesting deep enough for the encoder's limit, NaN keys, ...
        raise CorruptStoreError(f"{path}: manifest cannot be re-encoded to check its checksum; the file is"
                                " damaged or forged") from None
    if checksum != zlib.crc32(canonical):
        raise CorruptStoreError(f"{path}: manifest checksum mismatch; the file was modified or damaged")
    check_body(doc, path)
    return doc
