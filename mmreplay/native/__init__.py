"""Native kernels for the per-batch hot paths, compiled by numba (wheels only; no compiler needed).

Every kernel here has a numpy reference implementation elsewhere in the package that the tests
compare it against. Kernels are compiled on first use and cached on disk (``cache=True``), so a
second process does not compile them again.

Where numba does not compile (``NUMBA_DISABLE_JIT=1``: ``jit_enabled``) every caller takes the numpy
path; where the threading layer asked for cannot load (``NUMBA_THREADING_LAYER=tbb`` without TBB:
``parallel_layer_loadable``) nothing launches a ``parallel=True`` kernel.
"""

from __future__ import annotations

import functools
import importlib

# numba's threading layers a ``NUMBA_THREADING_LAYER`` value may load, in numba's order of preference
# (``forksafe`` on Linux: GNU OpenMP is not fork-safe, so TBB or the workqueue)
_LAYERS = {"tbb": ("tbb",), "omp": ("omp",), "workqueue": ("workqueue",), "safe": ("tbb",),
           "threadsafe": ("tbb", "omp"), "forksafe": ("tbb", "workqueue")}
_MODULES = {"tbb": "tbbpool", "omp": "omppool", "workqueue": "workqueue"}


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


@functools.cache
def parallel_layer_loadable() -> bool:
    """Whether numba can load the threading layer ``NUMBA_THREADING_LAYER`` asks for, which ``parallel=True``
    kernels need (``tbb`` or ``safe`` without the TBB library: no). Found by importing the layer's module,
    which starts no thread; where it cannot load, every launch would raise "Threading layer is not
    initialized", so nothing launches one."""
    if not jit_enabled():
        return False
    import numba

    layer = str(getattr(numba.config, "THREADING_LAYER", "default")).lower()
    if layer == "default":
        return True  # numba falls back to its workqueue layer, which always loads
    for name in _LAYERS.get(layer, ()):
        try:
            if name == "tbb":
                from numba.np.ufunc.parallel import _check_tbb_version_compatible

                _check_tbb_version_compatible()
            importlib.import_module("numba.np.ufunc." + _MODULES[name])
        except Exception:  # ImportError (a missing library), ValueError (an incompatible TBB)
            continue
        return True
    return False
