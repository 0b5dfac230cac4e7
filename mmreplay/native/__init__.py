"""Native kernels for the per-batch hot paths, compiled by numba (wheels only; no compiler needed).

Every kernel here has a numpy reference implementation elsewhere in the package that the tests
compare it against. Kernels are compiled on first use and cached on disk (``cache=True``), so a
second process does not compile them again.
"""
