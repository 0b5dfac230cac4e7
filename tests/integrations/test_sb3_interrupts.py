"""mmreplay.sb3.ReplayBuffer interrupted half-way (Ctrl-C's ``KeyboardInterrupt``, a preemption handler's
``sys.exit()``), then what a preemption handler does (``save_replay_buffer``, ``close()``): the buffer either
refuses, saying to load the last pickle, and its store reopens at that pickle's commit; or it saves a pickle
that agrees with its store. Never a pickle whose buffer and store disagree, nor a store left open and locked
by nothing. The interrupt is raised by a trace function at one chosen line, where Python would deliver a
signal that arrived there."""

from __future__ import annotations

import contextlib
import glob
import inspect
import os
import pickle
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.core.durability import Durability
from mmreplay.core.writer import EpisodeWriter
from tests._support import internals

REFUSED = "load the last save_replay_buffer pickle"  # what a broken buffer says to do


@contextlib.contextmanager
def interrupt_at(func: Callable[..., Any] | str, line: str, hit: int = 1,
                 exc: type[BaseException] = KeyboardInterrupt) -> Iterator[None]:
    """Raise ``exc`` in the calling thread when ``func`` (a function of ``mmreplay.sb3`` when a name) reaches,
    the ``hit``-th time, its first line holding ``line``."""
    if isinstance(func, str):
        func = internals.sb3_function(func)
    func = inspect.unwrap(func)  # (the function a decorator wraps, whose lines run)
    code = func.__code__
    src, first = inspect.getsourcelines(func)
    target = first + next(i for i, text in enumerate(src) if line in text)
    seen = [0]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == target:
            seen[0] += 1
            if seen[0] == hit:
                sys.settrace(None)
                raise exc
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
    try:
        yield
    finally:
        sys.settrace(None)
    assert seen[0] >= hit, f"{func.__qualname__} never reached {line!r}"


def _buffer(sb3, spaces, path, n_envs=1):
    return sb3.ReplayBuffer(1000, spaces.Box(-1e6, 1e6, (3,), np.float32), spaces.Discrete(2), device="cpu",
                            n_envs=n_envs, path=None if path is None else str(path))


def _add(buf, t):
    """Step ``t`` of every env's one episode: obs ``(t, env, 0)``, next_obs ``(t + 1, env, 0)``."""
    n = buf.n_envs
    obs = np.array([[t, i, 0] for i in range(n)], np.float32)
    nxt = obs.copy()
    nxt[:, 0] += 1
    buf.add(obs, nxt, np.zeros(n, np.int64), np.full(n, t, np.float32), np.zeros(n, bool), [{} for _ in range(n)])


def _resumes(blob, adds, t):
    """The pickle loads at its commit (``adds`` adds per env), its ``pos`` agreeing with its store, and adds
    from step ``t`` on are stored as added."""
    again = pickle.loads(blob)
    try:
        n = again.n_envs
        assert again.pos == adds and again.store.id_range == (0, adds * n)
        for u in range(t, t + 3):
            _add(again, u)
        store = again.store
        got = store.gather(store.sampleable_ids())
        obs, nxt = got.obs[:, -1], got.next_obs[:, -1]
        assert len(obs) == (adds + 3) * n
        assert (nxt[:, 0] == obs[:, 0] + 1).all() and (nxt[:, 1] == obs[:, 1]).all()  # each one an add
    finally:
        again.close(commit=False)


def _refuses(sb3, buf):
    """A broken buffer: every call but close() refuses, saying to load the last pickle."""
    for call in (lambda: pickle.dumps(buf), lambda: _add(buf, 20), lambda: buf.sample(2), lambda: buf.store):
        with pytest.raises(mr.StoreClosedError, match=REFUSED):
            call()


