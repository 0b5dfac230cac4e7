"""Shared test helpers: drive a store and the reference model with the same episode stream, and compare
their rows and sequences."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import mmreplay as mr
from tests._support.model import ModelStore

FIELDS = ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index")
SEQ_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "is_first", "mask", "ids")


def wait_until(cond: Callable[[], object], what: str, timeout: float = 60.0, pause: float = 0.001) -> None:
    """Poll ``cond()`` until it holds; fail naming ``what`` after ``timeout`` s. For what a thread or process
    reaches at some time, late on a loaded machine: never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(pause)


@dataclass
class Pair:
    store: mr.ReplayStore
    model: ModelStore
    counter: int = 0

    def frame(self, n: int | None) -> np.ndarray:
        """Distinct frames: [counter, stream] as int32 (or batched)."""
        if n is None:
            self.counter += 1
            return np.array([self.counter, 0], np.int32)
        out = np.stack([np.array([self.counter + 1 + s, s], np.int32) for s in range(n)])
        self.counter += n
        return out


def make_pair(path: str, **kw: object) -> Pair:
    store = mr.ReplayStore.create(path, obs_shape=(2,), obs_dtype="int32", **kw)  # type: ignore[arg-type]
    kw = dict(kw)
    kw.pop("seed", None)
    kw.pop("prioritized", None)
    model = ModelStore(obs_shape=(2,), obs_dtype="int32", **kw)
    return Pair(store, model)


def assert_row_equal(batch: mr.Batch, i: int, row: dict) -> None:
    """Every field of row i of ``batch`` equals the model's row."""
    for name in FIELDS:
        got = getattr(batch, name)[i]
        want = row[name]
        assert np.array_equal(np.asarray(got), np.asarray(want)), (
            f"{name} of id {row['index']}: store {got!r} != model {want!r}")
        if name in ("reward", "discount"):
            assert np.asarray(got).dtype == np.float32
    for name, want in row["extras"].items():
        got = batch.extras[name][i]
        assert np.array_equal(got, want), f"extras[{name}] of id {row['index']}: {got!r} != {want!r}"


def assert_same(pair: Pair) -> None:
    """The store and the model agree on the id range, the sampleable set and every field of every row."""
    store, model = pair.store, pair.model
    assert store.id_range == (model.oldest_id, model.next_id)
    ids = model.sampleable_ids()
    assert len(store) == len(ids)
    everything = np.arange(*store.id_range)
    valid = [int(i) for i in everything if _gatherable(store, int(i))]  # gather refuses exactly the others
    assert valid == ids == store.sampleable_ids().tolist()
    if ids:
        batch = store.gather(np.array(ids, np.int64))
        for j, i in enumerate(ids):
            assert_row_equal(batch, j, model.row(i))
        sample = store.sample(min(16, len(ids)))
        for j, i in enumerate(sample.index):
            assert_row_equal(sample, j, model.row(int(i)))


def _gatherable(store: mr.ReplayStore, i: int) -> bool:
    try:
        store.gather(np.array([i], np.int64))
    except mr.NotSampleableError:
        return False
    return True


def data_dir() -> str:
    """``tests/data``: data files committed with the tests (``data/atari`` is written by tools/record_atari.py)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


# The pyproject extra that installs each optional module the tests import.
EXTRAS = {"gymnasium": "gym", "stable_baselines3": "sb3", "ale_py": "atari", "torch": "torch", "PIL": "image", "minari": "minari",
          "pyarrow": "tables", "pandas": "tables", "ray": "ray", "s3fs": "s3", "fsspec": "s3", "moto": "ci"}


def require(module: str):  # noqa: ANN201
    """Import an optional dependency; skip without it, except under CI=true where it must be installed."""
    import importlib

    import pytest

    try:
        return importlib.import_module(module)
    except ImportError:
        extra = EXTRAS.get(module.split(".")[0])
        how = f"pip install -e '.[{extra}]' (or '.[ci]' for the full suite)" if extra else "pip install -e '.[ci]'"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} must be installed in CI: {how}")
        pytest.skip(f"{module} not installed; to run this test: {how}")


def assert_sequence_equal(seq: mr.SequenceBatch, b: int, want: dict, length: int) -> None:
    """Row ``b`` of ``seq`` equals the model's sequence, dtypes and shapes included."""
    for name in SEQ_FIELDS:
        got = getattr(seq, name)[b]
        assert got.shape == want[name].shape, (name, got.shape, want[name].shape)
        assert np.array_equal(got, want[name]), f"{name} of start {want['index']}, L={length}:\n{got!r}\n!=\n" \
                                                f"{want[name]!r}"
    assert seq.reward.dtype == np.float32 and seq.ids.dtype == np.int64 and seq.mask.dtype == np.bool_
    assert seq.index[b] == want["index"] == seq.ids[b, 0]
    for name, value in want["extras"].items():
        assert np.array_equal(seq.extras[name][b], value), f"extras[{name}] of start {want['index']}"


