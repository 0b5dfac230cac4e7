"""Run a test's scenario in a fresh interpreter, so that a regression that crashes (SIGSEGV) or hangs (a
fork child waiting for a thread it does not have) fails that test instead of killing or stalling pytest."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_scenario(module: str, function: str, *args: object, timeout: float = 120,
                 env: dict[str, str] | None = None) -> str:
    """``module.function(*args)`` (a dotted module of the repository, e.g. ``tests.store.test_fork``; ``args`` as their ``repr``) in a new interpreter
    with this tree first on the path; its output. Fails the calling test (``AssertionError``) when it
    exits non-zero, is killed by a signal, or runs past ``timeout`` seconds."""
    code = (f"import sys; sys.path[:0] = [{REPO!r}]\n"
            f"import {module}\n{module}.{function}({', '.join(repr(a) for a in args)})\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              env=None if env is None else {**os.environ, **env})
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{module}.{function} did not end within {timeout} s (a hang);"
                             f" output so far:\n{exc.stdout!r}\n{exc.stderr!r}") from None
    assert proc.returncode == 0, (f"{module}.{function} exited with {proc.returncode}"
                                  f" ({'signal ' + str(-proc.returncode) if proc.returncode < 0 else 'an error'}):"
                                  f"\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout
