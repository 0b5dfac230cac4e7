"""CleanRL's ``dqn_atari.py`` on its own replay buffer and on ``mmreplay.sb3.ReplayBuffer``, side by side.

    python tools/cleanrl_dqn.py PATH/TO/cleanrl/cleanrl/dqn_atari.py [--python PY] [--rounds 2]
        [--total-timesteps 3000] [--learning-starts 1000] [--buffer-size 100000]

Takes the path of your copy of CleanRL's script (this repository holds none of CleanRL's code; its other
off-policy scripts with the same flags work too, e.g. ``dqn.py``, ``sac_continuous_action.py``), makes a
second copy with one line changed (the buffer's import, ``from stable_baselines3.common.buffers import
ReplayBuffer`` or ``from cleanrl_utils.buffers import ReplayBuffer``, becomes ``from mmreplay.sb3 import
ReplayBuffer``) and runs both with the same arguments and seed, alternating which goes first each round.
For each run it prints the script's own last ``SPS`` (steps per second since the buffer was made), the
steps per second of the whole process, RssAnon and VmRSS (peaks of /proc/PID/status sampled every 0.2 s;
RssAnon also when the first ``SPS`` line comes, just after learning starts: what grows after it is mostly
the buffer's) and the episodic returns the script printed.

``--python`` is the interpreter of the environment CleanRL runs in (its pins: Gymnasium 0.29; see
BENCHMARKS.md, "CleanRL dqn_atari.py"); it needs mmreplay's dependencies too (this repository is put on
its PYTHONPATH, with the CleanRL checkout that holds ``cleanrl_utils``). The script runs unchanged in a
child process started with ``-c``: that child first imports ``ale_py``, whose import registers the Atari
ids; under Gymnasium 0.29 (where ale-py 0.12's import skips that: its vector env needs Gymnasium >= 1.0)
it calls ale-py's own registration. Nothing else differs between the two runs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# the import lines a CleanRL script may use for its buffer (SB3's, or CleanRL's copy of it since SB3
# became optional), and the one line that replaces it
BUFFER_IMPORTS = (
    "from stable_baselines3.common.buffers import ReplayBuffer",
    "from cleanrl_utils.buffers import ReplayBuffer",
)
MMREPLAY_IMPORT = "from mmreplay.sb3 import ReplayBuffer"

# run in the child before the script: make the Atari ids known to Gymnasium, then run the script as
# ``python script.py ARGS`` would (``__file__`` and ``sys.argv`` as usual)
BOOT = """
import runpy, sys
import gymnasium as gym
import ale_py  # ale-py >= 0.9 registers the Atari ids on import (Gymnasium >= 1.0)
if sys.argv[2] not in gym.registry:  # Gymnasium 0.29: that import skipped the registration
    from ale_py.registration import register_v0_v4_envs, register_v5_envs
    register_v0_v4_envs()
    register_v5_envs()
script = sys.argv[1]
sys.argv = [script] + sys.argv[3:]
sys.path.insert(0, __import__("os").path.dirname(script))
runpy.run_path(script, run_name="__main__")
"""


def patch(text: str) -> tuple[str, str]:
    """``text`` with its one buffer import replaced by mmreplay's; returns (new text, the line replaced).

    Raises ValueError unless exactly one line is one of ``BUFFER_IMPORTS`` (surrounding spaces aside)."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() in BUFFER_IMPORTS]
    if len(hits) != 1:
        raise ValueError(f"expected exactly one buffer import line ({' or '.join(BUFFER_IMPORTS)}), found {len(hits)}")
    i = hits[0]
    old = lines[i]
    indent = old[: len(old) - len(old.lstrip())]
    ending = old[len(old.rstrip("\r\n")):]
    lines[i] = indent + MMREPLAY_IMPORT + ending
    return "".join(lines), old.strip()


def cleanrl_root(script: str) -> str:
    """The directory above ``script`` that holds ``cleanrl_utils`` (CleanRL's checkout), else the script's."""
    d = os.path.dirname(os.path.abspath(script))
    for cand in (d, os.path.dirname(d)):
        if os.path.isdir(os.path.join(cand, "cleanrl_utils")):
            return cand
    return d


