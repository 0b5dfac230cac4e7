"""A Dopamine replay buffer writing DQN-replay checkpoints, as Dopamine and batch_rl write them (what the
DQN-replay importer reads)."""

from __future__ import annotations

import gzip
import os
import pickle
from dataclasses import dataclass

import numpy as np

OBS = (6, 5)


@dataclass
class Row:
    frame: np.ndarray
    action: int
    reward: float
    end: str | None  # "terminated", "truncated" (newer layout's non-terminal end) or None
    padding: bool


class Dopamine:
    """A Dopamine replay buffer of ``capacity`` slots writing checkpoints into ``d``.

    ``log=True``: batch_rl's logged buffer (suffix N written when an add leaves
    ``add_count % capacity == capacity - 1``). ``newer=True``: episode ends are recorded in
    ``episode_end_indices`` and a time limit is not a terminal.
    """

    def __init__(self, d, capacity, stack=4, horizon=1, newer=False, log=True, seed=0):
        self.d, self.C, self.K, self.N, self.newer, self.logging = d, capacity, stack, horizon, newer, log
        rng = np.random.default_rng(seed)
        # np.empty in Dopamine: slots never written hold garbage (non-zero here, so it would show)
        self.obs = rng.integers(1, 255, (capacity, *OBS), dtype=np.uint8)
        self.action = rng.integers(0, 9, capacity).astype(np.int32)
        self.reward = rng.random(capacity).astype(np.float32)
        self.terminal = rng.integers(0, 2, capacity).astype(np.uint8)
        self.add_count = 0
        self.invalid_range = np.zeros(stack)
        self.ends: set = set()
        self.next_start = True
        self.log_count = 0
        self.rows: list[Row] = []  # everything ever added, by add index
        os.makedirs(d, exist_ok=True)

    def cursor(self):
        return self.add_count % self.C

    def _add(self, row: Row, terminal: int):
        c = self.cursor()
        self.obs[c], self.action[c], self.reward[c], self.terminal[c] = row.frame, row.action, row.reward, terminal
        self.rows.append(row)
        self.add_count += 1
        cur = self.cursor()
        self.invalid_range = np.array([(cur - self.N + i) % self.C for i in range(self.K + self.N)])
        if self.logging and self.add_count % self.C == self.C - 1:
            self.save(self.log_count)
            self.log_count += 1

    def add(self, frame, action, reward, terminal, episode_end=False):
        start = self.next_start if self.newer else (self.add_count == 0 or self.terminal[self.cursor() - 1] == 1)
        if start:
            for _ in range(self.K - 1):
                self.ends.discard(self.cursor())
                self._add(Row(np.zeros(OBS, np.uint8), 0, 0.0, None, True), 0)
            self.next_start = False
        if self.newer:
            if episode_end or terminal:
                self.ends.add(np.int64(self.cursor()))  # Dopamine's cursor() is a numpy integer
                self.next_start = True
            else:
                self.ends.discard(self.cursor())
        end = "terminated" if terminal else ("truncated" if self.newer and episode_end else None)
        self._add(Row(frame, action, float(np.float32(reward)), end, False), int(terminal))

    def play(self, rng, until, time_limit=None):
        """Episodes of random length (a time limit ends one: terminal in the old layout) until ``until()``."""
        while not until():
            length = int(rng.integers(3, 40))
            limited = time_limit is not None and length >= time_limit
            length = min(length, time_limit) if limited else length
            for t in range(length):
                last = t == length - 1
                frame = rng.integers(1, 255, OBS, dtype=np.uint8)
                self.add(frame, int(rng.integers(0, 6)), float(rng.choice([-1.0, 0.0, 0.5, 1.0])),
                         int(last and (not limited or not self.newer)), episode_end=last)
                if until():
                    return

    def _write(self, name, arr, suffix):
        with gzip.open(os.path.join(self.d, f"{name}_ckpt.{suffix}.gz"), "wb", compresslevel=1) as g:
            np.save(g, arr, allow_pickle=False)

    def save(self, suffix, add_count=None):
        for name, arr in (("$store$_observation", self.obs), ("$store$_action", self.action),
                          ("$store$_reward", self.reward), ("$store$_terminal", self.terminal),
                          ("add_count", np.array(self.add_count if add_count is None else add_count)),
                          ("invalid_range", self.invalid_range)):
            self._write(name, arr, suffix)
        if self.newer:
            with gzip.open(os.path.join(self.d, f"episode_end_indices_ckpt.{suffix}.gz"), "wb") as g:
                pickle.dump(set(self.ends), g)

    def log_final(self):
        """batch_rl's log_final_buffer: the cursor is written as add_count."""
        self.save(self.log_count, add_count=self.cursor())
        self.log_count += 1
