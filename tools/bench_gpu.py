"""A Nature-DQN learner's updates/s fed to the GPU by each way of getting batches there.

Ways, in alternating windows in one process (each ratio: median over rounds of the per-round ratio to
"frames on the device"):

- ``alone``: the learner on one batch already on the device, again and again (no data movement at all);
- ``on-device``: frames already on the device: a pool of the store's frames as one device tensor, random
  stacks drawn and gathered there (what a replay kept in GPU memory costs; no n-step window);
- ``sample``: ``store.sample(B)`` + ``to_tensors`` + ``.to(device)``;
- ``batches2``: ``store.batches(B, prefetch=2)`` + ``to_tensors`` + ``.to(device)``;
- ``feed``: ``mmreplay.torch.device_batches(store, B, device, prefetch=2)`` (the target: >= 0.95 of
  ``on-device``); also timed: the learner thread's CPU time in ``next()`` per batch, and the feed's own rate
  with no learner (``feed-only``: what it can supply);
- ``feed-hs``: the same with ``host_stacks=True`` (both stacks read into the pinned buffers and copied as
  they are: 8 frames a row, no gather on the device), its ``next()`` timed too.

Learner: the Nature DQN (3 conv + 512 fc, 6 actions) on uint8 84x84x4 stacks / 255, Adam (lr 1e-4), Huber
loss, a target network synced every 1,000 updates, TF32 matmuls and convolutions, one update per batch.
Store: the repository's real Atari episodes (tests/data/atari) cycled into episodes of 100..3000 steps,
stack 4, n-step 3, compressed (the default), filled to 1.1x capacity (``--store PATH`` reuses one).
Writes the ``gpu`` section of BENCHMARKS.md when run on a CUDA device (``--no-write`` not given).

    python tools/bench_gpu.py                                   # CUDA, capacity 1M
    python tools/bench_gpu.py --device cpu --capacity 20000 --seconds 2    # smoke check without a GPU
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import fill_reference, table, write_section  # noqa: E402
from bench_feed import atari_pool, log  # noqa: E402

import mmreplay as mr  # noqa: E402
from mmreplay.torch import TensorBatch, device_batches, to_tensors  # noqa: E402

WAYS = ("alone", "on-device", "sample", "batches2", "feed", "feed-hs", "feed-only")
RATIO_WAYS = WAYS[:6]
TIMED = ("feed", "feed-hs")  # ways whose next() is timed on the learner's thread


def nature_dqn(actions: int = 6) -> nn.Module:
    return nn.Sequential(nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
                         nn.Linear(512, actions))


class Learner:
    def __init__(self, device: torch.device) -> None:
        if device.type == "cuda":  # (process-wide: TF32 matmuls and convolutions, cuDNN's autotuner)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        self.device = device
        self.q = nature_dqn().to(device)
        self.target = nature_dqn().to(device)
        self.target.load_state_dict(self.q.state_dict())
        self.opt = torch.optim.Adam(self.q.parameters(), lr=1e-4, eps=1.5e-4)
        self.updates = 0

    def update(self, b: TensorBatch) -> None:
        obs = b.obs.float().div_(255)
        nxt = b.next_obs.float().div_(255)
        q = self.q(obs).gather(1, b.action.long().view(-1, 1)).squeeze(1)
        with torch.no_grad():
            y = b.reward + b.discount * self.target(nxt).max(1).values
        loss = (nn.functional.smooth_l1_loss(q, y, reduction="none") * b.weight).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.updates += 1
        if self.updates % 1000 == 0:
            self.target.load_state_dict(self.q.state_dict())


class OnDevice:
    """Frames already on the device: random stacks of a device-resident frame pool, gathered there."""

    def __init__(self, pool: np.ndarray, b: int, device: torch.device) -> None:
        self.frames = torch.from_numpy(pool).to(device)
        self.b, self.device = b, device
        self.k = torch.arange(4, device=device)

    def next(self) -> TensorBatch:
        n, b, dev = self.frames.shape[0], self.b, self.device
        start = torch.randint(0, n - 8, (b,), device=dev)
        obs = self.frames[start[:, None] + self.k]
        nxt = self.frames[start[:, None] + 3 + self.k]
        return TensorBatch(obs=obs, action=torch.randint(0, 6, (b,), device=dev), reward=torch.rand(b, device=dev),
                           next_obs=nxt, discount=torch.full((b,), 0.97, device=dev),
                           terminated=torch.zeros(b, dtype=torch.bool, device=dev),
                           truncated=torch.zeros(b, dtype=torch.bool, device=dev), index=start,
                           weight=torch.ones(b, device=dev))


def tensors(batch: Any, device: torch.device) -> TensorBatch:
    """A store ``Batch`` as a ``TensorBatch`` on ``device``."""
    t = to_tensors(batch, as_dict=False)
    assert isinstance(t, TensorBatch)
    return t.to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def window(step: Callable[[], Any], seconds: float, device: torch.device) -> float:
    for _ in range(3):
        step()
    sync(device)
    n = 0
    t0 = time.perf_counter()
    while True:
        step()
        n += 1
        if n % 8 == 0 and time.perf_counter() - t0 >= seconds:
            sync(device)
            return n / (time.perf_counter() - t0)


def rates_for(store: mr.ReplayStore, pool: np.ndarray, b: int, device: torch.device, rounds: int,
              seconds: float) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    learner = Learner(device)
    fixed = tensors(store.sample(b), device)
    on_device = OnDevice(pool, b, device)
    out: dict[str, list[float]] = {w: [] for w in WAYS}
    next_cpu: dict[str, list[float]] = {w: [] for w in TIMED}  # the learner thread's CPU s per next(), per round
    for r in range(rounds):
        for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
            it: Any = None
            if way == "alone":
                def step() -> None:
                    learner.update(fixed)
            elif way == "on-device":
                def step() -> None:
                    learner.update(on_device.next())
            elif way == "sample":
                def step() -> None:
                    learner.update(tensors(store.sample(b), device))
            elif way == "batches2":
                it = store.batches(b, prefetch=2)

                def step() -> None:
                    learner.update(tensors(next(it), device))  # noqa: B023
            elif way in TIMED:
                it = device_batches(store, b, device, prefetch=2, host_stacks=way == "feed-hs")
                spent = [0.0, 0]

                def step() -> None:
                    t = time.thread_time()
                    tb = next(it)  # noqa: B023
                    spent[0] += time.thread_time() - t  # noqa: B023
                    spent[1] += 1  # noqa: B023
                    learner.update(tb)
            else:
                it = device_batches(store, b, device, prefetch=2)

                def step() -> None:
                    tb = next(it)  # noqa: B023
                    tb.obs.view(-1)[:1].add_(0)  # a token of use, ordered after the copy
            out[way].append(window(step, seconds, device))
            if way in TIMED:
                next_cpu[way].append(spent[0] / spent[1])
            if it is not None:
                it.close()
        log(f"B={b} round {r}: " + ", ".join(f"{w} {out[w][-1]:.0f}/s" for w in WAYS)
            + "; next() " + ", ".join(f"{w} {next_cpu[w][-1] * 1e6:.0f} us CPU" for w in TIMED))
    return out, next_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--store", help="an existing store to read (not filled, not deleted)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0, help="per window")
    ap.add_argument("--batch", type=int, action="append", help="default: 32 and 256")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --device cpu for a smoke check")
    sizes = args.batch or [32, 256]
    pool = atari_pool()
    tmp = None
    try:
        path = args.store
        if path is None:
            tmp = tempfile.mkdtemp(prefix="bench_gpu_")
            path = os.path.join(tmp, "store")
            steps = int(args.capacity * 1.1)
            log(f"filling {steps:,} steps")
            fill_reference(path, args.capacity, pool)
        rows = []
        with mr.ReplayStore.open(path, "r", seed=0) as store:
            for b in sizes:
                r, next_cpu = rates_for(store, pool, b, device, args.rounds, args.seconds)
                ratio = {w: statistics.median(x / o for x, o in zip(r[w], r["on-device"], strict=True))
                         for w in RATIO_WAYS}
                rows.append([str(b)] + [f"{statistics.median(r[w]):.0f}" + ("" if w in ("alone", "on-device")
                                                                          else f" ({ratio[w]:.2f})")
                                        for w in RATIO_WAYS]
                            + [f"{statistics.median(r['feed-only']):.0f}"]
                            + [f"{statistics.median(next_cpu[w]) * 1e6:.0f}" for w in TIMED])
                log(f"B={b}: {ratio}")
            capacity = store.capacity
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    body = "\n\n".join([
        f"## Nature-DQN learner fed to the GPU ({name})",
        f"Updates/s (one update per batch; Adam, Huber, target network, TF32) by way of feeding, medians of"
        f" {args.rounds} alternating rounds of {args.seconds:g} s; in brackets the median per-round ratio to frames"
        f" already on the device (target for the feed: >= 0.95). Store: capacity {capacity:,}, the repository's"
        " Atari episodes, stack 4, n-step 3, compressed.",
        table(["batch", "learner alone", "frames on the device", "`sample()` + `.to()`", "`batches(2)` + `.to()`",
               "`device_batches` (feed)", "feed, `host_stacks=True`", "feed, no learner (batches/s)",
               "feed `next()`: learner CPU us", "host stacks `next()`: learner CPU us"], rows),
        f"CPU: {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), reader threads as the store chooses"
        f" them. Command: `python tools/bench_gpu.py --rounds {args.rounds} --seconds {args.seconds:g}`.",
    ])
    print(body)
    if device.type == "cuda" and not args.no_write:
        write_section("gpu", body)


if __name__ == "__main__":
    main()
