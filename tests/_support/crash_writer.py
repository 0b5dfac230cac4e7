"""A writer to kill: a deterministic episode stream with frequent commits and snapshots.

Capacity 150 with chunks of 8: chunks seal and retire constantly, and about every other commit (once
the store holds ~100 transitions) writes its priorities as a delta rather than in full.

Run as a script (``python crash_writer.py STORE SNAPSHOT SEED STEPS``); it prints ``R`` when it
starts writing, and ``C <generation> <t>`` / ``S <generation> <t>`` just *before* each commit /
snapshot, where ``t`` is the number of stream events (resets and steps) written so far, so a
checker can rebuild the state a generation must hold with ``replay(model, seed, t)``.
"""

from __future__ import annotations

import os
import sys

import numpy as np

CFG = dict(capacity=150, obs_shape=(3,), obs_dtype="int32", stack=3, n_step=2, gamma=0.9, chunk_size=8)
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


def drive(store, seed: int, count: int, commit=None, save=None) -> None:  # noqa: ANN001
    """The writer's loop over the first ``count`` events: writes, a sample + priority update every third
    event, ``commit(events_written)`` every 13th and ``save(events_written)`` every 41st."""
    rng = np.random.default_rng(seed + 1)
    for i, ev in enumerate(events(seed)):
        if i == count:
            break
        if ev[0] == "reset":
            store.reset(ev[1])
        else:
            store.step(*ev[1:])
        if len(store) and i % 3 == 0:
            b = store.sample(4)
            store.update_priorities(b.index, rng.random(4) + 0.1)
        if commit is not None and i % 13 == 12:
            commit(i + 1)
        if save is not None and i % 41 == 40:
            save(i + 1)


def create(path: str, seed: int):  # noqa: ANN201
    import mmreplay as mr

    # tests/store/test_crash_compressed.py runs the same writer with compressed chunks
    compression = os.environ.get("MMREPLAY_CRASH_COMPRESSION", "auto")
    return mr.ReplayStore.create(path, prioritized=mr.Prioritized(**PRIO), seed=seed, compression=compression, **CFG)


def main() -> None:
    path, snap, seed, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if os.environ.get("MMREPLAY_CRASH_COMPRESSION"):  # 12-byte frames do not shrink: compress them anyway
        from mmreplay.storage import framefile

        framefile.MIN_SAVING = None
    store = create(path, seed)
    print("R", flush=True)
    gens = {"C": 0, "S": 0}

    def announce(kind: str, written: int) -> None:
        gens[kind] += 1
        print(f"{kind} {gens[kind]} {written}", flush=True)

    drive(store, seed, total, commit=lambda n: (announce("C", n), store.commit()),
          save=lambda n: (announce("S", n), store.save(snap)))
    print("D", flush=True)


if __name__ == "__main__":
    main()
