"""LZ4 decode rate of real Atari frames: this tree's decoder against a baseline tree's, the C library's, a copy.

The frames are the recorded episodes of tests/data/atari (the first ``--frames`` of each game), encoded
as the sealer encodes them (``framefile.encode_native`` with the image-row hint), one entry each. A
decode is ``lz4.decode_entry`` (CRC-32C check, then the block) of every entry, into one output where the
frames lie side by side, as a batch's do. Beside it, in the same process and windows:

- ``liblz4``: the system's LZ4 C library (``LZ4_decompress_safe``, called from a numba loop through
  ctypes, so no Python call per frame), when ``liblz4.so.1`` is found; no CRC check;
- ``np.copyto`` of the same output bytes.

With ``--baseline REV`` a second process runs the decoder of git revision REV of this repository (or of
the tree at REV, a directory: ``PYTHONPATH=REV``) on the same entries; the two processes measure in alternating windows (the order flips every round), and
each figure is the best window (CPU time of the measuring thread, ``time.thread_time``). With
``--sample``, each process also opens one compressed store (filled with the same frames, one read
thread) and measures ``sample(32)``'s CPU per batch in its windows.

    python tools/bench_lz4.py --baseline HEAD~3 --sample --write     # ~2 min; the ``lz4`` section of BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numba as nb
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import table, write_section  # noqa: E402

GAMES = ("breakout", "mspacman", "pong", "seaquest")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "atari")


def frames_of(game: str, n: int) -> np.ndarray:
    return np.ascontiguousarray(np.load(os.path.join(DATA, f"{game}.npz"))["frames"][:n])


def encoded(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(buffer, records)``: the frames' entries as the sealer writes them; records (n, 2) int64 of
    offset and ``length | crc << 32``, the layout ``lz4.decode_entry`` reads."""
    from mmreplay.storage import framefile

    n, fb = frames.shape[0], frames[0].nbytes
    got = framefile.encode_native(frames.reshape(-1), n, fb, 0, framefile.row_bytes(frames.shape[1:], 1))
    assert got is not None
    rec, buf = got
    records = np.stack([rec["offset"].astype(np.int64),
                        rec["length"].astype(np.int64) | (rec["crc"].astype(np.int64) << 32)], axis=1)
    return buf, records


def decoders() -> dict[str, Any]:
    """The decode loops this process measures, each ``fn(buf, records, out, fb) -> errors``."""
    from mmreplay.native import lz4

    decode_entry = lz4.decode_entry

    @nb.njit(nogil=True)
    def ours(buf: np.ndarray, records: np.ndarray, out: np.ndarray, fb: int) -> int:
        bad = 0
        for i in range(records.shape[0]):
            meta = records[i, 1]
            bad += decode_entry(buf, records[i, 0], meta & 0xFFFFFFFF, (meta >> 32) & 0xFFFFFFFF, out, i * fb,
                                fb) != 0
        return bad

    got: dict[str, Any] = {"ours": ours}
    name = ctypes.util.find_library("lz4")
    if name:
        lib = ctypes.CDLL(name)
        c_decode = lib.LZ4_decompress_safe
        c_decode.restype = ctypes.c_int
        c_decode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]

        @nb.njit(nogil=True)
        def clib(buf: np.ndarray, records: np.ndarray, out: np.ndarray, fb: int) -> int:
            bad = 0
            for i in range(records.shape[0]):
                o, length = records[i, 0], records[i, 1] & 0xFFFFFFFF
                if length == fb:
                    out[i * fb:(i + 1) * fb] = buf[o:o + fb]
                    continue
                bad += c_decode(buf[o + 4:].ctypes.data, out[i * fb:].ctypes.data, length - 4, fb) != fb
            return bad

        got["liblz4"] = clib
    return got


