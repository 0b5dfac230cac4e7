"""Checks of what a manifest says, before anything reads, writes, links or deletes a file because of it.

A manifest's CRC-32 detects damage, not forgery: anyone can rewrite a manifest and recompute it
(a store or snapshot downloaded from elsewhere, a tarball). So every value used as a path, a size
or a state is checked here, and anything that is not what this mmreplay writes is refused with
``CorruptStoreError`` naming the field, what it holds and what was expected:

- names that become paths are plain names inside the store: a chunk's ``name`` is its ``seq`` as
  12 digits, optionally ``g`` and the generation (6 digits or more) for a snapshot's copy of an
  open chunk; a state file is ``state/<name>.<generation:012d>.npy``. No separators, no ``..``,
  nothing absolute.
- numbers have their JSON type (an int is not a float, a bool is not an int) and lie in range;
  counters are consistent with each other; sizes that decide allocations stay within what the
  ring and this machine can hold.
- the sampling state (``rng``, ``pending_draws``) and the priorities entry have the shapes the
  store writes.

``check_body`` needs only the manifest (``read_manifest`` calls it on every read).
``check_files`` also looks at the directory: ``chunks/`` and ``state/`` must be real directories
and every file the manifest names a regular file (not a symbolic link that could point outside),
a state file's header must declare exactly the data the file holds, and priorities state files
must hold what the format says (``load_priority_table``).
"""

from __future__ import annotations

import math
import os
import re
import stat
import warnings
from typing import Any, NoReturn

import numpy as np

from ..errors import CorruptStoreError
from ..options import Schema, extent_rows, initial_positions, validate_ring

__all__ = ["check_body", "check_files", "check_dirs", "check_chunk_name", "check_state_name", "check_rng",
           "load_priority_table", "column_names", "CHUNK_NAME", "STATE_FILE"]

CHUNK_NAME = re.compile(r"(\d{12,18})(?:g(\d{6,18}))?")
STATE_FILE = re.compile(r"state/([a-z][a-z0-9_-]{0,63})\.(\d{12,18})\.npy")
MAX_ID = 2**62  # ids, rows, generations: far beyond any real store, far below int64 overflow
MAX_DELTAS = 4096  # state files in a priorities chain (the writer starts a new chain after 64)
_FORGED = ("the manifest's checksum matches, so it was rewritten whole (damaged by a tool or forged);"
           " restore the store from a copy or a snapshot")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

MAX_FRAME_FILE_BYTES = 1 << 44  # a compressed frame file (one chunk): far above any real one

class _Fields:
    """Reads fields of a manifest, raising ``CorruptStoreError`` for anything unexpected."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, got: Any, expected: str) -> NoReturn:
        raise CorruptStoreError(f"{self.where}: {field} is {_show(got)}, expected {expected}; {_FORGED}")

    def int_(self, field: str, value: Any, lo: int = 0, hi: int = MAX_ID) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.fail(field, value, f"an integer in [{lo:,}, {hi:,}]")
        return value

    def real(self, field: str, value: Any, lo: float = 0.0, hi: float = math.inf) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and lo <= value <= hi):
            self.fail(field, value, f"a finite number in [{lo}, {hi}]")
        return float(value)

    def dict_(self, field: str, value: Any, keys: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(field, value, "a JSON object" + (f" with keys {', '.join(keys)}" if keys else ""))
        for k in keys:
            if k not in value:
                self.fail(field, value, f"a JSON object with key {k!r}")
        return value

    def list_(self, field: str, value: Any, most: int | None = None) -> list[Any]:
        if not isinstance(value, list) or (most is not None and len(value) > most):
            self.fail(field, value, "a JSON list" + (f" of at most {most:,} entries" if most is not None else ""))
        return value

    def str_(self, field: str, value: Any) -> str:
        if not isinstance(value, str):
            self.fail(field, value, "a string")
        return value


def check_chunk_name(name: Any, seq: int, field: str = "chunk name", where: str = "manifest") -> str:
    """A chunk's name: ``seq`` as 12 digits, optionally followed by ``g`` and a generation (snapshots)."""
    m = CHUNK_NAME.fullmatch(name) if isinstance(name, str) else None
    if m is None or int(m.group(1)) != seq:
        _Fields(where).fail(field, name, f"the chunk's seq as 12 digits ({seq:012d}), optionally followed by"
                                         " g and 6 digits (a snapshot's copy of an open chunk)")
    return name


