"""A batch's row arithmetic in one compiled pass: ``Index.plan`` without its ~20 numpy calls.

For each sampled transition slot the kernel finds the ring slots of its observation stack, its
n-step window and its next stack, the window length ``m`` (up to and including the first episode
end), whether the episode terminated or was truncated inside it, and which stack positions are
padding (before the episode's first stored frame). It follows ``Index.plan`` (mmreplay/core/index.py)
step for step, including its one global choice: when any row's span of frame rows ``stream_row-k ..
stream_row+n-1`` leaves its chunk, every row's span is computed through (stream, row) arithmetic with the
rows clamped to the retained, written ones; otherwise each span is the row's slot plus offsets.
The tests compare every output array with ``Index.plan``'s on real stores.

The inputs are the index's arrays as they are (nothing is copied): ``flags`` (uint8, with the RAM
bits ``END``, ``TERMINATED``, ``MISSING``), ``episode_pos`` (int32) and ``seq_of_pos`` (int64), plus the
numbers in ``config`` (int64, positions ``C_*``) and ``gammas`` (float64, ``gamma**i`` for
``i < n``: a window of length m weighs its rewards by the first m of them, the rest by 0).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._mem import prefetch

# Flag bits (mmreplay/core/index.py; the layer rules keep this package from importing it, a test checks
# that the values agree).
TERMINATED = 2
MISSING = 8
END = 32

# Positions in ``config``.
C_NUM_ENVS = 0
C_ROWS_PER_STREAM = 1
C_ROWS_ALLOC = 2
C_POSITIONS = 3
C_STACK = 4
C_N_STEP = 5
C_PAD_FIRST = 6  # 1: pad = "first" (repeat the episode's first frame), 0: "zeros"
C_HAS_MISSING = 7  # 1: some frame was ever stored MISSING (imports)
C_OLDEST_ROW = 8
C_ROWS = 9
CONFIG_SIZE = 10


def config(num_envs: int, rows_per_stream: int, rows_alloc: int, positions: int, stack: int, n_step: int,
           pad_first: bool, has_missing: bool, oldest_row: int, rows: int) -> np.ndarray:
    """The ``config`` array of ``plan_batch``. The last four entries change as the store is written:
    keep one array and update them in place (``C_HAS_MISSING``, ``C_OLDEST_ROW``, ``C_ROWS``)."""
    return np.array([num_envs, rows_per_stream, rows_alloc, positions, stack, n_step, int(pad_first),
                     int(has_missing), oldest_row, rows], np.int64)


@njit(cache=True, nogil=True)
def plan_batch(slots: np.ndarray, flags: np.ndarray, episode_pos: np.ndarray, seq_of_pos: np.ndarray,
               config: np.ndarray, gammas: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Row arithmetic of the *valid* transition slots ``slots`` (int64, shape (B,)).

    Returns ``(stacks, pad, reward_slots, reward_weights, m, ends, zeros)``:

    - ``stacks`` int64 (2, B, k): ``[0]`` the observation stacks' slots (oldest first), ``[1]`` the
      next stacks'; ``pad`` bool (2, B, k): True where that frame is zero padding (all False with
      pad "first", where padding slots name the episode's first frame instead);
    - ``reward_slots`` int64 (B, n): the window's slots; ``reward_weights`` float64 (B, n):
      ``gammas[i]`` for ``i < m``, else 0; ``m`` int64 (B,): the window length;
    - ``ends`` bool (3, B): terminated, truncated (an end inside the window that is not a
      termination), and next_missing (terminated onto a MISSING final frame: next_obs is zeros);
    - ``zeros``: how many entries of ``pad`` and of ``ends[2]`` are True (0 for nearly every batch: then
      nothing of the batch's frames is zeroed).

    With ``Plan`` field names: obs_slots = stacks[0], obs_pad = pad[0], next_slots = stacks[1],
    next_pad = pad[1], terminated = ends[0], truncated = ends[1], next_missing = ends[2].
    """
    ends = np.zeros((3, slots.shape[0]), np.bool_)
    stacks, pad, reward_slots, reward_weights, m_out, zeros = plan_into(slots, flags, episode_pos, seq_of_pos, config,
                                                                         gammas, ends)
    return stacks, pad, reward_slots, reward_weights, m_out, ends, zeros