def child(args: argparse.Namespace) -> None:
    """Answer ``round SECONDS`` lines with one window's figures (JSON after ``@@``)."""
    games = {g: frames_of(g, args.frames) for g in GAMES}
    cases = {g: encoded(f) for g, f in games.items()}
    fns = decoders() if not args.decode_only else {"ours": decoders()["ours"]}
    outs = {g: np.empty(f.nbytes, np.uint8) for g, f in games.items()}
    for g, (buf, rec) in cases.items():
        for name, fn in fns.items():
            outs[g][:] = 0
            assert fn(buf, rec, outs[g], games[g][0].nbytes) == 0, (name, g)
            assert np.array_equal(outs[g], games[g].reshape(-1)), (name, g)
    store = None
    if args.store:
        import mmreplay as mr
        from mmreplay.bench import warm

        store = mr.ReplayStore.open(args.store, mode="r", read_threads=1, seed=0)
        warm(store)
        store.sample(32)
    print("@@" + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        seconds = float(cmd[1])
        res: dict[str, float] = {}
        share = seconds / (len(cases) * (len(fns) + (not args.decode_only)) + (store is not None))
        for g, (buf, rec) in cases.items():
            fb = games[g][0].nbytes
            for name, fn in fns.items():
                res[f"{name}/{g}"] = outs[g].nbytes / timed(lambda fn=fn, buf=buf, rec=rec, g=g, fb=fb:
                                                            fn(buf, rec, outs[g], fb), share) / 1e9
            if not args.decode_only:
                src = games[g].reshape(-1)
                res[f"copyto/{g}"] = outs[g].nbytes / timed(lambda src=src, g=g: np.copyto(outs[g], src), share) / 1e9
        if store is not None:
            res["sample_us"] = timed(lambda: store.sample(32), share) * 1e6
        print("@@" + json.dumps(res), flush=True)
    if store is not None:
        store.close()


def timed(fn: Any, seconds: float) -> float:
    """Thread CPU seconds per call of ``fn``, over calls for about ``seconds`` (after one untimed call)."""
    fn()
    n, t0 = 0, time.thread_time()
    while True:
        fn()
        n += 1
        t = time.thread_time() - t0
        if t >= seconds:
            return t / n


def make_store(path: str, frames: int) -> None:
    import mmreplay as mr
    from mmreplay.bench import fill

    store = mr.ReplayStore.create(path, capacity=frames, obs_shape=(84, 84), stack=4, n_step=3, seed=0,
                                  read_threads=1)
    pool = np.concatenate([frames_of(g, 512) for g in GAMES])
    fill(store, frames + frames // 10, pool)
    store.commit()
    store.close()


class Proc:
    def __init__(self, tree: str, args: argparse.Namespace, store: str | None):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--frames", str(args.frames)]
        if store:
            cmd += ["--store", store]
        if tree != ROOT:
            cmd.append("--decode-only")
        env = dict(os.environ, PYTHONPATH=tree)
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ask(None)

    def ask(self, cmd: str | None) -> dict[str, float]:
        assert self.p.stdin is not None and self.p.stdout is not None
        if cmd:
            self.p.stdin.write(cmd + "\n")
            self.p.stdin.flush()
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"child exited with {self.p.wait()}")
            if line.startswith("@@"):
                return dict(json.loads(line[2:]))

    def close(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
        self.p.wait(timeout=120)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=None, help="a git revision (or a tree) whose decoder to measure too")
    ap.add_argument("--frames", type=int, default=512, help="frames of each game (default 512)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=2.0, help="one window of one process")
    ap.add_argument("--sample", action="store_true", help="also sample(32)'s CPU per batch on a compressed store")
    ap.add_argument("--capacity", type=int, default=50_000, help="the store of --sample")
    ap.add_argument("--write", action="store_true", help="write the lz4 section of BENCHMARKS.md")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--decode-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    scratch = tempfile.mkdtemp(prefix="bench-lz4-")
    procs: dict[str, Proc] = {}
    try:
        store = None
        if args.sample:
            store = os.path.join(scratch, "s")
            make_store(store, args.capacity)
        procs["this"] = Proc(ROOT, args, store)
        if args.baseline:
            procs["baseline"] = Proc(checkout(args.baseline, scratch), args, store)
        load0 = os.getloadavg()[0]
        got: dict[str, list[dict[str, float]]] = {k: [] for k in procs}
        names = list(procs)
        for r in range(args.rounds):
            for k in (names if r % 2 == 0 else names[::-1]):
                got[k].append(procs[k].ask(f"round {args.seconds}"))
        load1 = os.getloadavg()[0]
    finally:
        for p in procs.values():
            p.close()
        shutil.rmtree(scratch, ignore_errors=True)
    best: dict[str, float] = {}
    for k, windows in got.items():
        for key in windows[0]:
            vals = [w[key] for w in windows]
            best[f"{k}:{key}"] = min(vals) if key == "sample_us" else max(vals)
    body = report(best, args, load0, load1)
    print(body)
    print(json.dumps(best))
    if args.write:
        write_section("lz4", body)


def checkout(rev: str, scratch: str) -> str:
    """A directory holding ``mmreplay`` as of ``rev`` (a directory is used as it is)."""
    if os.path.isdir(rev):
        return os.path.abspath(rev)
    tree = os.path.join(scratch, "baseline")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "mmreplay"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def report(best: dict[str, float], args: argparse.Namespace, load0: float, load1: float) -> str:
    base = f"`{args.baseline}`" if args.baseline else ""
    if args.baseline and not os.path.isdir(args.baseline):
        base = "commit " + subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", args.baseline], check=True,
                                          capture_output=True, text=True).stdout.strip()
    names = {"this:ours": "mmreplay (`lz4.decode_entry`: CRC-32C, then the block)",
             "baseline:ours": f"the same, as of {base}", "this:liblz4": "liblz4 `LZ4_decompress_safe` (no CRC)",
             "this:copyto": "`np.copyto` of the frames"}
    rows = [[label] + [f"{best[f'{key}/{g}']:.2f}" for g in GAMES] for key, label in names.items()
            if f"{key}/{GAMES[0]}" in best]
    out = ["## LZ4 decode of real frames", "",
           f"The first {args.frames} frames of each recorded game (`tests/data/atari`), encoded as the sealer "
           "encodes them, decoded side by side into one output, one thread; GB/s of frames, the best of "
           f"{args.rounds} windows of {args.seconds:g} s per process (thread CPU time), the processes alternating. "
           f"Load average {load0:.1f} at the start, {load1:.1f} at the end.", "",
           table(["decoder"] + list(GAMES), rows), ""]
    if "this:sample_us" in best:
        line = (f"`sample(32)` on a compressed store of {args.capacity:,} transitions of these frames (stack 4, "
                f"n-step 3, one read thread), CPU of the calling thread per batch, best window: "
                f"{best['this:sample_us']:.0f} us")
        if "baseline:sample_us" in best:
            line += f" against {best['baseline:sample_us']:.0f} us as of {base}"
        out += [line + ".", ""]
    return "\n".join(out)

if __name__ == "__main__":
    main()
