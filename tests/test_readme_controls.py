"""The README's sections on rate limiting, invalidating, quantize and tables run as written, each in a
fresh interpreter and an empty directory that they leave empty, and do what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests._support.helpers import require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ["Rate limiting across processes", "Invalidating and clearing", "Float frames as bytes (`quantize=True`)",
            "The buffer as a table"]


def block(heading: str) -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert f"\n## {heading}\n" in text, f"README.md has no section '## {heading}'"
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block under '## {heading}'"
    return match.group(1)


@pytest.mark.parametrize("heading", SECTIONS)
def test_section_runs(tmp_path, heading):
    if heading == "The buffer as a table":
        require("pandas")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", block(heading)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not left, f"the block under '## {heading}' leaves {left} behind: remove what it makes"
    if heading.startswith("Rate limiting"):
        ratio = float(done.stdout.split()[0])
        assert 3.0 < ratio <= 4.0 + 64 / 2000  # within the error buffer of samples_per_insert
        assert done.stdout.rstrip().endswith("of 2,000 inserted"), done.stdout
    if heading.startswith("The buffer"):
        sums = [float(line.split()[1]) for line in done.stdout.splitlines()[1:4]]
        assert sums == [sum(float(t % 7) for t in range(a, a + 20)) for a in (1, 21, 41)]
