"""The device feed (``mmreplay.torch.device_batches``) hands out exactly ``sample()``'s batches, and its host
buffers are never refilled while a copy out of them is in flight.

On CPU the "device" path is the same: distinct frames into a ring of host buffers, one copy of the packed
bytes, the stacks gathered from the copied frames by an index; ``LateCopier`` stands in for the CUDA
stream and events with copies whose completion comes late. CUDA tests skip without a GPU.
"""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.synthetic import atari_like_episodes

FIELDS = ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index", "weight")
SEQ_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "is_first", "mask", "ids", "index", "weight")


def _fill(s: mr.ReplayStore, episodes: int, seed: int) -> None:
    for ep in atari_like_episodes(episodes, seed=seed, min_len=30, max_len=120):
        s.reset(ep.frames[0])
        for t in range(ep.length):
            s.step(ep.actions[t], ep.rewards[t], ep.frames[t + 1], ep.terminated and t == ep.length - 1, False,
                   log_prob=np.float32(-t))


@pytest.fixture(scope="module")
def atari_store(tmp_path_factory):
    """84x84 frames, stack 4, 3-step returns, sealed (LZ4-compressed) chunks and the open one, an extra."""
    path = tmp_path_factory.mktemp("feed") / "store"
    with mr.ReplayStore.create(path, capacity=3000, obs_shape=(84, 84), stack=4, n_step=3, chunk_size=256,
                               extras={"log_prob": ((), "float32")}) as s:
        _fill(s, 8, 2)
    return path


@pytest.fixture(scope="module")
def prio_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("feed") / "prio"
    with mr.ReplayStore.create(path, capacity=3000, obs_shape=(84, 84), stack=4, n_step=2, chunk_size=256,
                               extras={"log_prob": ((), "float32")},
                               prioritized=mr.Prioritized(alpha=0.7, beta=0.5)) as s:
        _fill(s, 5, 4)
        ids = np.arange(*s.id_range)[::5]
        s.update_priorities(ids, np.random.default_rng(0).random(ids.size) * 5)
    return path


def assert_batch(tb, want, fields=FIELDS):
    """A TensorBatch / TensorSequenceBatch equals a numpy batch bit for bit, dtypes included."""
    for name in fields:
        t = getattr(tb, name).cpu()
        a = getattr(want, name)
        assert t.numpy().dtype == a.dtype, name
        assert t.shape == a.shape, name
        assert np.array_equal(t.numpy(), a), name
    assert tb.extras.keys() == want.extras.keys()
    for name, a in want.extras.items():
        assert np.array_equal(tb.extras[name].cpu().numpy(), a), name


class LateCopier:
    """A stand-in for ``CudaCopier`` on the CPU whose copies complete ``delay`` seconds after they start
    (``delay=None``: only when waited for, however slow the machine, so the ring must wait to reuse a buffer).

    It copies at once (so the batches are right whatever the ring does) and checks what matters: when a copy
    completes, the host bytes it read are still as they were (nobody refilled the buffer meanwhile), and no
    copy starts out of a buffer whose previous copy is still in flight."""

    pinned = False

    def __init__(self, torch, delay: float) -> None:
        self.torch = torch
        self.device = torch.device("cpu")
        self.delay = delay
        self.lock = threading.Lock()
        self.in_flight: dict[int, dict] = {}  # host buffer address -> its last copy
        self.handles: list[dict] = []
        self.copies = self.overwritten = self.started_early = 0
        self.always_done = False  # a broken copier (the test of the test)

    def copy(self, host):
        dev = host.clone()
        at = float("inf") if self.delay is None else time.monotonic() + self.delay
        h = {"host": host, "bytes": dev.clone(), "at": at, "done": False}
        with self.lock:
            self.copies += 1
            old = self.in_flight.get(host.data_ptr())
            if old is not None and not old["done"]:
                self.started_early += 1
            self.in_flight[host.data_ptr()] = h
            self.handles.append(h)
        return dev, h

    def build(self, fn):
        return fn(), None

    def _finish(self, h) -> None:
        with self.lock:
            if not h["done"]:
                h["done"] = True
                if not self.torch.equal(h["host"], h["bytes"]):
                    self.overwritten += 1

    def done(self, h) -> bool:
        if self.always_done:
            return True  # a lie: the copy is still in flight
        if h["done"] or time.monotonic() >= h["at"]:
            self._finish(h)
            return True
        return False

    def wait(self, h) -> None:
        if self.delay is not None:
            time.sleep(max(0.0, h["at"] - time.monotonic()))
        self._finish(h)

    def consume(self, handle, tensors) -> None:
        return None

    def finish_all(self) -> None:
        for h in list(self.handles):
            self.wait(h)


