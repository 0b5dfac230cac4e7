"""One contiguous virtual address range per column, with chunk files mapped into it.

Why: a sampled batch touches rows in many chunk files. If every chunk were its
own ``np.memmap``, gathering a batch would loop over chunks in Python. Instead
we reserve one large ``PROT_NONE`` range per column and map each chunk file's
data region with ``MAP_FIXED`` at ``ring_position * chunk_bytes``. The whole
ring is then a single numpy array and a batch is one vectorized ``np.take``.
The reservation costs address space only; pages of mapped files count as
page cache (``RssFile``), not as the process's anonymous memory.

Linux only (``MAP_FIXED`` and ``MAP_NORESERVE`` through libc via ctypes).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any, cast

import numpy as np

PAGE = mmap.PAGESIZE
_PROT_NONE = 0
_PROT_READ = 1
_PROT_WRITE = 2
_MAP_SHARED = 0x01
_MAP_PRIVATE = 0x02
_MAP_FIXED = 0x10
_MAP_ANONYMOUS = 0x20
_MAP_NORESERVE = 0x4000
MADV_NORMAL = 0
MADV_RANDOM = 1
MADV_SEQUENTIAL = 2
MADV_WILLNEED = 3
MADV_DONTNEED = 4
_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.restype = ctypes.c_int
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.msync.restype = ctypes.c_int
_libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _oserror(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


class VirtualRange:
    """A reserved, page-aligned span of address space; file regions are mapped into it."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(PAGE, -(-nbytes // PAGE) * PAGE)
        addr = _libc.mmap(None, self.nbytes, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if addr in (None, _FAILED):
            raise _oserror(f"reserving {self.nbytes} bytes of address space")
        self.addr: int = addr
        self._buf = (ctypes.c_char * self.nbytes).from_address(addr)

    def _check(self, offset: int, length: int) -> None:
        if self.addr == 0:
            raise ValueError("the virtual range is closed")
        if offset % PAGE or length % PAGE or offset < 0 or offset + length > self.nbytes:
            raise ValueError(f"bad range offset={offset} length={length} (page {PAGE}, size {self.nbytes})")

    def map_file(self, offset: int, fd: int, file_offset: int, length: int, writable: bool) -> None:
        """Map ``length`` bytes of ``fd`` from ``file_offset`` at ``offset`` of the range (replacing what was there)."""
        self._check(offset, length)
        prot = _PROT_READ | (_PROT_WRITE if writable else 0)
        got = _libc.mmap(self.addr + offset, length, prot, _MAP_SHARED | _MAP_FIXED, fd, file_offset)
        if got != self.addr + offset:
            raise _oserror("mapping a chunk file")
        # Sampling reads scattered rows: without MADV_RANDOM each fault reads ahead hundreds of KB.
        _libc.madvise(self.addr + offset, length, MADV_RANDOM)

    def release(self, offset: int, length: int) -> None:
        """Drop whatever is mapped at this span; it becomes inaccessible reserved space again."""
        self._check(offset, length)
        got = _libc.mmap(self.addr + offset, length, _PROT_NONE,
                         _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED, -1, 0)
        if got != self.addr + offset:
            raise _oserror("releasing a chunk mapping")

    def protect_readonly(self, offset: int, length: int) -> None:
        self._check(offset, length)
        if _libc.mprotect(self.addr + offset, length, _PROT_READ) != 0:
            raise _oserror("making a sealed chunk read-only")

    def advise(self, offset: int, length: int, advice: int) -> None:
        self._check(offset, length)
        _libc.madvise(self.addr + offset, length, advice)

    def sync(self, offset: int, length: int) -> None:
        """``msync(MS_SYNC)``: write the mapped pages of this span to the disk."""
        self._check(offset, length)
        if _libc.msync(self.addr + offset, length, 4) != 0:  # MS_SYNC
            raise _oserror("msync of a chunk")

    def array(self, dtype: np.dtype, shape: tuple[int, ...], writable: bool) -> np.ndarray:
        """A numpy view of the whole range as ``shape`` (whose byte size must fit in the range)."""
        count = int(np.prod(shape, dtype=np.int64))
        arr = np.frombuffer(cast(Any, self._buf), dtype=dtype, count=count).reshape(shape)
        arr.flags.writeable = writable
        return arr

    def bytes_view(self, offset: int, length: int) -> np.ndarray:
        """Read-only uint8 view of ``length`` bytes at ``offset`` (which must be mapped)."""
        if self.addr == 0 or offset < 0 or offset + length > self.nbytes:
            raise ValueError(f"bad range offset={offset} length={length} (size {self.nbytes})")
        arr = np.frombuffer(cast(Any, self._buf), dtype=np.uint8, count=length, offset=offset)
        arr.flags.writeable = False
        return arr

    def close(self) -> None:
        """Unmap everything. Views returned by ``array()`` must not be used afterwards."""
        if self.addr:
            _libc.munmap(self.addr, self.nbytes)
            self.addr = 0
            self._buf = None  # type: ignore[assignment]


_SYS_PROCESS_MADVISE = {"x86_64": 440, "aarch64": 440}.get(os.uname().machine)
_libc.syscall.restype = ctypes.c_long


class RangeAdvisor:
    """``MADV_WILLNEED`` on many address ranges with one system call (``process_madvise``, Linux >= 5.10).

    For a file mapping this starts asynchronous reads of the ranges' pages that are not in the page
    cache, all at once, so a following gather waits for many reads in flight instead of faulting them in
    one at a time. Pages already cached cost a lookup. Falls back to one ``madvise`` per range where
    ``process_madvise`` is unavailable.
    """

    def __init__(self) -> None:
        self._pid = -1
        self._pidfd = -1
        self._batched = _SYS_PROCESS_MADVISE is not None

    def _process_fd(self) -> int:
        # A pidfd names a process: after fork() the child must open its own, or it would advise its parent.
        if self._pid != os.getpid():
            self.close()
            try:
                self._pidfd = os.pidfd_open(os.getpid())
                self._pid = os.getpid()
            except (OSError, AttributeError):
                self._batched = False
        return self._pidfd

    def willneed(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Advise the byte ranges ``[starts[i], ends[i])`` (absolute addresses; aligned to pages here)."""
        if starts.size == 0:
            return
        lo = (starts // PAGE) * PAGE
        hi = -(-ends // PAGE) * PAGE
        if self._batched and self._process_fd() >= 0:
            iov = np.empty((lo.size, 2), np.uint64)
            iov[:, 0] = lo
            iov[:, 1] = hi - lo
            for i in range(0, lo.size, 1024):  # UIO_MAXIOV ranges per call
                part = iov[i:i + 1024]
                got = _libc.syscall(_SYS_PROCESS_MADVISE, self._pidfd, ctypes.c_void_p(part.ctypes.data),
                                    ctypes.c_size_t(part.shape[0]), MADV_WILLNEED, 0)
                if got < 0:
                    self._batched = False  # a kernel without it, or a sandbox that forbids it
                    break
            else:
                return
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            _libc.madvise(a, b - a, MADV_WILLNEED)

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
        self._pidfd = -1
        self._pid = -1


def memory_budget() -> int:
    """Bytes of page cache this process can expect to keep: the system's ``MemAvailable``, bounded by its
    memory cgroup's limit (cgroup v1 or v2, where page cache counts against it) minus the group's
    anonymous memory. Best effort: what cannot be read is not a bound."""
    budget = 1 << 62
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    budget = int(line.split()[1]) * 1024
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError):
        return budget
    for line in lines:
        hier, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        try:
            if "memory" in controllers.split(","):  # v1
                stat = _stat_file(f"/sys/fs/cgroup/memory{path}/memory.stat")
                limit = stat.get("hierarchical_memory_limit", 1 << 62)
                budget = min(budget, limit - stat.get("total_rss", stat.get("rss", 0)))
            elif hier == "0" and controllers == "":  # v2 (unified): the group and its ancestors
                for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                    if os.path.exists(f"{root}{path}/memory.max"):
                        anon = _stat_file(f"{root}{path}/memory.stat").get("anon", 0)
                        parts = path.rstrip("/").split("/")
                        for i in range(len(parts), 0, -1):
                            with open(f"{root}{'/'.join(parts[:i]) or '/'}/memory.max") as g:
                                value = g.read().strip()
                            if value != "max":
                                budget = min(budget, int(value) - anon)
                        break
        except (OSError, ValueError):
            continue
    return max(0, budget)


def _stat_file(path: str) -> dict[str, int]:
    with open(path) as f:
        return {k: int(v) for k, v in (line.split() for line in f if len(line.split()) == 2)}
