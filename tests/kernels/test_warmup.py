"""Kernels compiled ahead of the first batch: ``mmreplay warmup`` fills numba's cache so that a later
process samples without compiling, and a writable store warms the kernels in a background thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import mmreplay
from mmreplay.native import warmup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mmreplay.__file__)))

# A process that fills and samples stores of every kind the kernels are typed for (compressed and raw
# frames, uniform and prioritized, a reader opened read-only) and prints numba's cache hits and misses.
WORKLOAD = """
import json, os, sys
import numpy as np
import mmreplay as mr
from numba.core.registry import CPUDispatcher

for i, kw in enumerate([{}, {"prioritized": mr.Prioritized()}, {"compression": None},
                        {"compression": None, "prioritized": mr.Prioritized()}]):
    path = os.path.join(sys.argv[1], str(i))
    s = mr.ReplayStore.create(path, capacity=2048, obs_shape=(84, 84), stack=4, n_step=3, chunk_size=256, **kw)
    rng = np.random.default_rng(i)
    s.reset(rng.integers(0, 4, (84, 84), dtype=np.uint8))
    for t in range(700):
        s.step(1, 1.0, rng.integers(0, 4, (84, 84), dtype=np.uint8), False, t % 200 == 199)
        if t % 200 == 199:
            s.reset(rng.integers(0, 4, (84, 84), dtype=np.uint8))
    s.commit()
    b = s.sample(32)
    if "prioritized" in kw:
        s.update_priorities(b.index, np.ones(32))
    s.sample_sequences(8, 5, strict=True)
    it = s.batches(32, prefetch=2)
    for _ in range(4):
        next(it)
    s.close()
    with mr.ReplayStore.open(path, mode="r") as r:
        r.sample(32)
# a vector store whose streams are written apart (extend()): the plan's numpy path feeds the n-step kernel
v = mr.ReplayStore.create(os.path.join(sys.argv[1], "v"), capacity=512, obs_shape=(8, 8), num_envs=2, stack=2,
                          n_step=3, chunk_size=64)
for env, n in ((0, 50), (1, 20)):
    v.reset(np.zeros((8, 8), np.uint8), env=env)
    v.extend(np.zeros(n, np.int64), np.ones(n), np.ones((n, 8, 8), np.uint8), np.zeros(n, bool), np.zeros(n, bool),
             env=env)
v.sample(8)
v.close()
hits, misses = 0, []
for name, mod in list(sys.modules.items()):
    if name.startswith("mmreplay.native"):
        for k, v in vars(mod).items():
            if isinstance(v, CPUDispatcher) and v.__module__ == name:
                hits += sum(v.stats.cache_hits.values())
                misses += [f"{name}.{k}{sig}" for sig in v.stats.cache_misses]
print(json.dumps({"hits": hits, "misses": misses}))
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.update(extra)
    return env


