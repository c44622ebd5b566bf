"""Which READY versions stay loaded: a replica's budget of loaded versions, least recently used
unloaded first.

A replica serving hundreds of models cannot hold every one's compiled model, executables and
batcher. With ``KESTREL_MAX_LOADED_MODELS`` set, a version that has become READY over the budget
unloads the versions idle the longest. Such a version is UNLOADED: still current (or named), its
source estimator and registration sample kept, its compiled model, batcher and executor freed.
Its next request loads it again (:meth:`service.models.ModelManager.ensure_loaded`) from the
executable cache, following its stored plan: no compile and no second parity gate (this process
gated the same version, plan and executables when it first loaded it).

Never unloaded: versions of the models ``KESTREL_PINNED_MODELS`` names (their current, canary and
aliased versions alike), shadow versions (mirrored to only while READY), and versions with rows
queued or in flight. Pinned versions count
against the budget too, so a budget smaller than them is exceeded, with a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container, Iterable
from dataclasses import dataclass

from service.versions import ModelVersion, State

log = logging.getLogger("kestrel.residency")


@dataclass
class Residency:
    """The budget (``max_loaded``: None, no budget) and the pinned model names."""

    max_loaded: int | None
    pinned: frozenset[str] = frozenset()
    #: Whether the last :meth:`over_budget` left more loaded than the budget (the rest busy):
    #: the manager checks again as requests finish.
    short: bool = False

    @staticmethod
    def touch(mv: ModelVersion) -> None:
        """Note a request for ``mv`` (its recency)."""
        mv.last_used = time.monotonic()

    def over_budget(
        self, versions: Iterable[ModelVersion], kept: Container[tuple[str, str]] = ()
    ) -> list[ModelVersion]:
        """The READY versions to unload, least recently used first, for the rest to fit;
        never one of ``kept`` (``(name, version)``: shadows, which no request loads again)."""
        self.short = False
        if self.max_loaded is None:
            return []
        loaded = [mv for mv in versions if mv.state is State.READY]
        excess = len(loaded) - self.max_loaded
        if excess <= 0:
            return []
        # The most recently used stays whatever else is kept: its request is about to run.
        newest = max(loaded, key=lambda mv: mv.last_used)
        idle = sorted(
            (
                mv
                for mv in loaded
                if mv is not newest and self._may_unload(mv) and (mv.name, mv.version) not in kept
            ),
            key=lambda mv: mv.last_used,
        )
        self.short = len(idle) < excess
        pinned = sum(mv.name in self.pinned for mv in loaded)
        if pinned > self.max_loaded:
            log.warning(
                "%d versions of pinned models loaded, over the budget of %d loaded versions",
                pinned,
                self.max_loaded,
            )
        return idle[:excess]

    def _may_unload(self, mv: ModelVersion) -> bool:
        batcher = mv.batcher
        busy = batcher is not None and (batcher.queued_rows > 0 or batcher.in_flight_rows > 0)
        return mv.name not in self.pinned and not busy and not mv.waiting and mv.revival is None
