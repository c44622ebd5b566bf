"""The pod's board (service/pod_board.py) and the combination of the workers' metric snapshots
(service/pod_metrics.py), in one process: workers are slots claimed under other pids, and a
dead worker is the pid of a child process that has exited."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.pod_board import NONE, Board, BoardFullError, PodScoringLoad
from service.pod_metrics import combined


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def path(tmp_path: Path) -> Path:
    Board.create(tmp_path / "board", slots=3)
    return tmp_path / "board"


def test_the_pods_in_flight_count_and_cap_span_every_worker(path: Path) -> None:
    here = Board(path)
    sibling = Board(path, pid=os.getppid())  # a live process standing for another worker
    mine, theirs = PodScoringLoad(3, here), PodScoringLoad(3, sibling)
    theirs.enter("a")
    theirs.enter("b")
    mine.enter("a")
    assert here.in_flight() == 3 and mine.saturated and theirs.saturated
    theirs.leave("b")
    assert not mine.saturated and mine.in_flight == 1


def test_writes_settle_once_every_serving_worker_applied_them(path: Path) -> None:
    here = Board(path)
    sibling = Board(path, pid=os.getppid())
    assert here.oldest_applied() == NONE  # both recovering (JOINING): nobody serves yet
    here.set_applied(4)
    assert here.oldest_applied() == 4  # the sibling still recovering is not waited for
    sibling.set_applied(3)
    here.set_written(5)
    assert here.newest_written() == 5 and here.oldest_applied() == 3
    sibling.set_applied(5)
    here.set_applied(5)
    assert here.oldest_applied() == 5


def test_a_dead_workers_slot_is_freed_with_its_requests(path: Path) -> None:
    gone = Board(path, pid=dead_pid())
    PodScoringLoad(8, gone).enter("a")
    gone.set_applied(1)  # a stale generation must not hold back the pod's writes
    here = Board(path)  # claiming sweeps the dead
    assert here.in_flight() == 0 and here.live_pids() == [os.getpid()]
    assert here.oldest_applied() == NONE  # this one is JOINING until it recovers
    other = Board(path, pid=dead_pid())
    assert here.sweep() == [other.pid] and here.live_pids() == [os.getpid()]


def test_a_full_board_refuses_one_more_worker(path: Path) -> None:
    for _ in range(3):
        Board(path, pid=os.getppid())
    with pytest.raises(BoardFullError, match="all 3 worker slots"):
        Board(path)


def family(name: str, kind: str, *samples: tuple[str, dict[str, str], float]) -> dict:
    return {"name": name, "type": kind, "help": name, "samples": list(samples)}


def test_snapshots_combine_into_the_pods_series() -> None:
    worker = [
        family(
            "kestrel_requests",
            "counter",
            ("kestrel_requests_total", {"status": "200"}, 10.0),
            ("kestrel_requests_created", {"status": "200"}, 100.0),
        ),
        family(
            "kestrel_batch_rows",
            "histogram",
            ("kestrel_batch_rows_bucket", {"le": "1.0"}, 4.0),
            ("kestrel_batch_rows_count", {}, 4.0),
        ),
        family("kestrel_queue_rows", "gauge", ("kestrel_queue_rows", {"model": "m"}, 3.0)),
        family("kestrel_models", "gauge", ("kestrel_models", {"state": "READY"}, 2.0)),
        family("process_start_time_seconds", "gauge", ("process_start_time_seconds", {}, 50.0)),
    ]
    sibling = [
        family(
            "kestrel_requests",
            "counter",
            ("kestrel_requests_total", {"status": "200"}, 5.0),
            ("kestrel_requests_created", {"status": "200"}, 90.0),
        ),
        family(
            "kestrel_batch_rows",
            "histogram",
            ("kestrel_batch_rows_bucket", {"le": "1.0"}, 1.0),
            ("kestrel_batch_rows_count", {}, 1.0),
        ),
        family("kestrel_queue_rows", "gauge", ("kestrel_queue_rows", {"model": "m"}, 4.0)),
        family("kestrel_models", "gauge", ("kestrel_models", {"state": "READY"}, 2.0)),
        family("process_start_time_seconds", "gauge", ("process_start_time_seconds", {}, 40.0)),
    ]
    dead = [
        family("kestrel_requests", "counter", ("kestrel_requests_total", {"status": "200"}, 7.0)),
        family("kestrel_queue_rows", "gauge", ("kestrel_queue_rows", {"model": "m"}, 99.0)),
        family("kestrel_models", "gauge", ("kestrel_models", {"state": "LOADING"}, 1.0)),
    ]
    pod = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in combined([(True, worker), (True, sibling), (False, dead)])
        for s in f.samples
    }
    assert pod == {
        # counters and histograms add up, the dead worker's counts included
        ("kestrel_requests_total", (("status", "200"),)): 22.0,
        ("kestrel_requests_created", (("status", "200"),)): 90.0,  # the earliest
        ("kestrel_batch_rows_bucket", (("le", "1.0"),)): 5.0,
        ("kestrel_batch_rows_count", ()): 5.0,
        # load adds up over the live workers; state is the pod's once; a dead worker's gauges
        # are gone
        ("kestrel_queue_rows", (("model", "m"),)): 7.0,
        ("kestrel_models", (("state", "READY"),)): 2.0,
        ("process_start_time_seconds", ()): 40.0,
    }
