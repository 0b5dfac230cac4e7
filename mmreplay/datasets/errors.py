"""Errors of the dataset importers and exporters.

Both inherit the built-in type a caller would catch (``ValueError`` for a file
that is not what it should be, ``FileNotFoundError`` for one that is missing)
and ``MMReplayError``. Messages name the file and, where there is one, the key.
"""

from __future__ import annotations

from ..errors import MMReplayError

__all__ = ["DatasetError", "DatasetNotFoundError"]


class DatasetError(MMReplayError, ValueError):
    """A dataset file is malformed, truncated, inconsistent or of an unsupported kind."""


class DatasetNotFoundError(MMReplayError, FileNotFoundError):
    """A dataset path, or a file the dataset needs, does not exist."""
