"""One store used from several threads: calls are serialized (SEMANTICS.md "Threads and processes").

An actor thread's ``step()`` retires and unmaps chunks while a learner thread samples; a reader's
``refresh()`` unmaps its old commit while another thread samples. Before the store locked, both died with
SIGSEGV within a second or two, so each scenario runs in a fresh interpreter (``isolated.run_scenario``):
a crash or a hang fails the test instead of pytest. Every sampled row is compared with the reference model
(``tests/_support/model.py``), fed the same episode stream up front and never evicting: a row the store hands out
must be that transition's row whatever the other thread did meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

import mmreplay as mr
from tests._support.helpers import assert_row_equal
from tests._support.isolated import run_scenario
from tests._support.model import ModelStore

KW = dict(stack=2, n_step=3, gamma=0.9)
SMALL = dict(capacity=60, chunk_size=16)  # chunks retire every few dozen steps


def _script(steps: int, seed: int, atari: np.ndarray | None = None) -> list[tuple]:
    """An episode stream: ``("reset", frame)`` and ``("step", action, reward, frame, terminated)``. Episodes
    end by termination only, so a row never changes once its window has closed. Frames are distinct: small
    int32 pairs, or real Atari frames (``atari``, which the sealer compresses) stamped with their number."""
    rng = np.random.default_rng(seed)
    ops: list[tuple] = []
    k = 0

    def frame() -> np.ndarray:
        nonlocal k
        k += 1
        if atari is None:
            return np.array([k, k % 7], np.int32)
        f = atari[k % len(atari)].copy()
        f[0, :4] = np.frombuffer(np.int32(k).tobytes(), np.uint8)
        return f

    ops.append(("reset", frame()))
    for _ in range(steps):
        end = bool(rng.random() < 0.05)
        ops.append(("step", int(rng.integers(0, 4)), float(rng.integers(-4, 5)) / 4, frame(), end))
        if end:
            ops.append(("reset", frame()))
    return ops


def _apply(target: mr.ReplayStore | ModelStore, op: tuple) -> None:
    if op[0] == "reset":
        target.reset(op[1])
    else:
        target.step(op[1], op[2], op[3], op[4], False)


class _Rows:
    """The model's row of each id (cached: the model is read-only once built)."""

    def __init__(self, ops: list[tuple]) -> None:
        first = ops[0][1]
        self.model = ModelStore(capacity=10**9, obs_shape=first.shape, obs_dtype=first.dtype, chunk_size=None,
                                **KW)
        for op in ops:
            _apply(self.model, op)
        self._rows: dict[int, dict] = {}

    def check(self, batch: mr.Batch) -> int:
        for j, i in enumerate(batch.index.tolist()):
            row = self._rows.get(i)
            if row is None:
                row = self._rows[i] = self.model.row(i)
            assert_row_equal(batch, j, row)
        return len(batch)


def _run_threads(work: list, enough: Callable[[], bool], limit: float = 60.0) -> None:
    """Run each ``work`` function (given a stop event) in its own thread until ``enough()`` says so, one of
    them returns, or ``limit`` seconds pass; re-raise the first error."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(fn: Callable[[threading.Event], None]) -> None:
        try:
            fn(stop)
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)
        finally:
            stop.set()

    threads = [threading.Thread(target=run, args=(fn,), daemon=True) for fn in work]
    for t in threads:
        t.start()
    deadline = time.monotonic() + limit
    while not stop.wait(0.05) and not enough() and time.monotonic() < deadline:
        pass
    stop.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a thread did not stop"
    if errors:
        raise errors[0]


def _atari() -> np.ndarray:
    from tests._support.compression import atari_frames

    return atari_frames("pong")[:500]


def actor_learner(path: str, rolls: int, atari: bool) -> None:
    """An actor thread steps (retiring chunks all the time; with ``atari``, sealed chunks are compressed and
    switched to their compressed files too) while a learner thread samples with ``sample()``, a prefetching
    ``batches()`` iterator and ``iter_batches``, until the actor has rolled to a new chunk ``rolls`` times
    (the chunks retired under the learner); every row is the model's."""
    ops = _script(6_000 if atari else 40_000, seed=1, atari=_atari() if atari else None)
    rows = _Rows(ops)
    first = ops[0][1]
    store = mr.ReplayStore.create(path, obs_shape=first.shape, obs_dtype=first.dtype, seed=1,
                                  **(dict(capacity=300, chunk_size=64) if atari else SMALL), **KW)
    for op in ops[:200]:
        _apply(store, op)
    checked = [0, 0]

    def actor(stop: threading.Event) -> None:
        for op in ops[200:]:
            if stop.is_set():
                return
            _apply(store, op)
            checked[1] += 1

    def learner(stop: threading.Event) -> None:
        it = store.batches(8, prefetch=2)
        while not stop.is_set():
            checked[0] += rows.check(store.sample(8))
            checked[0] += rows.check(next(it))
            for batch in store.iter_batches(16, seed=checked[0]):
                checked[0] += rows.check(batch)
                break

    chunk = 64 if atari else SMALL["chunk_size"]
    _run_threads([actor, learner], lambda: checked[1] >= rolls * chunk and checked[0] >= rolls * 8)
    assert checked[1] >= rolls * chunk and checked[0] >= rolls * 8, f"too little done: {checked}"
    if atari:
        assert store.inspect()["compressed_chunks"], "no chunk was compressed: the scenario missed its point"
    store.close()
    print("rows checked", checked[0], "steps", checked[1])


