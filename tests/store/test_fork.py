"""A forked child uses a store its parent had open (SEMANTICS.md "Threads and processes").

Before: the child's first ``sample()`` queued work for the parent's read pool, whose idle thread the child
does not have, and waited for ever; a writer forked while a chunk was being sealed left a child whose
``close()`` and interpreter exit waited for ever on the parent's seal. Each scenario runs in a fresh
interpreter (``isolated.run_scenario``) with a timeout, so a hang fails the test rather than stalling pytest;
inside it, the parent waits for its children with a deadline too.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np
import pytest

import mmreplay as mr
from tests._support import internals
from tests._support.compression import atari_frames
from tests._support.helpers import require, wait_until
from tests._support.isolated import run_scenario

FIELDS = ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index", "weight")


def _fill(path: str, compression: str | None, steps: int = 1500) -> mr.ReplayStore:
    """A writable store of real Atari frames (compressed chunks with ``compression="lz4"``)."""
    frames = atari_frames("pong")
    s = mr.ReplayStore.create(path, capacity=1000, obs_shape=(84, 84), stack=4, n_step=3, chunk_size=256,
                              compression=compression, seed=4)
    s.reset(frames[0])
    for t in range(steps):
        s.step(t % 6, float(t % 3), frames[(t + 1) % len(frames)], t % 200 == 199, False)
        if t % 200 == 199:
            s.reset(frames[(t + 1) % len(frames)])
    return s


def _small(path: str) -> mr.ReplayStore:
    """A writable store of small synthetic frames (for scenarios about locks, not rows)."""
    s = mr.ReplayStore.create(path, capacity=500, obs_shape=(8, 8), chunk_size=64)
    s.reset(np.zeros((8, 8), np.uint8))
    for t in range(300):
        s.step(0, 1.0, np.full((8, 8), t % 200, np.uint8), False, False)
    return s


def _child_samples(*stores: mr.ReplayStore) -> None:
    """In a forked child: sample from each inherited store, then exit (status 0 when it could)."""
    code = 1
    try:
        for store in stores:
            assert len(store.sample(8)) == 8
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait_child(pid: int, seconds: float = 60) -> int:
    """The child's exit status; fails (killing it) when it has not exited within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"the forked child {pid} did not exit within {seconds} s (it hangs)")


def _save(path: str, batch: mr.Batch) -> None:
    np.savez(path, **{name: getattr(batch, name) for name in FIELDS})


def _same(path: str, batch: mr.Batch) -> None:
    with np.load(path) as got:
        for name in FIELDS:
            assert np.array_equal(got[name], getattr(batch, name)), name


def child_samples_after_parent(path: str, compression: str | None, reader: bool) -> None:
    """The parent samples many batches (``sample`` of 32 and 128: the larger ones split across the read
    pool; a prefetching iterator left live), then forks; the child samples, gathers and iterates. Its
    batches are those the parent draws next (the child continues the parent's RNG) and exits normally."""
    store = _fill(path, compression)
    store.commit()
    if reader:
        store.close()
        store = mr.ReplayStore.open(path, mode="r", seed=4)
    for _ in range(150):
        store.sample(32)
        store.sample(128)
    it = store.batches(32, prefetch=3)
    for _ in range(20):
        next(it)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _save(path + ".a.npz", store.sample(32))
            _save(path + ".b.npz", store.sample(128))
            _save(path + ".c.npz", next(it))
            g = store.gather(np.arange(*store.id_range)[-300:-200])
            assert np.array_equal(g.index, np.arange(*store.id_range)[-300:-200])
            code = 0
        except BaseException:
            traceback.print_exc()
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            if code:
                os._exit(code)  # (an assertion's traceback is printed by the interpreter below otherwise)
        sys.exit(0)  # a normal exit: atexit and the store's finalizer run in the child
    assert _wait_child(pid) == 0
    _same(path + ".a.npz", store.sample(32))
    _same(path + ".b.npz", store.sample(128))
    _same(path + ".c.npz", next(it))
    it.close()
    store.close()
    print("child sampled")


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_forked_child_samples_after_the_parent_sampled(tmp_path, compression):
    atari_frames("pong")  # skips when the frames are absent
    out = run_scenario("tests.store.test_fork", "child_samples_after_parent", str(tmp_path / "s"), compression, False)
    assert "child sampled" in out


def test_forked_child_of_a_reader_samples(tmp_path):
    atari_frames("pong")
    out = run_scenario("tests.store.test_fork", "child_samples_after_parent", str(tmp_path / "s"), "lz4", True)
    assert "child sampled" in out


