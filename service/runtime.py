"""What a serving process prepares at start, off the request path.

The first registration of a fresh process would otherwise wait for one-time work: importing
skops and its trusted types, starting the JAX backend, and building the native host kernels
(:func:`lazy.warm_kernels`; seconds on a cold numba cache, which lives beside the executable
cache). A background thread does it as the server starts; a registration that arrives meanwhile
waits only for what is still under way (imports and numba compiles are locked, never repeated).
"""

from __future__ import annotations

import logging
import threading
import time

import lazy as lz
from service import artifacts

log = logging.getLogger("kestrel.runtime")


def prepare(backend: str = "jax") -> dict[str, float]:
    """Do the one-time work of a first model load now; the seconds each step took."""
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    import skops.io  # noqa: F401  (the import is the work)

    artifacts.trusted_types()
    seconds["skops"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lz.get_backend(backend).fingerprint()  # starts the backend's client and devices
    seconds["backend"] = time.perf_counter() - t0
    seconds["native kernels"] = lz.warm_kernels()
    return seconds


def start_preparing(backend: str = "jax") -> threading.Thread:
    """:func:`prepare` on a daemon thread; a failure is logged, never fatal (a model load then
    does the same work itself, and reports what fails there)."""

    def run() -> None:
        try:
            seconds = prepare(backend)
        except Exception:
            log.exception("preparing the runtime failed; the first model load does it instead")
            return
        steps = ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items())
        log.info("runtime prepared: %s", steps)

    thread = threading.Thread(target=run, name="kestrel-prepare", daemon=True)
    thread.start()
    return thread
