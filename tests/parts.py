"""Builders for the tests of single parts (index, samplers): rows written the way the log and writer do."""

from __future__ import annotations

import numpy as np

from mmreplay.index import END, START, Geometry, Index

RS = 8  # rows per stream per chunk


class Feed:
    """Writes rows into an index the way the chunk log and the writer do (one stream)."""

    def __init__(self, stack: int = 2, n_step: int = 3, positions: int = 4, pad: str = "zeros") -> None:
        self.idx = Index(Geometry(1, RS, RS, positions), stack, n_step, pad, 0.5)
        self.epos = 0

    def _row(self) -> int:
        idx = self.idx
        if idx.rows % RS == 0:
            idx.add_chunk(idx.rows // RS)
        return int(idx.geo.slots(0, idx.rows))

    def reset(self) -> int:
        idx = self.idx
        if idx.rows:
            last = idx.geo.slots(0, idx.rows - 1)
            if not idx.frame_state(np.array([last]))[0][0]:
                idx.mark_end(np.array([last]))
        slot = self._row()
        idx.note_frames(np.array([slot]), np.array([START], np.uint8), np.zeros(1, np.int32), np.array([-1]))
        idx.rows += 1
        self.epos = 0
        return slot

    def step(self, flag: int = 0) -> int:
        idx = self.idx
        slot = self._row()
        self.epos += 1
        idx.note_frame(slot, flag | (END if flag else 0), self.epos, idx.next_id)
        idx.rows += 1
        idx.next_id += 1
        return slot
