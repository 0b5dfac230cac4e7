"""A longer kill -9 soak than the unit tests' share: many writers killed at random moments.

Each trial runs tests/_support/crash_writer.py (commits every 13 events, snapshots every 41, chunks of 8 slots so
sealing and retirement happen constantly), SIGKILLs it after a random delay, then checks that the store
reopens at a commit it made, equal to the reference model (priorities and sampling RNG equal to an
uninterrupted writer's at that commit), that writing continues, and that the snapshot
either loads to the state it was saved at or is refused with a clear error.

    python tools/crash_soak.py --trials 300
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests._support.crash_trial import kill_trial  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--max-delay", type=float, default=0.6, help="seconds of writing before the kill (uniform)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    seen: collections.Counter[str] = collections.Counter()
    t0 = time.time()
    for trial in range(args.trials):
        with tempfile.TemporaryDirectory() as d:
            r = kill_trial(d, seed=args.seed * 100_000 + trial, delay=float(rng.uniform(0, args.max_delay)),
                           total=2000)
        seen[f"snapshot {r['snapshot']}"] += 1
        seen["writer finished before the kill" if r["finished"] else "killed while writing"] += 1
        if (trial + 1) % 25 == 0:
            print(f"{trial + 1} trials ok ({time.time() - t0:.0f} s): {dict(seen)}", flush=True)
    print(f"all {args.trials} trials passed: {dict(seen)}")


if __name__ == "__main__":
    main()
