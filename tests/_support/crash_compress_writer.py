"""A writer killed at a chosen moment of a chunk's compression (run by tests/store/test_crash_compressed.py).

``python crash_compress_writer.py STORE MOMENT``: writes 30 steps and commits, writes 40 more (chunks
seal and are compressed) and commits again (printing ``C`` before each commit); at ``MOMENT`` it prints
``M`` and waits to be killed:

- ``write``: half of the compressed file written to its temporary name;
- ``rename``: the complete file renamed into place, before the commit that would list it;
- ``delete``: after the second commit, before the raw frame file it made unneeded is deleted.
"""

from __future__ import annotations

import sys
import time

import mmreplay as mr
from mmreplay.storage import framefile, ring
from tests._support.compression import drive

KW = dict(capacity=200, obs_shape=(6, 6), stack=2, n_step=2, chunk_size=16, seed=0)


def hang() -> None:
    print("M", flush=True)
    time.sleep(60)


def main() -> None:
    path, moment = sys.argv[1], sys.argv[2]
    store = mr.ReplayStore.create(path, compression="lz4", **KW)
    drive([store], 30, 9)
    print("C", flush=True)
    store.commit()
    if moment == "write":
        real_write = framefile._write_all

        def half(fd, view):  # noqa: ANN001, ANN202
            real_write(fd, view[:len(view) // 2])
            hang()

        framefile._write_all = half
    elif moment == "rename":  # the sealer has renamed the file into place (the directory is synced at commit)
        real_compress = ring.ChunkRing.compress_chunk

        def then_hang(self, seq):  # noqa: ANN001, ANN202
            real_compress(self, seq)
            hang()

        ring.ChunkRing.compress_chunk = then_hang
    elif moment == "delete":  # chunk 1 is the one the first commit lists open (raw)
        real_delete = ring.ChunkRing.delete_raw_frames
        ring.ChunkRing.delete_raw_frames = lambda self, name: hang() if name == "000000000001" else real_delete(
            self, name)
    drive([store], 40, 10, reset=False)
    print("C", flush=True)
    store.commit()
    time.sleep(60)


if __name__ == "__main__":
    main()