def status(pid: int) -> dict[str, int]:
    """RssAnon and VmRSS of ``pid`` in kB ({} once it is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("RssAnon", "VmRSS"):
                    out[key] = int(value.split()[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


@dataclass
class Result:
    name: str
    sps: int | None = None  # the script's last "SPS:" line
    wall: float = 0.0  # seconds, start to exit of the process
    rss_anon: int = 0  # kB, peak of the samples
    rss_anon_learn: int = 0  # kB, when the first "SPS:" line came (the first multiple of 100 past learning_starts)
    vm_rss: int = 0
    returns: list[tuple[int, float]] = field(default_factory=list)  # (global_step, episodic_return)


def run(name: str, script: str, python: str, env_id: str, args: list[str], cwd: str, pythonpath: str) -> Result:
    env = dict(os.environ, PYTHONPATH=pythonpath, TMPDIR=cwd)
    cmd = [python, "-c", BOOT, script, env_id, "--env-id", env_id, *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = {"RssAnon": 0, "VmRSS": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for k, v in status(proc.pid).items():
                peak[k] = max(peak[k], v)
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    res = Result(name)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        m = re.match(r"global_step=(\d+), episodic_return=\[?\s*([-\d.eE+]+)", line)
        if m:
            res.returns.append((int(m.group(1)), float(m.group(2))))
        m = re.match(r"SPS: (\d+)", line)
        if m:
            if res.sps is None:
                res.rss_anon_learn = status(proc.pid).get("RssAnon", 0)
            res.sps = int(m.group(1))
    rc = proc.wait()
    res.wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    if rc != 0:
        print("\n".join(tail), file=sys.stderr)
        raise SystemExit(f"{name}: exited {rc}")
    res.rss_anon, res.vm_rss = peak["RssAnon"], peak["VmRSS"]
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("script", help="your copy of CleanRL's cleanrl/dqn_atari.py")
    p.add_argument("--python", default=sys.executable, help="interpreter of CleanRL's environment")
    p.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    p.add_argument("--total-timesteps", type=int, default=3000)
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--buffer-size", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1, help="runs of each variant, alternating which goes first")
    p.add_argument("--dir", help="where the patched script and the runs' files go (default: a temporary one)")
    a = p.parse_args(argv)

    with open(a.script) as f:
        text = f.read()
    patched, old = patch(text)
    root = cleanrl_root(a.script)
    work = a.dir or tempfile.mkdtemp(prefix="cleanrl-dqn-")
    os.makedirs(work, exist_ok=True)
    variants = {}
    for name, body in (("cleanrl", text), ("mmreplay", patched)):
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, os.path.basename(a.script))  # same file name: same exp_name in the run name
        with open(path, "w") as f:
            f.write(body)
        variants[name] = (path, d)
    pythonpath = os.pathsep.join([root, REPO] + [x for x in [os.environ.get("PYTHONPATH")] if x])
    args = ["--seed", str(a.seed), "--total-timesteps", str(a.total_timesteps), "--learning-starts",
            str(a.learning_starts), "--buffer-size", str(a.buffer_size), "--no-cuda"]
    print(f"script {a.script} (sha256 {hashlib.sha256(text.encode()).hexdigest()[:12]}); changed line:")
    print(f"  - {old}\n  + {MMREPLAY_IMPORT}")
    print(f"runs in {work}; {a.env_id} {' '.join(args)}; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    results: list[Result] = []
    for r in range(a.rounds):
        order = ("cleanrl", "mmreplay") if r % 2 == 0 else ("mmreplay", "cleanrl")
        for name in order:
            path, d = variants[name]
            res = run(name, path, a.python, a.env_id, args, d, pythonpath)
            rets = [x for _, x in res.returns]
            print(f"round {r} {name:8s}: SPS {res.sps} (script), {a.total_timesteps / res.wall:.1f} steps/s"
                  f" (process, {res.wall:.0f} s), RssAnon {res.rss_anon / 1024:.0f} MB ({res.rss_anon_learn / 1024:.0f}"
                  f" MB at step {(a.learning_starts // 100 + 1) * 100}), VmRSS"
                  f" {res.vm_rss / 1024:.0f} MB, {len(rets)} episodes, returns {rets}, load"
                  f" {os.getloadavg()[0]:.2f}", flush=True)
            results.append(res)
    # the same seed: both variants play the same episodes until the first update (its batch differs)
    early = [[x for s, x in res.returns if s <= a.learning_starts] for res in results]
    same = all(e == early[0] for e in early)
    print(f"episodes ended by step {a.learning_starts} (before any update): "
          f"{'identical in every run' if same else 'DIFFERENT'}: {early[0]}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
