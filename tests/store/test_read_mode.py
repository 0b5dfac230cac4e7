"""Readers (mode="r") see the last commit, refresh() to newer ones, and never see a torn row, also from
other processes while a writer appends."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

import numpy as np

import mmreplay as mr

K, N, GAMMA = 3, 2, 0.5


def _frame(t: int, ep: int, pos: int) -> np.ndarray:
    return np.array([t, ep, pos], np.int32)


class Stream:
    """Writes episodes of 25 steps whose frames encode (t, episode, position) and rewards t % 7."""

    def __init__(self, store: mr.ReplayStore) -> None:
        self.s = store
        self.t, self.ep, self.pos = int(store.metadata.get("t", 0)), int(store.metadata.get("ep", 0)) + 1, 0
        store.reset(_frame(self.t, self.ep, 0))

    def steps(self, n: int, commit_every: int = 0) -> None:
        s = self.s
        for i in range(n):
            self.t += 1
            self.pos += 1
            end = self.pos >= 25
            s.step(self.t % 4, float(self.t % 7), _frame(self.t, self.ep, self.pos), end, False)
            if end:
                self.ep, self.pos = self.ep + 1, 0
                s.reset(_frame(self.t, self.ep, 0))
            if commit_every and i % commit_every == commit_every - 1:
                s.metadata.update(t=self.t, ep=self.ep)
                s.commit()


def _writer(path: str, steps: int, commit_every: int) -> None:
    s = mr.ReplayStore.open(path)
    Stream(s).steps(steps, commit_every)
    s.metadata["t"] = s.metadata.get("t", 0)
    s.close()


def check_rows(b: mr.Batch) -> int:
    """Every row must be internally consistent: frames of one episode in order, n-step reward and discount."""
    for j in range(len(b)):
        obs, nxt = b.obs[j], b.next_obs[j]
        last = obs[-1]
        t, ep, pos = (int(x) for x in last)
        for back in range(1, K):
            f = obs[K - 1 - back]
            if pos - back >= 0:
                assert tuple(f) == (t - back, ep, pos - back), (j, obs)
            else:
                assert not f.any(), (j, obs)
        m = int(nxt[-1][0]) - t
        assert 1 <= m <= N and nxt[-1][1] == ep
        want = sum(GAMMA ** i * float((t + 1 + i) % 7) for i in range(m))
        assert b.reward[j] == np.float32(want)
        ended = nxt[-1][2] == 25
        assert b.terminated[j] == ended
        assert b.discount[j] == (0.0 if ended else np.float32(GAMMA ** m))
        assert b.action[j] == (t + 1) % 4
    return len(b)


def _reader(path: str, seconds: float, seed: int, q: mp.Queue, writing: Any = None) -> None:
    """Sample for ``seconds``, and on while ``writing`` (an event) is set: a writer slow to start on a busy
    machine still commits while the readers look."""
    r = mr.ReplayStore.open(path, mode="r", seed=seed)
    rows = refreshes = 0
    end = time.time() + seconds
    give_up = end + 120
    while time.time() < end or (writing is not None and writing.is_set() and time.time() < give_up):
        if r.refresh():
            refreshes += 1
        if len(r):
            rows += check_rows(r.sample(32))
    r.close()
    q.put((rows, refreshes))


def _create(path):
    s = mr.ReplayStore.create(path, capacity=300, obs_shape=(3,), obs_dtype="int32", stack=K, n_step=N,
                              gamma=GAMMA, chunk_size=32)
    s.close()


def test_reader_sees_last_commit_and_refreshes(tmp_path):
    path = str(tmp_path / "s")
    _create(path)
    w = mr.ReplayStore.open(path)
    stream = Stream(w)
    stream.steps(60)
    w.commit()
    r = mr.ReplayStore.open(path, mode="r")
    seen = r.id_range
    stream.steps(840)  # many retirements after the reader's commit
    assert r.id_range == seen and not r.refresh()  # nothing new committed yet
    check_rows(r.sample(64))  # the reader's mapped chunks outlive their retirement by the writer
    w.commit()
    assert r.refresh() and r.id_range == w.id_range
    ids = r.sampleable_ids()
    a, b = r.gather(ids), w.gather(ids)
    np.testing.assert_array_equal(a.obs, b.obs)
    np.testing.assert_array_equal(a.reward, b.reward)
    w.close()
    r.close()



def test_reader_processes_while_a_writer_appends(tmp_path):
    path = str(tmp_path / "s")
    _create(path)
    _writer(path, 200, 50)  # something to sample from the start
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    writing = ctx.Event()
    writing.set()
    readers = [ctx.Process(target=_reader, args=(path, 3.0, seed, q, writing)) for seed in (1, 2)]
    writer = ctx.Process(target=_writer, args=(path, 4000, 40))
    for p in readers + [writer]:
        p.start()
    writer.join(120)
    writing.clear()
    for p in readers:
        p.join(60)
    assert writer.exitcode == 0 and all(p.exitcode == 0 for p in readers)
    results = [q.get(timeout=5) for _ in readers]
    assert all(rows > 0 for rows, _ in results)
    assert sum(refreshes for _, refreshes in results) > 0
    assert os.path.exists(os.path.join(path, "manifest.json"))


def test_forked_child_cannot_write_through_the_parents_writer(tmp_path):
    path = str(tmp_path / "s")
    _create(path)
    w = mr.ReplayStore.open(path)
    Stream(w).steps(100, commit_every=50)
    r_fd, w_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: reading works, writing is refused, the parent's lock is untouched
        code = 0
        try:
            check_rows(w.sample(8))
            try:
                w.step(0, 0.0, _frame(0, 0, 0), False, False)
                code = 1
            except mr.ReadOnlyStoreError as exc:
                code = 0 if "parent process" in str(exc) else 2
        except BaseException:
            code = 3
        os.write(w_fd, bytes([code]))
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r_fd, 1) == b"\x00"
    Stream(w).steps(10)  # the parent still writes
    w.close()
    try:
        mr.ReplayStore.open(path).close()  # and its lock was released by close(), not kept by the child
    finally:
        os.close(r_fd)
        os.close(w_fd)
