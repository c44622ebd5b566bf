"""The metrics of a pod (``kestrel serve --workers N``): a scrape through the one port reports
the whole pod, whichever worker answers it.

Each worker keeps its own registry (service/metrics.py, unchanged: plain in-memory counters on
the request path) and, every :data:`PUBLISH_S` and just before it answers a scrape, writes what
the registry collects to ``snapshots/<pid>.json`` in the pod directory. A scrape combines the
snapshots family by family:

- counters and histograms are summed over every worker that ever ran — a dead worker's last
  snapshot included, so a pod total never goes back when a worker is replaced;
- gauges only over the live workers: summed where they measure the pod's load
  (:data:`SUMMED`), the earliest for start times, and otherwise the largest, since a state-like
  series (``kestrel_models``, ``kestrel_model_info``, the in-flight limit, a PSI) is the same in
  every worker and must not be multiplied by N.

Why not prometheus_client's multiprocess mode: it writes every counter increment to a
memory-mapped file under a lock, which cost a single-row request 24 µs of CPU more (a 15 %
share) in bench/load.py's setting, and it cannot remove a gauge's series (a retired version's
state would stay). What snapshots cost instead: a sibling's counts reach a scrape up to
:data:`PUBLISH_S` late, and a worker killed outright loses at most its last second of counts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from service.metrics import Metrics
from service.pod_board import Board

log = logging.getLogger("kestrel.pod")

#: Seconds between two snapshots of a worker's metrics.
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
#: Families whose samples only add up (a dead worker's included).
CUMULATIVE = frozenset({"counter", "histogram", "summary"})

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


class PodMetrics:
    """One worker's side of the pod's metrics: publishing its snapshot, answering a scrape."""

    def __init__(self, root: Path, board: Board, metrics: Metrics) -> None:
        self.snapshots = root / "snapshots"
        self.board = board
        self.metrics = metrics
        self._mine = self.snapshots / f"{board.pid}.json"

    def publish(self) -> None:
        """Write this worker's snapshot (on the event loop: collectors read the manager)."""
        families = [
            {
                "name": f.name,
                "type": f.type,
                "help": f.documentation,
                "samples": [(s.name, s.labels, s.value) for s in f.samples],
            }
            for f in self.metrics.registry.collect()
        ]
        partial = self._mine.with_suffix(".partial")
        # The standard library's json: values may be NaN or infinite, or numpy floats.
        partial.write_text(json.dumps(families))
        os.replace(partial, self._mine)  # a reader sees the old snapshot or the new, whole

    async def run(self) -> None:
        """Publish every :data:`PUBLISH_S`, and free dead workers' board slots (a task of the
        application's lifespan)."""
        while True:
            try:
                self.publish()
            except OSError:
                log.exception("writing this worker's metrics snapshot failed")
            for pid in self.board.sweep():  # its in-flight requests stop counting for the cap
                log.warning("worker %d died; its slot on the board is freed", pid)
            await asyncio.sleep(PUBLISH_S)

    def scrape(self) -> bytes:
        """The pod's exposition (blocking file reads: run it off the event loop)."""
        return generate_latest(self)  # type: ignore[arg-type]  # a collector: it has collect()

    def collect(self) -> Iterator[Metric]:
        live = set(self.board.live_pids())
        snapshots = sorted(self.snapshots.glob("*.json"))
        yield from combined((int(p.stem) in live, json.loads(p.read_text())) for p in snapshots)
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


def combined(snapshots: Iterable[tuple[bool, list[dict[str, Any]]]]) -> Iterator[Metric]:
    """The workers' snapshots (whether the worker is alive, its families) as the pod's."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[SampleKey, list[float]]] = {}
    for alive, snapshot in snapshots:
        for family in snapshot:
            name, kind = family["name"], family["type"]
            if not (alive or kind in CUMULATIVE):
                continue  # a dead worker's gauges describe nothing now
            families.setdefault(name, Metric(name, family["help"], kind))
            samples = values.setdefault(name, {})
            for sample, labels, value in family["samples"]:
                samples.setdefault((sample, tuple(sorted(labels.items()))), []).append(value)
    for name, family in families.items():
        for (sample, labels), seen in values[name].items():
            family.add_sample(sample, dict(labels), _pod_value(family, sample, seen))
        yield family


def _pod_value(family: Metric, sample: str, seen: list[float]) -> float:
    if sample.endswith("_created") or family.name in EARLIEST:
        return min(seen)  # when the first worker made the series
    if family.type in CUMULATIVE or family.name in SUMMED:
        return sum(seen)
    return max(seen)
