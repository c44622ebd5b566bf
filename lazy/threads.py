"""A large call's chunks spread over the cores the process may use.

A call of more rows than one bucket runs as several chunks (:meth:`Buckets.chunks`), each its
own executable call: XLA executables and the host's numba kernels release the GIL while they
run, so chunks on different threads run on different cores. One pool is shared by every
compiled graph of the process, sized to its cores less one (each caller works too), so calls
made at once (two models' large batches) never add up to more busy threads than cores plus
their callers. The chunks are the same as a single thread's, so every answer is the same.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_local = threading.local()


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _mark_worker() -> None:
    _local.worker = True


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=max(available_cores() - 1, 1),
                thread_name_prefix="kestrel-chunks",
                initializer=_mark_worker,
            )
        return _pool


def _run_all(jobs: Sequence[Callable[[], None]]) -> None:
    for job in jobs:
        job()


def spread(jobs: Sequence[Callable[[], None]], threads: int) -> None:
    """Run every job once, at most ``threads`` at a time: the caller runs one share, the shared
    pool the others (every ``threads``-th job each). Inline, in order, where ``threads`` is 1,
    there is one job, or the caller is itself one of the pool's threads. A share stops at its
    first failure, which is raised once every share has finished."""
    if threads <= 1 or len(jobs) <= 1 or getattr(_local, "worker", False):
        _run_all(jobs)
        return
    k = min(threads, len(jobs))
    shares = [jobs[i::k] for i in range(k)]
    pool = _shared_pool()
    futures = [pool.submit(_run_all, share) for share in shares[1:]]
    try:
        _run_all(shares[0])
    finally:
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error


class SpreadChoice:
    """Whether spreading one graph's chunks over threads pays, learned from its own calls.

    Chunks that hold the GIL (numpy's per-op dispatch on small arrays) run slower spread; a
    forest's numba kernels or XLA executables run nearly twice as fast on two cores. Each call
    wide enough to tell (a chunk per thread at least) is timed per chunk, and an estimate of
    seconds per chunk is kept for either way (an exponential average, so a machine's load at
    one moment does not decide for good). The first such call runs sequentially, the second
    spread; after that the faster way runs, and every :data:`EXPLORE`-th call the other, to keep
    its estimate fresh. Spreading must take under :data:`MARGIN` of the sequential time.
    """

    EXPLORE = 16
    MARGIN = 0.95
    WEIGHT = 0.3  # of a new measurement in the average

    def __init__(self) -> None:
        self._seconds: dict[bool, float] = {}  # per chunk: spread (True) or not (False)
        self._calls = 0

    @property
    def pays(self) -> bool | None:
        """Whether spreading is the faster way now (None: not measured both ways yet)."""
        if len(self._seconds) < 2:
            return None
        return self._seconds[True] < self.MARGIN * self._seconds[False]

    def choose(self) -> bool:
        """Whether to spread the next wide call."""
        self._calls += 1
        pays = self.pays
        if pays is None:
            return False in self._seconds  # sequential first, then spread
        return pays != (self._calls % self.EXPLORE == 0)

    def record(self, spreading: bool, seconds_per_chunk: float) -> None:
        before = self._seconds.get(spreading)
        self._seconds[spreading] = (
            seconds_per_chunk
            if before is None
            else before + self.WEIGHT * (seconds_per_chunk - before)
        )
