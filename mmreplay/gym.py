"""Gymnasium integration: stores shaped from an env's spaces, and a recorder wrapper."""

from __future__ import annotations

import os
from typing import Any

from .store import ReplayStore


def store_from_env(env: Any, path: str | os.PathLike[str], capacity: int, **kwargs: Any) -> ReplayStore:
    """Create a store whose obs/action shapes and dtypes and ``num_envs`` come from ``env``."""
    raise NotImplementedError("store_from_env is being written")