def check_state_name(rel: Any, field: str = "state file", where: str = "manifest", prefix: str | None = None) -> str:
    """A state file the manifest names: ``state/<name>.<generation:012d>.npy`` (``name`` = ``prefix`` if given)."""
    m = STATE_FILE.fullmatch(rel) if isinstance(rel, str) else None
    if m is None or (prefix is not None and m.group(1) != prefix):
        _Fields(where).fail(field, rel, f"a file name state/{prefix or '<name>'}.<generation as 12 digits>.npy")
    return rel


def check_rng(value: Any, field: str = "rng", where: str = "manifest") -> dict[str, Any]:
    """A ``numpy.random.PCG64`` state as ``bit_generator.state`` returns it."""
    f = _Fields(where)
    expected = ("the state of numpy's PCG64 generator: {bit_generator: 'PCG64', state: {state, inc},"
                " has_uint32, uinteger}")
    if not isinstance(value, dict) or value.get("bit_generator") != "PCG64" or not isinstance(value.get("state"), dict):
        f.fail(field, value, expected)
    inner = value["state"]
    for key in ("state", "inc"):
        f.int_(f"{field}.state.{key}", inner.get(key), 0, 2**128 - 1)
    f.int_(f"{field}.has_uint32", value.get("has_uint32"), 0, 1)
    f.int_(f"{field}.uinteger", value.get("uinteger"), 0, 2**32 - 1)
    try:
        bit_generator: Any = np.random.PCG64()
        bit_generator.state = value
    except (TypeError, ValueError, KeyError, OverflowError):
        f.fail(field, value, expected)
    return value


