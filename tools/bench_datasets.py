"""Dataset export and import at Atari scale. Writes the `datasets` section of BENCHMARKS.md.

- Export of an N-transition Atari-like store (generated 84x84 frames, episodes of 100..3000
  steps) to zarr and to HDF5 (D4RL layout): time, MB/s of raw frames, size on disk, compression
  ratio; the same export of a store holding the real Atari frames of tests/data/atari.
- Import of one N-slot DQN-replay checkpoint generated here in Dopamine's layout (gzip'd .npy
  files, 3 zero padding rows before each episode, a wrapped ring with its cursor at N-1 as the
  logged buffer leaves it), and of the zarr export: time, MB/s of raw frames, peak RssAnon
  (anonymous memory, sampled every 20 ms; mapped file pages are not counted).

    python tools/bench_datasets.py                      # N = 1,000,000 (needs ~25 GB free disk)
    python tools/bench_datasets.py --transitions 100000 --no-write

Imports against an earlier version of mmreplay, in the same run (each import of each input runs
with both trees, alternating, in fresh processes; BENCHMARKS.md section `beyond-imports`):

    git archive <commit> mmreplay | tar -x -C /tmp/mmreplay-base
    python tools/bench_datasets.py --transitions 200000 --baseline /tmp/mmreplay-base

Everything written goes to a scratch directory that is deleted at the end.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import table, write_section  # noqa: E402

import mmreplay as mr  # noqa: E402
from mmreplay.bench import disk_bytes, rss_anon_mb  # noqa: E402
from mmreplay.datasets import export, import_dataset  # noqa: E402
from mmreplay.synthetic import atari_like_episodes  # noqa: E402

FRAME = 84 * 84
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PeakRss:
    """Peak RssAnon (MB) while the block runs, sampled by a thread."""

    def __enter__(self) -> PeakRss:
        self.start = rss_anon_mb()
        self.peak = self.start
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_anon_mb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_anon_mb())


def _child(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """One measured operation, in a fresh process: what a user running it would see."""
    with PeakRss() as peak:
        t = time.perf_counter()
        if op == "export":
            res = export(*args, progress=False, **kwargs)
            out = {"frames": res.frames, "bytes": res.bytes_on_disk}
        else:
            store = import_dataset(*args, progress=False, **kwargs)
            out = {"sampleable": len(store), "source": store.metadata.get("source", {})}
            store.close()
        out["seconds"] = time.perf_counter() - t
    out.update(rss_start=peak.start, rss_peak=peak.peak)
    return out


def isolated(op: str, *args: Any, tree: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """``_child`` in a fresh interpreter; ``tree``: a source tree of mmreplay to import instead of this one."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree or ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps([op, list(args), kwargs])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{op} {args} failed in a child process:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


# -- inputs ---------------------------------------------------------------------------------------------
def episodes_stream(seed: int = 0) -> Iterator[Any]:
    yield from atari_like_episodes(10**9, seed=seed, min_len=100, max_len=3000)


def atari_like_store(path: str, n: int) -> mr.ReplayStore:
    """n transitions of generated Atari-like episodes (the last one may still be running)."""
    store = mr.ReplayStore.create(path, capacity=n, obs_shape=(84, 84), stack=4, n_step=3, gamma=0.99)
    done = 0
    for ep in episodes_stream():
        store.reset(ep.frames[0])
        for i in range(ep.length):
            if done == n:
                break
            last = i == ep.length - 1
            store.step(int(ep.actions[i]), float(ep.rewards[i]), ep.frames[i + 1], ep.terminated and last,
                       ep.truncated and last)
            done += 1
        if done == n:
            break
    store.commit()
    return store


def real_atari_store(path: str) -> mr.ReplayStore | None:
    base = os.path.join(ROOT, "tests", "data", "atari")  # recorded by tools/record_atari.py
    games = [g for g in ("pong", "breakout", "seaquest", "mspacman") if os.path.exists(os.path.join(base, g + ".npz"))]
    if not games:
        return None
    data = [np.load(os.path.join(base, g + ".npz")) for g in games]
    total = sum(int(d["actions"].shape[0]) for d in data)
    store = mr.ReplayStore.create(path, capacity=total, obs_shape=(84, 84), stack=4, n_step=3, action_dtype="int32")
    for d in data:
        frames, starts = d["frames"], d["episode_starts"]
        acts, rews, term, trunc = d["actions"], d["rewards"], d["terminated"], d["truncated"]
        step = 0
        for e, s0 in enumerate(starts):
            s1 = starts[e + 1] if e + 1 < len(starts) else len(frames)
            store.reset(frames[s0])
            for t in range(s1 - s0 - 1):
                store.step(acts[step], float(rews[step]), frames[s0 + t + 1], bool(term[step]), bool(trunc[step]))
                step += 1
    store.commit()
    return store


