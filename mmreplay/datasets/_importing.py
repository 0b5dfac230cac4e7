"""What the importers share: the store built in a temporary directory and renamed when complete
(``StoreBuilder``), episodes written through ``reset``/``extend`` a piece at a time
(``feed_episode``), and sources read ahead by a thread (``ReadAhead``).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._inputs import local_path
from ..errors import MMReplayError
from ..storage.manifest import fsync_dir
from ..store import ReplayStore
from ._common import PIECE, remove_path, remove_stale_siblings, temp_sibling
from .errors import DatasetError

# The arguments of ReplayStore.create that the caller of an import chooses (or leaves to the source's record
# and the defaults); the others describe the dataset.
CALLER_ARGUMENTS = ("stack", "n_step", "gamma", "pad", "capacity", "chunk_size", "seed")
_NAMES_ARGUMENT = re.compile(rf"({'|'.join(CALLER_ARGUMENTS)})\b")


class ArgumentRefused(MMReplayError, ValueError):
    """``ReplayStore.create`` refused one of the ``CALLER_ARGUMENTS`` of an import: ``argument`` is its name,
    ``reason`` the store's message (which begins with that name)."""

    def __init__(self, path: str, argument: str, reason: str) -> None:
        super().__init__(f"import into {path}: {reason}")
        self.argument, self.reason = argument, reason


def check_store_path(path: str | os.PathLike[str]) -> str:
    """The absolute path of a new store at ``path``, refused unless a new path or an empty directory.

    A store is a local directory: only an import's source may be a URL. Nothing of a store is reached
    through a symbolic link (its files are opened without following one), so a link at ``path`` is refused.
    """
    full = os.path.abspath(local_path(path, "import"))
    if os.path.islink(full):
        raise ValueError(f"import: {full} is a symbolic link (to {os.readlink(full)}), and a store is never reached"
                         f" through a link; give the directory it points to ({os.path.realpath(full)}) or a new path")
    if os.path.exists(full) and (not os.path.isdir(full) or os.listdir(full)):
        raise FileExistsError(f"import: {full} already exists and is not an empty directory;"
                              " give a new path for the store")
    return full


# -- the store ----------------------------------------------------------------------
class StoreBuilder:
    """Creates the imported store in a hidden temporary directory next to ``path``; ``finish()`` renames it.

    Used as a context manager: an exception inside the block removes the temporary directory,
    so a failed import leaves no store behind.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = check_store_path(path)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        remove_stale_siblings(self.path)
        self.tmp = temp_sibling(self.path, "importing")
        self.store: ReplayStore | None = None

    def create(self, **kwargs: Any) -> ReplayStore:
        """Create the store. A value the store refuses (a ValueError naming the argument) is an
        ``ArgumentRefused`` for one of the ``CALLER_ARGUMENTS``, else a ``DatasetError``: the dataset's layout."""
        try:
            self.store = ReplayStore.create(self.tmp, **kwargs)
        except ValueError as exc:
            if isinstance(exc, MMReplayError):
                raise
            named = _NAMES_ARGUMENT.match(str(exc))
            if named:
                raise ArgumentRefused(self.path, named.group(1), str(exc)) from None
            raise DatasetError(f"import into {self.path}: the dataset cannot be stored as it is: {exc}") from None
        return self.store

    def finish(self) -> ReplayStore:
        if self.store is None:
            raise DatasetError("import: the source holds no episodes to import")
        self.store.close()
        self.store = None
        if os.path.isdir(self.path):
            os.rmdir(self.path)  # the empty directory the caller made for it
        os.rename(self.tmp, self.path)
        fsync_dir(os.path.dirname(self.path))
        return ReplayStore.open(self.path, mode="r+")

    def __enter__(self) -> StoreBuilder:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            return
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.close()
        remove_path(self.tmp)


def sampling_params(recorded: dict[str, Any], **given: Any) -> dict[str, Any]:
    """``stack``/``n_step``/``gamma``/``pad``: the caller's value, else the source's, else the store default."""
    out = {}
    for name, value in given.items():
        value = recorded.get(name) if value is None else value
        if value is not None:
            out[name] = value
    return out



# -- writing an episode into a store ------------------------------------------------------------------
@dataclass
class Steps:
    """Steps ``[a, b)`` of an episode as read from a source (``extras``: name -> (b - a, *shape))."""

    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)


