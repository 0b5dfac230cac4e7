"""``python -m mmreplay`` is the ``mmreplay`` command: same output, same exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

import mmreplay as mr
from mmreplay.cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "mmreplay", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_python_dash_m_runs_the_command(tmp_path, capsys):
    path = str(tmp_path / "s")
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(1,))
    s.reset(np.zeros(1, np.uint8))
    s.step(0, 1.0, np.ones(1, np.uint8), True, False)
    s.close()
    done = _run("verify", path)
    assert main(["verify", path]) == 0
    assert done.returncode == 0 and done.stdout == capsys.readouterr().out and "ok" in done.stdout
    assert _run("--version").stdout.strip() == f"mmreplay {mr.__version__}"
    missing = _run("info", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and missing.stderr.startswith("mmreplay info: error:")
    assert "usage: mmreplay" in _run("--help").stdout
