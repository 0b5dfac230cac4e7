"""Access to the real Atari episodes in ``../shared/data/atari`` (skipped outside CI when absent)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from helpers import shared_data_dir

GAMES = ("pong", "breakout", "seaquest", "mspacman")


@dataclass
class Episode:
    frames: np.ndarray  # (T+1, 84, 84) uint8
    actions: np.ndarray  # (T,) int32
    rewards: np.ndarray  # (T,) float32
    terminated: np.ndarray  # (T,) bool
    truncated: np.ndarray  # (T,) bool


def atari_dir() -> str:
    """The data directory, or skip (a failure under CI=true: CI must have the data)."""
    base = shared_data_dir()
    path = os.path.join(base, "atari") if base else None
    if path is None or not os.path.isdir(path):
        if os.environ.get("CI") == "true":
            pytest.fail("../shared/data/atari is missing in CI")
        pytest.skip("../shared/data/atari not present")
    return path


def episodes(game: str) -> Iterator[Episode]:
    d = np.load(os.path.join(atari_dir(), game + ".npz"))
    frames, starts = d["frames"], d["episode_starts"]
    step = 0
    for e, start in enumerate(starts):
        end = starts[e + 1] if e + 1 < len(starts) else len(frames)
        t = end - start - 1
        yield Episode(frames[start:end], d["actions"][step:step + t], d["rewards"][step:step + t],
                      d["terminated"][step:step + t], d["truncated"][step:step + t])
        step += t
