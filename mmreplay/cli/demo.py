"""``mmreplay demo``: the whole story in one command.

Record a few thousand steps of a real Gymnasium env into a store (an Atari game through ``ale-py``
when the ``[atari]`` extra is installed, CartPole with Gymnasium alone (``[gym]``), generated
Atari-like episodes with neither), sample it, save a snapshot, resume from it and check that the
resumed store samples exactly what the original does, export a dataset, and draw ``show``/``stats``
pictures when Pillow (``[image]``) is installed. It says up front which of these it will do and
why, and where its files go: a temporary directory removed at the end unless a PATH or ``--keep``
is given.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..bench import disk_bytes, rss_anon_mb
from ..datasets import export
from ..store import ReplayStore
from ..synthetic import atari_like_episodes
from ..version import __version__
from .main import out, positive_int, progress

ENVS = ("auto", "atari", "cartpole", "synthetic")
MIN_STEPS = 100  # enough for sample(32) of 3-step transitions
OUTPUTS = ("store", "snapshot", "resumed", "dataset.zarr", "sample.png", "stats.png")  # what it writes in PATH
ENV_LINES = {
    "atari": "ALE/Pong-v5 through ale-py (the [atari] extra)",
    "cartpole": "CartPole-v1 through Gymnasium (the [gym] extra; pip install 'mmreplay[atari]' adds Atari)",
    "synthetic": "generated Atari-like episodes (core dependencies only; pip install 'mmreplay[gym]' adds"
                 " CartPole, 'mmreplay[atari]' an Atari game)",
}


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module entry of None in sys.modules (blocked)
        return False


def pick_env(choice: str) -> str:
    """The env the demo records: ``auto`` is Atari with ale-py, CartPole with Gymnasium, else synthetic."""
    if choice == "auto":
        return "atari" if _have("ale_py") and _have("gymnasium") else "cartpole" if _have("gymnasium") else "synthetic"
    needs = {"atari": ("ale_py", "mmreplay[atari]"), "cartpole": ("gymnasium", "mmreplay[gym]")}
    if choice in needs and not (_have(needs[choice][0]) and _have("gymnasium")):
        raise ValueError(f"--env {choice} needs {needs[choice][0]}: pip install '{needs[choice][1]}'")
    return choice


def _record_gym(kind: str, path: str, capacity: int, steps: int, quiet: bool) -> tuple[ReplayStore, str]:
    """A random policy on a Gymnasium env, recorded by ``RecordToStore``."""
    import gymnasium as gym

    from ..gym import RecordToStore, make_atari

    if kind == "atari":
        env: Any = make_atari("ALE/Pong-v5", repeat_action_probability=0.0)
        store = ReplayStore.from_env(env, path, capacity=capacity, stack=4, n_step=3, gamma=0.99, seed=0)
        label = "ALE/Pong-v5, 84x84 grayscale frames, frame skip 4, stack 4, 3-step returns"
    else:
        env = gym.make("CartPole-v1")
        store = ReplayStore.from_env(env, path, capacity=capacity, stack=2, n_step=3, gamma=0.99, seed=0)
        label = "CartPole-v1, 4 floats per observation, stack 2, 3-step returns"
    rec = RecordToStore(env, store)
    rec.action_space.seed(0)
    rec.reset(seed=0)
    with progress(steps, "recording", quiet) as bar:
        for _ in range(steps):
            _, _, terminated, truncated, _ = rec.step(rec.action_space.sample())
            if terminated or truncated:
                rec.reset()
            bar.update(1)
    rec.close()
    return store, label


def _record_synthetic(path: str, capacity: int, steps: int, quiet: bool) -> tuple[ReplayStore, str]:
    store = ReplayStore.create(path, capacity=capacity, obs_shape=(84, 84), stack=4, n_step=3, gamma=0.99,
                               extras={"log_prob": ((), "float32")}, seed=0)
    done = 0
    with progress(steps, "recording", quiet) as bar:
        for ep in atari_like_episodes(10**9, seed=1, min_len=100, max_len=800, time_limit=600):
            store.reset(ep.frames[0])
            n = min(ep.length, steps - done)
            for t in range(n):
                last = t == ep.length - 1
                store.step(ep.actions[t], ep.rewards[t], ep.frames[t + 1], ep.terminated and last,
                           ep.truncated and last, log_prob=np.float32(-1.79))
            done += n
            bar.update(n)
            if done >= steps:
                break
    return store, "generated Atari-like episodes (84x84 uint8, no Gymnasium), stack 4, 3-step returns"


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


def _same(a: Any, b: Any) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("index", "obs", "next_obs", "reward"))


def check_path(path: str) -> None:
    """Refuse a PATH the demo cannot write its files into, before anything is recorded: a file, or a
    directory that already holds a demo's files (the demo creates each anew and never overwrites one)."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"path {path}: not a directory; give a new or empty directory for the demo's files")
    held = [name for name in OUTPUTS if os.path.lexists(os.path.join(path, name))]
    if held:
        raise ValueError(f"path {path}: already holds the files of a demo ({', '.join(held)}); give a new or empty"
                         f" directory, or remove this one first (rm -r {path})")


