"""Helpers of the compression tests: real Atari frames, and one episode stream written into several stores."""

from __future__ import annotations

import os

import numpy as np
import pytest

ATARI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "atari")


def atari_frames(game: str) -> np.ndarray:
    """The real frames of ``tests/data/atari/<game>.npz`` (skipped when absent, a failure under CI=true)."""
    path = os.path.join(ATARI, game + ".npz")
    if not os.path.exists(path):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path} is missing in CI")
        pytest.skip(f"{path} not present")
    return np.load(path)["frames"]


def atari_npz(game: str) -> dict[str, np.ndarray]:
    atari_frames(game)  # skips when absent
    with np.load(os.path.join(ATARI, game + ".npz")) as d:
        return {k: d[k] for k in d.files}
