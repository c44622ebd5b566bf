"""The process's one-time work, done as the server starts rather than by its first model load.

Every load needs skops and its trusted types imported and the JAX backend started: that is the
loader thread's first job (``Loader.prepare_runtime``), so loads queue behind it rather than
share the interpreter with it, since both are mostly Python under one GIL. The native host
kernels (:func:`compiler.warm_kernels`; seconds on a cold numba cache, which lives beside the
executable cache) only some models run (trees, SVC, and host encodings for trees), so they are
built on a thread of their own once the runtime is prepared and the stored versions are loaded
(:func:`start_building_kernels`): neither contends with them, and a registration that arrives
meanwhile waits only for the kernels it runs (numba compiles are locked, never repeated).
"""

from __future__ import annotations

import logging
import threading
import time

import compiler
import lazy as lz
from service import artifacts

log = logging.getLogger("kestrel.runtime")


def prepare(backend: str = "jax") -> dict[str, float]:
    """Do the one-time work every model load needs now; the seconds each step took."""
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    import skops.io  # noqa: F401  (the import is the work)

    artifacts.trusted_types()
    seconds["skops"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lz.get_backend(backend).fingerprint()  # starts the backend's client and devices
    seconds["backend"] = time.perf_counter() - t0
    return seconds


def prepare_logged(backend: str = "jax") -> None:
    """:func:`prepare`, its steps logged; a failure is logged, never raised (a model load then
    does the same work itself, and reports what fails there)."""
    try:
        seconds = prepare(backend)
    except Exception:
        log.exception("preparing the runtime failed; the first model load does it instead")
        return
    steps = ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items())
    log.info("runtime prepared: %s", steps)


#: Set as the server stops: the kernel build starts no further family.
_stopping = threading.Event()


def start_building_kernels() -> threading.Thread:
    """:func:`compiler.warm_kernels`, family by family, on a thread of its own; a failure is
    logged, never fatal (a model that runs a kernel then builds it itself). Not a daemon: a
    process that finalizes while numba compiles (a SIGTERM soon after start, on a cold cache)
    aborts inside LLVM; it waits for the family in the works instead, and
    :func:`stop_building_kernels` keeps it from starting the next."""
    _stopping.clear()

    def run() -> None:
        seconds = 0.0
        try:
            for build in compiler.kernels.KERNEL_BUILDS:
                if _stopping.is_set():
                    log.info("stopped building the native kernels: the server is stopping")
                    return
                seconds += build()
        except Exception:
            log.exception("building the native kernels failed; the models that run them do")
            return
        log.info("native kernels ready: %.2f s", seconds)

    thread = threading.Thread(target=run, name="kestrel-kernels", daemon=False)
    thread.start()
    return thread


def stop_building_kernels() -> None:
    """Let the kernel build end after the family in the works (see start_building_kernels)."""
    _stopping.set()
