"""Record a few MB of real Atari episodes for the tests and benchmarks: ``tests/data/atari/``.

Each game is played by a seeded uniform-random policy through Gymnasium's standard DQN
preprocessing (``gymnasium.wrappers.AtariPreprocessing``: 84x84 grayscale, frame_skip 4 with
max-pooling of the last two frames, up to 30 no-ops after reset, no terminal on life loss) inside a
``TimeLimit``, so that some episodes end by game over (``terminated``) and some by the time limit
(``truncated``). Needs the ``[atari]`` extra (gymnasium, ale-py)::

    pip install -e ".[atari]"
    python tools/record_atari.py                 # rewrites tests/data/atari/{<game>.npz, meta.json}
    python tools/record_atari.py --out /tmp/atari

One ``<game>.npz`` per game (``numpy.savez_compressed``):

- ``frames`` (N_frames, 84, 84) uint8: each episode contributes its reset observation, then one
  observation per step (T + 1 frames for T steps), episodes one after the other;
- ``episode_starts`` (E,) int64: index into ``frames`` of each episode's reset observation;
- ``actions`` (N_steps,) int32, ``rewards`` (N_steps,) float32 (raw, unclipped, summed over the
  skipped frames), ``terminated`` / ``truncated`` (N_steps,) bool, ``episode_ids`` (N_steps,) int32.

Step j of episode e (its t-th step) observes ``frames[episode_starts[e] + t]`` and leads to
``frames[episode_starts[e] + t + 1]``. ``meta.json`` records the versions, seeds, preprocessing,
this layout, and per game the episode lengths, returns and a SHA-256 of every array (a second run
with the same versions writes the same arrays).

AtariPreprocessing resizes with OpenCV (``cv2.resize``, INTER_AREA). OpenCV is not part of the
``[atari]`` extra: without it, this script hands the wrapper an area-averaging resize written in
numpy (``mmreplay.gym.area_resize``) in its place, and ``meta.json`` says which one was used.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import time
import types
from dataclasses import dataclass
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "atari")
ENV_SEED_BASE = 1000
POLICY_SEED_BASE = 2000


@dataclass(frozen=True)
class Game:
    name: str  # file name: <name>.npz
    env_id: str
    max_episode_steps: int  # the TimeLimit, in agent steps (4 emulator frames each)
    episodes: int


# Time limits chosen so that each game has both endings: random Pong rarely loses 21 points within
# 1000 steps, random Breakout loses its 5 lives in ~130-250.
GAMES = (
    Game("pong", "ALE/Pong-v5", 1000, 8),
    Game("breakout", "ALE/Breakout-v5", 250, 36),
    Game("seaquest", "ALE/Seaquest-v5", 500, 7),
    Game("mspacman", "ALE/MsPacman-v5", 500, 8),
)
PREPROCESSING = dict(noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False,
                     grayscale_obs=True, grayscale_newaxis=False, scale_obs=False)


def resize_backend() -> str:
    """Make ``import cv2`` inside AtariPreprocessing work; return which resize it will use."""
    try:
        import cv2
    except ImportError:
        pass
    else:
        return f"opencv {cv2.__version__} cv2.resize INTER_AREA"
    from mmreplay.gym import area_resize

    def resize(src: np.ndarray, dsize: tuple[int, int], interpolation: int = 3) -> np.ndarray:
        width, height = dsize
        return area_resize(src, height, width)

    # A stand-in module with the one function and constant the wrapper uses.
    stand_in = types.ModuleType("cv2")
    stand_in.INTER_AREA = 3  # type: ignore[attr-defined]
    stand_in.resize = resize  # type: ignore[attr-defined]
    sys.modules["cv2"] = stand_in
    return "mmreplay.gym.area_resize (numpy area averaging in place of cv2.resize INTER_AREA; OpenCV absent)"


def make_env(game: Game) -> Any:
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, TimeLimit

    gym.register_envs(ale_py)
    env = gym.make(game.env_id, frameskip=1)  # AtariPreprocessing does the frame skipping
    return TimeLimit(AtariPreprocessing(env, **PREPROCESSING), max_episode_steps=game.max_episode_steps)


def record(game: Game, policy_seed: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Play ``game.episodes`` episodes; the arrays of ``<game>.npz`` and the game's entry in meta.json."""
    env = make_env(game)
    n_actions = int(env.action_space.n)
    rng = np.random.default_rng(policy_seed)
    frames: list[np.ndarray] = []
    starts, actions, rewards, terminated, truncated, episode_ids = [], [], [], [], [], []
    episodes = []
    t0 = time.perf_counter()
    for e in range(game.episodes):
        obs, _ = env.reset(seed=ENV_SEED_BASE + e)
        starts.append(len(frames))
        frames.append(obs)
        ret, length = 0.0, 0
        while True:
            a = int(rng.integers(n_actions))
            obs, r, term, trunc, _ = env.step(a)
            term = bool(term)
            trunc = bool(trunc) and not term  # a game over on the time limit's last step is a termination
            frames.append(obs)
            actions.append(a)
            rewards.append(float(r))
            terminated.append(term)
            truncated.append(trunc)
            episode_ids.append(e)
            ret += float(r)
            length += 1
            if term or trunc:
                break
        episodes.append({"episode": e, "env_seed": ENV_SEED_BASE + e, "length": length,
                         "return": ret, "ending": "terminated" if term else "truncated"})
    sticky = float(env.unwrapped.ale.getFloat("repeat_action_probability"))
    env.close()
    arrays = {
        "frames": np.stack(frames).astype(np.uint8),
        "episode_starts": np.asarray(starts, np.int64),
        "actions": np.asarray(actions, np.int32),
        "rewards": np.asarray(rewards, np.float32),
        "terminated": np.asarray(terminated, bool),
        "truncated": np.asarray(truncated, bool),
        "episode_ids": np.asarray(episode_ids, np.int32),
    }
    check_layout(arrays)
    endings = {x["ending"] for x in episodes}
    if endings != {"terminated", "truncated"}:
        raise RuntimeError(f"{game.name}: expected both terminated and truncated episodes, got only {endings}; "
                           f"change max_episode_steps ({game.max_episode_steps}) or episodes ({game.episodes})")
    entry = {
        "env_id": game.env_id,
        "make_kwargs": {"frameskip": 1},
        "repeat_action_probability": sticky,
        "n_actions": n_actions,
        "max_episode_steps": game.max_episode_steps,
        "policy_seed": policy_seed,
        "n_episodes": len(episodes),
        "n_steps": int(arrays["actions"].size),
        "n_frames": int(arrays["frames"].shape[0]),
        "n_terminated": int(arrays["terminated"].sum()),
        "n_truncated": int(arrays["truncated"].sum()),
        "episodes": episodes,
        "sha256": {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in arrays.items()},
        "seconds_to_record": round(time.perf_counter() - t0, 1),
    }
    return arrays, entry


