"""Builders for the tests of single parts (index, samplers): rows written the way the log and writer do."""

from __future__ import annotations

import numpy as np

from mmreplay.core.index import END, START, Geometry, Index

RS = 8  # rows per stream per chunk


class Feed:
    """Writes rows into an index the way the chunk log and the writer do (one stream)."""

    def __init__(self, stack: int = 2, n_step: int = 3, positions: int = 4, pad: str = "zeros") -> None:
        self.idx = Index(Geometry(1, RS, RS, positions), stack, n_step, pad, 0.5)
        self.episode_pos = 0
        self.room = 0
        self.slot = 0

    @property
    def rows(self) -> int:
        return int(self.idx.rows[0])

    def _row(self) -> int:
        idx = self.idx
        if self.rows % RS == 0:
            idx.add_chunk(self.rows // RS, np.array([self.rows]))
        if self.room == 0:
            self.slot = idx.take_extent(self.rows // RS, 0, self.rows)
            self.room = idx.geo.extent
        return self.slot

    def _advance(self, n_transitions: int) -> None:
        self.idx.append_row(n_transitions)
        self.slot += 1
        self.room -= 1

    def reset(self) -> int:
        idx = self.idx
        if self.rows:
            ended, _, _ = idx.stream_state()
            if not ended[0]:
                idx.mark_end(idx.last_slots())
        slot = self._row()
        idx.note_frames(np.array([slot]), np.array([START], np.uint8), np.zeros(1, np.int32), np.array([-1]))
        self._advance(0)
        self.episode_pos = 0
        return slot

    def step(self, flag: int = 0) -> int:
        idx = self.idx
        slot = self._row()
        self.episode_pos += 1
        idx.note_frame(slot, flag | (END if flag else 0), self.episode_pos, idx.next_id)
        self._advance(1)
        return slot
