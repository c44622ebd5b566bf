"""A background daemon thread started on first use (live parity, payload capture): a server
that never samples a request never starts one."""

from __future__ import annotations

import threading
from collections.abc import Callable


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