def feed_episode(store: ReplayStore, length: int, read_frames: Callable[[int, int], np.ndarray],
                 read_steps: Callable[[int, int], Steps], final_missing: bool = False,
                 end_open_as_truncated: bool = True, bar: Any = None, piece: int = PIECE) -> None:
    """Write one episode of ``length`` steps: ``reset(frame 0)`` then one ``extend()`` per piece of steps.

    ``read_frames(a, b)`` returns observations ``a .. b-1`` and ``read_steps(a, b)`` steps ``a .. b-1``;
    both are called with ranges of at most ``piece``. ``final_missing``: the source lacks the final
    observation, so the last piece is written with ``final_missing=True`` (that frame is not read).
    ``end_open_as_truncated``: a last step with neither flag set ends the episode as truncated.
    Raises ``DatasetError`` if a step before the last one is flagged as the episode's end.
    """
    store.reset(read_frames(0, 1)[0])
    if bar is not None:
        bar.update(1)
    schema = store.schema
    for a in range(0, length, piece):
        b = min(a + piece, length)
        last_piece = b == length
        st = read_steps(a, b)
        term = np.asarray(st.terminated, np.bool_)
        trunc = np.asarray(st.truncated, np.bool_)
        missing = last_piece and final_missing
        if last_piece and (missing or end_open_as_truncated) and not (term[-1] or trunc[-1]):
            trunc = trunc.copy()
            trunc[-1] = True
        early = np.flatnonzero((term | trunc)[: b - a - 1 if last_piece else b - a])
        if early.size:
            raise DatasetError(f"an episode of {length} steps has step {a + int(early[0])} flagged as its end"
                               " (terminated or truncated) before its last step; every episode ends once")
        stop = b - 1 if missing else b
        frames = read_frames(a + 1, stop + 1) if stop > a else np.zeros((0, *schema.obs_shape), schema.obs_dtype)
        extras: dict[str, Any] = st.extras
        store.extend(st.actions, st.rewards, frames, term, trunc, final_missing=missing, **extras)
        if bar is not None:
            bar.update(b - a)


class ReadAhead:
    """Rows of a source array read front to back in blocks by a background thread, one block ahead.

    ``read(a, b)`` returns rows ``[a, b)``; calls must not go backwards (rows before ``a`` are
    dropped). ``fetch(a, b)`` is what reads the source (e.g. a zarr or HDF5 slice); it runs in
    the thread, so decoding overlaps the consumer's work. Memory: the block being read, the one
    being consumed, and a copy only when a request spans two blocks.
    """

    def __init__(self, fetch: Callable[[int, int], np.ndarray], total: int, block: int = PIECE) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._fetch, self.total, self.block = fetch, total, max(1, block)
        self._ex = ThreadPoolExecutor(1, thread_name_prefix="mmreplay-import-read-ahead")
        self._blocks: deque[tuple[int, np.ndarray]] = deque()  # (first source row, rows) not yet consumed
        self._next = 0  # first row not yet requested
        self._fut: Any = None
        self._ahead()

    def _ahead(self) -> None:
        a, b = self._next, min(self._next + self.block, self.total)
        self._fut = (a, self._ex.submit(self._fetch, a, b)) if a < b else None
        self._next = b

    def read(self, a: int, b: int) -> np.ndarray:
        if b <= a and self._blocks:
            return self._blocks[0][1][:0]
        while not self._blocks or self._blocks[-1][0] + len(self._blocks[-1][1]) < b:
            if self._fut is None:
                raise IndexError(f"ReadAhead.read({a}, {b}): the source has {self.total} rows")
            lo, fut = self._fut
            self._blocks.append((lo, np.asarray(fut.result())))
            self._ahead()
        while len(self._blocks) > 1 and self._blocks[0][0] + len(self._blocks[0][1]) <= a:
            self._blocks.popleft()  # wholly before the request: done with
        if self._blocks[0][0] > a:
            raise ValueError(f"ReadAhead.read({a}, {b}): rows before {self._blocks[0][0]} were already dropped")
        parts = [blk[max(a - lo, 0):b - lo] for lo, blk in self._blocks if lo < b]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def close(self) -> None:
        self._ex.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