def _python(code: str, *args: str, timeout: int = 600, **env: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=_env(**env), timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_warmup_fills_the_cache_and_a_later_process_compiles_nothing(tmp_path):
    cache = tmp_path / "numba-cache"
    done = subprocess.run([sys.executable, "-m", "mmreplay", "warmup", "--quiet", "--verbose"], capture_output=True,
                          text=True, env=_env(NUMBA_CACHE_DIR=str(cache)), timeout=900)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"{len(warmup.KERNELS)} kernels" in lines[-2]
    assert lines[-1].startswith(f"cache: {cache}") and "(NUMBA_CACHE_DIR)" in lines[-1]
    for k in warmup.KERNELS:  # a line per kernel, and numba's index file of each in the cache
        assert any(line.split()[0] == f"{k.module}.{k.name}" for line in lines[:-2])
        func = warmup.dispatcher(k.module, k.name).py_func.__name__  # (crc32c is one of two kernels, by CPU)
        assert any(f.name.startswith(f"{k.module}.{func}-") and f.name.endswith(".nbi") for f in cache.rglob("*"))

    again = subprocess.run([sys.executable, "-m", "mmreplay", "warmup", "--quiet"], capture_output=True, text=True,
                           env=_env(NUMBA_CACHE_DIR=str(cache)), timeout=900)
    assert again.returncode == 0, again.stderr
    assert "(0 compiled," in again.stdout  # everything loaded from the cache the first run filled

    stores = tmp_path / "stores"
    stores.mkdir()
    out = _python(WORKLOAD, str(stores), NUMBA_CACHE_DIR=str(cache), MMREPLAY_WARMUP="0")
    counts = json.loads(out.stdout.splitlines()[-1])
    assert counts["misses"] == []  # every kernel the stores called was in the cache: none compiled
    assert counts["hits"] > 0


def test_warmup_without_the_jit_says_nothing_compiles():
    done = subprocess.run([sys.executable, "-m", "mmreplay", "warmup"], capture_output=True, text=True,
                          env=_env(NUMBA_DISABLE_JIT="1"), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "NUMBA_DISABLE_JIT=1): nothing to compile" in done.stdout


def test_background_warmup_starts_once_and_finishes():
    bg = warmup.Background()
    thread = bg.start()
    assert thread is not None and thread.daemon and thread.name == "mmreplay-warmup"
    assert bg.start() is None  # once per process
    thread.join(timeout=600)
    assert not thread.is_alive()
    assert bg.error is None
    assert [c.kernel for c in bg.done] == [f"{k.module}.{k.name}" for k in warmup.KERNELS]
    for k in warmup.KERNELS:
        assert warmup.dispatcher(k.module, k.name).signatures  # compiled (or loaded) in this process


def test_background_warmup_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("MMREPLAY_WARMUP", "0")
    bg = warmup.Background()
    assert bg.start() is None and bg.thread is None


def test_a_writable_store_starts_the_warmup_and_a_reader_does_not(tmp_path):
    import numpy as np

    path = str(tmp_path / "s")
    with mmreplay.ReplayStore.create(path, capacity=64, obs_shape=(4,), chunk_size=16) as s:
        s.reset(np.zeros(4, np.uint8))
        for t in range(20):
            s.step(0, 1.0, np.full(4, t, np.uint8), False, False)
    code = """
        import sys
        import mmreplay as mr
        from mmreplay.native import warmup

        with mr.ReplayStore.open(sys.argv[1], mode="r", seed=7) as r:
            before = r.sample(8).obs.tolist()
        print(warmup.BACKGROUND.thread is None)
        with mr.ReplayStore.open(sys.argv[1], seed=7) as w:
            thread = warmup.BACKGROUND.thread
            print(thread is not None and thread.name)
            during = w.sample(8).obs.tolist()  # while it may still compile: the batch a reader draws
        thread.join(timeout=600)
        print(len(warmup.BACKGROUND.done), warmup.BACKGROUND.error, during == before)
    """
    out = _python(code, path).stdout.splitlines()
    raw_uniform = [k for k in warmup.KERNELS if k.needs <= warmup.store_tags(compressed=False, prioritized=False)]
    assert len(raw_uniform) < len(warmup.KERNELS)  # (no sum tree, no LZ4 encoder)
    assert out == ["True", "mmreplay-warmup", f"{len(raw_uniform)} None True"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_the_warmup_compiles_does_not_deadlock(tmp_path):
    # With an empty cache the warm-up is compiling when the process forks; the child's first kernel call
    # needs numba's compile lock, which the fork must not have left held by the warm-up thread.
    code = """
        import os, time
        import numpy as np
        from mmreplay.native import warmup

        thread = warmup.start_background()
        while not warmup.BACKGROUND.done and thread.is_alive():
            time.sleep(0.01)
        time.sleep(0.05)  # (inside a later kernel's compile)
        pid = os.fork()
        if pid == 0:
            from mmreplay.native.crc32c import crc32c
            os._exit(0 if crc32c(np.zeros(8, np.uint8), 0, 8) == crc32c(np.zeros(8, np.uint8), 0, 8) else 3)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print(os.waitstatus_to_exitcode(status))
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            print("deadlocked")
    """
    out = _python(code, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    assert out.stdout.split() == ["0"]
