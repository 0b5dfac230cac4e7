"""Native kernels for the per-batch hot paths, compiled by numba (wheels only; no compiler needed).

Every kernel here has a numpy reference implementation elsewhere in the package that the tests
compare it against. Kernels are compiled on first use and cached on disk (``cache=True``), so a
second process does not compile them again.

Where numba does not compile (``NUMBA_DISABLE_JIT=1``: ``jit_enabled``) every caller takes the numpy
path. No kernel is ``parallel=True``: numba's threading layers (OpenMP, TBB) are never loaded, so neither
``NUMBA_THREADING_LAYER`` nor a missing TBB can break sampling, and nothing is shared with another OpenMP
user in the process (``crew.py`` shares reads between threads of its own).
"""

from __future__ import annotations

import functools


@functools.cache
def jit_enabled() -> bool:
    """Whether numba compiles the kernels of this package. Not under ``NUMBA_DISABLE_JIT=1``: numba then calls
    them as Python functions, and those built on LLVM intrinsics (``_mem``: the LZ4 and CRC kernels) cannot
    run at all while the others would run orders of magnitude slower. Every place that chooses a kernel
    takes its numpy path instead (the references the tests compare the kernels with, bit for bit)."""
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return False
    return not getattr(numba.config, "DISABLE_JIT", False)
