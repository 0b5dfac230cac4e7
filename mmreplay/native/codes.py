"""Constants shared by the kernels and the Python code that calls them (importing this needs no numba)."""

from __future__ import annotations

# Per ring position: where its frames are read from.
KIND_NONE = -1  # nothing mapped
KIND_RAW = 0  # the raw column file
KIND_LZ4 = 1  # a compressed frame file

# What a frame read makes (a crew task's MODE, ``FrameReader._read``'s ``mode``): PAIRS, the obs and
# next stacks of rows, (2, rows, stack, frame); FLAT, one frame per slot.
PAIRS, FLAT = 0, 1

# Error codes returned by the decoding kernels (0 = fine).
E_UNMAPPED = 1
E_RECORD = 2
E_CHECKSUM = 3
E_STREAM = 4
E_SIZE = 5
ERRORS = {
    E_UNMAPPED: "the frame's chunk is not mapped",
    E_RECORD: "its record points outside the file's data",
    E_CHECKSUM: "its stored bytes do not match their CRC-32C",
    E_STREAM: "its LZ4 block is malformed",
    E_SIZE: "its size prefix is not the frame size",
}