def cmd_demo(args: argparse.Namespace) -> int:
    kind = pick_env(args.env)
    if args.steps < MIN_STEPS:
        raise ValueError(f"--steps: expected at least {MIN_STEPS} (the demo samples batches of 32 3-step"
                         f" transitions), got {args.steps}")
    if args.path is not None:
        check_path(args.path)
    pictures = _have("PIL")
    temporary = args.path is None
    root = tempfile.mkdtemp(prefix="mmreplay-demo-") if temporary else args.path
    os.makedirs(root, exist_ok=True)
    keep = args.keep or not temporary
    out(f"mmreplay {__version__} demo: 1 record, 2 sample, 3 snapshot and resume, 4 export, 5 pictures")
    out(f"   env       {ENV_LINES[kind]}")
    out("   pictures  " + ("drawn with Pillow (the [image] extra)" if pictures else
                           "skipped: Pillow is not installed (pip install 'mmreplay[image]' adds them)"))
    if keep:
        out(f"   files in  {root} (kept afterwards)")
    else:
        out(f"   files in  {root} (a temporary directory, removed at the end; give a PATH or --keep to keep it)")
    try:
        _story(kind, root, pictures, keep, args)
    finally:
        if not keep:
            size = disk_bytes(root)
            shutil.rmtree(root, ignore_errors=True)
            out(f"removed {root} ({size / 2**20:,.1f} MiB); run 'mmreplay demo PATH' (or add --keep) to keep the files")
    if keep:
        out(f"kept {root} ({disk_bytes(root) / 2**20:,.1f} MiB); remove it with: rm -r {root}")
    return 0