def _late(mt, torch, delay=0.02):
    copier = LateCopier(torch, delay)
    copier.__class__ = type("LateCopier", (LateCopier, mt.Copier), {})
    return copier


WAYS = ["cpu", "cpu-host-stacks", "ring", "ring-host-stacks"]


def _feed(mt, torch, store, b, way, **kw):
    if way.startswith("ring"):
        return mt.DeviceBatches(store, b, prefetch=kw.pop("prefetch", 2), host_stacks=way.endswith("stacks"),
                                copier=_late(mt, torch), **kw)
    if way == "cpu":  # the stacks gathered from the distinct frames, on CPU tensors
        return mt.device_batches(store, b, "cpu", host_stacks=False, **kw)
    return mt.device_batches(store, b, "cpu", **kw)  # the default on the CPU: batches()' stacks


@pytest.mark.parametrize("way", WAYS)
def test_uniform_batches_are_samples(torch, mt, atari_store, way):
    with mr.ReplayStore.open(atari_store, "r", seed=5) as a, mr.ReplayStore.open(atari_store, "r", seed=5) as b:
        feed = _feed(mt, torch, b, 48, way)
        for _ in range(12):
            tb = next(feed)
            assert isinstance(tb, mt.TensorBatch) and len(tb) == 48
            assert_batch(tb, a.sample(48))
        feed.close()


@pytest.mark.parametrize("way", WAYS)
def test_extras_of_every_width_are_samples(torch, mt, tmp_path, way):
    """Extras of item sizes 1 to 8 and of several shapes, in an order that mixes them, travel with the batch's
    columns (packed end to end, widest items first) and come out as ``sample()``'s, in its order."""
    extras = {"flag": ((), "bool"), "h": ((3,), "float16"), "q": ((), "int8"), "v": ((2, 3), "float64"),
              "c": ((5,), "int32"), "n": ((), "int16")}
    rng = np.random.default_rng(7)
    with mr.ReplayStore.create(tmp_path / "x", capacity=2000, obs_shape=(84, 84), stack=4, n_step=3,
                               chunk_size=256, extras=extras) as s:
        for ep in atari_like_episodes(4, seed=3, min_len=30, max_len=90):
            s.reset(ep.frames[0])
            for t in range(ep.length):
                values = {k: rng.integers(-100, 100, shape).astype(dtype) for k, (shape, dtype) in extras.items()}
                s.step(ep.actions[t], ep.rewards[t], ep.frames[t + 1], ep.terminated and t == ep.length - 1, False,
                       **values)
    with mr.ReplayStore.open(tmp_path / "x", "r", seed=2) as a, mr.ReplayStore.open(tmp_path / "x", "r", seed=2) as b:
        feed = _feed(mt, torch, b, 20, way)
        for _ in range(5):
            tb, want = next(feed), a.sample(20)
            assert_batch(tb, want)
            assert list(tb.extras) == list(want.extras) and set(want.extras) == set(extras)
            for name, (shape, dtype) in extras.items():
                assert tb.extras[name].numpy().dtype == np.dtype(dtype) and tuple(tb.extras[name].shape) == (20, *shape)
        feed.close()


