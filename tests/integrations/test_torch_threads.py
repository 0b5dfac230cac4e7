"""Sampling in a process that also runs PyTorch leaves PyTorch's threading as the user set it, and leaves no
thread spinning: after ``sample()``, a one-thread PyTorch loop is the only thing using CPU in the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

CHILD = textwrap.dedent("""
    import json, os, sys, threading, time
    import numpy as np
    import torch

    torch.set_num_threads(1)
    import mmreplay as mr

    def cpu_by_thread():
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return out

    path = sys.argv[1]
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (600, 84, 84), np.uint8)
    with mr.ReplayStore.create(path, capacity=500, obs_shape=(84, 84), stack=4, n_step=3, chunk_size=64,
                               seed=0, read_threads=2) as s:
        s.reset(frames[0])
        for t in range(1, 600):
            s.step(0, 1.0, frames[t], t % 100 == 0, False)
            if t % 100 == 0:
                s.reset(frames[t])
        s.commit()
        x = torch.randn(256, 256)
        for _ in range(300):
            b = s.sample(64)
            torch.from_numpy(b.obs).float().mean()  # a PyTorch op right after each batch
            x = torch.tanh(x @ x / 256)
        it = s.batches(64, prefetch=2)
        for _ in range(100):
            next(it)
            x = torch.tanh(x @ x / 256)
        it.close()
        threads_after = torch.get_num_threads()
        me = threading.get_native_id()
        before = cpu_by_thread()
        t0 = time.time()
        while time.time() - t0 < 1.5:  # a one-thread PyTorch learner, no sampling
            x = torch.tanh(x @ x / 256)
        after = cpu_by_thread()
        others = {t: after[t] - before.get(t, 0.0) for t in after if t != me}
        print(json.dumps({"torch_threads": threads_after, "main": after[me] - before[me],
                          "others": max(others.values(), default=0.0), "n_threads": len(after)}))
""")


@pytest.mark.parametrize("omp_env", [False, True])
def test_sampling_keeps_torch_at_one_thread_and_leaves_no_thread_busy(tmp_path, omp_env):
    env = dict(os.environ)
    if omp_env:
        env["OMP_NUM_THREADS"] = "1"
    else:
        env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "s")], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["torch_threads"] == 1  # torch.set_num_threads(1) still holds after sampling
    assert got["main"] > 0.05  # the learner's thread ran (CPU seconds over the 1.5 s window)
    # no other thread of the process used CPU meanwhile: no OpenMP team or reader spinning (one clock tick
    # of slack: a helper that wakes up once to find nothing to do)
    assert got["others"] <= 0.02, got
