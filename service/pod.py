"""A worker process of ``kestrel serve --workers N`` and what it shares with its siblings.

The supervisor (service/supervisor.py) makes one pod directory per run, exports its path as
:data:`POD_DIR_ENV`, and starts the workers, each of which builds its application with
:func:`create_worker_app`. The directory holds:

- ``board``: a slot per worker (service/pod_board.py): the pod-wide scoring in-flight count and
  the store generations each worker wrote and applied (service/pod_sync.py);
- ``snapshots/``: each worker's metrics, combined by a scrape (service/pod_metrics.py);
- ``locks/``: start-up work done by one worker at a time (registering a preloaded or demo model).

Every worker is a replica of the same store and shares the executable cache's disk layer: the
first to compile a bucket writes it, the others read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.pod_board import Board, locked
from service.pod_metrics import PodMetrics
from service.pod_sync import PodSync
from service.shedding import SheddingHttpProtocol

if TYPE_CHECKING:
    from fastapi import FastAPI

    from service.metrics import Metrics
    from service.models import ModelManager

#: The environment variable naming the pod directory, set by the supervisor for its workers.
POD_DIR_ENV = "KESTREL_POD_DIR"


def store_lock(root: Path) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """The lock the workers of the pod at ``root`` take around each store mutation: writes
    through different workers then never lose one another (service/store.py)."""
    return functools.partial(locked, root / "locks" / "store")


def prepare(root: Path, workers: int) -> None:
    """Lay out an empty pod directory for ``workers`` workers (the supervisor, once)."""
    for sub in ("snapshots", "locks"):
        (root / sub).mkdir()
    # Room beyond N: a replacement worker may start before its dead predecessor is reaped,
    # and uvicorn adds a worker on SIGTTIN.
    Board.create(root / "board", slots=max(2 * workers, 8))


@dataclass(frozen=True)
class PodWorker:
    """This worker's membership of the pod."""

    root: Path
    board: Board
    sync: PodSync
    metrics: PodMetrics

    @classmethod
    def join(
        cls, root: Path, board: Board, manager: ModelManager, metrics: Metrics, settle_s: float
    ) -> PodWorker:
        return cls(root, board, PodSync(board, manager, settle_s), PodMetrics(root, board, metrics))

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        """The worker's background loops, for the application's lifespan."""
        return [self.sync.run(), self.metrics.run()]

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str) -> AsyncIterator[None]:
        """Hold the pod-wide lock ``name`` (one worker at a time in the block), waiting for it
        off the event loop."""
        loop = asyncio.get_running_loop()
        with (self.root / "locks" / name).open("ab") as lock:
            await loop.run_in_executor(None, fcntl.flock, lock, fcntl.LOCK_EX)
            yield

    def leave(self) -> None:
        """A clean exit: a last snapshot (its counts stay in the pod's totals), the slot
        freed."""
        with contextlib.suppress(OSError):
            self.metrics.publish()
        self.board.leave()


class WorkerHttpProtocol(SheddingHttpProtocol):
    """The load-shedding HTTP protocol of a worker: uvicorn imports it by name in each worker,
    and :func:`create_worker_app` gives it the worker's admission."""


def create_worker_app() -> FastAPI:
    """The application of one worker (uvicorn's factory, called in the worker process)."""
    from service import logs
    from service.app import create_app
    from service.settings import Settings

    settings = Settings()
    logs.configure(settings.log_level, settings.log_format)
    app = create_app(settings, pod_dir=Path(os.environ[POD_DIR_ENV]))
    WorkerHttpProtocol.admission = app.state.admission
    return app
