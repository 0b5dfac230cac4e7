"""Smoke test of tools/dqn_atari.py: train, get killed, resume, finish.

    python tools/smoke_dqn_atari.py [--steps 2000] [--capacity 10000] [--dir DIR]

Starts the DQN run, kills it with SIGKILL once it has logged step 1250 (after its checkpoint at
step 1000), runs the same command again and checks that it resumed from step 1000 and finished at
``--steps``, with the replay snapshot holding exactly ``--steps`` transition ids (the 250 steps
after the checkpoint were lost with the process and recorded again). Prints timings; exits 1 on
failure. Needs gymnasium, ale-py and torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import mmreplay as mr

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd: list[str], kill_after: str | None = None) -> tuple[list[str], float, bool]:
    """Run ``cmd`` echoing its output; SIGKILL it once a line starts with ``kill_after``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    killed = False
    for line in proc.stdout or []:
        line = line.rstrip()
        lines.append(line)
        print(f"  | {line}", flush=True)
        if kill_after and line.startswith(kill_after):
            proc.send_signal(signal.SIGKILL)
            killed = True
            break
    proc.wait()
    if not killed and proc.returncode != 0:
        raise SystemExit(f"{cmd} exited with {proc.returncode}")
    return lines, time.perf_counter() - t0, killed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--capacity", type=int, default=10_000)
    p.add_argument("--dir", help="run directory (default: a new temporary directory)")
    args = p.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="dqn-smoke-")
    cmd = [sys.executable, os.path.join(HERE, "dqn_atari.py"), "--steps", str(args.steps), "--capacity",
           str(args.capacity), "--replay-dir", root, "--checkpoint-every", "500", "--learning-starts", "500"]
    print("$ " + " ".join(cmd))
    _, t_first, killed = run(cmd, kill_after="step=1250 ")
    if not killed:
        raise SystemExit("the first run finished before it could be killed")
    print(f"killed after {t_first:.1f} s")
    lines, t_second, _ = run(cmd)
    resumed = [line for line in lines if line.startswith("resumed from step")]
    done = [line for line in lines if line.startswith("done step=")]
    problems = []
    if not resumed or not resumed[0].startswith("resumed from step 1000:"):
        problems.append(f"expected a resume from step 1000, got {resumed}")
    if not done or not done[0].startswith(f"done step={args.steps} "):
        problems.append(f"expected the run to finish at step {args.steps}, got {done}")
    with mr.ReplayStore.open(os.path.join(root, "snapshot"), mode="r") as snap:
        info = snap.metadata.get("dqn", {})
        if info.get("step") != args.steps or snap.id_range[1] != args.steps:
            problems.append(f"snapshot: step {info.get('step')}, next id {snap.id_range[1]}; expected {args.steps}")
        sampleable = len(snap)
    print(f"first run (killed at step 1250): {t_first:.1f} s; resumed run (steps 1000..{args.steps}): {t_second:.1f} s;"
          f" final snapshot: {sampleable} sampleable transitions, files in {root}")
    for problem in problems:
        print("FAIL: " + problem)
    print("smoke test " + ("failed" if problems else "passed"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
