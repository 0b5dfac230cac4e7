"""Generated Atari-like episodes (84x84 uint8 frames), for the demo, quick benchmarks and tests.

The frames are cheap to make but not trivial: a dim background with a
bouncing ball and a paddle, so neighbouring frames differ like a game's do and
compress roughly like real ones. Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["Episode", "atari_like_episodes"]


@dataclass
class Episode:
    """One episode in Gymnasium order: ``frames[0]`` is the reset observation, ``frames[t+1]`` follows step t."""

    frames: np.ndarray  # (T+1, 84, 84) uint8
    actions: np.ndarray  # (T,) int64
    rewards: np.ndarray  # (T,) float32
    terminated: bool
    truncated: bool

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])


def _frames(rng: np.random.Generator, count: int, size: int = 84) -> np.ndarray:
    out = np.empty((count, size, size), np.uint8)
    background = rng.integers(20, 40, (size, size), dtype=np.uint8)
    pos = rng.uniform(10, size - 10, 2)
    vel = rng.uniform(-2.5, 2.5, 2)
    paddle = size / 2
    for t in range(count):
        pos += vel
        for d in range(2):
            if pos[d] < 2 or pos[d] > size - 4:
                vel[d] = -vel[d]
                pos[d] = min(max(pos[d], 2), size - 4)
        paddle += np.clip(pos[0] - paddle, -2, 2)
        frame = background.copy()
        y, x = int(pos[0]), int(pos[1])
        frame[y:y + 3, x:x + 3] = 236
        p = int(paddle)
        frame[max(p - 6, 0):p + 6, size - 6:size - 4] = 144
        frame[:4, :] = 87  # score bar
        frame[:4, : (t // 50) % size] = 200
        out[t] = frame
    return out


def atari_like_episodes(count: int, seed: int = 0, min_len: int = 100, max_len: int = 3000,
                        time_limit: int | None = None, n_actions: int = 6) -> Iterator[Episode]:
    """``count`` episodes with lengths uniform in ``[min_len, max_len]``.

    An episode that reaches ``time_limit`` steps is truncated, otherwise it terminates.
    """
    rng = np.random.default_rng(seed)
    for _ in range(count):
        length = int(rng.integers(min_len, max_len + 1))
        truncated = time_limit is not None and length >= time_limit
        if truncated:
            length = int(time_limit)  # type: ignore[arg-type]
        frames = _frames(rng, length + 1)
        rewards = (rng.random(length) < 0.02).astype(np.float32) * rng.choice([-1.0, 1.0], length).astype(np.float32)
        yield Episode(frames, rng.integers(0, n_actions, length), rewards, not truncated, truncated)
