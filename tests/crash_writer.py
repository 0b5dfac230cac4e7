"""A writer to kill: a deterministic episode stream with frequent commits and snapshots.

Run as a script (``python crash_writer.py STORE SNAPSHOT SEED STEPS``); it prints ``R`` when it
starts writing, and ``C <generation> <t>`` / ``S <generation> <t>`` just *before* each commit /
snapshot, where ``t`` is the number of stream events (resets and steps) written so far, so a
checker can rebuild the state a generation must hold with ``replay(model, seed, t)``.
"""

from __future__ import annotations

import sys

import numpy as np

CFG = dict(capacity=60, obs_shape=(3,), obs_dtype="int32", stack=3, n_step=2, gamma=0.9, chunk_size=8)
PRIO = dict(alpha=0.6, beta=0.4, eps=1e-6)


def events(seed: int):  # noqa: ANN201
    """The deterministic stream: ("reset", obs) and ("step", action, reward, obs, terminated, truncated)."""
    rng = np.random.default_rng(seed)
    t = 0
    while True:
        t += 1
        yield ("reset", np.array([t, -1, seed], np.int32))
        for _ in range(int(rng.integers(3, 40))):
            t += 1
            end = rng.random()
            yield ("step", int(rng.integers(4)), float(rng.integers(-2, 3)), np.array([t, 0, seed], np.int32),
                   bool(end < 0.1), bool(0.1 <= end < 0.15))
            if end < 0.15:
                break


def replay(target, seed: int, count: int) -> None:  # noqa: ANN001
    """Write the first ``count`` events of the stream into ``target`` (a store or the model)."""
    for i, ev in enumerate(events(seed)):
        if i == count:
            return
        if ev[0] == "reset":
            target.reset(ev[1])
        else:
            target.step(*ev[1:])


def main() -> None:
    import mmreplay as mr

    path, snap, seed, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = mr.ReplayStore.create(path, prioritized=mr.Prioritized(**PRIO), seed=seed, **CFG)
    rng = np.random.default_rng(seed + 1)
    print("R", flush=True)
    gen, snap_gen = 0, 0
    for i, ev in enumerate(events(seed)):
        if i == total:
            break
        if ev[0] == "reset":
            store.reset(ev[1])
        else:
            store.step(*ev[1:])
        if len(store) and i % 3 == 0:
            b = store.sample(4)
            store.update_priorities(b.index, rng.random(4) + 0.1)
        if i % 13 == 12:
            gen += 1
            print(f"C {gen} {i + 1}", flush=True)
            store.commit()
        if i % 41 == 40:
            snap_gen += 1
            print(f"S {snap_gen} {i + 1}", flush=True)
            store.save(snap)
    print("D", flush=True)


if __name__ == "__main__":
    main()