@pytest.mark.parametrize("way", WAYS)
def test_prioritized_batches_are_batches_with_updates(torch, mt, prio_store, way, tmp_path):
    """Priority updates between batches take effect as in ``batches(prefetch=2)``: same draws, same weights."""
    rng = np.random.default_rng(1)
    pa, pb = (shutil.copytree(prio_store, tmp_path / name) for name in "ab")  # two writable copies
    with mr.ReplayStore.open(pa, "r+", seed=9) as a, mr.ReplayStore.open(pb, "r+", seed=9) as b:
        want = a.batches(32, prefetch=2, beta=0.8)
        feed = _feed(mt, torch, b, 32, way, beta=0.8)
        for _ in range(10):
            tb, w = next(feed), next(want)
            assert_batch(tb, w)
            p = rng.random(32) * 3 + 0.1
            a.update_priorities(w.index, p)
            b.update_priorities(tb.index.numpy(), p)
        assert not np.all(w.weight == 1)
        feed.close()
        want.close()


@pytest.mark.parametrize("way", WAYS)
def test_sequences_are_samples(torch, mt, atari_store, way):
    with mr.ReplayStore.open(atari_store, "r", seed=3) as a, mr.ReplayStore.open(atari_store, "r", seed=3) as b:
        feed = _feed(mt, torch, b, 6, way, sequence_length=40)
        for _ in range(6):
            tb = next(feed)
            assert isinstance(tb, mt.TensorSequenceBatch)
            want = a.sample_sequences(6, 40)
            assert_batch(tb, want, SEQ_FIELDS)
        assert not want.mask.all()  # masked steps and zero states were among them
        feed.close()


@pytest.mark.parametrize("way", ["cpu", "ring", "ring-host-stacks"])
def test_commit_and_resume_as_batches(torch, mt, atari_store, tmp_path, way):
    """Draws made but not handed out are recorded at a commit and handed out first after a resume, as
    ``batches()`` does: a feed and a ``batches()`` run through the same commit agree batch for batch."""
    runs = []
    for name in ("batches", way):
        path = shutil.copytree(atari_store, tmp_path / name)
        got = []
        with mr.ReplayStore.open(path, "r+", seed=11) as s:
            it = s.batches(24, prefetch=2) if name == "batches" else _feed(mt, torch, s, 24, way)
            got += [next(it).index.tolist() for _ in range(3)]
            s.commit()
        with mr.ReplayStore.open(path, "r+") as s:
            it = s.batches(24, prefetch=2) if name == "batches" else _feed(mt, torch, s, 24, way)
            got += [next(it).index.tolist() for _ in range(4)]
            it.close()
        runs.append(got)
    assert runs[0] == runs[1]


def _recording_buffer():
    """A ``frame_buffer`` that hands out new arrays filled with 7s (whatever a buffer held must not show), and
    the list of the arrays it handed out."""
    calls = []

    def buffer(shape, dtype):
        calls.append(np.full(shape, 7, dtype))
        return calls[-1]

    return calls, buffer


def test_distinct_frames_are_fewer_and_exact(atari_store):
    """The store-level piece: ``batches(frames="distinct")`` reads each distinct frame once into the
    caller's buffer; the positions rebuild ``sample()``'s stacks, zero padding included."""
    calls, buffer = _recording_buffer()

    with mr.ReplayStore.open(atari_store, "r", seed=1) as a, mr.ReplayStore.open(atari_store, "r", seed=1) as b:
        it = b.batches(64, frames="distinct", frame_buffer=buffer)
        padded = 0
        for _ in range(10):
            fb, want = next(it), a.sample(64)
            assert any(fb.frames is c for c in calls) and fb.obs_index.dtype == np.int32
            assert fb.frames.shape[0] < 2 * 64 * 4 * 0.8
            assert np.array_equal(fb.frames[fb.obs_index], want.obs)
            assert np.array_equal(fb.frames[fb.next_index], want.next_obs)
            padded += int((want.obs == 0).all(axis=(2, 3)).sum())
        assert padded  # zero padding was exercised
        it.close()
        with pytest.raises(ValueError, match="frames"):
            b.batches(4, frames="rows")
        with pytest.raises(TypeError, match="frame_buffer: expected a callable"):
            b.batches(4, frame_buffer=np.zeros(3))