# (function, line, the call interrupted, envs): an add or a block write stopped between its steps
POINTS = {
    # a block forgotten before the store wrote it (sample() writes the pending adds first)
    "block write": ("_Pending.flush_env", "store.extend(", "sample", 1),
    # the short add path: the block's count moved on, the action not kept yet
    "short add": ("ReplayBuffer._add_step", "pend.actions[0].append(act)", "add", 1),
    # the short add path: the step kept, the env's last next_obs not yet
    "short add's stack": ("ReplayBuffer._add_step", "pend.last[0] = next_b", "add", 1),
    # the add counted towards the next pickle, SB3's pos not moved yet
    "pos": ("ReplayBuffer._added", "self.pos += 1", "add", 1),
    # the general path (two envs): env 0's reward kept, its episode end not
    "add": ("ReplayBuffer.add", "pend.ends[i].append(ends[i])", "add", 2),
    # inside the store's write of a block (the store refuses from then on)
    "store's write": (EpisodeWriter.write_extend, "log.finish_run(", "sample", 2),
}


def _checkpointed(sb3, spaces, path, n_envs=1):  # noqa: ANN001, ANN202
    """A buffer given adds 0..4, pickled then (the checkpoint, returned), then given adds 5..8."""
    buf = _buffer(sb3, spaces, path, n_envs)
    for t in range(5):
        _add(buf, t)
    blob = pickle.dumps(buf)
    for t in range(5, 9):
        _add(buf, t)
    return buf, blob


@pytest.mark.parametrize("point", list(POINTS))
def test_an_interrupted_add_or_write_refuses_and_resumes_from_the_last_pickle(sb3, spaces, tmp_path, point):
    func, line, call, n_envs = POINTS[point]
    buf, blob = _checkpointed(sb3, spaces, tmp_path / "s", n_envs)
    with pytest.raises(KeyboardInterrupt), interrupt_at(func, line):
        buf.sample(2) if call == "sample" else _add(buf, 9)
    _refuses(sb3, buf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (nothing about adds not kept: none can be)
        buf.close()
    _resumes(blob, 5, 10)


def test_close_after_an_interrupted_write_commits_nothing_and_lets_the_interrupt_through(sb3, spaces, tmp_path):
    buf = _buffer(sb3, spaces, tmp_path / "s", 2)  # never pickled: close() would commit
    for t in range(6):
        _add(buf, t)
    with pytest.raises(KeyboardInterrupt):
        try:
            with interrupt_at(EpisodeWriter.write_extend, "log.finish_run("):
                buf.sample(2)
        finally:
            buf.close()
    buf.close(commit=True)  # (closed: nothing more)
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as r:
        assert r.id_range == (0, 0) and r.verify() == []


def test_close_commit_true_of_a_broken_buffer_commits_nothing(sb3, spaces, tmp_path):
    buf, blob = _checkpointed(sb3, spaces, tmp_path / "s")
    with pytest.raises(KeyboardInterrupt), interrupt_at("ReplayBuffer._added", "self.pos += 1"):
        _add(buf, 9)
    buf.close(commit=True)
    _resumes(blob, 5, 10)


def test_a_store_interrupted_in_a_call_of_its_own_refuses_as_the_buffer(sb3, spaces, tmp_path):
    buf, blob = _checkpointed(sb3, spaces, tmp_path / "s")
    store = buf.store
    with pytest.raises(KeyboardInterrupt), interrupt_at(Durability.commit, "write_manifest("):
        store.commit()
    _refuses(sb3, buf)
    buf.close()
    _resumes(blob, 5, 10)


def test_a_failed_pickling_keeps_the_temporary_store_to_be_removed(sb3, spaces):
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "mmreplay-sb3-*")))
    buf = _buffer(sb3, spaces, None)
    for t in range(10):
        _add(buf, t)
    path = buf.store.path
    for t in range(10, 15):
        _add(buf, t)
    with pytest.raises(KeyboardInterrupt), interrupt_at(EpisodeWriter.write_extend, "log.finish_run("):
        buf.sample(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (not "pickling keeps the temporary store": it does not)
        with pytest.raises(mr.StoreClosedError, match=REFUSED):
            pickle.dumps(buf)
    buf.close()
    assert not os.path.exists(path)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "mmreplay-sb3-*"))) <= before