def _gz_npy(path: str, shape: tuple[int, ...], dtype: Any, level: int) -> Any:
    """A gzip stream with an .npy header for ``shape``/``dtype``; the caller writes the rows."""
    f = gzip.open(path, "wb", compresslevel=level)
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                             "fortran_order": False, "shape": shape})
    return f


def dqn_checkpoint(d: str, slots: int, level: int = 1, stack: int = 4) -> dict[str, Any]:
    """Suffix 1 of a logged Dopamine buffer of ``slots`` slots, as the logger leaves it.

    Rows in add order are slot ``slots-1`` (the stale one at the cursor) then slots 0..slots-2;
    the ring starts inside an episode; each episode is preceded by ``stack-1`` zero rows.
    """
    os.makedirs(d, exist_ok=True)
    act = np.zeros(slots, np.int32)
    rew = np.zeros(slots, np.float32)
    term = np.zeros(slots, np.uint8)
    obs = _gz_npy(os.path.join(d, "$store$_observation_ckpt.1.gz"), (slots, 84, 84), np.uint8, level)
    rows = 0  # rows written in add order; row 0 goes to slot slots-1 (written last)
    first_row: np.ndarray | None = None
    pending = np.zeros((0, 84, 84), np.uint8)
    episodes = episodes_stream(seed=1)
    start_inside = True
    while rows < slots:
        ep = next(episodes)
        frames = ep.frames[:-1]  # Dopamine never stores the final observation
        if start_inside:
            frames, start_inside = frames[len(frames) // 2:], False  # the oldest episode lost its start
            block = frames
            a_, r_, t_ = ep.actions[-len(frames):], ep.rewards[-len(frames):], np.zeros(len(frames), np.uint8)
        else:
            block = np.concatenate([np.zeros((stack - 1, 84, 84), np.uint8), frames])
            a_ = np.concatenate([np.zeros(stack - 1, np.int64), ep.actions])
            r_ = np.concatenate([np.zeros(stack - 1, np.float32), ep.rewards])
            t_ = np.zeros(len(block), np.uint8)
        t_[-1] = 1
        n = min(len(block), slots - rows)
        slot_of = (np.arange(rows, rows + n) - 1) % slots
        act[slot_of], rew[slot_of], term[slot_of] = a_[:n], r_[:n], t_[:n]
        if rows == 0:
            first_row = block[0].copy()
            block = block[1:n]
        else:
            block = block[:n]
        pending = block if not len(pending) else np.concatenate([pending, block])
        if len(pending) >= 4096:
            obs.write(pending.tobytes())
            pending = pending[:0]
        rows += n
    assert first_row is not None
    obs.write(pending.tobytes())
    obs.write(first_row.tobytes())
    obs.close()
    for name, arr in (("$store$_action", act), ("$store$_reward", rew), ("$store$_terminal", term),
                      ("add_count", np.array(2 * slots - 1, np.int64)),
                      ("invalid_range", np.array([(slots - 1 - 1 + i) % slots for i in range(stack + 1)]))):
        with gzip.open(os.path.join(d, f"{name}_ckpt.1.gz"), "wb", compresslevel=level) as f:
            np.save(f, arr, allow_pickle=False)
    return {"slots": slots, "episodes_ended": int(term.sum()), "gz_bytes": disk_bytes(d)}


def inflate_rate(path: str, limit: int = 256 * 2**20) -> float:
    """MB/s of zlib inflating the first ``limit`` output bytes of a gzip file (one thread)."""
    dz = zlib.decompressobj(31)
    out = 0
    t = time.perf_counter()
    with open(path, "rb") as f:
        while out < limit:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            out += len(dz.decompress(chunk))
    return out / 1e6 / (time.perf_counter() - t)


# -- the run --------------------------------------------------------------------------------------------
def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        op, args_, kwargs = json.loads(sys.argv[2])
        print(json.dumps(_child(op, tuple(args_), kwargs), default=str))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary directory)")
    ap.add_argument("--gzip-level", type=int, default=1, help="gzip level of the generated checkpoint")
    ap.add_argument("--no-write", action="store_true", help="print only, do not update BENCHMARKS.md")
    ap.add_argument("--baseline", default=None, help="a source tree of an earlier mmreplay: compare imports only")
    ap.add_argument("--rounds", type=int, default=2, help="with --baseline: alternating rounds per import")
    args = ap.parse_args()
    if args.baseline:
        compare_imports(args)
        return
    n = args.transitions
    scratch = tempfile.mkdtemp(prefix="mmreplay-bench-datasets-", dir=args.dir)
    p = lambda *names: os.path.join(scratch, *names)  # noqa: E731
    rows: list[list[str]] = []

    def row(what: str, frames: int, r: dict[str, Any], size: int | None = None) -> None:
        raw, seconds = frames * FRAME, r["seconds"]
        rows.append([what, f"{frames:,}", f"{seconds:.1f}", f"**{raw / 1e6 / seconds:,.0f}**",
                     "-" if size is None else f"{size / 1e6:,.0f}", "-" if size is None else f"{raw / size:.1f}",
                     f"{r['rss_peak']:,.0f}"])
        print(rows[-1], flush=True)

    load_before = os.getloadavg()[0]
    try:
        print(f"filling an Atari-like store of {n:,} transitions ...", flush=True)
        store = atari_like_store(p("store"), n)
        store.close()
        res = isolated("export", p("store"), p("out.zarr"))
        row("export Atari-like store -> zarr (zstd)", res["frames"], res, res["bytes"])
        res_h = isolated("export", p("store"), p("out.hdf5"), format="hdf5")
        row("export Atari-like store -> HDF5 (gzip 1)", res_h["frames"], res_h, res_h["bytes"])
        os.unlink(p("out.hdf5"))
        row("import zarr export -> store", res["frames"], isolated("import", p("out.zarr"), p("from-zarr")))
        shutil.rmtree(p("from-zarr"))
        shutil.rmtree(p("out.zarr"))
        shutil.rmtree(p("store"))
        real = real_atari_store(p("real"))
        if real is not None:
            real.close()
            r = isolated("export", p("real"), p("real.zarr"))
            row("export real Atari frames -> zarr (zstd)", r["frames"], r, r["bytes"])
            r = isolated("export", p("real"), p("real.hdf5"), format="hdf5")
            row("export real Atari frames -> HDF5 (gzip 1)", r["frames"], r, r["bytes"])
            shutil.rmtree(p("real"))
        print(f"writing a {n:,}-slot DQN-replay checkpoint ...", flush=True)
        info = dqn_checkpoint(p("dqn"), n, level=args.gzip_level)
        inflate = inflate_rate(p("dqn", "$store$_observation_ckpt.1.gz"))
        r = isolated("import", p("dqn"), p("from-dqn"), format="dqn-replay")
        src, sampleable = r["source"], r["sampleable"]
        row("import DQN-replay checkpoint -> store", n, r, info["gz_bytes"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()[0]
    body = "\n".join([
        "## Datasets: export and import",
        "",
        f"An Atari-like store of {n:,} transitions (generated 84x84 uint8 frames, episodes of 100..3000 steps,",
        "stack 4, n-step 3) exported to an mmreplay zarr v3 dataset (zstd level 3, chunks of 32 frames in",
        "shards of 4,096) and to HDF5 in the D4RL layout (gzip level 1, chunks of 64 frames); the zarr export",
        "imported back; the real Atari frames of `tests/data/atari` exported the same way; one",
        f"{n:,}-slot DQN-replay checkpoint generated in Dopamine's layout (gzip level {args.gzip_level}; Dopamine",
        "itself writes level 9, which inflates at about the same speed) imported. MB/s counts raw frame bytes",
        "(84 x 84 per frame); size and ratio are the output's (for the import: the checkpoint's gzip files).",
        "Each operation runs in a fresh process; peak RssAnon is that process's anonymous memory (mapped",
        "file pages are not counted), interpreter and imports included.",
        "",
        table(["operation", "frames", "seconds", "MB/s", "size MB", "ratio", "peak RssAnon MB"], rows),
        "",
        f"The checkpoint import kept {src['episodes']:,} episodes ({src['head_lost']} without their start,"
        f" {src['running']} running at the cursor); {sampleable:,} transitions are sampleable. Inflating its",
        f"frames alone runs at {inflate:,.0f} MB/s on one core here; decompression runs in a thread beside the",
        "store's writes, so imports run at about the store's append rate (one `step()` per transition).",
        f"Load average (1 min) when the run started / ended: {load_before:.1f} / {load_after:.1f} on"
        f" {os.cpu_count()} cores (other processes compete for them when it is above ~1).",
        "Targets: >= 150 MB/s of raw frames for export and import, peak RssAnon <= 300 MB.",
    ])
    if not args.no_write:
        write_section("datasets", body)
    print(body)


def lowdim_store(path: str, n: int, episode: int = 1000) -> None:
    """n transitions of MuJoCo-like episodes (17 float32 observations, 6 float32 actions), as in D4RL."""
    rng = np.random.default_rng(0)
    with mr.ReplayStore.create(path, capacity=n, obs_shape=(17,), obs_dtype="float32", action_shape=(6,),
                               action_dtype="float32") as store:
        for a in range(0, n, episode):
            m = min(episode, n - a)
            store.reset(rng.standard_normal(17).astype(np.float32))
            store.extend(rng.standard_normal((m, 6)).astype(np.float32), rng.standard_normal(m),
                         rng.standard_normal((m, 17)).astype(np.float32), np.zeros(m, np.bool_),
                         np.arange(m) == m - 1)


def compare_imports(args: argparse.Namespace) -> None:
    """Every import of the same inputs with this tree and with ``args.baseline``, alternating."""
    n = args.transitions
    base = os.path.abspath(args.baseline)
    if not os.path.exists(os.path.join(base, "mmreplay", "__init__.py")):
        raise SystemExit(f"--baseline {base}: expected a source tree holding mmreplay/ (see the module docstring)")
    scratch = tempfile.mkdtemp(prefix="mmreplay-bench-imports-", dir=args.dir)
    p = lambda *names: os.path.join(scratch, *names)  # noqa: E731
    load_before = os.getloadavg()[0]
    results: dict[str, dict[str, list[float]]] = {}
    try:
        print(f"filling an Atari-like store of {n:,} transitions and exporting it ...", flush=True)
        atari_like_store(p("store"), n).close()
        isolated("export", p("store"), p("src.zarr"))
        isolated("export", p("store"), p("src.hdf5"), format="hdf5", next_observations=True)
        shutil.rmtree(p("store"))
        dqn_checkpoint(p("dqn"), n, level=args.gzip_level)
        low = 4 * n
        print(f"filling a low-dimensional store of {low:,} transitions and exporting it ...", flush=True)
        lowdim_store(p("low"), low)
        isolated("export", p("low"), p("low.hdf5"), format="hdf5", next_observations=True)
        isolated("export", p("low"), p("low-minari"), format="minari", dataset_id="bench/mujoco-v0")
        shutil.rmtree(p("low"))
        inputs = [("Atari-like, zarr export", p("src.zarr"), "zarr", n),
                  ("Atari-like, HDF5 (D4RL layout)", p("src.hdf5"), "d4rl", n),
                  ("Atari-like, DQN-replay checkpoint", p("dqn"), "dqn-replay", n),
                  ("MuJoCo-like (17 float32), HDF5 (D4RL layout)", p("low.hdf5"), "d4rl", low),
                  ("MuJoCo-like (17 float32), Minari", p("low-minari", "bench", "mujoco-v0"), "minari", low)]
        for r in range(args.rounds):
            for what, src, fmt, count in inputs:
                for label, tree in (("before", base), ("after", None)) if r % 2 == 0 else \
                        (("after", None), ("before", base)):
                    res = isolated("import", src, p("out"), tree=tree, format=fmt)
                    shutil.rmtree(p("out"))
                    results.setdefault(what, {}).setdefault(label, []).append(res["seconds"])
                    print(f"round {r}: {what} {label}: {count / res['seconds']:,.0f} transitions/s"
                          f" ({res['seconds']:.1f} s)", flush=True)
        counts = {what: count for what, _, _, count in inputs}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()[0]
    rows = []
    for what, by in results.items():
        b, a, c = min(by["before"]), min(by["after"]), counts[what]
        atari = what.startswith("Atari")
        mb_b = f" ({c * FRAME / 1e6 / b:,.0f} MB/s)" if atari else ""
        mb_a = f" ({c * FRAME / 1e6 / a:,.0f} MB/s)" if atari else ""
        rows.append([what, f"{c:,}", f"{c / b:,.0f}{mb_b}", f"**{c / a:,.0f}**{mb_a}", f"{b / a:.1f}x"])
    body = "\n".join([
        "### Imports: `extend()` against one `step()` per transition",
        "",
        "The same inputs imported by this tree (`extend()`, a block per episode piece) and by a baseline tree",
        "(the version before `extend()`: one `step()` per transition), alternating, each import in a fresh",
        f"process; best of {args.rounds} rounds. Atari-like: {n:,} transitions of generated 84x84 uint8 episodes",
        f"(exports of this version; a DQN-replay checkpoint in Dopamine's layout, gzip level {args.gzip_level});",
        f"MuJoCo-like: {4 * n:,} transitions of 17 float32 observations and 6 float32 actions in episodes of",
        "1,000 steps, as in D4RL's locomotion datasets. Transitions/s (and MB/s of raw frames for Atari).",
        "",
        table(["import", "transitions", "before (step)", "after (extend)", "speedup"], rows),
        "",
        f"Load average (1 min) when the run started / ended: {load_before:.1f} / {load_after:.1f} on"
        f" {os.cpu_count()} cores.",
    ])
    if not args.no_write:
        write_section("beyond-imports", body)
    print(body)


if __name__ == "__main__":
    main()
