"""The native LZ4 kernels against python-lz4 and numcodecs, byte for byte, and against a plain spec decoder.

Blocks come from the reference encoders (random, periodic, incompressible frames), from our encoder,
and hand-built from sequences (overlapping matches, offset 1, long literal and match lengths); damaged
blocks must give an error code and never write outside the frame's output span.
"""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from numcodecs import LZ4

from mmreplay.native import crc32c as C
from mmreplay.native import lz4 as K
from mmreplay.native import lz4_encode as E
from mmreplay.native.codes import E_CHECKSUM, E_SIZE, E_STREAM
from mmreplay.storage import framefile

try:  # python-lz4: a second reference decoder and encoder (numcodecs is the first)
    import lz4.block as lz4_block
except ImportError:  # pragma: no cover - installed in CI
    lz4_block = None
CANARY = 0xA5
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def spec_decode_or_none(block: bytes, size: int) -> bytes | None:
    """The block format, read as written in its description, one byte at a time: the ``size`` bytes a block
    decodes to, or None where it is not a valid block of ``size`` bytes."""
    out = bytearray()
    i = 0
    try:
        while True:
            token = block[i]
            i += 1
            n, i = _extended(block, i, token >> 4)
            if i + n > len(block):
                return None
            out += block[i:i + n]
            i += n
            if i == len(block):
                break
            off = block[i] | block[i + 1] << 8
            i += 2
            m, i = _extended(block, i, token & 15)
            m += 4
            if not 0 < off <= len(out) or len(out) + m > size:
                return None
            for _ in range(m):
                out.append(out[-off])
    except IndexError:
        return None
    return bytes(out) if len(out) == size else None


def _extended(block: bytes, i: int, n: int) -> tuple[int, int]:
    """A token's 4-bit length ``n`` with the bytes that extend it from ``block[i]`` on (each adds its value; one
    below 255 ends them; only 15 is extended), and the position after them."""
    if n == 15:
        while True:
            b = block[i]
            i += 1
            n += b
            if b != 255:
                break
    return n, i


def spec_decode(block: bytes, size: int) -> bytes:
    """``spec_decode_or_none`` of a block that must be valid."""
    out = spec_decode_or_none(block, size)
    assert out is not None, "not a valid block of the size given"
    return out


def build_block(seqs: list[tuple[bytes, int, int]], last: bytes) -> bytes:
    """A block from sequences ``(literals, offset, match length)`` and the final literals."""
    def length(n: int) -> bytes:
        out = b""
        while n >= 255:
            out += b"\xff"
            n -= 255
        return out + bytes([n])

    out = b""
    for lit, off, ml in seqs:
        ll, m = len(lit), ml - 4
        out += bytes([(min(ll, 15) << 4) | min(m, 15)])
        out += length(ll - 15) if ll >= 15 else b""
        out += lit + off.to_bytes(2, "little")
        out += length(m - 15) if m >= 15 else b""
    out += bytes([min(len(last), 15) << 4]) + (length(len(last) - 15) if len(last) >= 15 else b"") + last
    return out


def kernel_decode(block: bytes, size: int, before: int = 0, after: int = 0) -> tuple[int, bytes]:
    """Decode with the kernel into a buffer with canary bytes around the frame; checks they survive."""
    src = np.frombuffer(block, np.uint8)
    out = np.full(before + size + after, CANARY, np.uint8)
    err = K.decode_block(src, 0, src.size, out, before, before + size)
    assert (out[:before] == CANARY).all() and (out[before + size:] == CANARY).all(), "wrote outside the frame"
    return err, out[before:before + size].tobytes()


@st.composite
def sequences(draw, rules: bool):  # noqa: ANN001, ANN201
    """Sequences of a valid block; with ``rules``, also the end rules reference decoders insist on
    (last 5 bytes literal, no match starting in the last 12)."""
    seqs, produced = [], 0
    for _ in range(draw(st.integers(0, 12))):
        lit = draw(st.binary(min_size=0 if produced else 1, max_size=draw(st.sampled_from([3, 20, 300]))))
        produced += len(lit)
        off = draw(st.one_of(st.just(1), st.integers(1, min(produced, 8)), st.integers(1, produced)))
        ml = draw(st.one_of(st.integers(4, 19), st.integers(4, 600)))
        seqs.append((lit, off, ml))
        produced += ml
    last = draw(st.binary(min_size=5 if rules else (0 if seqs else 1), max_size=300))
    if rules and seqs:
        # the last match must start at least 12 bytes before the end
        assume(produced - seqs[-1][2] + 12 <= produced + len(last))
    return seqs, last


