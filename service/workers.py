"""Background work off the request path: a daemon thread started on first use (a server that
never samples a request never starts one), and a worker that takes sampled items from a bounded
queue within a CPU budget (live parity, data-quality monitoring)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")


class LazyThread:
    """``target`` on a daemon thread named ``name``, started by the first :meth:`ensure`."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self._target, self._name = target, name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def ensure(self) -> None:
        """Start the thread unless it runs already (safe from any thread)."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._target, name=self._name, daemon=True
                    )
                    self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


class BudgetedWorker(Generic[Item]):
    """Items handled one by one on a :class:`LazyThread`, from a queue of at most ``capacity``.
    After each item the thread sleeps long enough to use at most ``cpu`` of one core. A handler
    that raises has ``on_error`` called with the item and the exception; the worker goes on."""

    def __init__(
        self,
        handle: Callable[[Item], None],
        on_error: Callable[[Item, Exception], None],
        *,
        name: str,
        capacity: int,
        cpu: float,
    ) -> None:
        self._handle, self._on_error, self.cpu = handle, on_error, cpu
        self._queue: queue.Queue[Item | None] = queue.Queue(capacity)
        self._thread = LazyThread(self._work, name)

    def submit(self, item: Item) -> bool:
        """Queue ``item`` without waiting; False (nothing queued) if the queue is full."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            return False
        self._thread.ensure()
        return True

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            t0 = time.perf_counter()
            try:
                self._handle(item)
            except Exception as exc:  # the item's trouble: reported, never raised
                self._on_error(item, exc)
            busy = time.perf_counter() - t0
            time.sleep(busy * (1.0 / self.cpu - 1.0))

    def close(self) -> None:
        """Stop the thread (items still queued are left)."""
        if self._thread.started:
            while True:
                try:
                    self._queue.put_nowait(None)
                    break
                except queue.Full:  # make room: the queued items are left anyway
                    with contextlib.suppress(queue.Empty):
                        self._queue.get_nowait()
            self._thread.join(5)
