"""mmreplay.ray on this machine: writers shipping blocks to a ReplayActor, a learner drawing batches.

- Aggregate write rate of 2 ``RemoteWriter``s (each in its own Ray task, one env stream each) into one
  ``ReplayActor`` (84x84 uint8 frames, blocks of 256 steps), against the same steps written by one
  local ``extend()`` per block in this process.
- ``mmreplay.ray.batches(actors, 32, prefetch=4)`` from one actor and from two (stack 4, n-step 3),
  against ``store.sample(32)`` on the same store in this process; MB/s counts obs + next_obs bytes.

    python tools/bench_ray.py             # writes the beyond-ray section of BENCHMARKS.md
    python tools/bench_ray.py --no-write

Ray runs locally (``ray.init(num_cpus=2)``); everything written goes to a scratch directory that is
deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import table, write_section  # noqa: E402

import mmreplay as mr  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OBS = (84, 84)
FRAME = 84 * 84
CREATE = dict(obs_shape=OBS, stack=4, n_step=3)


def _pool(n: int = 512) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, size=(n, *OBS), dtype=np.uint8)


def local_extend(path: str, steps: int, block: int) -> float:
    """Transitions/s of one extend() per block, two streams alternating, in this process."""
    pool = _pool()
    with mr.ReplayStore.create(path, capacity=2 * steps, num_envs=2, **CREATE) as s:
        for env in (0, 1):
            s.reset(pool[env], env=env)
        t0 = time.perf_counter()
        for i in range(0, steps, block):
            for env in (0, 1):
                s.extend(np.zeros(block, np.int64), np.ones(block), pool[(i + np.arange(block)) % 512],
                         np.zeros(block, np.bool_), np.zeros(block, np.bool_), env=env)
        return 2 * steps / (time.perf_counter() - t0)


def remote_write(ray, path: str, steps: int, block: int) -> float:
    from mmreplay.ray import RemoteWriter, ReplayActor

    actor = ReplayActor.options(num_cpus=0).remote(path, capacity=2 * steps, num_envs=2, **CREATE)

    @ray.remote(num_cpus=0)
    def writer(env: int) -> tuple[float, float]:
        pool = _pool()
        w = RemoteWriter(actor, env=env, block=block)
        w.reset(pool[env])
        w.flush()
        t0 = time.time()  # the same clock in every process of this machine
        for i in range(steps):
            w.step(0, 1.0, pool[i % 512], False, False)
        w.flush()
        return t0, time.time()

    ray.get(actor.stats.remote())
    spans = ray.get([writer.remote(env) for env in (0, 1)])  # from the first step to the last flush, both writers
    rate = 2 * steps / (max(b for _, b in spans) - min(a for a, _ in spans))
    ray.get(actor.close.remote())
    return rate


def fill_actor(ray, path: str, steps: int) -> object:
    from mmreplay.ray import ReplayActor

    actor = ReplayActor.options(num_cpus=0).remote(path, capacity=steps, **CREATE)
    pool = _pool()
    ray.get(actor.reset.remote(pool[0]))
    for i in range(0, steps, 1000):
        n = min(1000, steps - i)
        term = np.zeros(n, np.bool_)
        term[-1] = True
        ray.get(actor.extend.remote(np.zeros(n, np.int64), np.ones(n), pool[(i + np.arange(n)) % 512], term,
                                    np.zeros(n, np.bool_)))
        ray.get(actor.reset.remote(pool[i % 512]))
    ray.get(actor.commit.remote())
    return actor


def batch_rate(next_batch, seconds: float) -> float:
    next_batch()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        next_batch()
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20_000, help="steps per writer (and transitions per actor)")
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    import ray

    from mmreplay.ray import batches

    scratch = tempfile.mkdtemp(prefix="mmreplay-bench-ray-", dir=args.dir)
    load_before = os.getloadavg()[0]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tools")])}})
    p = lambda *names: os.path.join(scratch, *names)  # noqa: E731
    writes: dict[str, list[float]] = {"local": [], "remote": []}
    reads: dict[str, list[float]] = {"local": [], "one": [], "two": []}
    try:
        for r in range(args.rounds):
            for how in ("local", "remote") if r % 2 == 0 else ("remote", "local"):
                path = p(f"w{r}{how}")
                rate = (local_extend(path, args.steps, args.block) if how == "local"
                        else remote_write(ray, path, args.steps, args.block))
                writes[how].append(rate)
                shutil.rmtree(path)
                print(f"write {how}: {rate:,.0f} transitions/s", flush=True)
        actors = [fill_actor(ray, p(f"a{k}"), args.steps) for k in range(2)]
        local = mr.ReplayStore.open(p("a0"), mode="r", seed=1)
        its = {"one": batches(actors[:1], 32, prefetch=4, seed=0), "two": batches(actors, 32, prefetch=4, seed=0)}
        for _ in range(args.rounds):
            for how in ("local", "one", "two"):
                fn = (lambda: local.sample(32)) if how == "local" else (lambda it=its[how]: next(it))
                reads[how].append(batch_rate(fn, args.seconds))
                print(f"batches {how}: {reads[how][-1]:,.0f}/s", flush=True)
        local.close()
        for a in actors:
            ray.get(a.close.remote())
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()[0]
    row_bytes = 2 * 4 * FRAME * 32
    wrows = [["one `extend()` per block, in this process (2 streams)", f"{max(writes['local']):,.0f}",
              f"{max(writes['local']) * FRAME / 1e6:,.0f}"],
             ["2 `RemoteWriter`s (Ray tasks) -> 1 `ReplayActor`", f"**{max(writes['remote']):,.0f}**",
              f"**{max(writes['remote']) * FRAME / 1e6:,.0f}**"]]
    rrows = [[label, f"{max(reads[k]):,.1f}", f"{max(reads[k]) * row_bytes / 1e6:,.0f}"]
             for k, label in (("local", "`store.sample(32)` in this process"),
                              ("one", "`batches([actor], 32, prefetch=4)`"),
                              ("two", "`batches([a, b], 32, prefetch=4)`"))]
    body = "\n".join([
        "### Ray: remote writers and a learner's batches",
        "",
        f"A local Ray cluster (`ray.init(num_cpus=2)`) on this {os.cpu_count()}-core machine. Writes: 2 `RemoteWriter`s,",
        f"each in a Ray task and one env stream of one `ReplayActor` (84x84 uint8 frames, blocks of {args.block}",
        f"steps), {args.steps:,} steps each, against the same blocks written by `extend()` in this process. Reads:",
        f"batches of 32 (stack 4, n-step 3) from actors holding {args.steps:,} transitions each, against",
        "`sample(32)` on the same store opened in this process; MB/s counts obs + next_obs bytes. Best of",
        f"{args.rounds} alternating rounds.",
        "",
        table(["writes", "transitions/s", "MB/s of frames"], wrows),
        "",
        table(["reads", "batches/s", "MB/s"], rrows),
        "",
        f"Load average (1 min) when the run started / ended: {load_before:.1f} / {load_after:.1f} on"
        f" {os.cpu_count()} cores.",
    ])
    if not args.no_write:
        write_section("beyond-ray", body)
    print(body)


if __name__ == "__main__":
    main()