def check_body(doc: dict[str, Any], where: str) -> Schema:
    """Check a manifest body (its checksum already verified); return its schema. Raises CorruptStoreError."""
    f = _Fields(where)
    f.int_("generation", doc.get("generation"))
    if "committed_at" in doc:
        f.real("committed_at", doc["committed_at"])
    raw_schema = f.dict_("schema", doc.get("schema"))
    try:
        schema = Schema.from_json(raw_schema)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, IndexError) as exc:
        raise CorruptStoreError(f"{where}: unusable schema ({type(exc).__name__}: {exc}); {_FORGED}") from None
    rows = _check_rows(f, doc.get("rows"), schema.num_envs)
    next_id = f.int_("next_id", doc.get("next_id"))
    chunks = f.list_("chunks", doc.get("chunks"))
    oldest_id = _check_chunks(f, chunks, schema, rows, next_id)
    if doc.get("streams") is not None:
        streams = f.list_("streams", doc["streams"], schema.num_envs)
        if len(streams) != schema.num_envs:
            f.fail("streams", streams, f"{schema.num_envs} entries (one per env stream)")
        for i, st in enumerate(streams):
            st = f.list_(f"streams[{i}]", st, 3)
            if len(st) != 3 or not isinstance(st[0], bool) or not isinstance(st[2], bool):
                f.fail(f"streams[{i}]", st, "[ended (bool), episode position (int), head lost (bool)]")
            f.int_(f"streams[{i}][1]", st[1], 0, MAX_ID)
    if doc.get("head_epos") is not None:
        heads = f.list_("head_epos", doc["head_epos"], schema.num_envs)
        if len(heads) != schema.num_envs:
            f.fail("head_epos", heads, f"{schema.num_envs} entries (one per env stream)")
        for i, h in enumerate(heads):
            f.int_(f"head_epos[{i}]", h, 0, 2**31 - 1)  # an episode position (int32 in the index)
    positions = initial_positions(schema)
    if doc.get("ring_positions") is not None:
        positions = max(positions, f.int_("ring_positions", doc["ring_positions"], 1))
    positions = max(positions, len(chunks))
    try:
        validate_ring(schema, positions)
    except ValueError as exc:
        raise CorruptStoreError(f"{where}: ring_positions={positions:,}: {exc}") from None
    check_rng(doc.get("rng"), "rng", where)
    _check_pending(f, doc.get("pending_draws"), oldest_id, next_id, rows)
    _check_priorities(f, doc.get("priorities"), oldest_id, next_id, positions * schema.rows_alloc)
    _check_validity(f, doc.get("validity"), next_id, rows)
    if doc.get("state_crc32") is not None:
        for rel, crc in f.dict_("state_crc32", doc["state_crc32"]).items():
            f.int_(f"state_crc32[{_show(rel)}]", crc, 0, 2**32 - 1)
    _check_rate_counts(f, doc.get("rate_limit"))
    if doc.get("metadata") is not None:
        f.dict_("metadata", doc["metadata"])
    snaps = doc.get("snapshots")
    if snaps is not None:
        for i, s in enumerate(f.list_("snapshots", snaps)):
            s = f.dict_(f"snapshots[{i}]", s, ("path", "generation", "saved_at"))
            f.str_(f"snapshots[{i}].path", s["path"])
            f.int_(f"snapshots[{i}].generation", s["generation"])
            f.real(f"snapshots[{i}].saved_at", s["saved_at"])
    if "snapshot_of" in doc:
        s = f.dict_("snapshot_of", doc["snapshot_of"], ("path", "store_generation", "saved_at"))
        f.str_("snapshot_of.path", s["path"])
        f.int_("snapshot_of.store_generation", s["store_generation"])
        f.real("snapshot_of.saved_at", s["saved_at"])
    if "loaded_from" in doc:
        s = f.dict_("loaded_from", doc["loaded_from"], ("path", "generation"))
        f.str_("loaded_from.path", s["path"])
        f.int_("loaded_from.generation", s["generation"])
    return schema


def _check_rows(f: _Fields, value: Any, n_env: int) -> list[int]:
    """``rows``: one count per stream (format 1: one integer, every stream's count)."""
    if isinstance(value, list):
        if len(value) != n_env:
            f.fail("rows", value, f"{n_env} row counts (one per env stream)")
        return [f.int_(f"rows[{i}]", v) for i, v in enumerate(value)]
    return [f.int_("rows", value)] * n_env