def check_sequences(pair: Pair, lengths: list[int], rng: np.random.Generator) -> None:
    """Every sampleable start, at each length, gathered and sampled, equals the model; strict draws only
    start where the model says `length` steps follow, and raise exactly when none does."""
    store, model = pair.store, pair.model
    ids = model.sampleable_ids()
    assert store.sampleable_ids().tolist() == ids
    if not ids:
        with pytest.raises(mr.NotSampleableError):
            store.sample_sequences(4, 3)
        return
    for length in lengths:
        seq = store.gather_sequences(np.array(ids, np.int64), length)
        assert seq.obs.shape == (len(ids), length + 1, model.k) + model.obs_shape
        assert np.all(seq.weight == 1.0) and np.all(seq.mask[:, 0])
        for b, i in enumerate(ids):
            assert_sequence_equal(seq, b, model.sequence(i, length), length)
        drawn = store.sample_sequences(8, length)
        for b, i in enumerate(drawn.index):
            assert int(i) in ids
            assert_sequence_equal(drawn, b, model.sequence(int(i), length), length)
        fits = [i for i in ids if model.sequence_fits(i, length)]
        if not fits:
            with pytest.raises(mr.NotSampleableError, match="strict=True"):
                store.sample_sequences(8, length, strict=True)
            continue
        strict = store.sample_sequences(8, length, strict=True)
        assert strict.mask.all()
        for b, i in enumerate(strict.index):
            assert int(i) in fits
            assert_sequence_equal(strict, b, model.sequence(int(i), length), length)


def drive_pair(pair: Pair, cfg: dict, events: list[list[int]], resets: list[bool], every: int,
               check: Callable[[], None]) -> None:
    """Feed the same random episode stream to the store and the model, calling ``check`` every few steps."""
    n, vector = cfg["num_envs"], cfg["vector"]
    rng = np.random.default_rng(len(events))
    pair.store.reset(o := pair.frame(n if vector else None))
    pair.model.reset(o)
    ended = [False] * n
    for t, (ev, reset) in enumerate(zip(events, resets, strict=True)):
        if not vector and (ended[0] or reset):
            pair.store.reset(o := pair.frame(None))
            pair.model.reset(o)
            ended[0] = False
        elif vector and reset:
            pair.store.reset(o := pair.frame(n))
            pair.model.reset(o)
            ended = [False] * n
        ev = ev[:n] + [0] * (n - len(ev))
        term = [e in (1, 3) for e in ev]
        trunc = [e in (2, 3) for e in ev]
        ash = (n,) if vector else ()
        action = rng.integers(0, 5, size=ash + cfg["action_shape"]).astype(cfg["action_dtype"])
        reward = rng.integers(-3, 4, size=ash).astype(np.float64) / 4
        extras = dict(lp=rng.standard_normal(ash).astype(np.float32),
                      vec=rng.integers(-9, 9, size=ash + (2,)).astype(np.int16))
        obs = pair.frame(n if vector else None)
        if vector:
            args = (action, reward, obs, np.array(term), np.array(trunc))
        else:
            args = (action, float(reward), obs, term[0], trunc[0])
        pair.store.step(*args, **extras)
        pair.model.step(*args, **extras)
        # autoreset envs ignore flags: mirror which envs are now between episodes
        ended = [(not ended[s] and (term[s] or trunc[s])) if vector else (term[s] or trunc[s]) for s in range(n)]
        if t % every == every - 1:
            check()
    check()


@contextlib.contextmanager
def interrupt_at(func: Callable[..., Any], line: str | None, hit: int = 1, exc: type[BaseException] = KeyboardInterrupt
                 ) -> Iterator[None]:
    """Raise ``exc`` in the calling thread when ``func`` reaches (the ``hit``-th time) its first line holding
    ``line``, or returns (``line`` None)."""
    code = func.__code__
    target = None
    if line is not None:
        src, first = inspect.getsourcelines(func)
        target = first + next(i for i, text in enumerate(src) if line in text)
    seen = [0]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if (event == "line" and frame.f_lineno == target) or (target is None and event == "return"):
            seen[0] += 1
            if seen[0] == hit:
                sys.settrace(None)
                raise exc
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is code else None

    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(None)
    assert seen[0] >= hit, f"{func.__qualname__} never reached {line!r}"
