"""Exceptions raised by mmreplay.

Every class also inherits the built-in exception a caller would naturally catch
(``ValueError`` for bad input, ``FileNotFoundError`` for a missing store, ...),
so ``except ValueError`` keeps working for code that does not know mmreplay.
"""

from __future__ import annotations

__all__ = [
    "MMReplayError",
    "StoreNotFoundError",
    "NotAStoreError",
    "CorruptStoreError",
    "FormatVersionError",
    "ReadOnlyStoreError",
    "StoreLockedError",
    "StoreClosedError",
    "EpisodeStateError",
    "NotSampleableError",
    "StoreIOError",
    "RateLimitTimeout",
]


class MMReplayError(Exception):
    """Base class of every error raised by mmreplay itself."""


class StoreNotFoundError(MMReplayError, FileNotFoundError):
    """The path given to ``open()``/``load()`` does not exist."""


class NotAStoreError(MMReplayError, ValueError):
    """The directory exists but is not an mmreplay store (or snapshot)."""


class CorruptStoreError(MMReplayError, ValueError):
    """A file of the store is damaged: the message names the file and what is wrong."""


class FormatVersionError(MMReplayError, ValueError):
    """The store was written by a newer format version than this mmreplay reads."""


class ReadOnlyStoreError(MMReplayError, PermissionError):
    """A write was attempted on a store opened with ``mode="r"`` or turned read-only by an I/O error."""


class StoreLockedError(MMReplayError, BlockingIOError):
    """Another process holds the store's single-writer lock."""


class StoreClosedError(MMReplayError, ValueError):
    """The store was used after ``close()``."""


class EpisodeStateError(MMReplayError, ValueError):
    """``step()``/``reset()`` called in an order the episode rules do not allow."""


class NotSampleableError(MMReplayError, ValueError):
    """``gather()`` (or a sample request) named transitions that cannot be returned."""


class StoreIOError(MMReplayError, OSError):
    """The disk refused a write or a sync (full disk, I/O error); the store is now read-only."""


class RateLimitTimeout(MMReplayError, TimeoutError):
    """A rate-limited ``sample()``/``step()`` was not allowed within ``RateLimit.timeout`` seconds, or
    could only have been allowed by the very process that is waiting (the message says which, and what to do)."""
