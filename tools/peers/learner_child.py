"""One DQN-style learner loop in its own process, for ``tools/bench_cpu.py --learner``.

``python learner_child.py KIND CAPACITY WORKLOAD``, KIND ``mmreplay`` (a store filled with the workload) or
``numpy`` (the same frames in an in-RAM uint8 ring, stacks gathered with ``np.take``: what a hand-written
buffer does). Each step samples 32 stacked transitions and runs a small PyTorch update with one thread
(4x4 average pooling and a two-layer MLP on the stacks, Adam). Commands on stdin: ``run SECONDS`` answers ``@@{"rate": steps/s,
"cpu_share": CPU-seconds per second}``; ``quit``.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import GAMMA, N_STEP, OBS, STACK, Workload  # noqa: E402

B = 32


class NumpyRing:
    """Frames of the workload in RAM; a row's stack is its last 4 frames (no episode handling: the cheapest
    possible gather, which only flatters this baseline)."""

    def __init__(self, wl: Workload, capacity: int):
        t = np.arange(capacity)
        e, p = wl.episode_of(t)
        self.frames = wl.pool[wl.frame_id(e, p)]
        self.rng = np.random.default_rng(0)
        self.offsets = np.arange(-STACK + 1, 1)
        self.capacity = capacity

    def sample(self) -> tuple[np.ndarray, np.ndarray]:
        t = self.rng.integers(STACK, self.capacity - N_STEP, B)
        obs = np.take(self.frames, t[:, None] + self.offsets, axis=0)
        nxt = np.take(self.frames, (t + N_STEP)[:, None] + self.offsets, axis=0)
        return obs, nxt


def main() -> None:
    kind, capacity, workload = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    wl = Workload(workload, capacity)
    tmp = tempfile.mkdtemp(prefix="learner-")
    if kind == "mmreplay":
        import mmreplay as mr
        from mmreplay.bench import warm

        store = mr.ReplayStore.create(os.path.join(tmp, "s"), capacity=capacity, obs_shape=OBS, stack=STACK,
                                      n_step=N_STEP, gamma=GAMMA, seed=0)
        for e in range(len(wl.starts)):
            start, length = int(wl.starts[e]), int(wl.lengths[e])
            if start >= capacity:
                break
            store.reset(wl.pool[wl.frame_id(e, 0)])
            n = min(length, capacity - start)
            store.extend(wl.actions[start:start + n], wl.rewards[start:start + n],
                         wl.pool[wl.frame_id(e, np.arange(1, n + 1))], np.arange(n) == length - 1,
                         np.zeros(n, bool))
        store.commit()
        warm(store)

        def sample() -> tuple[np.ndarray, np.ndarray]:
            b = store.sample(B)
            return b.obs, b.next_obs
    else:
        ring = NumpyRing(wl, capacity)
        sample = ring.sample
    # small on purpose (4x4 average pooling, then an MLP): an update of about a millisecond, so that what the
    # batch costs shows in the loop's rate
    net = torch.nn.Sequential(torch.nn.AvgPool2d(4), torch.nn.Flatten(),
                              torch.nn.Linear(STACK * (OBS[0] // 4) * (OBS[1] // 4), 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 6))
    opt = torch.optim.Adam(net.parameters(), 1e-4)

    def step() -> None:
        obs, nxt = sample()
        x = torch.from_numpy(obs).float().div_(255)
        with torch.no_grad():
            target = net(torch.from_numpy(nxt).float().div_(255)).max(1).values
        loss = torch.nn.functional.smooth_l1_loss(net(x).max(1).values, target)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    print("@@" + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "run":
            n = 0
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < float(arg):
                step()
                n += 1
            wall = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
            print("@@" + json.dumps({"rate": n / wall, "cpu_share": cpu / wall}), flush=True)
        elif cmd == "quit":
            break
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