@given(sequences(rules=False))
@SETTINGS
def test_any_valid_block_decodes_as_the_spec_says(case):
    seqs, last = case
    block = build_block(seqs, last)
    want = spec_decode(block, sum(len(s[0]) + s[2] for s in seqs) + len(last))
    for before, after in ((0, 0), (5, 40), (40, 3)):
        err, got = kernel_decode(block, len(want), before, after)
        assert err == 0 and got == want


@pytest.mark.parametrize("ml", [4, 17, 33, 64, 65, 100, 257, 600])
def test_every_short_offset_and_length_decodes_as_the_spec_says(ml):
    """Matches close behind their output, at every offset up to past ``FAR``: the copies that switch to
    reading whole periods further back must give what a byte-by-byte copy gives, at the block's end too."""
    lit = bytes(range(1, 201))
    for off in range(1, K.FAR + 20):
        for tail in (0, 5, 30):
            block = build_block([(lit, off, ml)], bytes(range(7, 7 + tail)))
            want = spec_decode(block, len(lit) + ml + tail)
            for before, after in ((0, 0), (3, 40)):
                err, got = kernel_decode(block, len(want), before, after)
                assert err == 0 and got == want, (off, ml, tail)


@pytest.mark.parametrize("off", range(1, 21))
def test_short_matches_at_every_distance_from_the_end_decode_as_the_spec_says(off):
    """Matches up to 18 bytes long (the token's own length) and a little longer, at every offset up to 20,
    followed by 0..40 bytes: the decoder's wide stores and pattern fills switch to single bytes near
    the end of the frame."""
    lit = bytes(range(3, 3 + 24))
    for ml in range(4, 41):
        for tail in range(0, 41, 3):
            block = build_block([(lit, off, ml), (b"\x07", off, ml)], bytes(range(50, 50 + tail)))
            want = spec_decode(block, 2 * (len(lit) + ml) - len(lit) + 1 + tail)
            for before, after in ((0, 0), (2, 33)):
                err, got = kernel_decode(block, len(want), before, after)
                assert err == 0 and got == want, (off, ml, tail)


@given(sequences(rules=True))
@SETTINGS
def test_blocks_decode_as_python_lz4_and_numcodecs_decode_them(case):
    seqs, last = case
    block = build_block(seqs, last)
    size = sum(len(s[0]) + s[2] for s in seqs) + len(last)
    want = LZ4().decode(size.to_bytes(4, "little") + block)
    if lz4_block is not None:
        assert lz4_block.decompress(block, uncompressed_size=size) == want
    assert kernel_decode(block, size, 3, 17) == (0, want)


def frames_strategy():  # noqa: ANN201
    """Frame contents: random, runs, short periods, and mixes of them."""
    part = st.one_of(
        st.binary(min_size=1, max_size=400),
        st.tuples(st.integers(0, 255), st.integers(1, 3000)).map(lambda t: bytes([t[0]]) * t[1]),
        st.tuples(st.binary(min_size=2, max_size=9), st.integers(1, 400)).map(lambda t: t[0] * t[1]),
    )
    return st.lists(part, min_size=1, max_size=8).map(b"".join)


@given(frames_strategy(), st.sampled_from(["default", "fast", "high_compression"]))
@SETTINGS
def test_reference_encoders_output_decodes_the_same(data, mode):
    if lz4_block is not None:
        block = lz4_block.compress(data, mode=mode, store_size=False)
        assert kernel_decode(block, len(data), 8, 8) == (0, data)
    framed = bytes(LZ4().encode(np.frombuffer(data, np.uint8)))
    assert kernel_decode(framed[4:], len(data)) == (0, data)


