"""``Geometry.allocate`` keeps its derived state (segments, the arithmetic map's test, the search keys)
up to date incrementally: it must equal a recomputation from scratch after every allocation."""

from __future__ import annotations

import numpy as np
import pytest

from mmreplay.core.layout import Geometry


def _check_against_scratch(g: Geometry) -> None:
    lo, hi = g.seg_lo.copy(), g.seg_hi.copy()
    base = None if g._base is None else g._base.copy()
    keys, kseq, kx = g._keys.copy(), g._kseq.copy(), g._kx.copy()
    for pos in np.flatnonzero(g.seq_of_pos >= 0):
        g._segments(int(pos))
    g._refresh()
    owned = g.owner >= 0
    assert np.array_equal(lo[owned], g.seg_lo[owned]) and np.array_equal(hi[owned], g.seg_hi[owned])
    assert (base is None) == (g._base is None) and (base is None or np.array_equal(base, g._base))
    g.restored()  # the search keys rebuilt from the owners
    assert np.array_equal(keys, g._keys) and np.array_equal(kseq, g._kseq) and np.array_equal(kx, g._kx)


@pytest.mark.parametrize("num_envs,rows_per_stream,lockstep", [(1, 625, True), (1, 64, True), (3, 48, False),
                                                               (4, 32, True), (4, 32, False)])
def test_incremental_allocation_matches_a_recomputation(num_envs, rows_per_stream, lockstep):
    rng = np.random.default_rng(num_envs * 1000 + rows_per_stream)
    positions = 6
    g = Geometry(num_envs, rows_per_stream, num_envs * rows_per_stream, positions)
    e = g.extent
    rows = np.zeros(num_envs, np.int64)
    for seq in range(20):
        if seq >= positions - 1:
            g.remove(seq - positions + 1)
        g.place(seq, rows.copy())
        first = rows.copy()
        g.current[:] = -1
        free = g.n_extents
        while free:
            s = int(rng.integers(num_envs)) if not lockstep else int(np.argmin(rows - first))
            g.allocate(seq, s, int(rows[s]))
            free -= 1
            rows[s] += e if lockstep or rng.random() < 0.8 else int(rng.integers(1, e + 1))
            _check_against_scratch(g)
        g.seal(seq, rows - first)
        _check_against_scratch(g)
        if lockstep:  # every stream filled its home section: rows map by arithmetic
            assert g.aligned
