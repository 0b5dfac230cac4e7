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
import hashlib
import os
from typing import Any


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


def _kernel_sources_digest(folder: str) -> bytes:
    """A hash of every module of ``folder`` (names and contents)."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.digest()


def _package_locator(base: Any, folder: str, digest: bytes) -> Any:
    """numba's cache locator ``base``, for the kernels of ``folder`` only, stamped with ``digest``."""

    class PackageLocator(base):
        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if os.path.dirname(os.path.abspath(py_file)) != folder:
                return None  # another package's function: numba's own locators
            return super().from_function(py_func, py_file)

        def get_source_stamp(self) -> bytes:
            return digest

    PackageLocator.__name__ = PackageLocator.__qualname__ = f"MmreplayKernels{base.__name__.lstrip('_')}"
    return PackageLocator


def _stamp_cache_by_package() -> None:
    """numba keys a cached kernel by its own module's source only, not by the modules of the kernels it
    calls: after an upgrade that changed ``lz4.py`` but not ``crew.py``, ``crew``'s kernels would load machine
    code with the old ``lz4`` compiled in. So the kernels of this folder are cached under one stamp, a hash
    of all of its modules: any change to any of them compiles every kernel afresh. The locators keep
    numba's order (``NUMBA_CACHE_DIR``, ``__pycache__``, the user-wide folder) and its folders; where numba's
    caching module is not laid out as expected, nothing changes."""
    try:
        from numba.core import caching
    except ImportError:  # pragma: no cover - numba is a dependency
        return
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    classes = getattr(impl, "_locator_classes", None)
    if not isinstance(classes, list) or any(c.__name__.startswith("MmreplayKernels") for c in classes):
        return
    folder = os.path.dirname(os.path.abspath(__file__))
    try:
        digest = _kernel_sources_digest(folder)
    except OSError:  # (a frozen or zipped install: numba's own stamps)
        return
    ours = []
    for name in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator"):
        base = getattr(caching, name, None) or getattr(caching, "_" + name, None)
        if base is None or not hasattr(base, "get_source_stamp"):
            return
        ours.append(_package_locator(base, folder, digest))
    classes[:0] = ours


_stamp_cache_by_package()