def _check_layout(f: _Fields, c: dict[str, Any], i: int, schema: Schema) -> list[int] | None:
    """A chunk's ``rows`` (one count per stream, together at most a chunk) and ``extents`` (each stream's
    extents in row order: enough for its rows, every extent at most once). Returns the rows, if listed."""
    n_env, rs = schema.num_envs, schema.rows_per_stream
    if c.get("rows") is None:
        if c.get("extents") is not None:
            f.fail(f"chunks[{i}].extents", c["extents"], "absent when the chunk does not list its rows")
        return None
    fill = f.list_(f"chunks[{i}].rows", c["rows"], n_env)
    if len(fill) != n_env:
        f.fail(f"chunks[{i}].rows", fill, f"{n_env} row counts (one per env stream)")
    fill = [f.int_(f"chunks[{i}].rows[{s}]", v, 0, schema.chunk_size) for s, v in enumerate(fill)]
    if sum(fill) > schema.chunk_size:
        f.fail(f"chunks[{i}].rows", fill, f"at most {schema.chunk_size:,} rows together (one chunk)")
    e = extent_rows(rs)
    extents = c.get("extents")
    if extents is None:
        if any(v > rs for v in fill):
            f.fail(f"chunks[{i}].rows", fill, f"at most {rs:,} rows per stream (home sections: no extents listed)")
        return fill
    extents = f.list_(f"chunks[{i}].extents", extents, n_env)
    if len(extents) != n_env:
        f.fail(f"chunks[{i}].extents", extents, f"{n_env} lists (one per env stream)")
    seen: set[int] = set()
    for s, xs in enumerate(extents):
        xs = f.list_(f"chunks[{i}].extents[{s}]", xs, schema.chunk_size // e)
        for x in xs:
            f.int_(f"chunks[{i}].extents[{s}]", x, 0, schema.chunk_size // e - 1)
            if x in seen:
                f.fail(f"chunks[{i}].extents", extents, "each extent listed once")
            seen.add(x)
        if len(xs) * e < fill[s]:
            f.fail(f"chunks[{i}].extents[{s}]", xs, f"extents for its {fill[s]:,} rows ({e} rows each)")
    return fill


def _check_chunks(f: _Fields, chunks: list[Any], schema: Schema, rows: list[int], next_id: int) -> int:
    """The chunk table: names, types, consecutive seqs and ids, each chunk's layout. Returns the oldest
    retained id."""
    expect_id: int | None = None
    prev_seq: int | None = None
    held = [0] * schema.num_envs
    listed = False
    for i, c in enumerate(chunks):
        c = f.dict_(f"chunks[{i}]", c, ("seq", "name", "first_id", "n_transitions", "sealed"))
        seq = f.int_(f"chunks[{i}].seq", c["seq"])
        check_chunk_name(c["name"], seq, f"chunks[{i}].name", f.where)
        first = f.int_(f"chunks[{i}].first_id", c["first_id"])
        n = f.int_(f"chunks[{i}].n_transitions", c["n_transitions"], 0, schema.chunk_size)
        if not isinstance(c["sealed"], bool):
            f.fail(f"chunks[{i}].sealed", c["sealed"], "true or false")
        crc = c.get("crc32")
        if crc is not None:
            for col, value in f.dict_(f"chunks[{i}].crc32", crc).items():
                f.int_(f"chunks[{i}].crc32[{col!r}]", value, 0, 2**32 - 1)  # keys name files' parts, never paths
        _check_prefix(f, c, i, schema)
        fill = _check_layout(f, c, i, schema)
        if fill is not None:
            listed = True
            held = [a + b for a, b in zip(held, fill, strict=True)]
        frames = c.get("frames")
        if frames is not None:  # a compressed frame file; its codec names the file: never a free string
            frames = f.dict_(f"chunks[{i}].frames", frames, ("codec", "bytes", "crc32c"))
            if schema.compression is None or frames["codec"] != schema.compression:
                f.fail(f"chunks[{i}].frames.codec", frames["codec"],
                       f"the store's compression {schema.compression!r}")
            if not c["sealed"]:
                f.fail(f"chunks[{i}].frames", frames, "none on the open chunk (only sealed chunks are compressed)")
            f.int_(f"chunks[{i}].frames.bytes", frames["bytes"], 0, MAX_FRAME_FILE_BYTES)
            f.int_(f"chunks[{i}].frames.crc32c", frames["crc32c"], 0, 2**32 - 1)
        if prev_seq is not None and seq != prev_seq + 1:
            f.fail(f"chunks[{i}].seq", seq, f"{prev_seq + 1} (the chunks listed are consecutive)")
        if expect_id is not None and first != expect_id:
            f.fail(f"chunks[{i}].first_id", first, f"{expect_id} (where the chunk before it ends)")
        prev_seq, expect_id = seq, first + n
    if expect_id is not None and expect_id != next_id:
        f.fail("next_id", next_id, f"{expect_id} (where the last chunk's transitions end)")
    if listed:
        if any(h > r for h, r in zip(held, rows, strict=True)):
            f.fail("rows", rows, f"at least the rows the chunks hold ({held})")
    elif prev_seq is not None and max(rows) > (prev_seq + 1) * schema.rows_per_stream:
        f.fail("rows", rows, f"at most {(prev_seq + 1) * schema.rows_per_stream:,} (the end of the last chunk)")
    return int(chunks[0]["first_id"]) if chunks else next_id


def _check_prefix(f: _Fields, c: dict[str, Any], i: int, schema: Schema) -> None:
    """An open chunk's ``prefix_crc32``: for exactly the chunk's columns, one CRC-32 per env stream."""
    prefix = c.get("prefix_crc32")
    if prefix is None:
        return
    field = f"chunks[{i}].prefix_crc32"
    if c["sealed"]:
        f.fail(field, prefix, "none on a sealed chunk (its crc32 covers the whole files)")
    names = column_names(schema)
    prefix = f.dict_(field, prefix, names)
    if len(prefix) != len(names):
        f.fail(field, prefix, f"a JSON object with exactly the keys {', '.join(names)}")
    for name in names:
        crcs = f.list_(f"{field}[{name!r}]", prefix[name], schema.num_envs)
        if len(crcs) != schema.num_envs:
            f.fail(f"{field}[{name!r}]", crcs, f"{schema.num_envs} checksums (one per env stream)")
        for v in crcs:
            f.int_(f"{field}[{name!r}]", v, 0, 2**32 - 1)


def column_names(schema: Schema) -> tuple[str, ...]:
    """The names of a chunk's column files (``ring.columns_for``, which imports this module)."""
    return ("obs", "action", "reward", "flags", *("x_" + e.name for e in schema.extras),
            *(("id",) if schema.id_column else ()))


def _check_pending(f: _Fields, pending: Any, oldest_id: int, next_id: int, rows: list[int]) -> None:
    if pending is None:
        return
    p = f.dict_("pending_draws", pending, ("ids", "weights", "rng_after"))
    batches = f.list_("pending_draws.ids", p["ids"], 4096)
    size: int | None = None
    for i, ids in enumerate(batches):
        ids = f.list_(f"pending_draws.ids[{i}]", ids, 2**20)
        if not ids or (size is not None and len(ids) != size):
            f.fail(f"pending_draws.ids[{i}]", ids, "a non-empty list of ids, as long as every other batch")
        size = len(ids)
        for v in ids:
            if isinstance(v, bool) or not isinstance(v, int) or not oldest_id <= v < next_id:
                f.fail(f"pending_draws.ids[{i}]", ids, f"retained ids in [{oldest_id:,}, {next_id:,})")
    weights = p.get("weights")
    if weights is not None:
        weights = f.list_("pending_draws.weights", weights)
        if len(weights) != len(batches):
            f.fail("pending_draws.weights", weights, f"{len(batches)} lists (one per batch of ids) or null")
        for i, w in enumerate(weights):
            w = f.list_(f"pending_draws.weights[{i}]", w)
            if len(w) != size:
                f.fail(f"pending_draws.weights[{i}]", w, f"{size} weights (one per id)")
            for v in w:
                f.real(f"pending_draws.weights[{i}]", v, 0.0, 1.0)  # importance weights are normalised to <= 1
    check_rng(p["rng_after"], "pending_draws.rng_after", f.where)
    before = p.get("rng_before")  # (absent in manifests written before it was recorded)
    if before is not None:
        before = f.list_("pending_draws.rng_before", before)
        if len(before) != len(batches):
            f.fail("pending_draws.rng_before", before, f"{len(batches)} generator states (one per batch of ids)")
        for i, state in enumerate(before):
            check_rng(state, f"pending_draws.rng_before[{i}]", f.where)
    seq = p.get("sequences")
    if seq is not None:  # batches of sequences: their length, strictness, and the rows written at each draw
        seq = f.dict_("pending_draws.sequences", seq, ("length", "strict", "heads"))
        f.int_("pending_draws.sequences.length", seq["length"], 1)
        if not isinstance(seq["strict"], bool):
            f.fail("pending_draws.sequences.strict", seq["strict"], "true or false")
        heads = f.list_("pending_draws.sequences.heads", seq["heads"], 4096)
        if len(heads) != len(batches):
            f.fail("pending_draws.sequences.heads", heads, f"{len(batches)} row counts (one per batch of ids)")
        for i, h in enumerate(heads):
            if isinstance(h, list):  # rows written by each stream (format 1: one count, every stream's)
                if len(h) != len(rows) or not any(h):
                    f.fail(f"pending_draws.sequences.heads[{i}]", h, f"{len(rows)} row counts, not all 0")
                for s, (v, r) in enumerate(zip(h, rows, strict=True)):
                    f.int_(f"pending_draws.sequences.heads[{i}][{s}]", v, 0, r)
            else:
                f.int_(f"pending_draws.sequences.heads[{i}]", h, 1, min(rows))


def _check_priorities(f: _Fields, entry: Any, oldest_id: int, next_id: int, slots: int) -> None:
    if entry is None:
        return
    e = f.dict_("priorities", entry, ("file", "first_id", "max_priority", "beta", "skipped_updates"))
    check_state_name(e["file"], "priorities.file", f.where, "priorities")
    for i, rel in enumerate(f.list_("priorities.deltas", e.get("deltas", []), MAX_DELTAS)):
        check_state_name(rel, f"priorities.deltas[{i}]", f.where, "priorities-delta")
    f.int_("priorities.delta_rows", e.get("delta_rows", 0))
    # The full file covers the retained ids from where the oldest one was when it was written; the ids
    # issued since are few (deltas stop once they would reach a quarter of the retained ids).
    lo = max(0, next_id - 4 * slots)
    f.int_("priorities.first_id", e["first_id"], lo, oldest_id)
    f.real("priorities.max_priority", e["max_priority"])
    f.real("priorities.beta", e["beta"])
    f.int_("priorities.skipped_updates", e["skipped_updates"])


def _check_validity(f: _Fields, entry: Any, next_id: int, rows: list[int]) -> None:
    if entry is None:
        return
    e = f.dict_("validity", entry, ("cleared_below", "cleared_row", "invalid_ids", "file"))
    f.int_("validity.cleared_below", e["cleared_below"], 0, next_id)
    cleared = e["cleared_row"]
    if isinstance(cleared, list):  # each stream's rows at the clear (one count when they were all equal)
        if len(cleared) != len(rows):
            f.fail("validity.cleared_row", cleared, f"{len(rows)} row counts (one per env stream)")
        for s, (v, r) in enumerate(zip(cleared, rows, strict=True)):
            f.int_(f"validity.cleared_row[{s}]", v, 0, r)
    else:
        f.int_("validity.cleared_row", cleared, 0, min(rows))
    f.int_("validity.invalid_ids", e["invalid_ids"], 0, next_id)
    if e["file"] is not None:
        check_state_name(e["file"], "validity.file", f.where, "invalid")


def _check_rate_counts(f: _Fields, entry: Any) -> None:
    if entry is None:
        return
    e = f.dict_("rate_limit", entry, ("inserted", "sampled", "sampled_total", "size"))
    for key in ("inserted", "sampled", "sampled_total", "size"):
        f.int_(f"rate_limit.{key}", e[key])
    if e["sampled"] > e["sampled_total"]:
        f.fail("rate_limit.sampled", e["sampled"], f"at most sampled_total ({e['sampled_total']:,})")


# -- the files ----------------------------------------------------------------------------------------
def _regular_or_absent(path: str, what: str) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # reported by whoever needs the file, in its own words
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise CorruptStoreError(f"{path}: {what} is {kind}; a store holds only regular files (a link could"
                                " lead outside the store), restore the store from a copy or a snapshot")
    return st


def check_dirs(root: str) -> None:
    """``chunks/`` and ``state/`` of a store or snapshot, if present, are directories, not links."""
    for name in ("chunks", "state"):
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise CorruptStoreError(f"{path}: is {kind}; a store's {name}/ is a plain directory (files are"
                                    " written and deleted there, never elsewhere)")


def check_files(root: str, doc: dict[str, Any], schema: Schema | None = None) -> None:
    """The files a checked manifest names, under ``root``: plain files in plain directories, and state
    files whose ``.npy`` headers declare exactly the data they hold. Raises CorruptStoreError."""
    check_dirs(root)
    schema = schema if schema is not None else Schema.from_json(doc["schema"])
    for c in doc.get("chunks") or []:
        for col in column_names(schema):
            _regular_or_absent(os.path.join(root, "chunks", f"{c['name']}.{col}.npy"), "chunk file")
        if c.get("frames"):
            _regular_or_absent(os.path.join(root, "chunks", f"{c['name']}.obs.{c['frames']['codec']}"),
                               "compressed frame file")
    prio = doc.get("priorities")
    for i, rel in enumerate([prio["file"], *prio.get("deltas", [])] if prio else []):
        path = os.path.join(root, rel)
        st = _regular_or_absent(path, "state file")
        if st is not None:
            check_npy_size(path, st.st_size)
            if schema.prioritized is not None:
                load_priority_table(path, 2 if i == 0 else 3)
    validity = doc.get("validity") or {}
    if validity.get("file"):
        path = os.path.join(root, validity["file"])
        st = _regular_or_absent(path, "state file")
        if st is not None:
            check_npy_size(path, st.st_size)


def load_priority_table(path: str, rows: int) -> np.ndarray:
    """A priorities state file (FORMAT.md, "State files"), checked: float64 ``(rows, n)`` (2 rows for the
    full file, 3 for a delta whose first row holds transition ids), raw priorities and masses finite and
    >= 0 or both NaN (not sampleable), ids whole numbers >= 0. Raises CorruptStoreError naming the file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CorruptStoreError(f"{path}: state file named by the manifest is missing") from None
    except Exception as exc:  # a damaged header or body: numpy raises ValueError, OSError, EOFError, ...
        raise CorruptStoreError(f"{path}: unreadable state file ({type(exc).__name__}: {exc})") from None
    if arr.dtype != np.float64 or arr.ndim != 2 or arr.shape[0] != rows:
        raise CorruptStoreError(f"{path}: holds {arr.dtype}{list(arr.shape)}, expected float64[{rows}, n]")
    values = arr[rows - 2:]
    nan = np.isnan(values)
    if (nan[0] != nan[1]).any() or (values[~nan] < 0).any() or np.isinf(values).any():
        raise CorruptStoreError(f"{path}: priorities and masses must be finite and >= 0 (or both NaN for a"
                                " transition that is not sampleable); the file is damaged")
    if rows == 3:
        ids = arr[0]
        if not (np.isfinite(ids).all() and (ids >= 0).all() and (ids < MAX_ID).all() and (ids == np.floor(ids)).all()):
            raise CorruptStoreError(f"{path}: the first row must hold transition ids (whole numbers >= 0); the file"
                                    " is damaged")
    return arr


def check_npy_size(path: str, size: int) -> None:
    """A state file's header must declare a plain numeric array of exactly the bytes that follow it
    (``numpy.load`` would otherwise allocate whatever the header declares)."""
    try:
        with open(path, "rb") as fh, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. numpy's "created on Python 2" for a damaged header
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            offset = fh.tell()
    except Exception as exc:  # numpy's header parser raises ValueError, SyntaxError, tokenize errors, ...
        raise CorruptStoreError(f"{path}: unreadable state file ({type(exc).__name__}: {exc})") from None
    if dtype.hasobject or dtype.kind not in "biuf":
        raise CorruptStoreError(f"{path}: state file holds {dtype}, expected numbers (state files are never"
                                " pickled)")
    declared = math.prod(shape) * dtype.itemsize
    if offset + declared != size:
        raise CorruptStoreError(f"{path}: state file header declares {list(shape)} {dtype} ({declared:,} bytes),"
                                f" the file holds {size - offset:,} bytes after its header: truncated or damaged")
