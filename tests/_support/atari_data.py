"""The real Atari episodes in ``tests/data/atari`` (recorded by ``tools/record_atari.py``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from tests._support.helpers import data_dir

GAMES = ("pong", "breakout", "seaquest", "mspacman")


@dataclass
class Episode:
    frames: np.ndarray  # (T+1, 84, 84) uint8
    actions: np.ndarray  # (T,) int32
    rewards: np.ndarray  # (T,) float32
    terminated: np.ndarray  # (T,) bool
    truncated: np.ndarray  # (T,) bool


def atari_file(game: str) -> str:
    """The path of ``<game>.npz``; a missing file fails the test (the data is part of the repository)."""
    path = os.path.join(data_dir(), "atari", game + ".npz")
    if not os.path.isfile(path):
        pytest.fail(f"{os.path.relpath(path)} is missing: it is committed with the tests; restore it with git, or "
                    "record it again with 'python tools/record_atari.py' (needs pip install -e '.[atari]')")
    return path


def episodes(game: str) -> Iterator[Episode]:
    d = np.load(atari_file(game))
    frames, starts = d["frames"], d["episode_starts"]
    step = 0
    for e, start in enumerate(starts):
        end = starts[e + 1] if e + 1 < len(starts) else len(frames)
        t = end - start - 1
        yield Episode(frames[start:end], d["actions"][step:step + t], d["rewards"][step:step + t],
                      d["terminated"][step:step + t], d["truncated"][step:step + t])
        step += t