@pytest.mark.parametrize("posted", [True, False])
def test_sequence_states_are_read_into_the_frame_buffer(atari_store, posted):
    """``sequence_batches(frame_buffer=...)`` with stacks: the states are read straight into the caller's
    ``(B, L+1, k, *frame)`` buffer, posted or read when assembled; they are ``sample_sequences()``'s, zero
    states and padding included."""
    calls, buffer = _recording_buffer()

    from tests._support import internals

    with mr.ReplayStore.open(atari_store, "r", seed=8) as a, \
            mr.ReplayStore.open(atari_store, "r", seed=8, read_threads=None if posted else 1) as b:
        gate = internals.posting_always(b) if posted else None
        it = b.sequence_batches(6, 40, frame_buffer=buffer)
        zeros = 0
        for _ in range(6):
            got, want = next(it), a.sample_sequences(6, 40)
            assert any(got.obs is c for c in calls) and got.obs.shape == (6, 41, 4, 84, 84)
            assert np.array_equal(got.obs, want.obs) and np.array_equal(got.mask, want.mask)
            zeros += int((want.obs == 0).all(axis=(2, 3, 4)).sum())
        it.close()
        assert zeros  # zero states were among them
        if posted:
            assert gate.posts >= 4


@pytest.mark.parametrize("posted", [True, False])
def test_stacks_are_read_into_the_frame_buffer(atari_store, posted):
    """``batches(frame_buffer=...)`` with stacks: both stacks are read straight into the caller's
    ``(2, B, k, *frame)`` buffer, posted to the reader's helpers or read when assembled (a store without
    helpers); ``obs`` and ``next_obs`` are its halves and ``sample()``'s, zero padding included."""
    calls, buffer = _recording_buffer()

    from tests._support import internals

    threads = None if posted else 1
    with mr.ReplayStore.open(atari_store, "r", seed=4) as a, \
            mr.ReplayStore.open(atari_store, "r", seed=4, read_threads=threads) as b:
        gate = internals.posting_always(b) if posted else None
        it = b.batches(64, frame_buffer=buffer)
        padded = 0
        for _ in range(10):
            got, want = next(it), a.sample(64)
            both = calls[[c.ctypes.data for c in calls].index(got.obs.ctypes.data)]
            assert both.shape == (2, 64, 4, 84, 84) and both.dtype == np.uint8
            assert got.obs.base is not None and np.shares_memory(got.next_obs, both)
            assert got.next_obs.ctypes.data == both.ctypes.data + got.obs.nbytes
            assert np.array_equal(got.obs, want.obs) and np.array_equal(got.next_obs, want.next_obs)
            assert np.array_equal(got.index, want.index) and np.array_equal(got.reward, want.reward)
            padded += int((want.obs == 0).all(axis=(2, 3)).sum())
        it.close()
        assert padded  # zero padding was exercised
        if posted:
            assert gate.posts >= 8


@pytest.mark.parametrize("sequences", [False, True])
@pytest.mark.parametrize("posted", [True, False])
def test_host_stacks_are_read_into_the_ring(torch, mt, atari_store, posted, sequences):
    """``host_stacks=True`` on a device: each batch's stacks (a batch of sequences' states) are read by the
    reader straight into the ring buffer it is sent from (no second pass on the host), posted or read when
    assembled, and the batches are ``sample()``'s (``sample_sequences()``'s)."""
    from tests._support import internals

    with mr.ReplayStore.open(atari_store, "r", seed=6) as a, \
            mr.ReplayStore.open(atari_store, "r", seed=6, read_threads=None if posted else 1) as b:
        if posted:
            internals.posting_always(b)
        length = 30 if sequences else None
        feed = mt.DeviceBatches(b, 8 if sequences else 32, prefetch=2, host_stacks=True, copier=_late(mt, torch),
                                sequence_length=length)
        sent = internals.record_sent_stacks(feed)
        try:
            for _ in range(8):
                if sequences:
                    assert_batch(next(feed), a.sample_sequences(8, 30), SEQ_FIELDS)
                else:
                    assert_batch(next(feed), a.sample(32))
        finally:
            feed.close()
        kind = "SequenceBatch" if sequences else "Batch"
        assert len(sent) >= 8 and set(sent) == {(kind, True, True)}


