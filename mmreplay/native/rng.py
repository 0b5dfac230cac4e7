"""NumPy's ``Generator.integers`` for a PCG64 generator, drawn inside a kernel.

``rng.integers(lo, hi, size=n, dtype=np.int64)`` from Python costs several microseconds of call
overhead for a few nanoseconds of arithmetic, and passing a ``Generator`` into a numba function costs
as much again (numba unboxes its bit generator on every call). A uniform batch draw is therefore done
here, on the generator's own state: ``Pcg64State`` maps the PCG64 state that NumPy keeps in C (the
128-bit LCG state and increment, and the buffered half of a 64-bit output that ``next_uint32`` keeps)
as small arrays, and ``integers`` advances them exactly as NumPy does:

- PCG64: ``state = state * MULTIPLIER + inc`` (mod 2**128), output ``rotr64(hi ^ lo, hi >> 58)``;
- ``next_uint32``: a buffered upper half if there is one, else the lower half of a new output and the
  upper half kept;
- ``integers`` with ``endpoint=False``: ``range = hi - lo - 1``; 0 gives ``lo``; a range below
  ``2**32 - 1`` takes Lemire's multiply-and-reject on ``next_uint32``, ``2**32 - 1`` takes ``next_uint32``
  as it is, wider ranges the same on ``next_uint64``.

So the generator, its saved ``bit_generator.state`` and every later NumPy draw are the same as if NumPy
had drawn. ``Pcg64State.attach`` checks that claim on a copy of the generator before it is used
(the layout of NumPy's C struct is not a public API) and returns None when it does not hold; callers
then draw through NumPy. Tests compare the two on many states and ranges.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from numba import njit, uint64

from ._mem import prefetch

_M_HI = np.uint64(2549297995355413924)  # PCG64's 128-bit multiplier, upper and lower halves
_M_LO = np.uint64(4865540595714422341)
_MASK32 = np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True, inline="always")
def _mulhi(a: Any, b: Any) -> Any:
    """The upper 64 bits of the 128-bit product of two uint64."""
    a_lo, a_hi = a & _MASK32, a >> uint64(32)
    b_lo, b_hi = b & _MASK32, b >> uint64(32)
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    cross = (lo_lo >> uint64(32)) + (hi_lo & _MASK32) + lo_hi
    return a_hi * b_hi + (hi_lo >> uint64(32)) + (cross >> uint64(32))


@njit(cache=True, nogil=True, inline="always")
def _next64(st: np.ndarray) -> Any:
    """One PCG64 output; ``st`` is ``[state_lo, state_hi, inc_lo, inc_hi]`` (uint64)."""
    lo, hi = st[0], st[1]
    new_hi = hi * _M_LO + lo * _M_HI + _mulhi(lo, _M_LO)
    new_lo = lo * _M_LO
    s_lo = new_lo + st[2]
    carry = uint64(1) if s_lo < new_lo else uint64(0)
    s_hi = new_hi + st[3] + carry
    st[0], st[1] = s_lo, s_hi
    x = s_hi ^ s_lo
    rot = s_hi >> uint64(58)
    return (x >> rot) | (x << ((uint64(64) - rot) & uint64(63)))


@njit(cache=True, nogil=True, inline="always")
def _next32(st: np.ndarray, buf: np.ndarray) -> Any:
    """NumPy's ``next_uint32`` of PCG64: ``buf`` is ``[has_uint32, uinteger]`` (uint32)."""
    if buf[0]:
        buf[0] = 0
        return uint64(buf[1])
    x = _next64(st)
    buf[0] = 1
    buf[1] = np.uint32(x >> uint64(32))
    return x & _MASK32


@njit(cache=True, nogil=True)
def integers(st: np.ndarray, buf: np.ndarray, lo: int, hi: int, out: np.ndarray) -> None:
    """``out[:] = rng.integers(lo, hi, size=out.size, dtype=np.int64)`` on the state ``st``/``buf``
    (see ``Pcg64State``); ``lo < hi``."""
    rng = uint64(hi - lo - 1)
    n = out.size
    if rng == uint64(0):
        for i in range(n):
            out[i] = lo
    elif rng < _MASK32:
        excl = rng + uint64(1)
        threshold = (_MASK32 - rng) % excl
        for i in range(n):
            m = _next32(st, buf) * excl
            while (m & _MASK32) < threshold:
                m = _next32(st, buf) * excl
            out[i] = lo + np.int64(m >> uint64(32))
    elif rng == _MASK32:
        for i in range(n):
            out[i] = lo + np.int64(_next32(st, buf))
    else:
        excl = rng + uint64(1)
        threshold = (uint64(0xFFFFFFFFFFFFFFFF) - rng) % excl
        for i in range(n):
            x = _next64(st)
            while x * excl < threshold:
                x = _next64(st)
            out[i] = lo + np.int64(_mulhi(x, excl))


