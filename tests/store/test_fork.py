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

import numpy as np
import pytest

import mmreplay as mr
from tests._support import internals
from tests._support.compression import atari_frames
from tests._support.helpers import require
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
