"""Read-your-writes through the one port of a pod: a change to the store made by any worker is
applied by every worker before the client that made it is answered.

The workers of ``kestrel serve --workers N`` are replicas of one store (service/models.py,
``sync``), and a client's next request may reach any of them. Polling the store every
``poll_interval_s`` would leave a client that registered a model through one worker answered
404 by another for up to that long. So each worker, every :data:`TICK_S`:

- announces the newest manifest generation it wrote on the board (service/pod_board.py);
- syncs with the store as soon as any worker announced a generation newer than the one it
  applied, and then records that it applied it.

A management request that changed the store (a registration, promotion, rollback, alias,
traffic split, shadow, delete) is answered only once every live worker has applied the
generation its worker wrote (:class:`SettleWrites`), and a version's description says READY
only once every worker serves it (:func:`describe`). A worker takes no connection before it
has recovered and caught up (:meth:`PodSync.join`, awaited by the application's lifespan).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from service.models import ModelManager
from service.pod_board import JOINING, Board
from service.versions import LoadProgress, ModelVersion, Phase, State

log = logging.getLogger("kestrel.pod")

#: How often a worker looks at the board: the latency a write adds to its answer, twice over.
TICK_S = 0.02
#: After a failed sync, the wait before the next.
SYNC_RETRY_S = 1.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class PodSync:
    """This worker's side of the pod's read-your-writes."""

    def __init__(self, board: Board, manager: ModelManager, settle_timeout_s: float) -> None:
        self.board = board
        self.manager = manager
        self.settle_timeout_s = settle_timeout_s
        self._syncing: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """The worker's loop (a task of the application's lifespan)."""
        await self.manager.recovered.wait()
        try:
            while True:
                self.step()
                await asyncio.sleep(TICK_S)
        finally:
            if self._syncing is not None:
                self._syncing.cancel()

    async def join(self) -> None:
        """Return once this worker serves what the store holds: recovered, and synced with
        every generation a sibling announced. Until then it takes no connection (the port is
        its siblings') and no write waits for it."""
        self.board.set_applied(JOINING)
        await self.manager.recovered.wait()
        while True:
            self.step()
            if self.manager.synced_generation >= self.board.newest_written():
                return
            await asyncio.sleep(TICK_S)

    def step(self) -> None:
        """Announce what this worker wrote, record what it applied, and start a sync when a
        sibling announced something newer. The sync runs apart (one at a time), so a long load
        never holds back the announcement of this worker's own writes."""
        board, manager = self.board, self.manager
        if manager.written_generation > board.written():
            board.set_written(manager.written_generation)
        board.set_applied(manager.synced_generation)  # completed syncs only: loads are over
        behind = board.newest_written() > manager.synced_generation
        if behind and (self._syncing is None or self._syncing.done()):
            self._syncing = asyncio.create_task(self._sync())

    async def _sync(self) -> None:
        try:
            await self.manager.sync()
        except Exception:  # a store hiccup: try again a little later
            log.exception("syncing with a sibling worker's store change failed")
            await asyncio.sleep(SYNC_RETRY_S)

    def settled(self, generation: int) -> bool:
        """Whether every live worker has applied ``generation``."""
        return self.board.oldest_applied() >= generation

    async def settle(self) -> None:
        """Wait until every live worker applied what this one wrote (at most the timeout)."""
        generation = self.manager.written_generation
        if self.settled(generation):
            return
        deadline = time.monotonic() + self.settle_timeout_s
        while not self.settled(generation):
            if time.monotonic() >= deadline:
                log.warning(
                    "not every worker applied store generation %d within %g s; answering anyway",
                    generation,
                    self.settle_timeout_s,
                )
                return
            await asyncio.sleep(TICK_S)

    def state(self, mv: ModelVersion) -> State:
        """``mv``'s state as the pod reports it: READY once every worker applied the generation
        that made it serve, LOADING until then."""
        if mv.state is State.READY and not self.settled(mv.generation):
            return State.LOADING
        return mv.state


def reported_state(pod: PodSync | None, mv: ModelVersion) -> State:
    """``mv``'s state as its description reports it: the pod's view in a worker of one."""
    return mv.state if pod is None else pod.state(mv)


def describe(pod: PodSync | None, mv: ModelVersion) -> dict[str, Any]:
    """``mv``'s description, READY only once the whole pod serves it."""
    doc = mv.describe()
    if reported_state(pod, mv) is not mv.state:
        doc["state"] = State.LOADING.value
        doc["progress"] = LoadProgress(Phase.REPLICATING).as_dict()
    return doc


class SettleWrites:
    """ASGI middleware: a successful management write is answered once the whole pod applied
    it (:meth:`PodSync.settle`), so the client's next request, to any worker, sees it."""

    def __init__(self, app: ASGIApp, *, pod: PodSync) -> None:
        self.app = app
        self.pod = pod

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _WRITES or not _management(scope):
            await self.app(scope, receive, send)
            return

        async def settled_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                await self.pod.settle()
            await send(message)

        await self.app(scope, receive, settled_send)


def _management(scope: Scope) -> bool:
    path: str = scope["path"]
    return path.startswith(("/models", "/v2/repository")) and not path.endswith(
        ("/predict", "/infer")
    )
