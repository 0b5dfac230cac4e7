"""The kernels' disk cache follows every module of ``mmreplay/native``: a change to one module (here ``_mem.py``,
whose intrinsics ``crc32c.py`` compiles in) makes every kernel compile afresh, where numba alone would load
``crc32c``'s old machine code (it stamps a cached kernel with its own module's source only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import mmreplay
from mmreplay.native import _kernel_sources_digest, jit_enabled

pytestmark = pytest.mark.skipif(not jit_enabled(), reason="nothing is compiled or cached under NUMBA_DISABLE_JIT=1")

CHILD = """
import json, numpy as np
from mmreplay.native import crc32c
crc32c.crc32c(np.arange(64, dtype=np.uint8), 0, 64)
s = crc32c.crc32c.stats
print(json.dumps([sum(s.cache_hits.values()), sum(s.cache_misses.values()), s.cache_path]))
"""


def _run(root: str) -> tuple[int, int, str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = root
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=root,
                         check=True, timeout=300)
    hits, misses, path = json.loads(out.stdout.strip().splitlines()[-1])
    return hits, misses, path


def test_a_change_to_another_kernel_module_compiles_the_kernels_afresh(tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(os.path.dirname(mmreplay.__file__), root / "mmreplay",
                    ignore=shutil.ignore_patterns("__pycache__"))
    native = str(root / "mmreplay" / "native")
    assert _run(str(root))[1] == 1  # compiled and cached
    hits, misses, path = _run(str(root))
    assert (hits, misses) == (1, 0) and path.startswith(native)  # loaded from the copy's own cache
    with open(os.path.join(native, "_mem.py"), "a") as f:
        f.write("\n# changed\n")
    assert _run(str(root))[:2] == (0, 1)  # crc32c.py is unchanged, but what it compiles in changed


def test_the_stamp_covers_every_module_of_the_folder(tmp_path):
    for name, text in (("a.py", "x = 1\n"), ("b.py", "y = 2\n"), ("notes.txt", "not a module\n")):
        (tmp_path / name).write_text(text)
    first = _kernel_sources_digest(str(tmp_path))
    (tmp_path / "notes.txt").write_text("changed\n")
    assert _kernel_sources_digest(str(tmp_path)) == first
    (tmp_path / "b.py").write_text("y = 3\n")
    assert _kernel_sources_digest(str(tmp_path)) != first