def test_buffers_are_not_refilled_while_copied(torch, mt, atari_store):
    """Copies that complete only when waited for: once the prefetch thread has used the ring's 5 buffers it
    has to wait for copies; none is ever refilled in flight, and the batches are still ``sample()``'s."""
    with mr.ReplayStore.open(atari_store, "r", seed=2) as a, mr.ReplayStore.open(atari_store, "r", seed=2) as b:
        copier = _late(mt, torch, delay=None)
        feed = mt.DeviceBatches(b, 32, prefetch=2, copier=copier)
        for _ in range(15):
            time.sleep(0.005)  # a learner's step: the prefetch thread assembles meanwhile
            tb = next(feed)
            assert_batch(tb, a.sample(32))
        feed.close()
        copier.finish_all()
        assert copier.copies >= 15
        assert feed.ring.waits > 0  # takes did wait for copies to complete
        assert copier.overwritten == 0 and copier.started_early == 0
        assert len(feed.ring.slots) == 2 + 3


def test_a_take_asks_about_and_waits_for_the_oldest_copy(mt):
    """The host ring hands out a buffer no copy reads from first; else it asks only whether the oldest copy
    completed (copies on one stream complete in order) and, if not, waits for that one, never for a newer."""

    class InOrder(mt.Copier):  # copies complete one at a time, oldest first, each when waited for or released
        def __init__(self):
            self.done_up_to = -1  # copies 0 .. done_up_to completed
            self.asked, self.waited = [], []

        def done(self, handle):
            self.asked.append(handle)
            return handle <= self.done_up_to

        def wait(self, handle):
            self.waited.append(handle)
            self.done_up_to = max(self.done_up_to, handle)

    copier = InOrder()
    ring = mt.HostRing(copier, 3)
    slots = [ring.take() for _ in range(3)]
    assert copier.asked == [] and all(s.busy for s in slots)  # fresh buffers: nothing to ask
    for handle, slot in zip((0, 1, 2), (slots[2], slots[0], slots[1]), strict=True):  # given back out of list order
        ring.give(slot, handle)
    got = ring.take()  # every copy in flight: ask about the oldest (0) only, wait for it, take its buffer
    assert got is slots[2] and copier.asked == [0, 0] and copier.waited == [0] and ring.waits == 1
    copier.done_up_to = 2  # the others completed meanwhile: the next oldest is taken after one question
    assert ring.take() is slots[0] and copier.asked[-1] == 1 and len(copier.asked) == 3
    ring.give(got, None)  # a buffer given back with no copy (its batch failed) is free at once
    assert ring.take() is got and len(copier.asked) == 3


def test_the_cuda_copier_waits_without_spinning(torch, mt, monkeypatch):
    """Every event ``CudaCopier`` records, the ones its ring may wait on included, is created blocking: CUDA
    busy-waits a CPU core in ``synchronize`` on any other event. Its work is queued on its side stream, and
    the stream and the current device as they were before are current again after (``set_stream`` also
    makes its stream's device current), also when that work fails. The device's index is fixed when it is
    made, and every stream lookup names it (PyTorch looks the current device up again for a device without
    one). (CUDA is stood in for: the copies go to the meta device, the streams and events are recorders.)"""
    made, lookups = [], []
    state = {"device": 3, 3: "learner's stream", 0: "device 0's stream"}

    class Event:
        def __init__(self, **flags):
            self.flags = flags
            self.recorded = None
            made.append(self)

        def record(self, stream):
            self.recorded = stream

    def current_stream(device=None):
        lookups.append(device)
        return state[device]

    def set_stream(stream):  # as PyTorch's: the stream's device becomes the current one
        index = stream[1].index if isinstance(stream, tuple) else (3 if stream == "learner's stream" else 0)
        state["device"] = index
        state[index] = stream

    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["device"])
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: state.__setitem__("device", index))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: ("side stream", device))
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "set_stream", set_stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    copier = mt.CudaCopier(torch.device("cuda"))
    assert copier.device == torch.device("cuda", 3) and copier.stream == ("side stream", copier.device)
    copier.device = torch.device("meta")
    host = torch.zeros(64, dtype=torch.uint8)
    seen = []
    copier.copy(host)
    copier.build(lambda: seen.append(state[3]))
    copier.send(host, lambda dev: seen.append(state[3]))
    assert seen == [copier.stream] * 2 and state[3] == "learner's stream" and state["device"] == 3
    with pytest.raises(RuntimeError, match="a failed gather"):
        copier.send(host, lambda dev: (_ for _ in ()).throw(RuntimeError("a failed gather")))
    assert state[3] == "learner's stream" and state["device"] == 3
    state["device"] = 0  # the learner works on another device: it stays current, with its stream
    copier.send(host, lambda dev: seen.append((state[3], state["device"])))
    assert seen[-1] == (copier.stream, 3) and state == {"device": 0, 3: "learner's stream", 0: "device 0's stream"}
    assert len(made) == 4
    assert all(e.flags.get("blocking") is True and e.recorded == copier.stream for e in made)
    assert lookups and all(d == 3 and type(d) is int for d in lookups)
    with pytest.raises(ValueError, match="expected a CUDA device, got cpu"):
        mt.CudaCopier(torch.device("cpu"))