def writer_forks_during_a_seal(path: str) -> None:
    """A writer forks while a chunk's background seal is held up. The children sample; their writes,
    commit and save raise ``ReadOnlyStoreError`` saying to reopen; one closes, the other just exits, and
    neither waits on the parent's seal. The parent then finishes the seal, goes on writing and commits a
    store that verifies."""
    gate = threading.Event()
    internals.hold_seals(gate)
    store = _fill(path, "lz4", steps=600)  # rolled: a seal is waiting at the gate
    for _ in range(20):
        store.sample(32)
    frame = np.zeros((84, 84), np.uint8)
    pids = []
    for close in (True, False):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                assert len(store.sample(32)) == 32
                for write in (lambda: store.step(0, 0.0, frame, False, False), store.commit,
                              lambda: store.save(path + ".snap"), lambda: store.reset(frame)):
                    try:
                        write()
                    except mr.ReadOnlyStoreError as exc:
                        assert "mode='r'" in str(exc) and "forked" in str(exc), exc
                    else:
                        raise AssertionError(f"{write} was allowed in a forked child of the writer")
                if close:
                    store.close()
                code = 0
            finally:
                sys.stdout.flush()
                if code:
                    os._exit(code)
            sys.exit(0)
        pids.append(pid)
    for pid in pids:
        assert _wait_child(pid) == 0
    gate.set()
    n = store.id_range[1]
    for _ in range(300):
        store.step(0, 1.0, frame, False, False)
    store.close()
    assert not os.path.exists(path + ".snap")
    with mr.ReplayStore.open(path, mode="r") as again:
        assert again.id_range[1] == n + 300
        assert again.verify() == []
        assert again.inspect()["compressed_chunks"]
    print("children exited")


def test_writer_forked_during_a_seal(tmp_path):
    atari_frames("pong")
    out = run_scenario("tests.store.test_fork", "writer_forks_during_a_seal", str(tmp_path / "s"))
    assert "children exited" in out


def dataloader_fork_workers(path: str) -> None:
    """A PyTorch ``DataLoader`` with two fork workers over a dataset holding the parent's open (writable) store,
    after the parent sampled: every row a worker samples is the parent's ``gather`` of its id."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    store = _fill(path, "lz4")
    for _ in range(100):
        store.sample(64)

    class Inherited(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            for _ in range(3):
                b = store.sample(16)
                yield {"index": b.index, "obs": b.obs, "next_obs": b.next_obs, "reward": b.reward}

    loader = DataLoader(Inherited(), batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60)
    got = list(loader)
    assert len(got) == 6
    for batch in got:
        want = store.gather(batch["index"].numpy())
        for name in ("obs", "next_obs", "reward"):
            assert isinstance(batch[name], torch.Tensor)
            assert np.array_equal(batch[name].numpy(), getattr(want, name)), name
    store.close()
    print("workers sampled")


def test_dataloader_fork_workers_over_an_inherited_store(tmp_path):
    atari_frames("pong")
    require("torch")
    out = run_scenario("tests.store.test_fork", "dataloader_fork_workers", str(tmp_path / "s"), timeout=240)
    assert "workers sampled" in out


def fork_while_another_thread_holds_the_store(path: str) -> None:
    """A fork while another thread is inside a call on the store that does not end (here: holds its lock)
    waits ``FORK_WAIT`` seconds, then forks: the child's copy may be half-changed, so its calls raise
    ``StoreClosedError`` saying to reopen (its iterators end), and it exits normally. The parent's store is
    unaffected."""
    from mmreplay import store as store_module

    store_module.FORK_WAIT = 0.2  # type: ignore[attr-defined]
    store = _fill(path, "lz4", steps=400)
    it = store.batches(8)
    next(it)
    inside, leave = threading.Event(), threading.Event()

    def busy() -> None:
        with internals.lock(store):
            inside.set()
            leave.wait(60)

    t = threading.Thread(target=busy)
    t.start()
    inside.wait(10)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with pytest.raises(StopIteration):  # the store's iterators end, as when it is closed
                next(it)
            for call in (lambda: store.sample(8), lambda: store.gather([5]), store.commit):
                try:
                    call()
                except mr.StoreClosedError as exc:
                    assert "another thread" in str(exc) and "open the store again" in str(exc), exc
                else:
                    raise AssertionError("a half-changed store was used in the child")
            store.close()
            code = 0
        except BaseException:
            traceback.print_exc()
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            if code:
                os._exit(code)
        sys.exit(0)
    leave.set()
    t.join()
    assert _wait_child(pid) == 0
    assert len(store.sample(8)) == 8 and len(next(it)) == 8
    store.close()
    print("child refused")


def test_fork_while_another_thread_is_inside_a_call(tmp_path):
    atari_frames("pong")
    out = run_scenario("tests.store.test_fork", "fork_while_another_thread_holds_the_store", str(tmp_path / "s"))
    assert "child refused" in out


def fork_while_a_call_loads_a_kernel(path: str) -> None:
    """A fork while another thread is inside a call on the store that needs numba's compile lock (its first
    batch loads kernels): the fork waits for the store's lock first and takes the compile lock after it, so
    the call ends, the fork goes on, and the child samples. Taking the compile lock first, the fork and the
    call waited on each other until ``FORK_WAIT`` ran out, and the child's store was closed."""
    from numba.core.compiler_lock import global_compiler_lock

    store = _small(path)
    forker = threading.current_thread()
    inside = threading.Event()

    def loads_a_kernel() -> None:
        with internals.lock(store):
            inside.set()
            wait_until(lambda: internals.in_before_fork(forker), "the fork to start")
            with global_compiler_lock:  # (as a kernel's first call does)
                pass

    t = threading.Thread(target=loads_a_kernel)
    t.start()
    inside.wait(60)
    pid = os.fork()
    if pid == 0:
        _child_samples(store)
    t.join()
    assert _wait_child(pid) == 0
    store.close()
    print("child sampled")


