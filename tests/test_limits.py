"""Sizes meant to exhaust memory or hang (issue 12, item 3): refused before anything is created or
allocated, at once, with an error that names the parameter and the bound."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_limited(code: str, timeout: float = 60, address_space: int = 4 << 30) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with this tree first on the path and its address space capped,
    so a regression fails the test (MemoryError, timeout) instead of the machine."""
    prelude = (f"import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}));"
               f" sys.path.insert(0, {REPO!r})\n")
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("kw,words", [
    (dict(n_step=10**6), ["n_step=1,000,000", "at most 1,000"]),
    (dict(stack=10**6), ["stack=1,000,000", "at most 1,000"]),
    (dict(capacity=10, chunk_size=10**9), ["chunk_size=1,000,000,000", "capacity=10", "chunk_size <= 4,096"]),
    (dict(obs_shape=(10**6, 10**6)), ["obs_shape", "bytes per row", "256 MiB"]),
    (dict(capacity=10**11, chunk_size=10**8), ["capacity=100,000,000,000", "in-RAM index", "GiB"]),
    (dict(obs_shape=(2**20,), obs_dtype="float64", capacity=10**8, chunk_size=2**22),
     ["address space", "TiB"]),
])
def test_resource_bombs_at_create_are_refused_at_once(tmp_path, kw, words):
    args = dict(capacity=10, obs_shape=(2,))
    args.update(kw)
    code = f"""
        import time, os, mmreplay as mr
        t = time.perf_counter()
        try:
            mr.ReplayStore.create({str(tmp_path / 's')!r}, **{args!r})
        except ValueError as exc:
            print("REFUSED", time.perf_counter() - t, exc)
        else:
            print("CREATED")
        print("EXISTS" if os.path.exists({str(tmp_path / 's')!r}) else "ABSENT")
    """
    r = run_limited(code, timeout=30)
    assert r.stdout.startswith("REFUSED"), (r.stdout, r.stderr[-2000:])
    assert float(r.stdout.split()[1]) < 0.5
    for w in words:
        assert w in r.stdout, (w, r.stdout)
    assert r.stdout.split()[-1] == "ABSENT"