def _story(kind: str, root: str, pictures: bool, keep: bool, args: argparse.Namespace) -> None:
    paths = {name: os.path.join(root, name) for name in OUTPUTS}
    # 1. record
    t0 = time.perf_counter()
    if kind == "synthetic":
        store, label = _record_synthetic(paths["store"], args.capacity, args.steps, args.quiet)
    else:
        store, label = _record_gym(kind, paths["store"], args.capacity, args.steps, args.quiet)
    t_rec = time.perf_counter() - t0
    table = store.episodes()
    lo, hi = store.id_range
    out(f"1. recorded {hi} transitions of {label}")
    out(f"   {len(table)} episodes ({int(table.ended.sum())} ended) in {t_rec:.1f} s -> {paths['store']}")
    out(f"   ids {lo}..{hi - 1} retained (capacity {store.capacity}), {len(store)} sampleable;"
        f" {disk_bytes(paths['store']) / 2**20:,.1f} MiB on disk, {rss_anon_mb():,.0f} MB anonymous memory")

    # 2. sample
    n = 200
    _, t_first = _timed(lambda: store.sample(32))  # the first call loads (or once per install compiles) the kernels
    _, t_s = _timed(lambda: [store.sample(32) for _ in range(n)])
    batch = store.sample(32)
    out(f"2. sample(32): obs {batch.obs.shape} {batch.obs.dtype}, next_obs {batch.next_obs.shape}, action"
        f" {batch.action.shape}, reward/discount float32; {t_s / n * 1e6:,.0f} us per batch"
        f" (the first call {t_first * 1e3:,.0f} ms: it loads the compiled kernels, compiling them once per install)")
    out(f"   row 0: id {batch.index[0]}, action {batch.action[0]}, 3-step reward {batch.reward[0]:.3f},"
        f" discount {batch.discount[0]:.4f}, terminated {bool(batch.terminated[0])}")

    # 3. snapshot, then resume from it: the resumed store samples what the original samples next
    _, t_save = _timed(lambda: store.save(paths["snapshot"]))
    ahead = [store.sample(32) for _ in range(3)]
    resumed, t_load = _timed(lambda: ReplayStore.load(paths["snapshot"], paths["resumed"]))
    again = [resumed.sample(32) for _ in range(3)]
    same = all(_same(a, b) for a, b in zip(ahead, again, strict=True))
    out(f"3. save() {t_save * 1e3:,.0f} ms -> {paths['snapshot']}; load() {t_load * 1e3:,.0f} ms ->"
        f" {paths['resumed']}")
    out(f"   the resumed store hands out the same next batches as the original: {same}")
    resumed.close()
    store.commit()

    # 4. export (the last commit: complete episodes only)
    result, t_exp = _timed(lambda: export(store, paths["dataset.zarr"], format="zarr", progress=not args.quiet))
    out(f"4. exported in {t_exp:.1f} s: {result.summary()}")

    # 5. pictures (Pillow), and the numbers behind the stats picture
    from .viz import show_image, stats_image, stats_text, store_stats

    s = store_stats(store)
    if pictures:
        starts = table.first_id[table.start_retained & (table.first_id >= 0) & (table.length >= store.schema.n_step)]
        ids = np.concatenate([starts[:1], np.sort(store.sample(3).index)]) if starts.size else store.sample(4).index
        show_image(store, store.gather(ids)).save(paths["sample.png"])
        stats_image(s).save(paths["stats.png"])
        out(f"5. pictures: {paths['sample.png']} (rows {', '.join(map(str, ids.tolist()))}; the first one starts an"
            f" episode: its padding is outlined), {paths['stats.png']}")
    else:
        out("5. pictures skipped (pip install 'mmreplay[image]' adds them); the numbers:")
    for line in stats_text(s)[1:]:
        out("   " + line)
    store.close()
    if keep:
        out(f"next: mmreplay info {paths['store']}; mmreplay show {paths['store']} --out sample.png;"
            f" mmreplay stats {paths['store']}")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    d = sub.add_parser("demo", parents=[common], help="record a real env (or generated episodes), sample, save,"
                       " resume, export, draw (with [image]); print where everything is",
                       description="Record, sample, snapshot and resume, export, and draw pictures, saying what"
                       " each step shows. The env is an Atari game with the [atari] extra, CartPole with [gym],"
                       " generated Atari-like episodes with neither; pictures need Pillow (the [image] extra)."
                       " Without PATH the files go to a temporary directory that is removed at the end.")
    d.add_argument("path", nargs="?", help="directory for the demo's files, kept afterwards: a new or empty one"
                   " (default: a new temporary directory, removed at the end)")
    d.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    d.add_argument("--env", choices=ENVS, default="auto", help="auto: Atari with ale-py, CartPole with"
                   " gymnasium, else generated episodes")
    d.add_argument("--steps", type=positive_int, default=3000,
                   help=f"environment steps to record (default: 3000, at least {MIN_STEPS})")
    d.add_argument("--capacity", type=positive_int, default=10_000, help="store capacity in transitions (default: 10000)")
    d.set_defaults(func=cmd_demo)