@pytest.mark.parametrize("line", ["if store.generation", "handle = _Handle(store, None)", "self._attach(handle)",
                                  "handle.pending.last ="])
def test_an_interrupted_load_leaves_the_store_closed(sb3, spaces, tmp_path, line):
    buf = _buffer(sb3, spaces, tmp_path / "s")
    for t in range(6):
        _add(buf, t)
    blob = pickle.dumps(buf)
    buf.close()
    # (the interrupt's traceback is kept, as an interactive session keeps sys.last_traceback: it holds the
    # half-loaded buffer)
    with pytest.raises(KeyboardInterrupt) as kept, interrupt_at("ReplayBuffer.__setstate__", line):
        pickle.loads(blob)
    _resumes(blob, 6, 6)
    assert kept.value is not None


@pytest.mark.parametrize("temporary", [False, True])
def test_an_interrupted_creation_leaves_no_store_open(sb3, spaces, tmp_path, temporary):
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "mmreplay-sb3-*")))
    # (whole observations: the store is created with the buffer)
    with pytest.raises(KeyboardInterrupt) as kept, interrupt_at("ReplayBuffer._open_new", "self._attach(_Handle("):
        _buffer(sb3, spaces, None if temporary else tmp_path / "s")
    if temporary:
        assert set(glob.glob(os.path.join(tempfile.gettempdir(), "mmreplay-sb3-*"))) <= before
    else:
        with mr.ReplayStore.open(tmp_path / "s") as s:  # (not locked by what the interrupt left)
            assert s.id_range == (0, 0)
    assert kept.value is not None


# every line of the buffer's own bookkeeping of an add and of a block write
SWEPT = ["ReplayBuffer.add", "ReplayBuffer._add_step", "ReplayBuffer._added", "_Pending.start", "_Pending.flush",
         "_Pending.flush_env", "_Handle.flush"]


@pytest.mark.parametrize("name", SWEPT)
def test_an_interrupt_at_any_line_refuses_or_saves_what_the_store_holds(sb3, spaces, tmp_path, monkeypatch, name):
    internals.sb3_block_rows(monkeypatch, 4)  # (blocks written often)
    func = internals.sb3_function(name)
    src, first = inspect.getsourcelines(func)
    run = sorted({n for _, _, n in func.__code__.co_lines() if n is not None and n > first})
    lines = [src[n - first].strip() for n in run]
    reached = []
    for k, line in enumerate(lines):
        if any(line in text for text in src[:run[k] - first]):
            continue  # (interrupt_at stops at the first line holding the text)
        path = tmp_path / f"s{k}"
        buf = _buffer(sb3, spaces, path, 2 if name in ("ReplayBuffer.add", "_Pending.start") else 1)
        for t in range(9):
            _add(buf, t)
        blob = pickle.dumps(buf)
        try:
            with interrupt_at(name, line):
                for t in range(9, 20):
                    if t == 14:  # a new episode: a start pending before the next block
                        _add(buf, 100)
                    else:
                        _add(buf, t)
                buf.sample(2)
                pickle.dumps(buf)
        except KeyboardInterrupt:
            pass
        except AssertionError:  # a line this scenario does not reach
            buf.close(commit=False)
            continue
        reached.append(line)
        try:
            blob, adds = pickle.dumps(buf), buf.pos
        except mr.StoreClosedError as exc:
            assert REFUSED in str(exc), (line, exc)
            adds = 9
        buf.close()
        again = pickle.loads(blob)
        try:
            store = again.store
            assert store.id_range == (0, adds * again.n_envs), (line, store.id_range, adds)
            for t in range(200, 203):
                _add(again, t)
            got = store.gather(store.sampleable_ids())
            obs, nxt = got.obs[:, -1], got.next_obs[:, -1]
            assert (nxt[:, 0] == obs[:, 0] + 1).all() and (nxt[:, 1] == obs[:, 1]).all(), line
        finally:
            again.close(commit=False)
    assert reached
