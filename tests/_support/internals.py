"""The one place where tests reach inside a store (or the SB3 buffer around one).

Tests of the public API use the public API; the few that need a hook into a store's parts take it from
here, so that every private name they depend on is in this file (``tests/test_tests_layout.py`` refuses a
private read anywhere else under ``tests/store/`` and ``tests/integrations/``). The hooks are of three
kinds: a part of a live store, to run or check that part on the store's own data (``log``, ``reader``,
``sampler``, ``discounts``, ``lock``); a fault or a slowdown injected where no public call can cause it
(``hold_seals``, ``read_without_numba``); and the SB3 buffer's conversions, to compare its device path with
its host path on the same rows.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import mmreplay as mr

# -- parts of a live store ---------------------------------------------------------------------------


def log(store: mr.ReplayStore) -> Any:
    """The store's ``ChunkLog`` (``.ring``: the mapped chunks; ``.index``: the ``Index``)."""
    return store._parts.log


def reader(store: mr.ReplayStore) -> Any:
    """The store's ``FrameReader``."""
    return store._reader


def lend_frame_buffer(feed: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A ``DeviceBatches``' ring buffer lent as a batch's frame buffer (what ``batches(frame_buffer=...)`` calls)."""
    return feed._frame_buffer(shape, dtype)


def frame_buffers_lent(feed: Any) -> int:
    """How many of a ``DeviceBatches``' ring buffers are lent to batches not yet sent."""
    return len(feed._lent)


def record_sent_stacks(feed: Any) -> list[tuple[str, bool, bool]]:
    """From now on, for each batch a ``DeviceBatches`` sends: the type of the store's batch, whether it is
    sent as read in place (its stacks already in the ring buffer it is sent from), and whether its ``obs``
    (a ``Batch``'s or a ``SequenceBatch``'s) lies in that buffer."""
    seen: list[tuple[str, bool, bool]] = []
    send = feed._send

    def recorded(batch: Any, slot: Any, in_place: bool = False) -> Any:
        obs = getattr(batch, "obs", None)  # (distinct-frame batches have none)
        seen.append((type(batch).__name__, in_place, obs is not None and np.shares_memory(obs, slot.array)))
        return send(batch, slot, in_place)

    feed._send = recorded
    return seen


def posting_always(store: mr.ReplayStore) -> Any:
    """Have the store's reader post every batch it may (any size; joins slowed by other work on a busy
    machine do not rest posting; page faults under memory pressure do not turn it to reading ahead, which
    does not post); returns its ``PostGate`` (``.posts``: reads posted so far)."""
    r = store._reader
    r.MIN_SHARED_BYTES = 0
    r._gate.SLOWER = 1e9
    r.read_ahead = False
    return r._gate


def record_batch_copies(store: mr.ReplayStore) -> list[str]:
    """From now on, who copies each of the store's prefetched batches: "posted" (joined from the reader's
    helper threads) or the copying thread's name."""
    copied_by: list[str] = []
    assemble = store._assemble_draw

    def recorded(d: Any, posted: Any = None, then: Any = None) -> Any:
        copied_by.append("posted" if posted is not None else threading.current_thread().name)
        return assemble(d, posted, then)

    store._assemble_draw = recorded  # type: ignore[method-assign]
    return copied_by


def sampler(store: mr.ReplayStore) -> Any:
    """The store's sampler (``sampling/``)."""
    return store._parts.sampler


def discounts(store: mr.ReplayStore) -> np.ndarray:
    """The store's table of ``gamma ** k`` the batch plan uses for n-step returns."""
    return store._discounts


def lock(store: mr.ReplayStore) -> Any:
    """The re-entrant lock every public call of the store takes (held: the store's calls wait)."""
    return store._lock


def read_ahead(store: mr.ReplayStore) -> tuple[int, bool]:
    """The reader's cold-read state: batches left before the next plain probe (> 0: cold batches request
    their ranges first), and whether a whole compressed store's read-ahead was started."""
    r = store._reader
    return r._cold_batches, r._store_read_ahead_started


def replace_lock(store: mr.ReplayStore, lock: Any) -> None:
    """Put ``lock`` (a stand-in that watches its takers) in place of the store's own lock."""
    store._lock = lock


def in_before_fork(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside the store's at-fork ``before`` hook (taking the locks a fork takes)."""
    import sys

    from mmreplay import store as store_module

    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code is store_module._before_fork.__code__:
            return True
        frame = frame.f_back
    return False


# -- faults and slowdowns ----------------------------------------------------------------------------


def read_without_numba(store: mr.ReplayStore) -> None:
    """From now on the store's reader decodes compressed frames as it does when numba cannot be imported
    (numcodecs, frame by frame)."""
    store._reader._native = None


def hold_seals(gate: threading.Event) -> None:
    """Every chunk seal of this process (the log's background thread) waits for ``gate`` (up to 60 s) before
    it starts. For a process of its own: it is not undone."""
    from mmreplay.core.log import ChunkLog

    real_seal = ChunkLog._seal

    def slow_seal(self: Any, seq: int, *rest: Any) -> Any:
        gate.wait(60)
        return real_seal(self, seq, *rest)

    ChunkLog._seal = slow_seal  # type: ignore[method-assign]


def killed_in_sampled_change() -> None:
    """From now on this process dies (SIGKILL) when it changes the rate limit's sampled counts, after storing
    the new counts and before their check (what a process killed there leaves in ``ratelimit.npy``)."""
    import os
    import signal
    import sys

    from mmreplay.core import ratelimit

    check = ratelimit._check

    def killed(total: int, base: int) -> int:
        if sys._getframe(1).f_code.co_name == "_set_sampled":
            os.kill(os.getpid(), signal.SIGKILL)
        return check(total, base)

    ratelimit._check = killed  # type: ignore[assignment]


# -- the SB3 buffer ----------------------------------------------------------------------------------


def sb3_samples(buf: Any, batch: mr.Batch) -> Any:
    """``batch`` (from ``buf.store``) as the ``ReplayBufferSamples`` the buffer's host ``sample()`` makes."""
    return buf._to_samples(batch)


def sb3_device_feed(buf: Any) -> Any:
    """The buffer's device feed (what its ``sample()`` draws from on an accelerator)."""
    return buf._device_feed()


def sb3_device_samples(buf: Any, batch: Any) -> Any:
    """A device feed's ``batch`` as the ``ReplayBufferSamples`` the buffer's device ``sample()`` makes."""
    return buf._device_samples(batch)


def sb3_drop_feed(buf: Any) -> None:
    """Stop and forget the buffer's device feed."""
    buf._handle.drop_feed()


def sb3_pending_counts(buf: Any) -> list[int]:
    """Per env, the adds waiting in the buffer's block, not yet written to the store."""
    return buf._handle.pending.count


def sb3_block_rows(monkeypatch: Any, rows: int) -> None:
    """The buffer writes an env's adds to the store in blocks of ``rows`` (for the test's duration)."""
    from mmreplay import sb3

    monkeypatch.setattr(sb3._Pending, "BLOCK_ROWS", rows)


def sb3_short_adds(monkeypatch: Any, buf: Any, enabled: bool, taken: list[bool]) -> None:
    """Whether ``buf.add`` may take its short path for one env (``ReplayBuffer._add_step``); each time it is
    asked, ``taken`` gets whether it took the add."""
    buf._fast = enabled
    step = buf._add_step
    monkeypatch.setattr(buf, "_add_step", lambda *a: taken.append(step(*a)) or taken[-1])


def sb3_last_next_obs(buf: Any) -> list[bytes | None]:
    """Per env, the last ``next_obs`` the buffer was given (what the next ``obs`` must continue)."""
    return list(buf._handle.pending.last)


def sb3_collect_when_registering(monkeypatch: Any) -> list[int]:
    """The next buffer that registers its store runs a garbage collection first, inside its registration
    (holding the lock a buffer's finalizer takes to close it); the list gets what that collection found."""
    import gc

    from mmreplay import sb3

    found: list[int] = []

    class Collecting(dict):  # type: ignore[type-arg]
        def __setitem__(self, key: Any, value: Any) -> None:
            if not found:
                found.append(gc.collect())
            super().__setitem__(key, value)

    monkeypatch.setattr(sb3, "_OPEN", Collecting(sb3._OPEN))
    return found


def sb3_function(name: str) -> Any:
    """The function ``name`` of ``mmreplay.sb3`` (``"_Pending.flush_env"``), to interrupt at one of its lines."""
    from mmreplay import sb3

    found: Any = sb3
    for part in name.split("."):
        found = getattr(found, part)
    return found


def release_in_prefetch_thread(store: mr.ReplayStore) -> None:
    """Run what a store dropped unclosed runs when it is collected (its finalizer) in the store's own prefetch
    thread, as a garbage collection that starts there does; raises what it raised."""
    store._draw_state._executor().submit(store._release).result()