def test_a_frame_buffer_whose_batch_fails_goes_back_to_the_ring(torch, mt, atari_store):
    """A distinct-frame buffer lent to a batch that is never sent (its read failed: the array is dropped) is
    free again at once; one that is sent stays held until its copy completes. A buffer of two stacks stays
    held while either stack (a view of it, as a batch holds them) lives."""
    with mr.ReplayStore.open(atari_store, "r", seed=2) as b:
        copier = _late(mt, torch, delay=0.05)
        feed = mt.DeviceBatches(b, 32, prefetch=2, copier=copier)
        from tests._support import internals

        try:
            lent = internals.lend_frame_buffer(feed, (10, 84, 84), np.dtype(np.uint8))
            busy = [s for s in feed.ring.slots if s.busy]
            assert len(busy) == 1 and internals.frame_buffers_lent(feed) == 1
            del lent
            assert not busy[0].busy and internals.frame_buffers_lent(feed) == 0  # given back: the array died unsent
            both = internals.lend_frame_buffer(feed, (2, 32, 4, 84, 84), np.dtype(np.uint8))
            obs, next_obs = both[0], both[1]
            del both
            assert busy[0].busy and internals.frame_buffers_lent(feed) == 1  # its stacks hold it
            del obs
            assert busy[0].busy
            del next_obs
            assert not busy[0].busy and internals.frame_buffers_lent(feed) == 0
            for _ in range(5):
                next(feed)
            assert len(feed.ring.slots) == 2 + 3
        finally:
            feed.close()
            copier.finish_all()


@pytest.mark.parametrize("host_stacks", [False, True])
def test_failed_batches_give_their_buffers_back_without_a_collection(torch, mt, tmp_path, host_stacks):
    """Batches that fail after their ring buffer was lent (a damaged frame: the read raises) give it back
    once the error is dropped, with the garbage collector off: nothing keeps the failed batch in a cycle,
    so the ring never grows, and every buffer is free after ``close()``."""
    import gc

    from tests._support.crew import damaged_store

    damaged_store(str(tmp_path / "s"))
    b = mr.ReplayStore.open(tmp_path / "s", "r", seed=3)
    copier = _late(mt, torch, delay=0.001)
    feed = mt.DeviceBatches(b, 32, prefetch=2, host_stacks=host_stacks, copier=copier)
    failed = served = 0
    gc.disable()
    try:
        for _ in range(40):
            try:
                next(feed)
                served += 1
            except mr.CorruptStoreError:
                failed += 1
            assert len(feed.ring.slots) == 2 + 3
        feed.close()
        copier.finish_all()
        assert failed > 0 and served > 0
        assert not any(slot.busy for slot in feed.ring.slots)
        assert copier.overwritten == 0 and copier.started_early == 0
    finally:
        gc.enable()
        b.close()


