"""TorchRL's ``SliceSampler`` on the episodes ``tools/bench_sequences.py`` gives mmreplay (run by that tool in
the TorchRL virtual environment, started as ``python peer_torchrl_slices.py CONFIG_JSON``).

A ``TensorDictReplayBuffer`` over ``LazyMemmapStorage`` holds one step per entry: ``pixels`` (the 84x84
observation before the step, one frame: stacked states would take 4x the disk), ``action`` and
``("next", reward/done/terminated/truncated)``. The episodes are those of ``mmreplay.bench.fill`` (same
seeded lengths, actions, rewards and frame pool), appended with ``extend`` in blocks of 1000 steps.

Protocol (one JSON line per answer on stdout, prefixed ``@@``; errors as ``{"error": ...}``): after
``{"versions": ...}`` and ``{"fill_s", "disk_bytes", ...}`` it reads commands from stdin:

    sample frames SECONDS   -> {"per_call_s"}: rb.sample() of 32 slices of 81 steps, frames as stored
    sample stacked SECONDS  -> {"per_call_s"}: 32 slices of 84 steps, stacked into (32, 81, 4, 84, 84)
                               (states 3.. of a slice: TorchRL slices do not reach before an episode)
    quit
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from importlib import metadata
from typing import Any

import numpy as np
import torch
from common import emit, rss_anon_mb

# As in peer_torchrl.py: torchrl's C++ extension is built against an older torch; lazy binding loads it.
_flags = sys.getdlopenflags()
sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_LOCAL)
try:
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, SliceSampler, TensorDictReplayBuffer
finally:
    sys.setdlopenflags(_flags)

BLOCK = 1000


def episodes(steps: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Episode lengths, actions and rewards drawn as ``mmreplay.bench.fill`` draws them."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(100, 3001, size=steps // 100 + 2)
    actions = rng.integers(0, 6, size=steps)
    rewards = (rng.random(steps) < 0.02).astype(np.float32)
    return lengths, actions, rewards


def frame_ids(steps: int, lengths: np.ndarray, npool: int) -> tuple[np.ndarray, np.ndarray]:
    """Pool index of the observation before each step, and whether the step ends its episode (the
    frames ``mmreplay.bench.fill`` writes: reset frame ``pool[(i + 7) % n]`` after step i ended one)."""
    obs = np.empty(steps, np.int64)
    done = np.zeros(steps, bool)
    e, left, current = 0, int(lengths[0]), 0
    for i in range(steps):
        obs[i] = current
        left -= 1
        current = (i + 1) % npool
        if left == 0:
            done[i] = True
            current = (i + 7) % npool
            e += 1
            left = int(lengths[e % len(lengths)])
    return obs, done


class Slices:
    def __init__(self, cfg: dict[str, Any]) -> None:
        torch.manual_seed(cfg["seed"])
        torch.set_num_threads(1)  # see peer_torchrl.py: more threads were slower on the shared 2 cores
        self.cfg = cfg
        self.batch, self.length, self.stack = cfg["batch"], cfg["length"], cfg["stack"]
        storage = LazyMemmapStorage(cfg["capacity"], scratch_dir=os.path.join(cfg["workdir"], "storage"))
        self.rb_frames = TensorDictReplayBuffer(
            storage=storage, batch_size=self.batch * (self.length + 1),
            sampler=SliceSampler(slice_len=self.length + 1, end_key=("next", "done"), strict_length=False,
                                 pad_output=True))
        self.rb_stacked = TensorDictReplayBuffer(
            storage=storage, batch_size=self.batch * (self.length + self.stack),
            sampler=SliceSampler(slice_len=self.length + self.stack, end_key=("next", "done"), strict_length=False,
                                 pad_output=True))

    def fill(self) -> dict[str, Any]:
        cfg = self.cfg
        pool = torch.from_numpy(np.load(cfg["pool"]))
        steps = cfg["steps"]
        lengths, actions, rewards = episodes(steps, cfg["seed"])
        obs, done = frame_ids(steps, lengths, len(pool))
        t0 = time.perf_counter()
        for a in range(0, steps, BLOCK):
            b = min(a + BLOCK, steps)
            d = torch.from_numpy(done[a:b])
            nxt = TensorDict({"reward": torch.from_numpy(rewards[a:b]).unsqueeze(-1), "done": d.unsqueeze(-1),
                              "terminated": d.unsqueeze(-1), "truncated": torch.zeros(b - a, 1, dtype=torch.bool)},
                             batch_size=[b - a])
            self.rb_frames.extend(TensorDict({"pixels": pool[torch.from_numpy(obs[a:b])],
                                              "action": torch.from_numpy(actions[a:b]), "next": nxt},
                                             batch_size=[b - a]))
        fill_s = time.perf_counter() - t0
        root = os.path.join(cfg["workdir"], "storage")
        disk = sum(os.stat(os.path.join(r, n)).st_blocks * 512 for r, _, ns in os.walk(root) for n in ns)
        self.warm()
        return {"fill_s": fill_s, "disk_bytes": disk, "rss_anon_mb": rss_anon_mb()}

    def warm(self) -> None:
        for leaf in self.rb_frames.storage._storage.values(include_nested=True, leaves_only=True):
            flat = leaf.reshape(-1).view(torch.uint8) if leaf.dtype != torch.bool else leaf.reshape(-1)
            flat[::4096].sum()

    def sample(self, variant: str) -> Any:
        if variant == "frames":
            return self.rb_frames.sample()
        td = self.rb_stacked.sample()
        t = self.length + self.stack
        pix = td["pixels"].reshape(self.batch, t, 84, 84)  # slices stay in their episode (short ones padded)
        return pix.unfold(1, self.stack, 1)[:, : self.length + 1].permute(0, 1, 4, 2, 3).contiguous()

    def rate(self, variant: str, seconds: float) -> float:
        self.sample(variant)
        n, spent = 0, 0.0
        end = time.perf_counter() + seconds
        out = None
        while time.perf_counter() < end or n < 3:
            del out
            t = time.perf_counter()
            out = self.sample(variant)
            spent += time.perf_counter() - t
            n += 1
        return spent / n


def main() -> None:
    cfg = json.loads(sys.argv[1])
    peer = Slices(cfg)
    emit(versions={p: metadata.version(p) for p in ("torch", "torchrl", "tensordict", "numpy")})
    emit(**peer.fill())
    for line in sys.stdin:
        cmd = line.split()
        try:
            if cmd and cmd[0] == "sample":
                emit(per_call_s=peer.rate(cmd[1], float(cmd[2])))
            elif cmd and cmd[0] == "quit":
                break
            else:
                emit(error=f"unknown command {line.strip()!r}")
        except Exception as exc:  # report and keep serving
            emit(error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-2000:])


if __name__ == "__main__":
    main()