class Pcg64State:
    """The C state of a NumPy PCG64 generator as two arrays the kernels advance in place: ``st``
    (uint64: state low, high, increment low, high) and ``buf`` (uint32: has_uint32, uinteger). Holds the
    generator, so the memory stays valid while this object lives."""

    def __init__(self, rng: np.random.Generator, st: np.ndarray, buf: np.ndarray) -> None:
        self.rng, self.st, self.buf = rng, st, buf

    @classmethod
    def attach(cls, rng: np.random.Generator) -> Pcg64State | None:
        """The state of ``rng``, or None when it is not a PCG64 whose C state is laid out as expected
        (checked by drawing with both on a copy of it)."""
        try:
            if type(rng.bit_generator) is not np.random.PCG64:
                return None
            state = cls._map(rng)
            probe = np.random.Generator(np.random.PCG64())
            saved = rng.bit_generator.state
            probe.bit_generator.state = saved
            mapped = cls._map(probe)
            got = np.empty(64, np.int64)
            for lo, hi in ((0, 1000), (7, 7 + 2**32), (-5, 2**40), (0, 2**32 - 1)):
                integers(mapped.st, mapped.buf, lo, hi, got)
                want = np.random.Generator(np.random.PCG64())
                want.bit_generator.state = saved
                expected = want.integers(lo, hi, size=got.size, dtype=np.int64)
                if not np.array_equal(got, expected):
                    return None
                saved = want.bit_generator.state
                if probe.bit_generator.state != saved:
                    return None
            return state
        except Exception:  # noqa: BLE001  (a NumPy whose PCG64 differs: draw through NumPy instead)
            return None

    def snapshot(self) -> bytes:
        """The generator's state now, as bytes (``state_dict`` makes NumPy's ``bit_generator.state`` of it): a
        fraction of the cost of reading ``bit_generator.state``, for states that are seldom looked at."""
        return self.st.tobytes() + self.buf.tobytes()

    @staticmethod
    def state_dict(snapshot: bytes) -> dict[str, Any]:
        """NumPy's ``bit_generator.state`` of a ``snapshot``."""
        st = np.frombuffer(snapshot, np.uint64, 4)
        buf = np.frombuffer(snapshot, np.uint32, 2, offset=32)
        return {"bit_generator": "PCG64", "state": {"state": int(st[0]) | int(st[1]) << 64,
                                                    "inc": int(st[2]) | int(st[3]) << 64},
                "has_uint32": int(buf[0]), "uinteger": int(buf[1])}

    @classmethod
    def _map(cls, rng: np.random.Generator) -> Pcg64State:
        # pcg64_state: {pcg64_random_t *pcg_state; int has_uint32; uint32_t uinteger}
        # pcg64_random_t: {state, inc} as two little-endian 128-bit integers
        address = rng.bit_generator.ctypes.state_address
        pcg = ctypes.c_void_p.from_address(address).value
        if not pcg:
            raise ValueError("no PCG64 state")
        st = np.ctypeslib.as_array((ctypes.c_uint64 * 4).from_address(pcg))
        buf = np.ctypeslib.as_array((ctypes.c_uint32 * 2).from_address(address + ctypes.sizeof(ctypes.c_void_p)))
        return cls(rng, st, buf)


@njit(cache=True, nogil=True)
def draw_slots(st: np.ndarray, buf: np.ndarray, lo: int, hi: int, ids: np.ndarray, slots: np.ndarray,
               id2slot: np.ndarray, valid: np.ndarray) -> int:
    """``ids[:] = rng.integers(lo, hi, ...)`` (as ``integers``), ``slots[:] = id2slot[ids % id2slot.size]``,
    and how many of those slots are not ``valid``: a uniform draw's proposals in one call."""
    integers(st, buf, lo, hi, ids)
    size = id2slot.size
    n = ids.size
    # the ids are scattered over the tables (megabytes at 1M transitions, cold after a learner's step): every
    # line is hinted before it is read, so their misses overlap instead of each row waiting for its own
    for i in range(n):
        prefetch(id2slot, ids[i] % size)  # type: ignore[call-arg]  # (an intrinsic: mypy counts its typing context)
    for i in range(n):
        s = id2slot[ids[i] % size]
        slots[i] = s
        prefetch(valid, s)  # type: ignore[call-arg]
    bad = 0
    for i in range(n):
        if not valid[slots[i]]:
            bad += 1
    return bad