@njit(cache=True, nogil=True)
def plan_into(slots: np.ndarray, flags: np.ndarray, episode_pos: np.ndarray, seq_of_pos: np.ndarray,
              config: np.ndarray, gammas: np.ndarray, ends: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """``plan_batch`` with the ends written into the caller's zeroed ``ends`` (bool (3, B)): returns the
    other outputs, ``(stacks, pad, reward_slots, reward_weights, m, zeros)``."""
    b_count = slots.shape[0]
    k = config[C_STACK]
    n = config[C_N_STEP]
    stacks = np.empty((2, b_count, k), np.int64)
    pad = np.zeros((2, b_count, k), np.bool_)
    reward_slots = np.empty((b_count, n), np.int64)
    reward_weights = np.empty((b_count, n), np.float64)
    m_out = np.empty(b_count, np.int64)
    zeros = _plan_rows(slots, flags, episode_pos, seq_of_pos, config, gammas, stacks, pad, reward_slots, reward_weights,
                       m_out, ends)
    return stacks, pad, reward_slots, reward_weights, m_out, zeros


@njit(cache=True, nogil=True)
def _plan_rows(slots: np.ndarray, flags: np.ndarray, episode_pos: np.ndarray, seq_of_pos: np.ndarray, config: np.ndarray,
               gammas: np.ndarray, stacks: np.ndarray, pad: np.ndarray, reward_slots: np.ndarray,
               reward_weights: np.ndarray, m_out: np.ndarray, ends: np.ndarray) -> int:
    """``plan_batch``'s pass into its output arrays (``pad`` and ``ends`` zeroed); returns ``zeros``."""
    b_count = slots.shape[0]
    n_envs = config[C_NUM_ENVS]
    rs = config[C_ROWS_PER_STREAM]
    alloc = config[C_ROWS_ALLOC]
    positions = config[C_POSITIONS]
    k = config[C_STACK]
    n = config[C_N_STEP]
    pad_first = config[C_PAD_FIRST] != 0
    has_missing = config[C_HAS_MISSING] != 0
    oldest = config[C_OLDEST_ROW]
    last_row = config[C_ROWS] - 1
    zeros = 0
    span = np.empty(k + n, np.int64)  # column c: frame row stream_row + c - k
    # Index.plan's global choice: through (stream, row) arithmetic for every row as soon as one
    # row's span leaves its chunk.
    rows_path = False
    for b in range(b_count):
        within = slots[b] % alloc % rs
        if within < k or within > rs - n:
            rows_path = True
            break
    _ = n_envs  # streams are implied by the slot layout; kept in config for the caller's checks
    # Drawn slots are scattered over arrays of megabytes: their lines are nearly all cache misses. Hinted
    # for every row first, the misses overlap, instead of each row waiting for its own.
    for b in range(b_count):
        prefetch(flags, slots[b])  # type: ignore[call-arg]  # (an intrinsic: mypy counts its typing context)
        prefetch(episode_pos, slots[b])
    for b in range(b_count):
        slot = slots[b]
        if rows_path:
            pos = slot // alloc
            off = slot % alloc
            stream = off // rs
            stream_row = seq_of_pos[pos] * rs + off % rs
            for c in range(k + n):
                r = stream_row + c - k
                if r < oldest:
                    r = oldest
                if r > last_row:
                    r = last_row
                span[c] = ((r // rs) % positions) * alloc + stream * rs + r % rs
        else:
            for c in range(k + n):
                span[c] = slot + c - k
        m = n
        has_end = False
        for i in range(n):
            if flags[span[k + i]] & END:
                m = i + 1
                has_end = True
                break
        last_f = flags[span[k + m - 1]]
        terminated = (last_f & TERMINATED) != 0
        ends[0, b] = terminated
        ends[1, b] = has_end and not terminated
        missing = has_missing and terminated and (last_f & MISSING) != 0
        ends[2, b] = missing
        zeros += missing
        m_out[b] = m
        for i in range(n):
            reward_slots[b, i] = span[k + i]
            reward_weights[b, i] = gammas[i] if i < m else 0.0
        first_col = k - episode_pos[slot]  # span columns before it are before the episode's first stored frame
        first = span[max(first_col, 0)]
        for c in range(k):
            obs_pad = c < first_col
            next_pad = m + c < first_col
            if pad_first:
                stacks[0, b, c] = first if obs_pad else span[c]
                stacks[1, b, c] = first if next_pad else span[m + c]
            else:
                stacks[0, b, c] = span[c]
                stacks[1, b, c] = span[m + c]
                pad[0, b, c] = obs_pad
                pad[1, b, c] = next_pad
                zeros += obs_pad + next_pad
    return zeros


@njit(cache=True, nogil=True)
def nstep_returns(reward: np.ndarray, reward_slots: np.ndarray, reward_weights: np.ndarray,
                  discounts: np.ndarray, m: np.ndarray, terminated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(reward, discount)`` float32 (B,) as ``batch.assemble`` computes them: the float64 terms
    ``reward[slot] * weight`` summed strictly in increasing i, then rounded to float32; the discount
    ``discounts[m]`` (float32 table), 0 after a termination."""
    b_count = reward_slots.shape[0]
    out_r = np.empty(b_count, np.float32)
    out_d = np.empty(b_count, np.float32)
    _returns(reward, reward_slots, reward_weights, discounts, m, terminated, out_r, out_d)
    return out_r, out_d


@njit(cache=True, nogil=True)
def _returns(reward: np.ndarray, reward_slots: np.ndarray, reward_weights: np.ndarray, discounts: np.ndarray,
             m: np.ndarray, terminated: np.ndarray, out_r: np.ndarray, out_d: np.ndarray) -> None:
    """``nstep_returns`` into ``out_r`` and ``out_d``."""
    b_count, n = reward_slots.shape
    for b in range(b_count):
        acc = np.float64(reward[reward_slots[b, 0]]) * reward_weights[b, 0]  # not 0.0 + ...: keeps -0.0
        for i in range(1, n):
            acc += np.float64(reward[reward_slots[b, i]]) * reward_weights[b, i]
        out_r[b] = np.float32(acc)
        out_d[b] = 0.0 if terminated[b] else discounts[m[b]]


@njit(cache=True, nogil=True)
def plan_returns(slots: np.ndarray, flags: np.ndarray, episode_pos: np.ndarray, seq_of_pos: np.ndarray,
                 config: np.ndarray, gammas: np.ndarray, reward: np.ndarray, discounts: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """``plan_batch`` then ``nstep_returns`` in one call, returning only what ``sample()`` hands out or
    reads with: ``(stacks, pad, values, ends, zeros)`` as ``plan_batch``'s, with ``values`` float32 (3, B):
    the n-step rewards, the discounts and 1.0 (a uniform batch's weights). Every call from Python pays
    for typing its arguments and boxing each array it returns: one call that returns five objects costs
    less than two that return nine (and their caller's ``np.ones``)."""
    b_count = slots.shape[0]
    values = np.empty((3, b_count), np.float32)
    ends = np.zeros((3, b_count), np.bool_)
    stacks, pad, zeros = plan_returns_into(slots, flags, episode_pos, seq_of_pos, config, gammas, reward, discounts,
                                           values, ends)
    return stacks, pad, values, ends, zeros


@njit(cache=True, nogil=True)
def plan_returns_into(slots: np.ndarray, flags: np.ndarray, episode_pos: np.ndarray, seq_of_pos: np.ndarray,
                      config: np.ndarray, gammas: np.ndarray, reward: np.ndarray, discounts: np.ndarray,
                      values: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """``plan_returns`` into the caller's ``values`` (float32 (3, B)) and zeroed ``ends`` (bool (3, B)):
    returns ``(stacks, pad, zeros)``."""
    for b in range(slots.shape[0]):  # (the rewards' cache misses overlap the plan's, see _plan_rows)
        prefetch(reward, slots[b])  # type: ignore[call-arg]  # (as in _plan_rows)
    # (calls between compiled functions: nothing is boxed)
    stacks, pad, reward_slots, reward_weights, m, zeros = plan_into(slots, flags, episode_pos, seq_of_pos, config,
                                                                    gammas, ends)
    _returns(reward, reward_slots, reward_weights, discounts, m, ends[0], values[0], values[1])
    values[2, :] = 1.0
    return stacks, pad, zeros


@njit(cache=True, nogil=True)
def _bits(n: int) -> int:
    """The bits that hold 0 .. n-1 (at least 1)."""
    b = 1
    while (1 << b) < n:
        b += 1
    return b


@njit(cache=True, nogil=True)
def distinct_slots(slots: np.ndarray, run: int, zero: np.ndarray, read: np.ndarray, positions: np.ndarray
                   ) -> tuple[int, int]:
    """The distinct slots of ``slots`` (int64, 1-D) and where each entry is among them, in one pass after a
    sort (``reading.batch.distinct_slots``' numpy reference: ``np.unique`` with its inverse, several calls).

    ``run``: ``slots`` is a series of runs of that many entries (a batch's stacks: rows of k slots), each
    usually ascending; any values are right, these only sort faster. ``zero``: bool, ``slots``' size (or
    empty: none) of entries whose frame reads as zeros whatever the slot. Writes the sorted distinct slots of
    the other entries to ``read[:count]`` and each entry's int32 position to ``positions`` (a zero frame,
    where any entry is one, is position 0 and shifts the others by one); returns ``(count, zeroed)``.

    A batch's stacks are runs of nearby slots: ordered by their first slot, the runs laid end to end are
    nearly sorted (rows overlap only where they lie within a stack of each other), and an insertion sort
    finishes them in about one pass, well under a general sort's time (BENCHMARKS.md, "Figures behind the
    code"). Each key carries its entry's index in its low bits, so the
    sort moves one word per entry. Where the insertion sort has to move many entries (runs that are not
    ascending, e.g. a ring's wrap inside a stack), a general sort of the keys takes over.
    """
    n = slots.size
    count = 0
    zeroed = 0
    if n == 0:
        return 0, 0
    run = max(1, min(run, n))
    if n % run:
        run = 1
    shift = _bits(n)
    top = 0
    for i in range(n):
        top = max(top, slots[i])
    if top >= (1 << (62 - shift)):  # (no room for the entry's index: slots this large do not occur in a ring)
        return _distinct_argsort(slots, zero, read, positions)
    runs = n // run
    rshift = _bits(runs)
    firsts = np.empty(runs, np.int64)
    for r in range(runs):
        firsts[r] = (max(slots[r * run], 0) << rshift) | r
    firsts.sort()
    keys = np.empty(n, np.int64)
    m = 0
    check = zero.size != 0
    for j in range(runs):
        r = firsts[j] & ((1 << rshift) - 1)
        for i in range(r * run, r * run + run):
            if check and zero[i]:
                positions[i] = 0
                zeroed = 1
            else:
                keys[m] = (slots[i] << shift) | i
                m += 1
    moved = 0
    for j in range(1, m):
        v = keys[j]
        i = j - 1
        while i >= 0 and keys[i] > v:
            keys[i + 1] = keys[i]
            i -= 1
        keys[i + 1] = v
        moved += j - 1 - i
        if moved > 4 * m:  # far from sorted: a general sort of the rest (quadratic time otherwise)
            keys[:m].sort()
            break
    mask = (1 << shift) - 1
    last = -1
    for j in range(m):
        v = keys[j] >> shift
        if v != last:
            read[count] = v
            count += 1
            last = v
        positions[keys[j] & mask] = count - 1 + zeroed
    return count, zeroed


@njit(cache=True, nogil=True)
def _distinct_argsort(slots: np.ndarray, zero: np.ndarray, read: np.ndarray, positions: np.ndarray) -> tuple[int, int]:
    """``distinct_slots`` through an argsort of the slots (any int64 values >= 0)."""
    n = slots.size
    keys = slots.copy()
    if zero.size:
        for i in range(n):
            if zero[i]:
                keys[i] = -1  # (slots are >= 0: the zero frame sorts first)
    order = np.argsort(keys)
    count = 0
    zeroed = 0
    last = -2
    for j in range(n):
        i = order[j]
        v = keys[i]
        if v != last:
            if v == -1:
                zeroed = 1
            else:
                read[count - zeroed] = v
            count += 1
            last = v
        positions[i] = count - 1
    return count - zeroed, zeroed
