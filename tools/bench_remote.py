"""Datasets on object storage: export to and import from a local S3 protocol server (moto, in its own
process), against the same operations on local files in the same run.

- An Atari-like store of N transitions (84x84 uint8, stack 4, n-step 3) exported to zarr and to HDF5
  (D4RL layout, with next_observations) at ``s3://bench/...`` and locally, then imported back;
- an N-slot DQN-replay checkpoint (Dopamine's layout) uploaded to the bucket, imported from there and
  from local disk.

MB/s counts raw frame bytes (84 x 84 per frame). Each operation runs in a fresh process (peak RssAnon is
that process's anonymous memory: the bucket lives in the server process, so the client's memory shows
what streaming costs).

    python tools/bench_remote.py --transitions 100000     # writes the beyond-remote section of BENCHMARKS.md
    python tools/bench_remote.py --transitions 20000 --no-write

Everything written goes to a scratch directory (and the server's memory), removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import table, write_section  # noqa: E402
from bench_datasets import FRAME, atari_like_store, dqn_checkpoint, isolated  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    options: dict[str, object] = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "bench", "secret": "bench",
                                  "client_kwargs": {"region_name": "us-east-1"}}
    import boto3

    client = boto3.client("s3", endpoint_url=options["endpoint_url"], aws_access_key_id="bench",
                          aws_secret_access_key="bench", region_name="us-east-1")
    for _ in range(100):
        try:
            client.create_bucket(Bucket="bench")
            return proc, options
        except Exception:  # the server is still starting
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the moto S3 server did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=100_000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    n = args.transitions
    scratch = tempfile.mkdtemp(prefix="mmreplay-bench-remote-", dir=args.dir)
    p = lambda *names: os.path.join(scratch, *names)  # noqa: E731
    load_before = os.getloadavg()[0]
    server, so = start_server()
    rows: list[list[str]] = []

    def row(what: str, frames: int, local: dict, remote: dict) -> None:
        mb = frames * FRAME / 1e6
        rows.append([what, f"{frames:,}", f"{mb / local['seconds']:,.0f}", f"**{mb / remote['seconds']:,.0f}**",
                     f"{local['rss_peak']:,.0f} / {remote['rss_peak']:,.0f}"])
        print(rows[-1], flush=True)

    try:
        print(f"filling an Atari-like store of {n:,} transitions ...", flush=True)
        atari_like_store(p("store"), n).close()
        for fmt, name, kw in (("zarr", "d.zarr", {}), ("hdf5", "d.hdf5", {"next_observations": True})):
            loc = isolated("export", p("store"), p(name), format=fmt, **kw)
            rem = isolated("export", p("store"), f"s3://bench/{name}", format=fmt, storage_options=so, **kw)
            row(f"export -> {fmt}", loc["frames"], loc, rem)
            loc_i = isolated("import", p(name), p("from-local"), format=fmt)
            rem_i = isolated("import", f"s3://bench/{name}", p("from-s3"), format=fmt, storage_options=so)
            row(f"import {fmt} -> store", loc["frames"], loc_i, rem_i)
            shutil.rmtree(p("from-local"))
            shutil.rmtree(p("from-s3"))
            shutil.rmtree(p(name)) if os.path.isdir(p(name)) else os.unlink(p(name))
        shutil.rmtree(p("store"))
        dqn_checkpoint(p("dqn"), n)
        import s3fs

        s3fs.S3FileSystem(**so).put(p("dqn") + "/", "bench/dqn/", recursive=True)
        loc_i = isolated("import", p("dqn"), p("from-local"), format="dqn-replay")
        rem_i = isolated("import", "s3://bench/dqn", p("from-s3"), format="dqn-replay", storage_options=so)
        row("import DQN-replay checkpoint -> store", n, loc_i, rem_i)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()[0]
    body = "\n".join([
        "### Datasets on object storage (a local S3 server)",
        "",
        f"An Atari-like store of {n:,} transitions (generated 84x84 uint8 frames, stack 4, n-step 3) exported",
        "to zarr (zstd) and to HDF5 (D4RL layout with next_observations, gzip 1) locally and at `s3://` on",
        "moto's S3 server (its own process on localhost), each imported back from where it was written; an",
        f"{n:,}-slot DQN-replay checkpoint imported from local disk and from the bucket. Each operation in a",
        "fresh process; MB/s of raw frames; peak RssAnon of the client process (the bucket's bytes live in the",
        "server process). Remote HDF5 exports are written locally and uploaded; everything else streams.",
        "",
        table(["operation", "frames", "local MB/s", "S3 MB/s", "peak RssAnon MB (local / S3)"], rows),
        "",
        f"Load average (1 min) when the run started / ended: {load_before:.1f} / {load_after:.1f} on"
        f" {os.cpu_count()} cores: client, server and the store's writes share them.",
    ])
    if not args.no_write:
        write_section("beyond-remote", body)
    print(body)


if __name__ == "__main__":
    main()
