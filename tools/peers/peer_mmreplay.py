"""mmreplay through its public API: create, reset/step, sample, update_priorities, commit, save/load."""

from __future__ import annotations

import os
import subprocess
import time
from importlib import metadata
from typing import Any

import numpy as np
from common import ALPHA, BATCH, BETA, GAMMA, N_STEP, OBS, STACK

import mmreplay as mr


class Peer:
    needs_stacks = False
    stack_last = False
    n_step = N_STEP

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.path = os.path.join(cfg["workdir"], "store")
        prio = mr.Prioritized(alpha=ALPHA, beta=BETA) if cfg["prioritized"] else None
        self.store = mr.ReplayStore.create(self.path, capacity=cfg["capacity"], obs_shape=OBS, obs_dtype="uint8",
                                           stack=STACK, n_step=N_STEP, gamma=GAMMA, prioritized=prio, seed=0,
                                           compression=None if cfg.get("compression") == "none" else "auto")
        self.api = "save/load" if hasattr(mr.ReplayStore, "save") and hasattr(mr.ReplayStore, "load") \
            else "commit/open"

    def versions(self) -> dict[str, str]:
        here = os.path.dirname(os.path.abspath(mr.__file__))
        try:
            rev = subprocess.run(["git", "-C", here, "describe", "--always", "--dirty"], capture_output=True,
                                 text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            rev = ""
        return {"mmreplay": metadata.version("mmreplay") + (f" ({rev})" if rev else ""), "numpy": np.__version__,
                "checkpoint_api": self.api}

    def prep_reset(self, frame: np.ndarray, stack: Any) -> np.ndarray:
        return frame

    def add_reset(self, frame: np.ndarray) -> None:
        self.store.reset(frame)

    def prep_step(self, a: int, r: float, obs: np.ndarray, nxt: np.ndarray, obs_s: Any, nxt_s: Any,
                  terminated: bool, truncated: bool) -> tuple[Any, ...]:
        return a, r, nxt, terminated, truncated

    def add(self, x: tuple[Any, ...]) -> None:
        self.store.step(*x)

    def end_episode(self) -> None:
        pass

    def warm(self) -> None:
        c = time.perf_counter()
        self.store.commit()
        if not hasattr(self, "commit_s"):  # the first commit, right after filling
            self.commit_s = time.perf_counter() - c
        try:
            from mmreplay.bench import warm
        except ImportError:
            return
        warm(self.store)

    def sample(self, batch: int = BATCH) -> Any:
        return self.store.sample(batch)

    def update(self, b: Any, priorities: np.ndarray) -> None:
        self.store.update_priorities(b.index, priorities)

    def ids(self, b: Any, wl: Any) -> np.ndarray:
        return np.asarray(b.index)

    def normalize(self, b: Any) -> dict[str, np.ndarray]:
        return {"obs": b.obs, "next_obs": b.next_obs, "reward": b.reward, "terminal": np.asarray(b.terminated)}

    def shapes(self, b: Any) -> dict[str, np.ndarray]:
        return {"obs": b.obs, "next_obs": b.next_obs, "action": b.action, "reward": b.reward,
                "discount": b.discount, "weight": b.weight}

    def data_paths(self) -> list[str]:
        return [self.path]

    def save(self, where: str) -> dict[str, Any]:
        if self.api == "save/load":
            self.store.save(where)
        else:
            self.store.commit()
        return {"api": self.api, "commit_s": getattr(self, "commit_s", None)}

    def drop(self) -> None:
        self.store.close()

    def load(self, where: str) -> None:
        if self.api == "save/load":
            self.path = os.path.join(self.cfg["workdir"], "restored")
            self.store = mr.ReplayStore.load(where, self.path)
        else:
            self.store = mr.ReplayStore.open(self.path)

    def close(self) -> None:
        if not self.store.closed:
            self.store.close()
