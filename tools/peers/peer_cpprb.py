"""cpprb: ``ReplayBuffer`` / ``PrioritizedReplayBuffer`` holding uint8 stacks compressed with ``stack_compress``.

Variant ``nstep``: the reference workload's n-step 3 through cpprb's ``Nstep`` option. cpprb turns
``next_of`` off with ``Nstep``, so ``next_obs`` is a field of its own, stored as a full stack
(``stack_compress`` on it returns wrong frames near episode ends: the n-step tail's next_obs are not
a sliding window). Variant ``1step``: ``next_of="obs"`` + ``stack_compress="obs"``, the most compact
layout cpprb has, but it returns 1-step transitions (less work than the reference workload).
"""

from __future__ import annotations

import copy
import gc
import os
from importlib import metadata
from typing import Any

import cpprb
import numpy as np
from common import ALPHA, BATCH, BETA, GAMMA, N_STEP, OBS, STACK


class Peer:
    needs_stacks = True
    stack_last = True  # cpprb's stack_compress wants the stack on the last axis

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.nstep = cfg["variant"] == "nstep"
        self.n_step = N_STEP if self.nstep else 1
        shape = (*OBS, STACK)
        env: dict[str, Any] = {"obs": {"shape": shape, "dtype": np.uint8}, "act": {"dtype": np.int64},
                               "rew": {}, "done": {}}
        if self.nstep:
            env["next_obs"] = {"shape": shape, "dtype": np.uint8}
            kw: dict[str, Any] = {"stack_compress": "obs",
                                  "Nstep": {"size": N_STEP, "gamma": GAMMA, "rew": "rew", "next": "next_obs"}}
        else:
            kw = {"next_of": "obs", "stack_compress": "obs"}
        self.env, self.kw = env, kw
        self.rb = self._make()

    def _make(self) -> Any:
        # cpprb writes into the nested dicts of env_dict: give each buffer its own copy
        if self.cfg["prioritized"]:
            return cpprb.PrioritizedReplayBuffer(self.cfg["capacity"], copy.deepcopy(self.env), alpha=ALPHA,
                                                 **copy.deepcopy(self.kw))
        return cpprb.ReplayBuffer(self.cfg["capacity"], copy.deepcopy(self.env), **copy.deepcopy(self.kw))

    def versions(self) -> dict[str, str]:
        return {"cpprb": metadata.version("cpprb"), "numpy": np.__version__}

    def prep_reset(self, frame: np.ndarray, stack: Any) -> None:
        return None

    def prep_step(self, a: int, r: float, obs: np.ndarray, nxt: np.ndarray, obs_s: np.ndarray,
                  nxt_s: np.ndarray, terminated: bool, truncated: bool) -> dict[str, Any]:
        return {"obs": obs_s, "act": a, "rew": r, "next_obs": nxt_s, "done": float(terminated)}

    def add(self, x: dict[str, Any]) -> None:
        self.rb.add(**x)

    def end_episode(self) -> None:
        self.rb.on_episode_end()

    def warm(self) -> None:
        pass  # anonymous memory, touched when cpprb allocates it

    def sample(self, batch: int = BATCH) -> dict[str, np.ndarray]:
        if self.cfg["prioritized"]:
            return self.rb.sample(batch, beta=BETA)
        return self.rb.sample(batch)

    def sample_for_check(self) -> dict[str, np.ndarray]:
        if self.cfg["prioritized"]:
            return self.sample()
        # ReplayBuffer.sample draws np.random.randint(0, stored, B) and returns no indices: draw the same
        # numbers first (restoring the global state) so the check knows which transitions came back
        state = np.random.get_state()
        idx = np.random.randint(0, self.rb.get_stored_size(), BATCH)
        np.random.set_state(state)
        out = self.rb.sample(BATCH)
        out["_indexes"] = idx
        return out

    def update(self, raw: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        self.rb.update_priorities(raw["indexes"], priorities)

    def ids(self, raw: dict[str, np.ndarray], wl: Any) -> np.ndarray:
        slots = np.asarray(raw["indexes"] if "indexes" in raw else raw["_indexes"]).astype(np.int64)
        # the Nstep buffer holds back up to n-1 transitions of the open episode
        held = min(N_STEP - 1, wl.pending()) if self.nstep else 0
        return wl.last_written(slots, self.cfg["capacity"], wl.steps - held)

    def normalize(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"obs": np.moveaxis(raw["obs"], -1, 1), "next_obs": np.moveaxis(raw["next_obs"], -1, 1),
                "reward": raw["rew"][:, 0], "terminal": raw["done"][:, 0] > 0}

    def shapes(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v for k, v in raw.items() if not k.startswith("_")}

    def data_paths(self) -> list[str]:
        return []

    def save(self, where: str) -> dict[str, Any]:
        os.makedirs(where, exist_ok=True)
        # safe=False keeps the compressed layout and its episode-end cache instead of expanding every
        # transition first (safe=True, the default, writes the expanded stacks of obs and next_obs)
        self.rb.save_transitions(os.path.join(where, "transitions.npz"), safe=False)
        return {"note": "save_transitions(safe=False); priorities are not saved"}

    def drop(self) -> None:
        del self.rb
        gc.collect()

    def load(self, where: str) -> None:
        self.rb = self._make()
        self.rb.load_transitions(os.path.join(where, "transitions.npz"))

    def close(self) -> None:
        pass
