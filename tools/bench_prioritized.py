"""Prioritized vs uniform sampling at 1M capacity: sample(32) + update_priorities(32) per second.

Two workloads, each run in its own process (so RssAnon is the store's own): the Atari reference
workload (84x84 uint8 frames, stack 4, n-step 3) and tiny 1-byte observations, which leave only
the cost of the index and the sum tree. Uniform sampling is measured on a uniform store filled
with the same transitions in the same run. Writes the `prioritized` section of BENCHMARKS.md.

    python tools/bench_prioritized.py                   # capacity 1,000,000 (needs ~16 GB free disk)
    python tools/bench_prioritized.py --capacity 100000 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import table, write_section  # noqa: E402

CHILD = """
import json, sys
import mmreplay as mr
from mmreplay.bench import reference_workload
cap, obs, prio, d = int(sys.argv[1]), tuple(json.loads(sys.argv[2])), sys.argv[3] == "1", sys.argv[4] or None
r = reference_workload(cap, d, prioritized=mr.Prioritized(alpha=0.6, beta=0.4) if prio else None, obs_shape=obs)
print(json.dumps(r))
"""


def run(capacity: int, obs: tuple[int, ...], prio: bool, scratch: str | None) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(capacity), json.dumps(obs), "1" if prio else "0",
                          scratch or ""], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _status(met: bool) -> str:
    return "met" if met else "**not met**"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None, help="scratch directory on the disk to measure")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    rows = []
    ratio = rss = 0.0
    for label, obs in (("Atari 84x84, stack 4", (84, 84)), ("tiny (1 byte), stack 4", (1,))):
        uni = run(args.capacity, obs, False, args.dir)
        pri = run(args.capacity, obs, True, args.dir)
        print(label, uni, pri, flush=True)
        if obs == (84, 84):  # the targets are stated for the Atari workload, from the figures in its row
            ratio, rss = pri["batches_per_s"] / uni["batches_per_s"], pri["rss_anon_mb"]
        rows.append([label, f"{uni['batches_per_s']:,.0f}", f"{pri['batches_per_s']:,.0f}",
                     f"**{pri['batches_per_s'] / uni['batches_per_s']:.2f}**", f"{uni['rss_anon_mb']:,.0f}",
                     f"**{pri['rss_anon_mb']:,.0f}**"])
    body = "\n".join([
        "## Prioritized replay: sample + update vs uniform sample",
        "",
        f"Capacity {args.capacity:,}, filled to 1.1x through `step()`, n-step 3, batch 32, warm data.",
        "Prioritized: `sample(32)` then `update_priorities(32)` of the batch's ids with random priorities, per",
        "second. Uniform: `sample(32)` per second on a uniform store holding the same transitions. Each",
        "store in its own process; RssAnon after filling.",
        "",
        table(["workload", "uniform batches/s", "prioritized sample+update /s", "ratio", "RssAnon uniform MB",
               "RssAnon prioritized MB"], rows),
        "",
        "Targets: prioritized sample+update within 2x of uniform (ratio >= 0.5) on the Atari workload"
        f" ({_status(ratio >= 0.5)}:",
        f"{ratio:.2f}); RssAnon <= 150 MB at 1M with priorities ({_status(rss <= 150)}: {rss:,.0f} MB).",
    ])
    if not args.no_write:
        write_section("prioritized", body)
    print(body)


if __name__ == "__main__":
    main()