def check_layout(a: dict[str, np.ndarray]) -> None:
    """The arrays obey the documented layout (T + 1 frames per episode of T steps)."""
    n_steps, n_eps = a["actions"].size, a["episode_starts"].size
    lengths = np.bincount(a["episode_ids"], minlength=n_eps)
    assert a["frames"].shape == (n_steps + n_eps, 84, 84), a["frames"].shape
    assert np.array_equal(a["episode_starts"], np.concatenate([[0], np.cumsum(lengths + 1)[:-1]]))
    ends = np.cumsum(lengths) - 1
    assert np.all(a["terminated"][ends] | a["truncated"][ends]), "every episode ends"
    assert int((a["terminated"] | a["truncated"]).sum()) == n_eps, "only at episode ends"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("gymnasium", "ale-py", "numpy", "opencv-python", "opencv-python-headless"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT, help=f"output directory (default: {os.path.relpath(OUT, ROOT)})")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)  # mmreplay of this checkout, for the resize stand-in
    try:
        import ale_py  # noqa: F401
        import gymnasium  # noqa: F401
    except ImportError as exc:
        ap.exit(2, f"record_atari.py needs the [atari] extra: pip install -e '.[atari]' ({exc})\n")
    resize = resize_backend()
    os.makedirs(args.out, exist_ok=True)
    games = {}
    for i, game in enumerate(GAMES):
        arrays, entry = record(game, POLICY_SEED_BASE + i)
        path = os.path.join(args.out, game.name + ".npz")
        np.savez_compressed(path, **arrays)  # type: ignore[arg-type]
        entry["file"], entry["file_bytes"] = game.name + ".npz", os.path.getsize(path)
        games[game.name] = entry
        print(f"{game.name}: {entry['n_episodes']} episodes ({entry['n_terminated']} terminated, "
              f"{entry['n_truncated']} truncated), {entry['n_steps']} steps, {entry['file_bytes'] / 1e6:.2f} MB "
              f"in {entry['seconds_to_record']} s", flush=True)
    meta = {
        "description": "Real Atari episodes of a seeded uniform-random policy with DQN preprocessing, "
                       "for mmreplay's tests and benchmarks.",
        "command": " ".join(["python tools/record_atari.py", *(argv if argv is not None else sys.argv[1:])]),
        "versions": versions(),
        "preprocessing": {"wrapper": "gymnasium.wrappers.AtariPreprocessing", **PREPROCESSING,
                          "resize": resize},
        "time_limit": "gymnasium.wrappers.TimeLimit around AtariPreprocessing; max_episode_steps counts agent "
                      "steps (frame_skip emulator frames each); a game over on the last allowed step counts "
                      "as terminated, not truncated",
        "seeds": {
            "env": f"episode e of every game starts with env.reset(seed={ENV_SEED_BASE} + e)",
            "policy": f"action = numpy.random.default_rng({POLICY_SEED_BASE} + game index).integers(n_actions), "
                      "one draw per step, one generator per game; game index in "
                      + ", ".join(g.name for g in GAMES),
        },
        "layout": {
            "frames": "(N_frames, 84, 84) uint8; each episode contributes its reset observation, then one "
                      "observation per step (T + 1 frames for T steps)",
            "episode_starts": "(E,) int64; index into frames of each episode's reset observation",
            "actions": "(N_steps,) int32; the action of each step",
            "rewards": "(N_steps,) float32; raw unclipped reward of each step (summed over the skipped frames)",
            "terminated": "(N_steps,) bool; game over at this step",
            "truncated": "(N_steps,) bool; the time limit ended the episode at this step (not terminated)",
            "episode_ids": "(N_steps,) int32; the episode of each step, 0..E-1",
            "indexing": "step t of episode e observes frames[episode_starts[e] + t] and leads to "
                        "frames[episode_starts[e] + t + 1]",
        },
        "games": games,
    }
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
