"""Native host kernels: numba, where it is installed, compiles the loops the numpy backend runs
for ops whose tensor formulations would cost many numpy calls per row (FOREST_SUM, COUPLE).

numba is imported only when a graph first needs a kernel (the import is slow): :data:`AVAILABLE`
is checked without importing it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time
from collections.abc import Callable
from typing import Any

#: Whether native kernels can be built (numba importable).
AVAILABLE = importlib.util.find_spec("numba") is not None


def numba_version() -> str:
    """The installed numba's version (without importing it)."""
    return importlib.metadata.version("numba")


def compile_kernel(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by numba: ``nogil`` (a batch scored on a worker thread leaves the event
    loop free) and cached on disk (each dtype combination is slow to compile) where numba finds a
    writable place: NUMBA_CACHE_DIR, the package's __pycache__, or the user's cache directory.
    On a read-only filesystem without one it is compiled once per process instead. Float
    arithmetic is IEEE's, as in numpy and XLA (numba's default raises on a division by zero)."""
    import numba

    options = {"nogil": True, "error_model": "numpy"}
    try:
        return numba.njit(cache=True, **options)(fn)  # type: ignore[no-any-return]
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(**options)(fn)  # type: ignore[no-any-return]


def build_on_tables(encode: Callable[[Any], object]) -> float:
    """Call ``encode`` (a host encoding backed by a kernel) on a one-value float64 table,
    writable and then read-only, so that numba builds the kernel for both (a read-only array,
    one a client's bytes back, is a type of its own; other layouts are the caller's to copy
    row-major); the seconds it took, 0 without numba."""
    if not AVAILABLE:
        return 0.0
    import numpy as np

    t0 = time.perf_counter()
    for writeable in (True, False):
        table = np.zeros((1, 1))
        table.flags.writeable = writeable
        encode(table)
    return time.perf_counter() - t0


_FLOAT32_BITS: Any = None


def float32_bits() -> Callable[..., Any]:
    """A numba intrinsic for kernels: a float32's bits as an int32, reinterpreted in a register.
    Kernels that need both views of an array otherwise pass it twice (``a`` and
    ``a.view(np.int32)``), and two views of one buffer stop LLVM vectorizing the loop."""
    global _FLOAT32_BITS
    if _FLOAT32_BITS is None:
        from numba import types
        from numba.extending import intrinsic

        @intrinsic  # type: ignore[misc]
        def bits(typingctx: Any, value: Any) -> Any:
            if value != types.float32:
                return None

            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                return builder.bitcast(args[0], context.get_value_type(types.int32))

            return types.int32(types.float32), codegen

        _FLOAT32_BITS = bits
    return _FLOAT32_BITS  # type: ignore[no-any-return]