def test_actor_thread_steps_while_learner_thread_samples(tmp_path):
    out = run_scenario("tests.store.test_threads", "actor_learner", str(tmp_path / "s"), 20, False)
    assert "rows checked" in out


def test_actor_and_learner_threads_compressed_chunks(tmp_path):
    _atari()  # skips when the frames are absent
    out = run_scenario("tests.store.test_threads", "actor_learner", str(tmp_path / "s"), 8, True)
    assert "rows checked" in out


def sample_beside_refresh(path: str, commits: int) -> None:
    """A reader store shared by a thread that samples and one that calls ``refresh()`` (which unmaps the old
    commit's chunks), while a writer (its own store object) commits every few steps; every row is the model's."""
    ops = _script(40_000, seed=2)
    rows = _Rows(ops)
    writer = mr.ReplayStore.create(path, obs_shape=(2,), obs_dtype="int32", seed=1, **SMALL, **KW)
    for op in ops[:200]:
        _apply(writer, op)
    writer.commit()
    reader = mr.ReplayStore.open(path, mode="r", seed=5)
    done = [0, 0, 0]  # rows checked, refreshes that moved, commits

    def write(stop: threading.Event) -> None:
        for t, op in enumerate(ops[200:]):
            if stop.is_set():
                return
            _apply(writer, op)
            if t % 10 == 9:
                writer.commit()
                done[2] += 1

    def sample(stop: threading.Event) -> None:
        it = reader.batches(8, prefetch=1)
        while not stop.is_set():
            done[0] += rows.check(reader.sample(8))
            try:
                done[0] += rows.check(next(it))
            except StopIteration:  # refresh() ends a reader's live iterators
                it = reader.batches(8, prefetch=1)

    def refresh(stop: threading.Event) -> None:
        while not stop.is_set():
            done[1] += reader.refresh()
            time.sleep(0.001)

    _run_threads([write, sample, refresh], lambda: done[2] >= commits and done[1] >= commits // 2)
    assert done[2] >= commits and done[1] >= commits // 2 and done[0] > 0, f"too little done: {done}"
    reader.close()
    writer.close()
    print("rows checked", done[0], "refreshes", done[1], "commits", done[2])


def test_sample_beside_refresh_in_another_thread(tmp_path):
    out = run_scenario("tests.store.test_threads", "sample_beside_refresh", str(tmp_path / "s"), 40)
    assert "rows checked" in out


def test_rate_limited_step_waits_without_holding_the_store(tmp_path):
    """An actor thread's ``step()`` that waits for samples must let the learner thread of the same store
    sample meanwhile: its waits end by the learner's rows, never by the timeout (a step that held the store's
    lock while waiting would stall both until ``RateLimitTimeout``)."""
    path = tmp_path / "s"
    store = mr.ReplayStore.create(path, capacity=1000, obs_shape=(2,), obs_dtype="int32", n_step=1, seed=0,
                                  rate_limit=mr.RateLimit(1.0, min_size=20, error_buffer=16, timeout=20))
    reader = mr.ReplayStore.open(path, mode="r")  # present: the writer's step() waits instead of raising
    store.reset(np.zeros(2, np.int32))
    counts = [0, 0]

    def actor(stop: threading.Event) -> None:
        for t in range(400):
            store.step(0, 1.0, np.array([t, 0], np.int32), False, False)
            counts[0] += 1
        stop.set()

    def learner(stop: threading.Event) -> None:
        while not stop.is_set():
            if store.can_sample(8):
                counts[1] += len(store.sample(8))
            time.sleep(0.002)  # slower than the actor: its steps keep reaching the limit and waiting

    _run_threads([actor, learner], lambda: False, limit=120)
    assert store.inspect()["rate_limit"]["inserted"] == 400
    assert counts[0] == 400 and counts[1] >= 400 - 16 - 20 - 8, counts
    reader.close()
    store.close()
