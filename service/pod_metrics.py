"""The metrics of a pod (``kestrel serve --workers N``): a scrape through the one port reports
the whole pod, whichever worker answers it.

Two kinds of series take two paths:

- **Counted per request** (the counters and histograms of :class:`service.metrics.Metrics`):
  prometheus_client's multiprocess mode. Each worker adds into memory-mapped files of its own in
  the pod's ``metrics/`` directory (``PROMETHEUS_MULTIPROC_DIR``, set by the supervisor before a
  worker imports prometheus_client), and a scrape sums every worker's files, a dead worker's
  included, so a pod total never goes back when a worker is replaced.
- **Read at scrape** (``Metrics.live``: in-flight requests, queue rows, model states, the
  executable cache's counts, drift PSI, ``process_*``): every :data:`PUBLISH_S`, and just before
  it answers a scrape, a worker writes its own exposition to ``live/<pid>.prom``. A scrape
  combines them by family: counters summed over every worker that ever ran; gauges over live
  workers only — summed where they measure the pod's load (:data:`SUMMED`), the earliest for
  start times, and otherwise the largest, since a state-like series (a version's state, the
  in-flight limit, a PSI) is the same in every worker and must not be multiplied by N.

prometheus_client also writes the gauges' values to files; they are never read, because its
multiprocess mode cannot remove a series (a retired version's state would stay forever).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from service.metrics import Metrics
from service.pod_board import Board

log = logging.getLogger("kestrel.pod")

#: Seconds between two snapshots of a worker's read-at-scrape series.
PUBLISH_S = 1.0
#: Gauges that measure load: the pod's value is the sum of its workers'.
SUMMED = frozenset(
    {
        "kestrel_in_flight_requests",
        "kestrel_queue_rows",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
    }
)
EARLIEST = frozenset({"process_start_time_seconds"})

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


class PodMetrics:
    """One worker's side of the pod's metrics: publishing its snapshot, answering a scrape."""

    def __init__(self, root: Path, board: Board, metrics: Metrics) -> None:
        self.files = root / "metrics"
        self.snapshots = root / "live"
        self.board = board
        self.metrics = metrics
        self._mine = self.snapshots / f"{board.pid}.prom"

    def publish(self) -> None:
        """Write this worker's read-at-scrape series (on the event loop: the collectors read
        the manager's state)."""
        text = generate_latest(self.metrics.live)
        partial = self._mine.with_suffix(".partial")
        partial.write_bytes(text)
        os.replace(partial, self._mine)  # a reader sees the old snapshot or the new, whole

    async def run(self) -> None:
        """Publish every :data:`PUBLISH_S` (a task of the application's lifespan)."""
        while True:
            try:
                self.publish()
            except OSError:
                log.exception("writing this worker's metrics snapshot failed")
            await asyncio.sleep(PUBLISH_S)

    def scrape(self) -> bytes:
        """The pod's exposition (blocking file reads: run it off the event loop)."""
        return generate_latest(self)  # type: ignore[arg-type]  # a collector: it has collect()

    def collect(self) -> Iterator[Metric]:
        counted = [
            str(p) for p in self.files.glob("*.db") if p.name.startswith(("counter_", "histogram_"))
        ]
        yield from MultiProcessCollector.merge(counted, accumulate=True)
        live = set(self.board.live_pids())
        snapshots = sorted(self.snapshots.glob("*.prom"))
        yield from _combined((int(path.stem) in live, path.read_text()) for path in snapshots)
        workers = Metric("kestrel_workers", "Worker processes serving the port now.", "gauge")
        workers.add_sample("kestrel_workers", {}, float(len(live)))
        yield workers
        starts = Metric(
            "kestrel_worker_starts",
            "Worker processes started since the pod started: the workers, plus one per restart "
            "of a worker that died.",
            "counter",
        )
        starts.add_sample("kestrel_worker_starts_total", {}, float(len(snapshots)))
        yield starts


def _combined(snapshots: Iterable[tuple[bool, str]]) -> Iterator[Metric]:
    """The workers' snapshots (whether the worker is alive, its exposition) as one."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[SampleKey, list[float]]] = {}
    for alive, text in snapshots:
        for family in text_string_to_metric_families(text):
            counter = family.type == "counter"
            if not (alive or counter):
                continue  # a dead worker's gauges describe nothing now
            families.setdefault(family.name, family)
            samples = values.setdefault(family.name, {})
            for s in family.samples:
                samples.setdefault((s.name, tuple(sorted(s.labels.items()))), []).append(s.value)
    for name, family in families.items():
        out = Metric(name, family.documentation, family.type)
        for (sample, labels), seen in values[name].items():
            out.add_sample(sample, dict(labels), _pod_value(name, family.type, seen))
        yield out


def _pod_value(name: str, kind: str, seen: list[float]) -> float:
    if kind == "counter" or name in SUMMED:
        return sum(seen)
    if name in EARLIEST:
        return min(seen)
    return max(seen)