@given(st.lists(frames_strategy(), min_size=1, max_size=6), st.integers(1, 200), st.sampled_from([0, 1, 7, 84]))
@SETTINGS
def test_our_encoder_is_read_by_python_lz4_and_numcodecs(parts, pad, row):
    fb = max(len(p) for p in parts) + pad
    frames = np.stack([np.frombuffer((p * (fb // len(p) + 1))[:fb], np.uint8) for p in parts])
    records, buf = framefile.encode_native(frames.reshape(-1), len(parts), fb, 16, row)
    for i, rec in enumerate(records):
        entry = buf[rec["offset"]:rec["offset"] + rec["length"]].tobytes()
        assert google_crc32c.value(entry) == rec["crc"]
        if len(entry) == fb:
            assert entry == frames[i].tobytes()  # stored as it was: it did not shrink
            continue
        assert len(entry) < fb and int.from_bytes(entry[:4], "little") == fb
        assert bytes(LZ4().decode(entry)) == frames[i].tobytes()
        if lz4_block is not None:
            assert lz4_block.decompress(entry) == frames[i].tobytes()


def test_incompressible_and_tiny_frames_are_stored_raw():
    rng = np.random.default_rng(0)
    for fb in (1, 4, 12, 13, 100, 7056):
        frames = rng.integers(0, 256, (3, fb), dtype=np.uint8)
        records, buf = framefile.encode_native(frames.reshape(-1), 3, fb, 0)
        assert (records["length"] == fb).all()
        assert np.array_equal(buf.reshape(3, fb), frames)


@pytest.mark.parametrize("native", [True, False])
def test_a_chunk_that_would_not_shrink_enough_is_not_written_by_either_encoder(tmp_path, native):
    # the sealer keeps such a chunk's raw frames (FORMAT.md), with numba or without it (NUMBA_DISABLE_JIT=1)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (300, 16, 16), dtype=np.uint8)
    flat = np.repeat(rng.integers(0, 4, (300, 1, 1), dtype=np.uint8), 256, axis=1).reshape(300, 16, 16)
    path = str(tmp_path / "f.lz4")
    assert framefile.write(path, noise.reshape(-1), 300, noise.dtype, (16, 16), "lz4", native=native,
                           min_saving=0.1) is None
    assert not (tmp_path / "f.lz4").exists()
    assert framefile.write(path, flat.reshape(-1), 300, flat.dtype, (16, 16), "lz4", native=native,
                           min_saving=0.1) is not None


def test_real_frames_round_trip_through_every_decoder(atari_frames):
    frames = atari_frames[::7][:600]
    n, fb = frames.shape[0], frames[0].nbytes
    records, buf = framefile.encode_native(frames.reshape(-1), n, fb, 0, framefile.row_bytes((84, 84), 1))
    ref_records, ref_data = framefile.encode(frames, "lz4")
    assert buf.size < frames.nbytes / 5  # Atari frames shrink ~10x
    out = np.empty(fb, np.uint8)
    for i in range(n):
        off, length, crc = (int(v) for v in records[i].tolist())
        assert K.decode_entry(buf, off, length, crc, out, 0, fb) == 0 and np.array_equal(out, frames[i].reshape(-1))
        off, length, crc = (int(v) for v in ref_records[i].tolist())
        assert K.decode_entry(ref_data, off, length, crc, out, 0, fb) == 0
        assert np.array_equal(out, frames[i].reshape(-1))  # numcodecs' own blocks, through our decoder


@pytest.fixture(scope="module")
def atari_frames():  # noqa: ANN201
    from tests._support.compression import atari_frames

    return atari_frames("breakout")


@given(st.binary(min_size=0, max_size=300), st.integers(1, 500))
@SETTINGS
def test_garbage_never_writes_outside_its_frame(block, size):
    err, got = kernel_decode(block, size, 16, 16)
    want = spec_decode_or_none(block, size)
    assert (err, got if err == 0 else None) == ((0, want) if want is not None else (E_STREAM, None))


@given(st.sampled_from(["breakout", "mspacman", "pong", "seaquest"]), st.integers(0, 63),
       st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4),
       st.sampled_from(["replace", "insert", "delete", "truncate"]), st.sampled_from([0, 1, 16]))
@SETTINGS
def test_damaged_real_blocks_decode_as_the_spec_says_or_fail_inside_their_frame(game, i, edits, how, guard):
    """A real frame's block with bytes replaced, inserted or deleted, or cut short, decoded into a frame with
    ``guard`` bytes either side: the decoder never writes outside the frame, and it gives the frame the
    block format says or an error, exactly where the format says the block is invalid."""
    block, fb = real_blocks()[game][i]
    b = bytearray(block)
    for where, value in edits:
        k = int(where * len(b))
        if how == "replace":
            b[k] = value
        elif how == "insert":
            b.insert(k, value)
        elif how == "delete" and len(b) > 1:
            del b[k]
        else:
            del b[k:]
            break
    err, got = kernel_decode(bytes(b), fb, guard, guard)
    want = spec_decode_or_none(bytes(b), fb)
    assert (err, got if err == 0 else None) == ((0, want) if want is not None else (E_STREAM, None))


def test_real_frames_of_every_game_decode_side_by_side():
    """Every game's first frames, encoded as the sealer encodes them, decoded next to each other into one
    output (as a batch's are: the wide stores of one frame stop at its end) and compared with the frames."""
    for game, blocks in real_blocks().items():
        frames = atari_frames_of(game)[:len(blocks)]
        out = np.full(frames.nbytes + 16, CANARY, np.uint8)
        for i in np.random.default_rng(0).permutation(len(blocks)):  # neighbours decoded before or after
            block, fb = blocks[i]
            src = np.frombuffer(block, np.uint8)
            assert K.decode_block(src, 0, src.size, out, i * fb, (i + 1) * fb) == 0
        assert np.array_equal(out[:frames.nbytes], frames.reshape(-1)), game
        assert (out[frames.nbytes:] == CANARY).all()
        for block, fb in blocks[:8]:
            assert spec_decode(block, fb) == kernel_decode(block, fb)[1]


def atari_frames_of(game: str) -> np.ndarray:
    from tests._support.compression import atari_frames

    return atari_frames(game)


_BLOCKS: dict[str, list[tuple[bytes, int]]] = {}


def real_blocks() -> dict[str, list[tuple[bytes, int]]]:
    """The LZ4 blocks of the first 64 frames of each recorded game, as the sealer encodes them."""
    if not _BLOCKS:
        for game in ("breakout", "mspacman", "pong", "seaquest"):
            frames = np.ascontiguousarray(atari_frames_of(game)[:64])
            n, fb = frames.shape[0], frames[0].nbytes
            records, buf = framefile.encode_native(frames.reshape(-1), n, fb, 0, framefile.row_bytes((84, 84), 1))
            entries = [buf[r["offset"]:r["offset"] + r["length"]].tobytes() for r in records]
            assert all(len(e) < fb for e in entries)
            _BLOCKS[game] = [(e[4:], fb) for e in entries]
    return _BLOCKS


@given(frames_strategy(), st.data())
@SETTINGS
def test_damaged_entries_are_errors_never_wrong_frames(data, draw):
    fb = len(data)
    records, buf = framefile.encode_native(np.frombuffer(data, np.uint8), 1, fb, 0)
    length, crc = int(records[0]["length"]), int(records[0]["crc"])
    entry = buf[:length].copy()
    kind = draw.draw(st.sampled_from(["flip", "truncate", "size"]))
    out = np.zeros(fb + 32, np.uint8)
    if kind == "flip":
        i = draw.draw(st.integers(0, length - 1))
        entry[i] ^= 1 << draw.draw(st.integers(0, 7))
        assert K.decode_entry(entry, 0, length, crc, out, 16, fb) == E_CHECKSUM
    elif kind == "truncate":
        cut = draw.draw(st.integers(0, length - 1))
        assert K.decode_entry(entry, 0, cut, crc, out, 16, fb) != 0
    else:
        assume(length < fb)
        entry[:4] = np.frombuffer((fb + 1).to_bytes(4, "little"), np.uint8)
        assert K.decode_entry(entry, 0, length, google_crc32c.value(entry.tobytes()), out, 16, fb) == E_SIZE
    assert (out[:16] == 0).all() and (out[16 + fb:] == 0).all()


@given(st.binary(max_size=2000), st.integers(0, 7))
@SETTINGS
def test_crc32c_in_hardware_and_by_table_match_google_crc32c(data, start):
    buf = np.frombuffer(b"\x00" * start + data, np.uint8)
    want = google_crc32c.value(data)
    assert C._crc32c_tables(buf, start, len(data)) == want
    if C.HARDWARE_CRC:
        assert C._crc32c_sse42(buf, start, len(data)) == want


def test_the_sealers_check_catches_an_entry_that_decodes_wrong():
    rng = np.random.default_rng(1)
    frames = np.repeat(rng.integers(0, 4, (40, 1, 50), dtype=np.uint8), 8, axis=1).reshape(40, -1)
    fb = frames.shape[1]
    records, buf = framefile.encode_native(frames.reshape(-1), 40, fb, 0)
    rec = np.stack([records["offset"].astype(np.int64),
                    records["length"].astype(np.int64) | (records["crc"].astype(np.int64) << 32)], axis=1)
    assert E.check_frames(frames.reshape(-1), 40, fb, buf, rec, 1) == -1
    wrong = frames.copy()
    wrong[17, 3] ^= 1  # as if the encoder had written frame 17 wrong
    assert E.check_frames(wrong.reshape(-1), 40, fb, buf, rec, 1) == 17
    assert E.check_frames(wrong.reshape(-1), 40, fb, buf, rec, 16) == -1  # sampled: frames 0, 16, 32, 39
    wrong[39, 0] ^= 1
    assert E.check_frames(wrong.reshape(-1), 40, fb, buf, rec, 16) == 39
