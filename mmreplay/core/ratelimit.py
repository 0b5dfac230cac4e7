"""Samples-per-insert rate limiting, shared live between the writer and every reader process of a store.

The counts live in ``<store>/ratelimit.npy`` (FORMAT.md, "Rate limit"): a plain ``.npy`` file of
eight little-endian int64 that every process of the store maps:

    0 inserted        transitions stored since the store began (or its last clear())   writer only
    1 sampled_total   rows ever handed out, by any process; only grows                 samplers, under a lock
    2 sampled_base    sampled = sampled_total - sampled_base                            writer, under the lock
    3 size            the writer's len(store), published as it changes                  writer only
    4 writer_pid      the process that has the store open for writing (0: none)         writer only
    5 check           sampled_total ^ sampled_base ^ CHECK_KEY                          with them, under the lock
    6 previous_total  sampled_total before its last change (see _set_sampled)         with them, under the lock
    7 tag             CHECK_TAG: slot 5 is kept (files of older versions hold 0 there);  the lock holder
                      CHANGING_TAG while the writer changes slots 1-2 (see _set_sampled)

Damage: whoever holds the lock checks slot 5 before using the sampled counts, and the writer compares
``inserted`` and ``size`` with its own, so a flipped bit is refused (``CorruptStoreError``) or repaired
by the writer, never counted or committed. A file deleted or replaced while processes have it open would
split the counts (each would count in its own file): every lock holder checks that the file it has open is
still the one at the path (``st_nlink`` > 0) and refuses otherwise. A process stopped while it holds the
lock (SIGSTOP, a debugger) makes the others wait at most ``RateLimit.timeout`` (at least ``LOCK_WAIT_MIN``)
for it, then ``RateLimitTimeout`` says so; with ``timeout=None`` they wait as long as it takes.

Why the writer's ``step()`` needs no lock: samplers check, draw and count under an exclusive ``flock``
on the file, so their checks and counts are atomic among themselves; ``inserted`` only grows (except
when the writer resets it under that lock), and ``sampled_total`` only grows. A sampler's check that
passed against the ``inserted`` it read still holds for any newer value, and the writer's check that
passed against the ``sampled`` it read holds for any newer one. So both rules hold at every moment:

    sampled <= samples_per_insert * inserted + error_buffer
    samples_per_insert * inserted <= sampled + error_buffer + samples_per_insert * min_size

and the writer's hot path is a comparison against a bound it recomputes only when it reaches it.

Every store object that is not the writer holds a shared ``flock`` on ``<store>/ratelimit.readers``
for its lifetime (the kernel drops it when a process dies), so the writer can tell whether anyone
else could sample: a writer that both samples and steps raises at once instead of waiting on itself.

Crashes: a reader's counted rows stay counted; its locks go with it. A writer that reopens takes
``inserted`` from the last commit (newer transitions were lost with the crash) and keeps every row
sampled since that commit (``sampled = committed sampled + sampled_total - committed sampled_total``).
"""

from __future__ import annotations

import errno
import fcntl
import math
import mmap
import os
import time
import weakref
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import numpy as np

from ..errors import CorruptStoreError, RateLimitTimeout, ReadOnlyStoreError, StoreClosedError
from ..native import busguard
from ..native.busguard import COUNT, counter
from ..options import RateLimit, Schema, floor_ratio
from ..storage.files import create_exclusive, open_regular
from .snapshot import SNAPSHOT_KEY

__all__ = ["RateLimiter", "StoreLimit", "store_limiter", "COUNTERS", "READERS", "initial_files"]

COUNTERS = "ratelimit.npy"
READERS = "ratelimit.readers"
SLOTS = 8
INSERTED, SAMPLED_TOTAL, SAMPLED_BASE, SIZE, WRITER_PID, CHECK, PREVIOUS_TOTAL, TAG = range(8)
CHECK_KEY = 0x6D6D72706C617931  # "mmrplay1": a check of all zeros is never right
CHECK_TAG = 0x434B  # "CK"
CHANGING_TAG = 0x4348  # "CH"
LOCK_WAIT_MIN = 1.0  # seconds: a lock is held for one draw; waiting longer means its holder is stopped
MAX_COUNT = 2**62
_RESTORE = ("close every process that has the store open, delete the file, and reopen the store: it is"
            " recreated from the last commit (deleting it while processes run would split their counts)")
