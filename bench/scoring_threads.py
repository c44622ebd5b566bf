"""One thread count for every system in a benchmark run, restored afterwards.

XLA reads ``XLA_FLAGS`` once, when jax initialises its CPU client, so pinning must happen before
jax is imported; OpenMP/BLAS pools read their environment variables when first loaded. What was
already loaded is limited through threadpoolctl and torch's own setters, and a note says what
could not be pinned (e.g. jax imported earlier in the same process, as under pytest).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "XLA_FLAGS")
_ONE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false"


@dataclass
class Pins:
    """The pinned thread count; :meth:`sync` applies it to libraries imported since entry."""

    threads: int
    notes: list[str] = field(default_factory=list)
    _torch_threads: int | None = None
    _limits: Any = None

    def sync(self) -> None:
        """Limit torch and every OpenMP/BLAS pool loaded so far to ``threads``."""
        if "torch" in sys.modules:
            import torch

            if self._torch_threads is None:
                self._torch_threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            with contextlib.suppress(RuntimeError):  # only before torch's first parallel work
                torch.set_num_interop_threads(1)
        from threadpoolctl import threadpool_limits

        if self._limits is not None:
            self._limits.restore_original_limits()
        self._limits = threadpool_limits(limits=self.threads)

    def restore(self) -> None:
        if self._limits is not None:
            self._limits.restore_original_limits()
        if self._torch_threads is not None:
            import torch

            torch.set_num_threads(self._torch_threads)


@contextlib.contextmanager
def pinned_threads(threads: int) -> Iterator[Pins]:
    """Run the body with ``threads`` threads (and CPUs) for numpy, XLA, torch and ONNX Runtime."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    saved_env = {k: os.environ.get(k) for k in _ENV}
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    pins = Pins(threads)
    if affinity is not None and threads > len(affinity):
        raise ValueError(f"--threads {threads}: this process may use only {len(affinity)} CPU(s)")
    for name in _ENV[:3]:
        os.environ[name] = str(threads)
    if threads == 1:
        # Appended as a separate token: XLA ignores the whole string if any token is unknown.
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_ONE_THREAD_XLA}".strip()
    if "jax" in sys.modules:
        pins.notes.append(
            "jax was imported before the threads were pinned: XLA's CPU thread pool is sized by "
            "the CPU affinity of that moment, not by --threads"
        )
    if affinity is not None:
        os.sched_setaffinity(0, affinity[:threads])
    try:
        pins.sync()
        yield pins
    finally:
        pins.restore()
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