def test_a_buffer_dropped_while_the_ring_is_locked_comes_back_later(torch, mt, atari_store):
    """A lent array can die at any allocation (a garbage collection), also inside the ring's ``take`` while
    it holds its lock (asking the copier whether a copy completed): its buffer comes back at the next take
    or give, rather than by taking the lock again, which would hang the feed."""
    from tests._support import internals

    b = mr.ReplayStore.open(atari_store, "r", seed=2)
    copier = _late(mt, torch, delay=None)
    feed = mt.DeviceBatches(b, 32, prefetch=2, copier=copier)
    held = [internals.lend_frame_buffer(feed, (10, 84, 84), np.dtype(np.uint8))]
    done, dropped_inside = copier.done, []

    def dropping_done(h):  # (called by take() with the ring's lock held)
        if held:
            held.clear()  # the lent array's last reference: its weak reference's callback runs here
            dropped_inside.append(True)
        return done(h)

    copier.done = dropping_done
    thread = threading.Thread(target=lambda: [next(feed) for _ in range(12)], daemon=True)
    thread.start()
    thread.join(120)  # (a hang detector)
    assert not thread.is_alive(), "the feed hung: a buffer given back inside take() took the ring's lock again"
    assert dropped_inside == [True]
    feed.close()
    copier.finish_all()
    assert len(feed.ring.slots) == 2 + 3 and not any(slot.busy for slot in feed.ring.slots)
    assert internals.frame_buffers_lent(feed) == 0
    b.close()


def test_the_check_catches_a_ring_that_does_not_wait(torch, mt, atari_store):
    """The test above can fail: a copier that claims completion at once lets the ring refill buffers whose
    (late) copies are still in flight, and the checks see it."""
    with mr.ReplayStore.open(atari_store, "r", seed=2) as b:
        copier = _late(mt, torch, delay=None)
        copier.always_done = True
        feed = mt.DeviceBatches(b, 32, prefetch=1, copier=copier)
        for _ in range(6):
            next(feed)
        feed.close()
        copier.always_done = False
        copier.finish_all()
        assert copier.started_early > 0 and copier.overwritten > 0


def test_device_feed_for_sample_calls(torch, mt, atari_store):
    """``DeviceFeed.next(batch_size)``: a ``sample(batch_size)`` on the device (what the SB3 drop-in calls)."""
    with mr.ReplayStore.open(atari_store, "r", seed=4) as a, mr.ReplayStore.open(atari_store, "r", seed=4) as b:
        feed = mt.DeviceFeed(b, "cpu")
        for size in (16, 16, 16):
            assert_batch(feed.next(size), a.sample(size))
        feed.close()


@pytest.mark.parametrize("sequence_length", [None, 12])
def test_dataset_device_option(torch, mt, atari_store, sequence_length):
    """``ReplayDataset(device=...)`` / ``replay_loader`` yield the feed's batches: ``sample()``'s rows."""
    loader = mt.replay_loader(atari_store, 16, seed=7, num_batches=4, device="cpu", as_dict=False,
                              sequence_length=sequence_length)
    got = list(loader)
    assert len(got) == 4
    with mr.ReplayStore.open(atari_store, "r", seed=7) as a:
        for tb in got:
            if sequence_length is None:
                assert_batch(tb, a.sample(16))
            else:
                assert_batch(tb, a.sample_sequences(16, sequence_length), SEQ_FIELDS)
    d = next(iter(mt.ReplayDataset(atari_store, 4, device="cpu", num_batches=1)))
    assert isinstance(d, dict) and d["obs"].shape == (4, 4, 84, 84) and "extras" in d
    with pytest.raises(ValueError, match="num_workers=0"):
        list(mt.replay_loader(atari_store, 4, num_workers=1, device="cpu", num_batches=1))


def test_pin_memory_on_cpu(torch, mt, atari_store, accelerator):
    with mr.ReplayStore.open(atari_store, "r", seed=4) as b:
        if accelerator:
            feed = mt.device_batches(b, 8, "cpu", pin_memory=True)
            assert next(feed).obs.is_pinned()
        else:
            with pytest.warns(UserWarning, match="no accelerator"):
                feed = mt.device_batches(b, 8, "cpu", pin_memory=True)
            assert next(feed).obs.dtype == torch.uint8
        feed.close()
        with pytest.raises(ValueError, match="device"):
            mt.device_batches(b, 8, "meta")


@pytest.fixture
def cuda(torch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none here): the CPU tests above run the same path with a stand-in copier")
    return torch.device("cuda")


