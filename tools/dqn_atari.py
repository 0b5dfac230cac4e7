"""DQN on an Atari game, with its replay in an mmreplay store (PyTorch; runs on a CPU).

    pip install -e ".[gym,atari,torch]"
    python tools/dqn_atari.py --steps 2000 --capacity 10000 --replay-dir runs/pong

Run the same command again after the process was killed and it resumes from its last checkpoint
(``--checkpoint-every`` steps): the replay snapshot plus the model checkpoint it names. Raise
``--steps`` to train longer (Pong needs a few million steps and a GPU to win). A run resumes only with
the ``--env-id`` it was started with; ``--fresh`` starts it over.

What the store does here:
- ``RecordToStore`` records every env step: one 84x84 frame per step, stored once;
- the learner draws ``store.batches(32)`` - stacks of 4 frames and 3-step returns assembled at sample
  time (``discount`` is ``gamma**m``, or 0 when the episode terminated inside the window), frames
  copied in a background thread while the network trains;
- the agent acts on ``store.current_obs()``, the same stacked state the learner sees;
- a checkpoint is ``store.save(snapshot)`` (O(one chunk), not O(buffer)) plus ``torch.save`` of the
  networks and optimizer; ``ReplayStore.load`` restores the replay exactly, including the batches
  already drawn, so the learner continues with the batches the killed run would have used.

Files under ``--replay-dir``: ``store/`` (the live store, rebuilt from the snapshot on resume),
``snapshot/`` (the last replay snapshot; its metadata names the model file), ``model-<step>.pt``.
The env's own state is not saved: a resumed run starts a new episode (the store records the
interrupted one as truncated).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import mmreplay as mr
from mmreplay.cli.main import positive_int
from mmreplay.gym import RecordToStore, make_atari


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env-id", default="ALE/Pong-v5")
    p.add_argument("--steps", type=int, default=2000, help="total env steps (agent steps, 4 frames each)")
    p.add_argument("--replay-dir", required=True, help="store, snapshot and model checkpoints go here")
    p.add_argument("--capacity", type=positive_int, default=10_000, help="replay capacity in transitions")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--n-step", type=positive_int, default=3)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--learning-starts", type=int, default=500, help="env steps before the first update")
    p.add_argument("--train-every", type=positive_int, default=4, help="env steps per gradient update")
    p.add_argument("--target-every", type=positive_int, default=1000, help="env steps between target-network copies")
    p.add_argument("--checkpoint-every", type=positive_int, default=500, help="env steps between checkpoints")
    p.add_argument("--eps-start", type=float, default=1.0)
    p.add_argument("--eps-end", type=float, default=0.05)
    p.add_argument("--eps-steps", type=int, default=100_000, help="env steps over which epsilon decays")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint in --replay-dir")
    return p.parse_args(argv)


class QNetwork(nn.Module):
    """The Nature-DQN convolutional network: 4 stacked uint8 frames in, one value per action out."""

    def __init__(self, n_actions: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU(),
            nn.Linear(512, n_actions))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.net(frames.float() / 255.0)  # frames stay uint8 until they reach the device


def log(text: str) -> None:
    print(text, flush=True)


class Run:
    """Networks, optimizer and counters of one training run, and where its files go."""

    def __init__(self, args: argparse.Namespace, n_actions: int) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.q = QNetwork(n_actions).to(self.device)
        self.target = QNetwork(n_actions).to(self.device)
        self.target.load_state_dict(self.q.state_dict())
        self.opt = torch.optim.Adam(self.q.parameters(), lr=args.lr, eps=1.5e-4)
        self.rng = np.random.default_rng(args.seed)
        self.step = 0
        self.episodes = 0
        self.returns: list[float] = []
        self.store_dir = os.path.join(args.replay_dir, "store")
        self.snapshot_dir = os.path.join(args.replay_dir, "snapshot")

    def state(self) -> dict[str, Any]:
        return {"q": self.q.state_dict(), "target": self.target.state_dict(), "opt": self.opt.state_dict(),
                "step": self.step, "episodes": self.episodes, "returns": self.returns,
                "rng": self.rng.bit_generator.state, "torch_rng": torch.get_rng_state()}

    def restore(self, ckpt: dict[str, Any]) -> None:
        self.q.load_state_dict(ckpt["q"])
        self.target.load_state_dict(ckpt["target"])
        self.opt.load_state_dict(ckpt["opt"])
        self.step, self.episodes, self.returns = ckpt["step"], ckpt["episodes"], list(ckpt["returns"])
        self.rng.bit_generator.state = ckpt["rng"]
        torch.set_rng_state(ckpt["torch_rng"])

    def checkpoint(self, store: mr.ReplayStore) -> None:
        """Model file first, then the replay snapshot naming it: the snapshot's manifest is renamed into place
        last, so whatever moment the process dies, the snapshot on disk names a complete model file."""
        name = f"model-{self.step:09d}.pt"
        path = os.path.join(self.args.replay_dir, name)
        torch.save(self.state(), path + ".tmp")
        os.replace(path + ".tmp", path)
        store.metadata["dqn"] = {"step": self.step, "model": name, "env_id": self.args.env_id}
        t0 = time.perf_counter()
        store.save(self.snapshot_dir)
        for old in glob.glob(os.path.join(self.args.replay_dir, "model-*.pt")):
            if os.path.basename(old) != name:
                os.remove(old)
        log(f"checkpoint step={self.step} replay snapshot {len(store)} sampleable transitions,"
            f" save {1e3 * (time.perf_counter() - t0):.0f} ms")

    def resume(self) -> mr.ReplayStore | None:
        """The store restored from the snapshot (and the model from the file it names), or None."""
        if self.args.fresh or not os.path.exists(os.path.join(self.snapshot_dir, "manifest.json")):
            return None
        shutil.rmtree(self.store_dir, ignore_errors=True)  # the live store may be ahead of the snapshot
        t0 = time.perf_counter()
        store = mr.ReplayStore.load(self.snapshot_dir, self.store_dir)
        info = store.metadata["dqn"]
        recorded = info.get("env_id", store.metadata.get("env_id"))
        if recorded != self.args.env_id:  # its network and replay belong to another game
            store.close(commit=False)
            raise SystemExit(f"--env-id {self.args.env_id}: {self.args.replay_dir} holds a run of {recorded};"
                             f" resume it with --env-id {recorded}, or start a new run with --fresh (which"
                             " discards that one) or with another --replay-dir")
        ckpt = torch.load(os.path.join(self.args.replay_dir, info["model"]), map_location=self.device,
                          weights_only=False)
        self.restore(ckpt)
        log(f"resumed from step {self.step}: {len(store)} sampleable transitions, ids {store.id_range},"
            f" load {1e3 * (time.perf_counter() - t0):.0f} ms")
        return store

    def epsilon(self) -> float:
        a = self.args
        frac = min(1.0, self.step / max(a.eps_steps, 1))
        return a.eps_start + frac * (a.eps_end - a.eps_start)

    def act(self, store: mr.ReplayStore, n_actions: int) -> int:
        if self.rng.random() < self.epsilon():
            return int(self.rng.integers(n_actions))
        state = torch.from_numpy(store.current_obs()).to(self.device)[None]
        with torch.no_grad():
            return int(self.q(state).argmax(dim=1).item())

    def learn(self, batch: mr.Batch) -> float:
        """One TD update on an n-step batch: target = reward + discount * max_a Q_target(next_obs, a)."""
        dev = self.device
        obs = torch.from_numpy(batch.obs).to(dev, non_blocking=True)
        next_obs = torch.from_numpy(batch.next_obs).to(dev, non_blocking=True)
        action = torch.from_numpy(batch.action).to(dev)
        reward = torch.from_numpy(batch.reward).to(dev)
        discount = torch.from_numpy(batch.discount).to(dev)  # gamma**m, 0 if terminated in the window
        with torch.no_grad():
            target = reward + discount * self.target(next_obs).max(dim=1).values
        q = self.q(obs).gather(1, action[:, None]).squeeze(1)
        loss = nn.functional.smooth_l1_loss(q, target)
        self.opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), 10.0)
        self.opt.step()
        return float(loss.item())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.replay_dir, exist_ok=True)
    base = gym.wrappers.TransformReward(make_atari(args.env_id), lambda r: float(np.sign(float(r))))  # clip rewards
    n_actions = int(base.action_space.n)  # type: ignore[attr-defined]
    run = Run(args, n_actions)
    store = run.resume()
    if store is None:
        shutil.rmtree(run.store_dir, ignore_errors=True)
        store = mr.ReplayStore.from_env(base, run.store_dir, capacity=args.capacity, stack=4, n_step=args.n_step,
                                        gamma=args.gamma, seed=args.seed)
        log(f"new run: {args.env_id}, {n_actions} actions, replay capacity {args.capacity} -> {run.store_dir}")
    env = RecordToStore(base, store)
    env.reset(seed=args.seed + run.step)  # a resumed run starts a new episode; the store truncates the old one
    batches = store.batches(args.batch_size)
    ep_return, ep_len, losses, t0, start = 0.0, 0, [], time.perf_counter(), run.step
    while run.step < args.steps:
        _, reward, terminated, truncated, _ = env.step(run.act(store, n_actions))
        run.step += 1
        ep_return, ep_len = ep_return + float(reward), ep_len + 1
        if terminated or truncated:
            run.episodes += 1
            run.returns.append(ep_return)
            log(f"step={run.step} episode={run.episodes} return={ep_return:.0f} length={ep_len}"
                f" epsilon={run.epsilon():.3f}")
            ep_return, ep_len = 0.0, 0
            env.reset()
        if run.step >= args.learning_starts and run.step % args.train_every == 0:
            losses.append(run.learn(next(batches)))
        if run.step % args.target_every == 0:
            run.target.load_state_dict(run.q.state_dict())
        if run.step % 250 == 0:
            sps = (run.step - start) / (time.perf_counter() - t0)
            loss = f"{np.mean(losses):.4f}" if losses else "-"
            log(f"step={run.step} sampleable={len(store)} loss={loss} epsilon={run.epsilon():.3f} steps/s={sps:.0f}")
            losses = []
        if run.step % args.checkpoint_every == 0 or run.step == args.steps:
            run.checkpoint(store)
    store.close()
    env.close()
    log(f"done step={run.step} episodes={run.episodes} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
