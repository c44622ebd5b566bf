"""The board of a pod: one shared page where each worker process of ``kestrel serve --workers N``
keeps the few numbers its siblings must read without asking it.

A slot per worker holds four 64-bit integers: its pid (0: free), its scoring requests in
progress, the newest store-manifest generation it wrote, and the newest it applied. Each worker
writes only its own slot (an aligned 8-byte store, which no reader sees half-done), so the
per-request path takes no lock; the file lock is taken only to claim or free a slot. Readers sum
or compare the slots: a pod-wide count read this way may be behind by the requests that entered
in other workers during the read, which is why the pod's in-flight cap can be passed by at most
one request per worker (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from service.admission import ScoringLoad

# Field offsets within a slot.
PID, IN_FLIGHT, WRITTEN, APPLIED = range(4)
FIELDS = 4
#: No generation (a worker that wrote none; a pod where no worker serves yet).
NONE = -1
#: The "applied" of a worker while it recovers: it takes no connection before it has caught up
#: (service/pod_sync.py), so no write waits for it.
JOINING = -2


class BoardFullError(RuntimeError):
    """Every slot is held by a live worker."""


class Board:
    """This worker's view of the board file at ``path``: its own slot and everyone's."""

    def __init__(self, path: Path, pid: int | None = None) -> None:
        self.path = path
        self.pid = os.getpid() if pid is None else pid
        with path.open("r+b") as file:
            self._map = mmap.mmap(file.fileno(), 0)
        self._cells = memoryview(self._map).cast("q")
        self.slots = len(self._cells) // FIELDS
        with self._locked():
            self._sweep()
            free = next((s for s in range(self.slots) if self._get(s, PID) == 0), None)
            if free is None:
                raise BoardFullError(f"all {self.slots} worker slots of {path} are taken")
            self.slot = free
            base = free * FIELDS
            self._cells[base + IN_FLIGHT] = 0
            self._cells[base + WRITTEN] = NONE
            self._cells[base + APPLIED] = JOINING
            self._cells[base + PID] = self.pid

    @staticmethod
    def create(path: Path, slots: int) -> None:
        """Write an empty board of ``slots`` slots (the supervisor, before any worker starts)."""
        path.write_bytes(bytes(slots * FIELDS * 8))

    # -- this worker's slot ----------------------------------------------------------------------
    def set_in_flight(self, n: int) -> None:
        self._cells[self.slot * FIELDS + IN_FLIGHT] = n

    def set_written(self, generation: int) -> None:
        self._cells[self.slot * FIELDS + WRITTEN] = generation

    def set_applied(self, generation: int) -> None:
        self._cells[self.slot * FIELDS + APPLIED] = generation

    def written(self) -> int:
        return self._get(self.slot, WRITTEN)

    def leave(self) -> None:
        """Free this worker's slot (a clean exit; a crashed worker's is freed by the next claim
        or :meth:`sweep`)."""
        with self._locked():
            if self._get(self.slot, PID) == self.pid:
                self._cells[self.slot * FIELDS + IN_FLIGHT] = 0
                self._cells[self.slot * FIELDS + PID] = 0

    # -- the pod ---------------------------------------------------------------------------------
    def in_flight(self) -> int:
        """Scoring requests in progress in the whole pod (the hot path: no lock, no syscall)."""
        return sum(self._cells[IN_FLIGHT::FIELDS])

    def newest_written(self) -> int:
        return max(self._cells[WRITTEN::FIELDS])

    def oldest_applied(self) -> int:
        """The newest generation every live worker serving the port has applied."""
        applied = [self._get(s, APPLIED) for s in self._live_slots()]
        return min((a for a in applied if a != JOINING), default=NONE)

    def live_pids(self) -> list[int]:
        return [self._get(s, PID) for s in self._live_slots()]

    def sweep(self) -> list[int]:
        """Free the slots of workers that died without leaving; their pids."""
        with self._locked():
            return self._sweep()

    def close(self) -> None:
        self._cells.release()
        self._map.close()

    # -- internals -------------------------------------------------------------------------------
    def _get(self, slot: int, field: int) -> int:
        return self._cells[slot * FIELDS + field]

    def _live_slots(self) -> Iterator[int]:
        for slot in range(self.slots):
            pid = self._get(slot, PID)
            if pid and _alive(pid):
                yield slot

    def _sweep(self) -> list[int]:
        dead = []
        for slot in range(self.slots):
            pid = self._get(slot, PID)
            if pid and not _alive(pid):
                base = slot * FIELDS
                self._cells[base + IN_FLIGHT] = 0  # its requests ended with it
                self._cells[base + APPLIED] = JOINING
                self._cells[base + PID] = 0
                dead.append(pid)
        return dead

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return locked(self.path)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if missing) against the other
    processes of the pod; blocks until it is free."""
    with path.open("ab") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        yield


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a pid reused by another user's process: not our worker
        return False
    return True


class PodScoringLoad(ScoringLoad):
    """:class:`ScoringLoad` whose in-flight cap counts the whole pod's scoring requests: this
    worker publishes its own count on the board, and the cap compares the board's sum."""

    __slots__ = ("_board",)

    def __init__(self, cap: int | None, board: Board) -> None:
        super().__init__(cap)
        self._board = board

    @property
    def saturated(self) -> bool:
        return self.cap is not None and self._board.in_flight() >= self.cap

    def enter(self, model: str | None) -> None:
        super().enter(model)
        self._board.set_in_flight(self.in_flight)

    def leave(self, model: str | None) -> None:
        super().leave(model)
        self._board.set_in_flight(self.in_flight)