POLL_MIN, POLL_MAX = 1e-4, 1e-3  # seconds between checks while a call waits (doubling)
T = TypeVar("T")


def _entry_counts(entry: dict[str, Any] | None) -> tuple[int, int, int, int]:
    """(inserted, sampled, sampled_total, size) of a manifest's ``rate_limit`` entry (zeros if none)."""
    if not entry:
        return 0, 0, 0, 0
    try:
        return int(entry["inserted"]), int(entry["sampled"]), int(entry["sampled_total"]), int(entry["size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptStoreError(f"manifest.json: malformed rate_limit entry {entry!r} ({exc})") from None


def _write_counters(path: str, entry: dict[str, Any] | None) -> None:
    """Create the counters file from a commit's entry, unless another process made it first."""
    inserted, sampled, total, size = _entry_counts(entry)
    values = np.zeros(SLOTS, "<i8")
    values[[INSERTED, SAMPLED_TOTAL, SAMPLED_BASE, SIZE]] = inserted, total, total - sampled, size
    values[CHECK], values[TAG] = _check(total, total - sampled), CHECK_TAG
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(create_exclusive(tmp), "wb") as f:  # never through a link planted at the temp name
        np.lib.format.write_array(f, values, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # atomic "create if absent": a concurrent opener's file wins
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _check(total: int, base: int) -> int:
    """Slot ``CHECK``'s value for these sampled counts (as a signed int64)."""
    v = (int(total) ^ int(base) ^ CHECK_KEY) & (2**64 - 1)
    return v - 2**64 if v >= 2**63 else v


def initial_files(root: str) -> None:
    """Write the files of a new rate-limited store (all counts zero)."""
    _write_counters(os.path.join(root, COUNTERS), None)
    os.close(open_regular(os.path.join(root, READERS), os.O_RDONLY | os.O_CREAT, "rate-limit readers file"))


class RateLimiter:
    """The limiter of one open store object (writer or reader); see the module docstring."""

    def __init__(self, root: str, options: RateLimit, entry: dict[str, Any] | None, writer: bool,
                 pending_lag: int, refresh_every: int) -> None:
        self.root = root
        self.options = options
        self.writer = writer
        self.sampled_here = False  # this (writing) store handed out rows: it both writes and samples
        self._spi, self._min, self._eb = options.samples_per_insert, options.min_size, options.error_buffer
        self._lag = pending_lag  # transitions whose n-step window may still be open at the write head
        self._refresh = refresh_every
        self._fd = -1
        self._readers_fd = -1
        self._mm: mmap.mmap | None = None
        self._need = 0
        # the SIGBUS guard (``native/busguard.py``): the mapping's slot and span, the fault count as of the
        # last look, and what to raise once a use of the mapping faulted (the file was truncated)
        self._guard_slot, self._span = -1, (0, 0)
        self._faults_seen = busguard.count()
        self._damage = ""
        self._c: memoryview | None = None
        self._wc = memoryview(bytearray(8 * SLOTS)).cast("q")  # the writer's view of the counters (hot path)
        self._problem = ""  # why counting is impossible here (a read-only directory), if it is
        self._closed = False
        self._ins = 0  # writer: inserted, as published
        self._allowed = -1  # writer: the largest inserted the last sampled count it read allows
        self._size_due = 0  # writer: inserted count at which the published size is refreshed
        self._size = -1  # writer: the size last published
        self._room = 2 * self._eb + self._spi * self._min  # the most rows ever available at once
        self._map(entry)
        try:
            if writer:
                self._wc = self._counters()
                self._adopt(entry)
            else:
                self._join_readers()
        except BaseException:
            self.close()  # (a refused open leaves no descriptor or mapping behind)
            raise
        _LIMITERS.add(self)

    # -- files -----------------------------------------------------------------------------------------
    def _map(self, entry: dict[str, Any] | None) -> None:
        path = os.path.join(self.root, COUNTERS)
        try:
            try:
                fd = open_regular(path, os.O_RDWR, "rate-limit counters")
            except FileNotFoundError:
                _write_counters(path, entry)
                fd = open_regular(path, os.O_RDWR, "rate-limit counters")
        except OSError as exc:
            if self.writer or exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise
            self._problem = (f"{path} cannot be opened for writing ({exc.strerror}), so this reader cannot count"
                             " the rows it samples; open the store where that file is writable")
            return
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(f)
                offset = f.tell()
            if shape != (SLOTS,) or fortran or dtype != np.dtype("<i8") or offset % 8:
                raise ValueError(f"holds {dtype}{list(shape)}, expected int64[{SLOTS}]")
            mm = mmap.mmap(fd, offset + 8 * SLOTS)
        except (ValueError, OSError) as exc:
            os.close(fd)
            raise CorruptStoreError(f"{path}: unreadable rate-limit counters ({exc}), expected a .npy file of"
                                    f" int64[{SLOTS}]; {_RESTORE}") from None
        self._fd, self._mm = fd, mm
        base = np.frombuffer(mm, np.uint8).ctypes.data  # (the view is dropped at once: close() can unmap)
        self._span = (base, base + len(mm))
        self._guard_slot = busguard.register(base, len(mm), True)
        self._c = memoryview(mm)[offset:offset + 8 * SLOTS].cast("q")
        self._need = offset + 8 * SLOTS  # the file's size the mapping needs
        try:
            self._check_file(os.fstat(fd))
        except CorruptStoreError:
            self.close()
            raise

    def _join_readers(self) -> None:
        """Hold a shared lock on the readers file while open: the writer sees someone could sample."""
        path = os.path.join(self.root, READERS)
        for flags in (os.O_RDONLY | os.O_CREAT, os.O_RDONLY):
            try:
                fd = open_regular(path, flags, "rate-limit readers file")  # a planted link: refused
                break
            except OSError:
                continue
        else:
            return  # a read-only directory without the file: this reader goes unseen, nothing more
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._readers_fd = fd

    def _readers_present(self) -> bool:
        """Whether any store object other than the writer has the store open (it could sample)."""
        try:
            fd = open_regular(os.path.join(self.root, READERS), os.O_RDONLY | os.O_CREAT, "rate-limit readers file")
        except (OSError, CorruptStoreError):
            return True  # cannot tell: assume someone could, and wait
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # also releases the probe's lock
        return False

    def _lock(self, what: str = "counting") -> memoryview:
        """Take the counters' lock (waiting as ``_take_lock`` says) and check the counts; their view."""
        c = self._counters()
        self._take_lock(what)
        try:
            self._check_counts(c)
        except BaseException:
            self._unlock()
            raise
        return c

    def _take_lock(self, what: str) -> None:
        """The exclusive ``flock``; waits at most ``timeout`` (at least ``LOCK_WAIT_MIN``) for a holder that
        does not let go (a process stopped while sampling), then ``RateLimitTimeout``. While the sampled
        count moves, the lock is busy, not held by a stopped process: the wait goes on."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        timeout = self.options.timeout
        limit = None if timeout is None else max(timeout, LOCK_WAIT_MIN)
        start, delay = time.monotonic(), POLL_MIN
        seen = self._counters()[SAMPLED_TOTAL]
        while True:
            time.sleep(delay)
            delay = min(2 * delay, POLL_MAX * 10)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                now = self._counters()[SAMPLED_TOTAL]
                if now != seen:  # other samplers get the lock: it is contended, not stuck
                    seen, start = now, time.monotonic()
                waited = time.monotonic() - start
                if limit is not None and waited >= limit:
                    path = os.path.join(self.root, COUNTERS)
                    raise RateLimitTimeout(
                        f"{what}: waited {waited:.1f} s for the lock of {path}, which another process holds (one"
                        " stopped while sampling: SIGSTOP, a debugger, a frozen container; `fuser` names it);"
                        " nothing was counted or changed. Resume or end that process, or raise"
                        " RateLimit(timeout=...)") from None

    def _unlock(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _check_counts(self, c: memoryview) -> None:
        """Under the lock: the file is still the store's (not deleted or replaced) and its sampled counts
        pass their check; for the writer also ``inserted`` and ``size`` are its own (repaired if not)."""
        path = os.path.join(self.root, COUNTERS)
        self._check_file(os.fstat(self._fd))
        total, base = c[SAMPLED_TOTAL], c[SAMPLED_BASE]
        if c[TAG] == CHECK_TAG and c[CHECK] != _check(total, base) and c[CHECK] == _check(c[PREVIOUS_TOTAL], base):
            # a sampler killed between its stores of the new total and of its check: undone (see _set_sampled)
            c[SAMPLED_TOTAL] = total = c[PREVIOUS_TOTAL]
        bad = ""
        if c[TAG] == CHECK_TAG and c[CHECK] != _check(total, base):
            bad = "their check (slot 5) does not match"
        elif not 0 <= base <= total <= MAX_COUNT:
            bad = f"expected 0 <= sampled_base <= sampled_total <= {MAX_COUNT:,}"
        elif not 0 <= c[INSERTED] <= MAX_COUNT or not 0 <= c[SIZE] <= MAX_COUNT:
            bad = "inserted or size is out of range"
        if bad and not (self.writer and bad.startswith("inserted")):
            raise CorruptStoreError(
                f"{path}: damaged rate-limit counters (sampled_total {total:,}, sampled_base {base:,}, inserted"
                f" {c[INSERTED]:,}, size {c[SIZE]:,}): {bad}; nothing was counted or committed. {_RESTORE[0].upper()}"
                f"{_RESTORE[1:]}")
        if self.writer and self._c is not None and self._wc is c:
            if c[INSERTED] != self._ins:
                c[INSERTED] = self._ins  # the writer's own counts: it knows them
            if self._size >= 0 and c[SIZE] != self._size:
                c[SIZE] = self._size
        # a file of an older version, or the writer killed changing the counts (CHANGING_TAG, see _set_sampled:
        # they are taken as they are when in range, and a writer that opens the store sets them from its last
        # commit): keep the check from now on
        if c[TAG] != CHECK_TAG:
            c[CHECK], c[TAG] = _check(total, base), CHECK_TAG

    @staticmethod
    def _set_sampled(c: memoryview, total: int, base: int, writer: bool = False) -> None:
        """Change the sampled counts (under the lock), with their check. A sampler changes the total only: the
        total before goes first to its own slot, so a sampler killed before the new check is stored leaves
        counts that the check matches with that total, and the next lock holder puts it back
        (``_check_counts``), where any other mismatch is damage. The writer (``writer``) also moves the base:
        the tag says so first (``CHANGING_TAG``), so that one killed half-way leaves counts the next lock
        holder takes as they are, not damage; its stores keep ``base <= total`` at every step (the total goes
        first and never decreases)."""
        c[PREVIOUS_TOTAL] = c[SAMPLED_TOTAL]
        if writer:
            c[TAG] = CHANGING_TAG
        c[SAMPLED_TOTAL], c[SAMPLED_BASE] = total, base
        c[CHECK] = _check(total, base)
        if writer:
            c[TAG] = CHECK_TAG

    def _counters(self) -> memoryview:
        """The mapped counts, after checking the file still holds them (see ``_check_file``)."""
        if self._c is None:
            self._unusable()
        self._check_file(os.fstat(self._fd))
        return self._c

    def _unusable(self) -> NoReturn:
        if self._closed:  # (by another thread, while this one waited for the limit)
            raise StoreClosedError(f"the store {self.root} was closed (by another thread)")
        raise ReadOnlyStoreError(self._problem)

    def _check_file(self, st: os.stat_result) -> None:
        """The counters file is still the store's (not deleted or replaced: counting on would split the
        counts) and still holds the mapped counts (truncated by another process, reading them would be a
        SIGBUS). Checked before every use of the mapping but the writer's store of ``inserted`` in
        ``step()``, which the SIGBUS guard checks after it instead (``_faulted``; ARCHITECTURE.md: truncation)."""
        path = os.path.join(self.root, COUNTERS)
        if counter[COUNT] != self._faults_seen:
            self._faulted()
        if st.st_nlink == 0:
            raise CorruptStoreError(
                f"{path} was deleted or replaced while this store had it open: counting on would split the"
                " counts between the old and the new file. Close this store and reopen it (and every other"
                " process's), so all count in one file")
        if st.st_size < self._need:
            raise CorruptStoreError(f"{path}: truncated to {st.st_size} bytes by another process while this store"
                                    f" had it open ({self._need} needed); nothing was counted. {_RESTORE[0].upper()}"
                                    f"{_RESTORE[1:]}")

    # -- the writer --------------------------------------------------------------------------------------
    def _adopt(self, entry: dict[str, Any] | None) -> None:
        """Take the counts of the last commit, keeping every row sampled since it (see the module docstring)."""
        inserted, sampled, total, size = _entry_counts(entry)
        c = self._lock("opening the store")
        try:
            # a file older than the commit: the commit's counts
            self._set_sampled(c, max(c[SAMPLED_TOTAL], total), total - sampled, writer=True)
            c[INSERTED] = inserted
            c[SIZE] = size
            c[WRITER_PID] = os.getpid()
        finally:
            self._unlock()
        self._ins = inserted
        self._allowed = -1

    def fits(self, n: int) -> bool:
        """Whether ``n`` more transitions fit under the bound last computed (the writer's cheap check)."""
        return self._ins + n <= self._allowed

    def inserting(self, n: int) -> None:
        """Before a ``step()`` stores ``n`` transitions: returns at once while under the bound last computed,
        else recomputes it from the shared count and waits until they fit.

        Raises ``RateLimitTimeout`` after ``timeout``, or at once when no other store object is open to
        sample (only this store's own ``sample()`` could allow the step: waiting would never end).
        """
        if self._ins + n > self._allowed and not self._can_insert(n):
            if not self._readers_present():
                raise RateLimitTimeout(
                    f"step() is not allowed by the rate limit ({self._insert_blocked(n)}), and no reader store is"
                    " open: only this store's own sample() could allow it, so waiting would never end. Sample"
                    " before stepping again (store.can_insert() says when), or sample from reader processes"
                    " (ReplayStore.open(path, mode='r'))")
            self._wait(lambda: self._can_insert(n), lambda: self._insert_blocked(n), "step()")

    def _can_insert(self, n: int) -> bool:
        """Recompute the writer's bound from the shared sampled count; whether ``n`` more fit under it."""
        c = self._counters()
        allowed = floor_ratio(c[SAMPLED_TOTAL] - c[SAMPLED_BASE] + self._eb + self._spi * self._min, self._spi)
        if 0 <= self._size < self._min:
            # below min_size (transitions invalidated) readers wait for the writer: it may store until len(store)
            # is back at min_size whatever the counts say, or both would wait for ever (these n, then ask again)
            allowed = max(allowed, self._ins + n)
        self._allowed = allowed
        return self._ins + n <= allowed

    def inserted(self, n: int) -> bool:
        """``n`` transitions were stored; whether the published size is due for a refresh (validity updated, then
        ``publish_size``)."""
        self._ins += n
        self._wc[INSERTED] = self._ins
        if counter[COUNT] != self._faults_seen:  # the store went into a truncated file (the SIGBUS guard)
            self._faulted()
        return self._ins >= self._size_due

    def publish_size(self, size: int) -> None:
        """The writer's ``len(store)`` now. While it is below ``min_size`` the next refresh is due once
        enough transitions could have become sampleable; above it, once per chunk of inserts."""
        if size == self._size and self._ins < self._size_due:
            return  # (called after every validity update: most of the time nothing changed)
        self._size = size
        self._wc[SIZE] = size
        if size >= self._min:
            self._size_due = self._ins + self._refresh
        else:
            self._size_due = self._ins + max(1, self._min - size - self._lag)

    def reset(self, size: int) -> None:
        """``clear()``: the counts start again from zero, as in a new store."""
        c = self._lock("clear()")
        try:
            self._set_sampled(c, c[SAMPLED_TOTAL], c[SAMPLED_TOTAL], writer=True)
            c[INSERTED] = 0
        finally:
            self._unlock()
        self._ins = 0
        self._allowed = -1
        self._size = -1  # publish afresh (the refresh schedule counted the old inserts)
        self.publish_size(size)

    def state(self) -> dict[str, int]:
        """The counts a commit records (manifest ``rate_limit``)."""
        c = self._lock("commit()")
        try:
            total, base = c[SAMPLED_TOTAL], c[SAMPLED_BASE]
            return {"inserted": c[INSERTED], "sampled": total - base, "sampled_total": total, "size": c[SIZE]}
        finally:
            self._unlock()

    def check_block(self, n: int) -> None:
        """Refuse a block of ``n`` transitions the limit can never allow, whatever the processes do (``ValueError``)."""
        most = self.options.most_inserted_at_once
        if n > most:
            raise ValueError(
                f"a block of {n} transitions can never be allowed by the rate limit: the writer may be at most"
                f" (2 * error_buffer + samples_per_insert * min_size) / samples_per_insert = {most:,} transitions"
                f" ahead of what readers may sample; extend() blocks of at most {most:,} steps, or create the store"
                f" with error_buffer >= {math.ceil((self._spi * (n - self._min)) / 2):,}")

    # -- samplers ----------------------------------------------------------------------------------------
    def check_batch(self, rows: int) -> None:
        """Refuse a batch the limit can never allow, whatever the processes do (``ValueError``)."""
        room = self._room
        if rows > room:
            raise ValueError(
                f"a batch of {rows} rows can never be allowed by the rate limit: at most 2 * error_buffer +"
                f" samples_per_insert * min_size = {room:g} rows are ever available at once; sample smaller"
                f" batches or create the store with error_buffer >= {math.ceil((rows - self._spi * self._min) / 2):,}")

    def sample(self, rows: int, draw: Callable[[], T]) -> T:
        """Hand out ``rows`` rows chosen by ``draw()``: waits until the limit allows them, then draws and
        counts them under the counters' lock, so no other process takes the room between the check and
        the count, and a refused call draws nothing (the sampling RNG does not move). If ``draw`` raises,
        nothing is counted.

        Raises ``RateLimitTimeout`` after ``timeout``; on the writing store at once (only its own
        ``step()`` could allow the rows).
        """
        c = self._c
        if c is None:
            self._unusable()
        self._take_lock(f"sampling a batch of {rows}")  # (the first try inline: this is every sample's path)
        try:
            self._check_counts(c)
            if c[SIZE] >= self._min and c[SAMPLED_TOTAL] - c[SAMPLED_BASE] + rows <= self._spi * c[INSERTED] + self._eb:
                out = draw()
                self._set_sampled(c, c[SAMPLED_TOTAL] + rows, c[SAMPLED_BASE])
                self.sampled_here = self.writer
                return out
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return self._sample_waiting(rows, draw)

    def _sample_waiting(self, rows: int, draw: Callable[[], T]) -> T:
        if self.writer:
            raise RateLimitTimeout(
                f"sampling a batch of {rows} from the writing store is not allowed by the rate limit"
                f" ({self._sample_blocked(rows)}), and only this store's own step() could allow it, so"
                f" waiting would never end. Step more before sampling (store.can_sample({rows}) says"
                " when), or sample from reader processes (ReplayStore.open(path, mode='r'))")
        out: list[T] = []

        def attempt() -> bool:
            c = self._lock(f"sampling a batch of {rows}")
            try:
                if not self._sample_allowed(c, rows):
                    return False
                out.append(draw())
                self._set_sampled(c, c[SAMPLED_TOTAL] + rows, c[SAMPLED_BASE])
                return True
            finally:
                self._unlock()

        # poll without the lock; take it only when the rows look allowed
        self._wait(lambda: self.can_sample(rows) and attempt(), lambda: self._sample_blocked(rows),
                   f"sampling a batch of {rows}")
        return out[0]

    def _sample_allowed(self, c: memoryview, rows: int) -> bool:
        return c[SIZE] >= self._min and c[SAMPLED_TOTAL] - c[SAMPLED_BASE] + rows <= self._spi * c[INSERTED] + self._eb

    def can_sample(self, rows: int) -> bool:
        return self._sample_allowed(self._counters(), rows)

    def can_insert(self, n: int) -> bool:
        """The writer's ``step()`` of ``n`` transitions would proceed now."""
        return self._can_insert(n)

    def counts(self) -> dict[str, int]:
        """``inserted``, ``sampled``, ``size`` and ``writer_pid`` as one consistent reading."""
        c = self._lock("counts()")
        try:
            return {"inserted": c[INSERTED], "sampled": c[SAMPLED_TOTAL] - c[SAMPLED_BASE], "size": c[SIZE],
                    "writer_pid": c[WRITER_PID]}
        finally:
            self._unlock()

    # -- waiting and messages -----------------------------------------------------------------------------
    def _wait(self, attempt: Callable[[], bool], blocked: Callable[[], str], what: str) -> None:
        timeout = self.options.timeout
        start = time.monotonic()
        delay = POLL_MIN
        while True:
            waited = time.monotonic() - start
            if timeout is not None and waited >= timeout:
                raise RateLimitTimeout(f"{what} waited {timeout:g} s for the rate limit: {blocked()}; raise"
                                       " RateLimit(timeout=...) to wait longer, or None to wait as long as it takes")
            time.sleep(delay if timeout is None else min(delay, max(timeout - waited, 0.0)))
            delay = min(2 * delay, POLL_MAX)
            if attempt():
                return

    def _sample_blocked(self, rows: int) -> str:
        c = self._counters()
        ins, sampled, size = c[INSERTED], c[SAMPLED_TOTAL] - c[SAMPLED_BASE], c[SIZE]
        if size < self._min:
            why = f"len(store) is {size:,}, below min_size={self._min:,}"
        else:
            bound = self._spi * ins + self._eb
            why = (f"sampled {sampled:,} + {rows} rows would exceed samples_per_insert {self._spi:g} x inserted"
                   f" {ins:,} + error_buffer {self._eb:g} = {bound:,.0f}; the writer must store"
                   f" ~{math.ceil((sampled + rows - bound) / self._spi):,} more transitions")
        if not self.writer and c[WRITER_PID] == 0:
            why += " (no writer has the store open)"
        return why

    def _insert_blocked(self, n: int) -> str:
        c = self._counters()
        sampled = c[SAMPLED_TOTAL] - c[SAMPLED_BASE]
        bound = sampled + self._eb + self._spi * self._min
        return (f"samples_per_insert {self._spi:g} x (inserted {self._ins:,} + {n}) would exceed sampled {sampled:,}"
                f" + error_buffer {self._eb:g} + samples_per_insert x min_size {self._min:,} = {bound:,.0f}; readers"
                f" must sample ~{math.ceil(self._spi * (self._ins + n) - bound):,} more rows")

    # -- lifetime ----------------------------------------------------------------------------------------
    def after_fork_in_child(self) -> None:
        """A forked child samples as a reader: its own lock descriptor (a ``flock`` belongs to an open file,
        which the child shares with its parent) and its own place among the readers."""
        if self._fd >= 0:
            fd = open_regular(os.path.join(self.root, COUNTERS), os.O_RDWR, "rate-limit counters")
            os.close(self._fd)
            self._fd = fd
        self.writer = False
        self.sampled_here = False
        if self._readers_fd >= 0:  # the parent's open file: closing this copy leaves the parent's lock be
            os.close(self._readers_fd)
            self._readers_fd = -1
        self._join_readers()

    def _faulted(self) -> None:
        """A fault was patched by the SIGBUS guard since the last look: raise ``CorruptStoreError`` (from now
        on at every use) if it was in the counters' mapping, whose file was then truncated under it."""
        if not self._damage:
            now, addresses = busguard.since(self._faults_seen)
            lo, hi = self._span
            if addresses is not None and not any(lo <= a < hi for a in addresses):
                self._faults_seen = now  # faults in other mappings
                return
            if addresses is None and self._fd >= 0 and os.fstat(self._fd).st_size >= self._need:
                self._faults_seen = now  # more faults than the log keeps, and this file is whole
                return
            path = os.path.join(self.root, COUNTERS)
            self._damage = (f"{path}: truncated by another process while this store had it mapped: a use of the"
                            " counts found no data (without the SIGBUS guard the process would have died); nothing"
                            f" more is counted. {_RESTORE[0].upper()}{_RESTORE[1:]}")
            self._faults_seen = -1
        raise CorruptStoreError(self._damage)

    def close(self) -> None:
        self._closed = True
        if self._c is not None:
            if self.writer and self._c[WRITER_PID] == os.getpid():
                self._c[WRITER_PID] = 0
            self._c.release()
            self._c = None
        busguard.unregister(self._guard_slot)  # before unmapping: the addresses may be reused
        self._guard_slot = -1
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        for fd in (self._fd, self._readers_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._readers_fd = -1
        _LIMITERS.discard(self)


def store_limiter(root: str, schema: Schema, manifest: dict[str, Any], writer: bool) -> RateLimiter | None:
    """The limiter of a store opened from ``manifest``: None without a rate limit, and for a snapshot (it is
    never written to: nothing to limit)."""
    limit = schema.rate_limit
    if limit is None or SNAPSHOT_KEY in manifest:
        return None
    return RateLimiter(root, limit, manifest.get("rate_limit"), writer,
                       pending_lag=(schema.n_step - 1) * schema.num_envs, refresh_every=schema.chunk_size)


class StoreLimit:
    """What a store's sampling and writing paths call around its rate limit (each does nothing without one).

    ``update_validity()`` is the store's: it tells the sampler of transitions whose n-step window closed and
    publishes the writer's ``len(store)``.
    """

    __slots__ = ("limiter", "_update_validity")

    def __init__(self, limiter: RateLimiter | None, update_validity: Callable[[], None]) -> None:
        self.limiter = limiter
        self._update_validity = update_validity

    def sample(self, rows: int, draw: Callable[[], T]) -> T:
        """``draw()`` (which chooses ``rows`` rows to hand out, with the sampling RNG) under the rate limit:
        waits until the limit allows them, then draws and counts them under the counters' lock. A refused
        call raises ``RateLimitTimeout`` having drawn nothing (the RNG does not move). Every path that
        hands out sampled rows calls this (a sequence counts as one row: its start)."""
        lim = self.limiter
        if lim is None:
            return draw()
        lim.check_batch(rows)
        if lim.writer:
            self._update_validity()  # its len(store) is published before the limit is read
        return lim.sample(rows, draw)

    def hand_out(self, rows: int) -> None:
        """``batches()``: count a drawn batch's rows when it is handed out (waiting for the limit)."""
        self._update_validity()
        if self.limiter is not None:
            self.limiter.check_batch(rows)
            self.limiter.sample(rows, lambda: None)

    @property
    def on_hand_out(self) -> Callable[[int], None] | None:
        """``hand_out`` for a prefetching iterator, or None without a limit (nothing to count)."""
        return None if self.limiter is None else self.hand_out

    def fits(self, n: int) -> bool:
        """Whether ``n`` more transitions may be stored without waiting, under the bound last computed (the
        writer's cheap check; always without a limit)."""
        lim = self.limiter
        return lim is None or lim.fits(n)

    def inserting(self, n: int) -> None:
        """Wait until the rate limit allows ``n`` more transitions (call before storing them, once ``fits(n)``
        said no: the wait also recomputes the bound ``fits`` compares with, so asked for 0 it still settles)."""
        lim = self.limiter
        if lim is not None:
            lim.inserting(n)

    def check_block(self, n: int) -> None:
        """Refuse an ``extend()`` block the limit can never allow (``ValueError``), before anything is written."""
        if self.limiter is not None:
            self.limiter.check_block(n)

    def inserted(self, n: int) -> None:
        """``n`` transitions were stored: count them (and refresh the published ``len`` when due)."""
        lim = self.limiter
        if lim is not None and n and lim.inserted(n):
            self._update_validity()


_LIMITERS: weakref.WeakSet[RateLimiter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for lim in list(_LIMITERS):
        try:
            lim.after_fork_in_child()
        except (OSError, CorruptStoreError):
            pass  # (the child's first use of the limiter says what is wrong)


os.register_at_fork(after_in_child=_after_fork_in_child)