@pytest.mark.parametrize("host_stacks", [False, True])
def test_cuda_batches_are_samples(torch, mt, atari_store, prio_store, cuda, host_stacks):
    for path in (atari_store, prio_store):
        with mr.ReplayStore.open(path, "r", seed=5) as a, mr.ReplayStore.open(path, "r", seed=5) as b:
            feed = mt.device_batches(b, 64, cuda, host_stacks=host_stacks)
            for _ in range(20):
                tb = next(feed)
                assert tb.obs.device.type == "cuda" and tb.index.device.type == "cuda"
                assert_batch(tb, a.sample(64))
            assert feed.ring.slots[0].host is not None and feed.ring.slots[0].host.is_pinned()
            feed.close()


def test_cuda_sequences_are_samples(torch, mt, atari_store, cuda):
    with mr.ReplayStore.open(atari_store, "r", seed=3) as a, mr.ReplayStore.open(atari_store, "r", seed=3) as b:
        feed = mt.device_batches(b, 6, cuda, sequence_length=40)
        for _ in range(5):
            assert_batch(next(feed), a.sample_sequences(6, 40), SEQ_FIELDS)
        feed.close()


def test_cuda_slow_consumer_on_a_busy_stream(torch, mt, atari_store, cuda):
    """The consumer's stream is kept busy (a long matmul chain) while batches arrive: the events order them."""
    x = torch.randn(2048, 2048, device=cuda)
    with mr.ReplayStore.open(atari_store, "r", seed=6) as a, mr.ReplayStore.open(atari_store, "r", seed=6) as b:
        feed = mt.device_batches(b, 128, cuda, prefetch=1)
        for _ in range(10):
            for _ in range(20):
                x = torch.tanh(x @ x)
            tb = next(feed)
            assert_batch(tb, a.sample(128))
        feed.close()


def test_reader_gather_into_a_callers_array():
    """``FrameReader.gather(slots, out=)`` reads into the caller's array (and returns it); a wrong shape, dtype
    or layout is refused before anything is read."""
    from mmreplay.reading.reader import FrameReader

    frames = np.random.default_rng(0).integers(0, 255, (50, 6, 5), dtype=np.uint8)
    reader = FrameReader(frames, threads=2)
    slots = np.array([[3, 7], [49, 0], [7, 7]])
    out = np.full((3, 2, 6, 5), 9, np.uint8)
    assert reader.gather(slots, out=out) is out
    assert np.array_equal(out, frames[slots])
    for bad in (np.empty((3, 2, 6, 4), np.uint8), np.empty((3, 2, 6, 5), np.int16),
                np.empty((3, 2, 5, 6), np.uint8).transpose(0, 1, 3, 2)):
        with pytest.raises(ValueError, match="out: expected"):
            reader.gather(slots, out=bad)
    reader.close()


@pytest.mark.parametrize("way", WAYS)
def test_a_slow_learner_s_batches_stay_as_handed_out(torch, mt, atari_store, way):
    """A learner that keeps its last three batches and steps between them (so the next batches' frames are
    read by helper threads or the prefetch thread meanwhile, and output buffers are recycled): no batch it
    still holds is overwritten, and every batch is ``sample()``'s."""
    with mr.ReplayStore.open(atari_store, "r", seed=9, read_threads=2) as a, \
            mr.ReplayStore.open(atari_store, "r", seed=9) as b:
        from tests._support import internals

        gate = internals.posting_always(a)
        feed = _feed(mt, torch, a, 40, way)
        held: list[tuple[object, dict[str, np.ndarray]]] = []
        for i in range(40):
            tb = next(feed)
            want = b.sample(40)
            assert_batch(tb, want)
            held.append((tb, {name: getattr(want, name) for name in ("obs", "next_obs", "index")}))
            if len(held) > 3:
                old, arrays = held.pop(0)
                for name, a_ in arrays.items():  # still what it was when handed out, 3 batches later
                    assert np.array_equal(getattr(old, name).numpy(), a_), (i, name)
            time.sleep(0.004 if i % 4 else 0.0)  # the learner's step (a tight loop now and then)
        feed.close()
        from mmreplay.reading.readpolicy import usable_cpus

        if way in ("cpu-host-stacks", "ring") and usable_cpus() > 1:
            assert gate.posts >= 20  # the helpers read the batches (or distinct frames) of a learner away
