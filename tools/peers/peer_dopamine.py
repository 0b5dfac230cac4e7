"""Dopamine's in-RAM circular buffers (``dopamine-rl``): ``OutOfGraphReplayBuffer`` and
``OutOfGraphPrioritizedReplayBuffer`` with their Atari defaults (uint8 frames, int32 actions).

Dopamine stores one frame per add (the observation the action was taken in) and pads every episode
start with ``stack_size - 1`` zero transitions; it never stores an episode's final observation, so a
terminal row's next state is undefined (its docstring says so).
"""

from __future__ import annotations

import gc
import os
from importlib import metadata
from typing import Any

import numpy as np
from common import BATCH, GAMMA, N_STEP, OBS, STACK
from dopamine.tf.replay_memory import circular_replay_buffer, prioritized_replay_buffer


class Peer:
    needs_stacks = False
    stack_last = True
    n_step = N_STEP

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.rb = self._make()
        self.names = [e.name for e in self.rb.get_transition_elements(BATCH)]

    def _make(self) -> Any:
        cls = (prioritized_replay_buffer.OutOfGraphPrioritizedReplayBuffer if self.cfg["prioritized"]
               else circular_replay_buffer.OutOfGraphReplayBuffer)
        return cls(observation_shape=OBS, stack_size=STACK, replay_capacity=self.cfg["capacity"],
                   batch_size=BATCH, update_horizon=N_STEP, gamma=GAMMA, observation_dtype=np.uint8)

    def versions(self) -> dict[str, str]:
        out = {"dopamine-rl": metadata.version("dopamine-rl"), "numpy": np.__version__}
        for name in ("tensorflow-cpu", "gin-config"):
            try:
                out[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
        return out

    def prep_reset(self, frame: np.ndarray, stack: Any) -> None:
        return None

    def prep_step(self, a: int, r: float, obs: np.ndarray, nxt: np.ndarray, obs_s: Any, nxt_s: Any,
                  terminated: bool, truncated: bool) -> tuple[Any, ...]:
        # Dopamine's agents add (observation acted on, action, reward, terminal); truncation would be
        # episode_end=True with terminal=False
        return obs, a, r, int(terminated)

    def add(self, x: tuple[Any, ...]) -> None:
        if self.cfg["prioritized"]:
            # as Dopamine's agents do: new transitions enter with the largest priority seen so far
            self.rb.add(*x, priority=self.rb.sum_tree.max_recorded_priority)
        else:
            self.rb.add(*x)

    def end_episode(self) -> None:
        pass

    def warm(self) -> None:
        pass

    def sample(self) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.rb.sample_transition_batch(BATCH), strict=True))

    def update(self, raw: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        self.rb.set_priority(raw["indices"], priorities)

    def ids(self, raw: dict[str, np.ndarray], wl: Any) -> np.ndarray:
        # every episode start adds stack-1 zero transitions first: transition t is add number t + 3 (e + 1)
        t = np.arange(wl.steps)
        e, _ = wl.episode_of(t)
        adds = t + (STACK - 1) * (e + 1)
        cap = self.cfg["capacity"]
        recent = adds >= adds[-1] + 1 - cap
        slot_to_t = np.full(cap, -1, np.int64)
        slot_to_t[adds[recent] % cap] = t[recent]
        return slot_to_t[np.asarray(raw["indices"], np.int64)]

    def normalize(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"obs": np.moveaxis(raw["state"], -1, 1), "next_obs": np.moveaxis(raw["next_state"], -1, 1),
                "reward": raw["reward"], "terminal": raw["terminal"].astype(bool)}

    def shapes(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return raw

    def data_paths(self) -> list[str]:
        return []

    def save(self, where: str) -> dict[str, Any]:
        os.makedirs(where, exist_ok=True)
        self.rb.save(where, 0)
        return {}

    def drop(self) -> None:
        del self.rb
        gc.collect()

    def load(self, where: str) -> None:
        self.rb = self._make()
        self.rb.load(where, 0)

    def close(self) -> None:
        pass