def test_fork_while_another_thread_loads_a_kernel_in_a_call(tmp_path):
    out = run_scenario("tests.store.test_fork", "fork_while_a_call_loads_a_kernel", str(tmp_path / "s"),
                       env={"MMREPLAY_WARMUP": "0"})
    assert "child sampled" in out


def two_threads_fork_at_once(path: str) -> None:
    """A thread forks while another is between its fork's hooks, holding the locks of two stores: the forks take
    turns, each releases the stores' locks after its own fork, and both children sample. (With one list of
    the locks taken for the whole process, the second fork emptied the first's, whose lock then stayed held.)"""
    from mmreplay import store as store_module

    store_module.FORK_WAIT = 0.5  # type: ignore[attr-defined]
    stores = [_small(path + ".a"), _small(path + ".b")]
    locks = [internals.lock(store) for store in stores]
    second_tries = threading.Event()
    pids: list[int] = []

    def forks() -> None:
        pid = os.fork()
        if pid == 0:
            _child_samples(*stores)
        pids.append(pid)

    first, second = threading.Thread(target=forks, name="first"), threading.Thread(target=forks, name="second")
    taken_by_first: list[Watched] = []

    class Watched:
        """A store's lock; once the first fork has taken both, the second thread forks."""

        def __init__(self, lock: Any) -> None:
            self.lock = lock

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            me = threading.current_thread()
            if me is second:
                second_tries.set()
            got = bool(self.lock.acquire(blocking, timeout))
            if got and me is first:  # in its fork's hook
                taken_by_first.append(self)
                if len(taken_by_first) == len(stores):
                    second.start()
                    second_tries.wait(1)  # (when forks take turns it waits for this one, and does not try)
            return got

        def release(self) -> None:
            self.lock.release()

        def __enter__(self) -> bool:
            return self.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    for store, lock in zip(stores, locks, strict=True):
        internals.replace_lock(store, Watched(lock))
    first.start()
    first.join()
    second.join()
    for lock in locks:
        assert lock.acquire(blocking=False), "a store's lock is still held by a thread that forked"
        lock.release()
    for pid in pids:
        assert _wait_child(pid) == 0
    for store in stores:
        store.close()
    print("both children sampled")


def test_two_threads_fork_at_once(tmp_path):
    # without numba's compiler (whose lock a fork also takes) nothing but the store's own rule orders the forks
    out = run_scenario("tests.store.test_fork", "two_threads_fork_at_once", str(tmp_path / "s"),
                       env={"NUMBA_DISABLE_JIT": "1"})
    assert "both children sampled" in out


def fork_while_another_thread_opens(path: str) -> None:
    """A fork while another thread is inside ``ReplayStore.open`` for writing, the writer lock taken and the
    store not yet built: the child closes its copy of the lock's descriptor, so once the parent closed the
    store it opens it for writing again while the child still lives."""
    from mmreplay import store as store_module

    _small(path).close()
    locked, forked = threading.Event(), threading.Event()
    read_consistent = store_module.read_consistent

    def held_up(*args: object, **kwargs: object) -> object:  # (open() calls it once it took the lock)
        locked.set()
        forked.wait(60)
        return read_consistent(*args, **kwargs)

    store_module.read_consistent = held_up  # type: ignore[attr-defined]
    opened: list[mr.ReplayStore] = []
    t = threading.Thread(target=lambda: opened.append(mr.ReplayStore.open(path)))
    t.start()
    locked.wait(60)
    alive, ended = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ended)
        os.read(alive, 1)  # lives on until the parent closes its end
        os._exit(0)
    os.close(alive)
    forked.set()
    t.join()
    store_module.read_consistent = read_consistent  # type: ignore[attr-defined]
    opened[0].close()
    try:
        mr.ReplayStore.open(path).close()  # (StoreLockedError while the child held the lock)
    finally:
        os.close(ended)
        assert _wait_child(pid) == 0
    print("reopened")


def test_fork_while_another_thread_opens_the_store_for_writing(tmp_path):
    out = run_scenario("tests.store.test_fork", "fork_while_another_thread_opens", str(tmp_path / "s"))
    assert "reopened" in out
