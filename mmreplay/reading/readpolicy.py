"""How a read is made: how many threads may read (``usable_cpus``: affinity and cgroup quota), whether a
read is shared with the helper threads or made alone (``WayChooser``), and whether a batch's read is posted
ahead (``PostGate``). Both choose from what reads and joins cost per output byte."""

from __future__ import annotations

import math
import os

SHARED, ALONE = 0, 1  # the two ways to read (``WayChooser``): with the helper threads, or the caller alone


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by its cgroup's CPU quota (a container limited
    to 2 CPUs on a 64-core host gets 2), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup") -> float | None:
    """The CPU quota (CPUs' worth of time per period) of this process's cgroup and its parents, the smallest
    one set; None where there is none (or no cgroup file system to read)."""
    try:
        with open(proc) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, rel = parts
        rel = rel.lstrip("/")
        v2 = hierarchy == "0" and controllers == ""
        if not v2 and "cpu" not in controllers.split(","):
            continue
        base = root if v2 else None
        if base is None:  # cgroup v1: the cpu controller's own mount
            for name in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
                if os.path.isdir(os.path.join(root, name)):
                    base = os.path.join(root, name)
                    break
            if base is None:
                continue
        parts_rel = [p for p in rel.split("/") if p]
        for depth in range(len(parts_rel), -1, -1):
            here = os.path.join(base, *parts_rel[:depth])
            q = _read_quota(here, v2)
            if q is not None:
                found.append(q)
    return min(found) if found else None


def _read_quota(directory: str, v2: bool) -> float | None:
    try:
        if v2:
            with open(os.path.join(directory, "cpu.max")) as f:
                quota, period = (f.read().split() + ["100000"])[:2]
            return None if quota == "max" else int(quota) / int(period)
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as f:
            quota_us = int(f.read().strip())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
            period_us = int(f.read().strip())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def default_threads() -> int:
    """Threads that read a batch (the caller and its helpers): the CPUs this process may use, at most 4."""
    return min(4, usable_cpus())


class WayChooser:
    """Which of two ways to read is faster now: ``SHARED`` with the helper threads, or ``ALONE`` in the
    calling thread. From what reads cost per output byte: the way in use is averaged over its recent reads (each
    clipped to 4x the average: switching takes a run of slow reads, not one), the other is tried every
    ``PROBE`` reads (and once early) and taken as measured. The first read with helpers starts them, so it is
    not timed.

    Why measure: helpers pay on idle cores, and cost when other processes keep the cores busy (the caller
    then waits for a chunk a helper claimed but the system stopped running).

    "Faster" means faster by enough to be worth the CPU: a shared read spends more CPU than the same read
    alone (the helpers' wake-ups, and threads copying side by side wait on memory longer), so reads are
    shared only while they take at most ``GAIN`` of the time alone: the cores a process shares its reads
    with are cores its learner and environments could use."""

    PROBE = 128
    EARLY = 4
    GAIN = 0.75  # a shared read must take at most this share of the time alone (BENCHMARKS.md, "CPU cost")
    WEIGHT = 0.05  # of a read in the average of the way in use
    AVERAGE, MEASURED, UNTIMED = 0, 1, 2  # how ``record`` takes a read

    def __init__(self) -> None:
        self.cost = [0.0, 0.0]  # per way (SHARED, ALONE): seconds per output byte (0.0: not measured yet)
        self.reads = 0

    def pick(self) -> tuple[int, int]:
        """The way for the next read, and how to take its time (``AVERAGE``, ``MEASURED``, ``UNTIMED``)."""
        self.reads += 1
        r = self.reads
        shared, alone = self.cost
        if r == 1:
            return SHARED, self.UNTIMED  # the first shared read starts the helpers
        if alone == 0.0 and r >= self.EARLY:
            return ALONE, self.MEASURED
        if shared == 0.0 or alone == 0.0 or shared <= self.GAIN * alone:
            return (ALONE, self.MEASURED) if r % self.PROBE == 0 else (SHARED, self.AVERAGE)
        if r % self.PROBE == 0:
            return SHARED, self.MEASURED
        return ALONE, self.AVERAGE

    def record(self, way: int, seconds: float, nbytes: int, how: int) -> None:
        if how == self.UNTIMED:
            return
        c = seconds / max(1, nbytes)
        old = self.cost[way]
        if old == 0.0 or how == self.MEASURED:
            self.cost[way] = c
        else:  # one slow read (a thread woken late) must not switch ways: clipped, and a slow average
            self.cost[way] = old + self.WEIGHT * (min(c, 4 * old) - old)


class PostGate:
    """Whether ``FrameReader.post_stacks`` posts: not while joins, the time the caller spends reading what
    the helper has not read and waiting for the rest, cost more per byte than a plain read of the way in
    use (``WayChooser``'s costs). A join that waits on a helper the system has descheduled (other processes
    keep the cores busy) can take a time slice. Joins are averaged like ``WayChooser`` averages reads (each
    clipped to 4x the average), after ``UNTIMED`` joins (a helper that had gone to sleep wakes up during
    the first ones); once the average is over, ``OFF`` reads go through ``stacks`` (they also bring the
    chooser's costs up to date), then posting is tried again."""

    OFF = 256
    UNTIMED = 8
    WEIGHT = 0.05
    SLOWER = 1.0  # joins at most this times the plain read's cost

    def __init__(self) -> None:
        self.cost = 0.0  # seconds per byte of a join (0.0: none yet)
        self.off = 0  # reads left before posting is tried again
        self.untimed = self.UNTIMED
        self.times_off = 0
        self.posts = 0  # reads posted

    def open(self) -> bool:
        if self.off:
            self.off -= 1
            return False
        return True

    def joined(self, per_byte: float, plain: list[float]) -> None:
        if self.untimed:
            self.untimed -= 1
            return
        c = self.cost
        self.cost = per_byte if c == 0.0 else c + self.WEIGHT * (min(per_byte, 4 * c) - c)
        measured = [x for x in plain if x > 0.0]
        if measured and self.cost > self.SLOWER * min(measured):
            self.off, self.cost, self.untimed = self.OFF, 0.0, self.UNTIMED
            self.times_off += 1
