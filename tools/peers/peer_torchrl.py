"""TorchRL: ``TensorDictReplayBuffer`` over ``LazyMemmapStorage`` with ``RandomSampler`` or
``PrioritizedSampler``, n-step returns through ``MultiStepTransform`` (its replay-buffer transform).

Each transition is stored in TorchRL's TED layout as its own Atari DQN example does: ``pixels`` (the
stacked state, here uint8 (4, 84, 84) instead of the example's float32) and ``("next", "pixels")``,
plus action, reward and done flags. ``MultiStepTransform`` works on a time dimension, so one transition
is added as ``extend()`` of a batch of one (``add()`` of a TensorDictReplayBuffer does not add that
dimension for the transform).
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import time
from importlib import metadata
from typing import Any

import numpy as np
import torch
from common import ALPHA, BETA, GAMMA, N_STEP
from tensordict import TensorDict

# torchrl's wheels are built against a torch older than the 2.13.0 used here: its C++ extension (the
# segment trees of PrioritizedSampler) references one autograd symbol whose signature changed, so the
# default eager binding refuses to load it. Lazy binding loads it; the segment trees never call that
# symbol (only safetanh/safeatanh do, unused here), and check() verifies what the sampler returns.
_flags = sys.getdlopenflags()
sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_LOCAL)
try:
    from torchrl.data import LazyMemmapStorage, PrioritizedSampler, RandomSampler, TensorDictReplayBuffer
    from torchrl.envs.transforms import MultiStepTransform
finally:
    sys.setdlopenflags(_flags)


class Peer:
    needs_stacks = True
    stack_last = False
    n_step = N_STEP

    def __init__(self, cfg: dict[str, Any]):
        torch.manual_seed(0)
        # one intra-op thread: with torch's default of one per core, every other busy process on this
        # 2-core machine made adds and samples up to 10x slower (spinning worker threads); one is faster
        torch.set_num_threads(1)
        self.cfg = cfg
        self.root = os.path.join(cfg["workdir"], "rb")
        self.scratch = os.path.join(self.root, "storage")
        self.rb = self._make(self.scratch)

    def _make(self, scratch: str) -> Any:
        cap = self.cfg["capacity"]
        sampler = PrioritizedSampler(cap, alpha=ALPHA, beta=BETA) if self.cfg["prioritized"] else RandomSampler()
        return TensorDictReplayBuffer(storage=LazyMemmapStorage(cap, scratch_dir=scratch), sampler=sampler,
                                      batch_size=32, transform=MultiStepTransform(n_steps=N_STEP, gamma=GAMMA))

    def versions(self) -> dict[str, str]:
        return {p: metadata.version(p) for p in ("torch", "torchrl", "tensordict", "numpy")}

    def prep_reset(self, frame: np.ndarray, stack: Any) -> None:
        return None

    def prep_step(self, a: int, r: float, obs: np.ndarray, nxt: np.ndarray, obs_s: np.ndarray,
                  nxt_s: np.ndarray, terminated: bool, truncated: bool) -> TensorDict:
        nxt_td = TensorDict({"pixels": torch.from_numpy(nxt_s)[None], "reward": torch.tensor([[r]]),
                             "done": torch.tensor([[terminated or truncated]]),
                             "terminated": torch.tensor([[terminated]]), "truncated": torch.tensor([[truncated]])},
                            batch_size=[1])
        return TensorDict({"pixels": torch.from_numpy(obs_s)[None], "action": torch.tensor([a]), "next": nxt_td},
                          batch_size=[1])

    def add(self, x: TensorDict) -> None:
        self.rb.extend(x)

    def add_batch(self, ops: list[tuple[str, Any]]) -> None:
        self.rb.extend(torch.cat([x for kind, x in ops if kind == "step"]))

    def end_episode(self) -> None:
        pass

    def warm(self) -> None:
        # touch every page of the memory-mapped storage, as a long-running learner's mapping would be
        for leaf in self.rb.storage._storage.values(include_nested=True, leaves_only=True):
            flat = leaf.reshape(-1).view(torch.uint8) if leaf.dtype != torch.bool else leaf.reshape(-1)
            flat[::4096].sum()

    def sample(self) -> TensorDict:
        return self.rb.sample()

    def update(self, td: TensorDict, priorities: np.ndarray) -> None:
        self.rb.update_priority(td["index"], torch.from_numpy(priorities.astype(np.float32)))

    def ids(self, td: TensorDict, wl: Any) -> np.ndarray:
        # MultiStepTransform holds back the last n transitions until later ones arrive
        return wl.last_written(td["index"].numpy().astype(np.int64), self.cfg["capacity"], wl.steps - N_STEP)

    def normalize(self, td: TensorDict) -> dict[str, np.ndarray]:
        return {"obs": td["pixels"].numpy(), "next_obs": td["next", "pixels"].numpy(),
                "reward": td["next", "reward"][:, 0].numpy(), "terminal": td["next", "terminated"][:, 0].numpy()}

    def shapes(self, td: TensorDict) -> dict[str, Any]:
        return {".".join(k) if isinstance(k, tuple) else k: v
                for k, v in td.items(include_nested=True, leaves_only=True)}

    def data_paths(self) -> list[str]:
        return [self.scratch]

    def save(self, where: str) -> dict[str, Any]:
        self.rb.dumps(where)
        self.ckpt = where
        # also the documented zero-copy form: dumping into the directory that holds the storage (the
        # live files themselves, which training goes on overwriting: not a snapshot)
        c = time.perf_counter()
        self.rb.dumps(self.root)
        return {"save_inplace_s": time.perf_counter() - c}

    def drop(self) -> None:
        del self.rb
        gc.collect()
        shutil.rmtree(self.root, ignore_errors=True)

    def load(self, where: str) -> None:
        # into a fresh scratch directory: the checkpoint stays a checkpoint (loads() copies the data)
        self.scratch = os.path.join(self.cfg["workdir"], "loaded", "storage")
        self.rb = self._make(self.scratch)
        self.rb.loads(where)

    def load_inplace(self, where: str) -> float:
        """The zero-copy load: a storage whose scratch directory is the checkpoint's own storage."""
        del self.rb
        gc.collect()
        shutil.rmtree(os.path.dirname(self.scratch), ignore_errors=True)
        c = time.perf_counter()
        self.scratch = os.path.join(where, "storage")
        self.rb = self._make(self.scratch)
        self.rb.loads(where)
        return time.perf_counter() - c

    def close(self) -> None:
        pass
