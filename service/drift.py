"""Data-quality and drift metrics: a share of the scored requests (``KESTREL_DRIFT_SHARE``)
hands its first rows (``KESTREL_DRIFT_ROWS``) and the answers served for them to one background
worker, within a CPU budget (``KESTREL_DRIFT_CPU``); nothing touches the request path beyond a
queue put. The worker reads the rows by the model's schema and counts, per input column, missing
values, categories the model does not know and numbers outside the registration reference's
range (the sample's and the fitted statistics'; see :mod:`service.drift_reference`) (counters,
so any window's ratio is a PromQL ``rate`` away), and bins the values and the answers by the
version's :class:`~service.drift_reference.Reference`. Over a sliding window
(``KESTREL_DRIFT_WINDOW_S``) the bins give each column's and each output head's PSI, read at
scrape.

Label cardinality is bounded: the first ``KESTREL_DRIFT_COLUMNS`` columns of a schema, in the
schema's order, are labelled by name, the rest are counted together as ``(other)``; the largest
PSI over all columns is exported per version whatever their number. Schema order on purpose: it
is the order the model was fitted on, so the labelled set is the same for every version of a
model with the same columns, which dashboards and alerts rely on; a ranking by importance would
move columns in and out of it between versions (and no public, cheap one maps a model's
importances back to its raw columns through its featurizers).
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from service.codecs import head
from service.drift_reference import Histogram, Reference, present_values, psi
from service.metrics import Metrics
from service.settings import Settings
from service.versions import ModelVersion, State
from service.workers import BudgetedWorker

log = logging.getLogger("kestrel.drift")

#: Samples waiting for the worker, at most.
QUEUE = 256
#: The label of the columns past ``KESTREL_DRIFT_COLUMNS``, counted together.
OTHER_COLUMNS = "(other)"
#: Slots a window is kept in: it slides by a tenth of its length.
SLOTS = 10


@dataclass(frozen=True)
class _Sample:
    version: ModelVersion
    rows: Any
    served: dict[str, Any]


class _Layout:
    """Every histogram of a reference (input columns, then output heads' columns) laid end to end
    in one count vector, so that a batch is counted with one ``bincount``."""

    def __init__(self, reference: Reference) -> None:
        self.columns = [(j, c.histogram) for j, c in enumerate(reference.columns) if c.histogram]
        self.outputs = list(reference.outputs.items())
        histograms = [h for _, h in self.columns] + [
            h for _, o in self.outputs for h in o.histograms
        ]
        sizes = [h.bins for h in histograms]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.size = int(self.offsets[-1])
        self.histograms: list[Histogram] = histograms


class _Window:
    """The counts of the last ``seconds``, in :data:`SLOTS` slots (thread-safe)."""

    def __init__(self, size: int, seconds: float) -> None:
        self.size, self.slot_s = size, seconds / SLOTS
        self._slots: collections.deque[tuple[int, np.ndarray]] = collections.deque()
        self._lock = threading.Lock()

    def add(self, counts: np.ndarray, now: float) -> None:
        slot = int(now // self.slot_s)
        with self._lock:
            if not self._slots or self._slots[-1][0] != slot:
                self._slots.append((slot, np.zeros(self.size)))
            self._slots[-1][1][:] += counts
            while self._slots[0][0] <= slot - SLOTS:
                self._slots.popleft()

    def total(self, now: float) -> np.ndarray:
        oldest = int(now // self.slot_s) - SLOTS
        with self._lock:
            return sum((c for s, c in self._slots if s > oldest), np.zeros(self.size))


@dataclass
class _Tracked:
    version: ModelVersion
    layout: _Layout
    window: _Window
    labels: list[str]  # per schema column, its ``column`` label


class DriftMonitor:
    """The worker, its bounded queue and the windows of the versions it has seen."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.share, self.rows = settings.drift_share, settings.drift_rows
        self.window_s, self.min_rows = settings.drift_window_s, settings.drift_min_rows
        self.labelled = settings.drift_columns
        self.metrics = metrics
        self._tracked: dict[int, _Tracked] = {}
        self._lock = threading.Lock()
        self._worker: BudgetedWorker[_Sample] = BudgetedWorker(
            self.observe,
            self._failed,
            name="kestrel-drift",
            capacity=QUEUE,
            cpu=settings.drift_cpu,
        )
        metrics.registry.register(_DriftCollector(self))

    def offer(self, mv: ModelVersion, data: Any, answer: Mapping[str, Any], rows: int) -> None:
        """Maybe sample one scored request (its share), for the worker to count."""
        if self.share <= 0 or not rows or random.random() >= self.share:
            return
        if mv.reference is None or mv.model is None:
            return
        n = min(rows, self.rows)
        cut = head(data, n)
        if cut is None:
            return
        served = {k: v[:n] for k, v in answer.items() if isinstance(v, np.ndarray)}
        if not self._worker.submit(_Sample(mv, cut, served)):
            self._count(mv, "dropped")

    def observe(self, sample: _Sample) -> None:
        """Count one sample's rows: data-quality counters now, bins into the version's window."""
        mv = sample.version
        model, reference = mv.model, mv.reference
        if model is None or reference is None:  # retired meanwhile
            return
        tracked = self._track(mv, reference)
        x, indices = model.schema.observed(sample.rows)
        n = len(x)
        m, name, version = self.metrics, mv.name, mv.version
        missing, unknown, out_of_range = _quality(reference, x, indices)
        per_label: dict[str, np.ndarray] = {}
        for j, label in enumerate(tracked.labels):
            counts = np.array([missing[j], unknown[j], out_of_range[j]])
            per_label[label] = per_label.get(label, 0) + counts
        for label, (miss, unk, oor) in per_label.items():
            m.child(m.input_missing, name, version, label).inc(miss)
            m.child(m.input_unknown, name, version, label).inc(unk)
            m.child(m.input_out_of_range, name, version, label).inc(oor)
        m.child(m.input_rows, name, version).inc(n)
        tracked.window.add(_binned(tracked.layout, x, indices, sample.served), time.time())
        self._count(mv, "observed")

    def _track(self, mv: ModelVersion, reference: Reference) -> _Tracked:
        with self._lock:
            tracked = self._tracked.get(id(mv))
            if tracked is None or tracked.version is not mv:
                layout = _Layout(reference)
                names = [c.name for c in reference.columns]
                labels = [n if j < self.labelled else OTHER_COLUMNS for j, n in enumerate(names)]
                tracked = _Tracked(mv, layout, _Window(layout.size, self.window_s), labels)
                self._tracked[id(mv)] = tracked
            return tracked

    def tracked(self) -> list[_Tracked]:
        """The versions with a window, dropping those no longer READY."""
        with self._lock:
            for key, t in list(self._tracked.items()):
                if t.version.state is not State.READY:
                    del self._tracked[key]
            return list(self._tracked.values())

    def scores(self, tracked: _Tracked, now: float | None = None) -> DriftScores:
        """The PSI of each histogram over the window, where it holds enough values."""
        counts = tracked.window.total(time.time() if now is None else now)
        layout, offsets = tracked.layout, tracked.layout.offsets
        values = []
        for k, histogram in enumerate(layout.histograms):
            part = counts[offsets[k] : offsets[k + 1]]
            values.append(psi(part, histogram.expected) if part.sum() >= self.min_rows else None)
        columns = {j: values[k] for k, (j, _) in enumerate(layout.columns)}
        outputs: dict[str, float | None] = {}
        k = len(layout.columns)
        for method, output in layout.outputs:
            width = len(output.histograms)
            scored = [v for v in values[k : k + width] if v is not None]
            outputs[method] = max(scored) if scored else None
            k += width
        return DriftScores(columns, outputs)

    def _failed(self, sample: _Sample, exc: Exception) -> None:
        mv = sample.version
        log.info(
            "drift monitoring of model %s version %s: could not read a sample (%s)",
            mv.name,
            mv.version,
            exc,
            extra={"model": mv.name, "version": mv.version},
        )
        self._count(mv, "failed")

    def _count(self, mv: ModelVersion, result: str) -> None:
        m = self.metrics
        m.child(m.drift_samples, mv.name, mv.version, result).inc()

    def close(self) -> None:
        """Stop the worker (samples still queued are left)."""
        self._worker.close()


@dataclass(frozen=True)
class DriftScores:
    """PSI per input column (by schema index) and per output head; None: too few values in the
    window to score."""

    columns: Mapping[int, float | None]
    outputs: Mapping[str, float | None]


def _quality(
    reference: Reference, x: np.ndarray, indices: Mapping[int, np.ndarray]
) -> tuple[list[int], list[int], list[int]]:
    """Per column: missing values, unknown categories, numbers outside the reference's range."""
    missing, unknown, out_of_range = [], [], []
    for j, ref in enumerate(reference.columns):
        present, absent = present_values(x, indices, j)
        missing.append(int(np.count_nonzero(absent)))
        if j in indices:
            unknown.append(int(np.count_nonzero(present == -1)))
            out_of_range.append(0)
        else:
            unknown.append(0)
            outside = 0
            if ref.low is not None:
                outside = np.count_nonzero(present < ref.low)
            if ref.high is not None:
                outside += np.count_nonzero(present > ref.high)
            out_of_range.append(int(outside))
    return missing, unknown, out_of_range


def _binned(
    layout: _Layout, x: np.ndarray, indices: Mapping[int, np.ndarray], served: Mapping[str, Any]
) -> np.ndarray:
    """One sample's counts in ``layout``'s order (missing values, unless a histogram has a bin
    for them, and unmatched answers left out)."""
    parts: list[np.ndarray] = []
    k = 0
    for j, histogram in layout.columns:
        present, missing = present_values(x, indices, j)
        parts.append(histogram.bin_of(present) + layout.offsets[k])
        if histogram.missing_bin is not None:
            count = int(np.count_nonzero(missing))
            parts.append(np.full(count, histogram.missing_bin + layout.offsets[k], np.int64))
        k += 1
    for method, output in layout.outputs:
        answer = served.get(method)
        bins = None if answer is None else output.bins_of(answer)
        for i in range(len(output.histograms)):
            if bins is not None:
                parts.append(bins[i] + layout.offsets[k])
            k += 1
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return np.bincount(flat.astype(np.int64), minlength=layout.size).astype(np.float64)


class _DriftCollector(Collector):
    """The windows' PSI and the references' missing ratios, read at scrape."""

    def __init__(self, monitor: DriftMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[GaugeMetricFamily]:
        column_psi = GaugeMetricFamily(
            "kestrel_input_psi",
            "Population stability index of an input column over the drift window against the "
            "registration reference (the sample's histogram, or the fitted quantiles').",
            labels=("model", "version", "column"),
        )
        max_psi = GaugeMetricFamily(
            "kestrel_input_psi_max",
            "The largest input-column PSI of a version over the drift window (every column).",
            labels=("model", "version"),
        )
        output_psi = GaugeMetricFamily(
            "kestrel_prediction_psi",
            "PSI of an output head's answers over the drift window against the registration "
            "sample's (a head of several columns: its largest).",
            labels=("model", "version", "output"),
        )
        reference_missing = GaugeMetricFamily(
            "kestrel_input_reference_missing_ratio",
            "The share of missing values of an input column in the registration sample.",
            labels=("model", "version", "column"),
        )
        for tracked in self.monitor.tracked():
            mv = tracked.version
            scores = self.monitor.scores(tracked)
            reference = mv.reference
            if reference is not None:
                for j, column in enumerate(reference.columns):
                    label = tracked.labels[j]
                    if label != OTHER_COLUMNS and column.missing_ratio is not None:
                        reference_missing.add_metric(
                            (mv.name, mv.version, label), column.missing_ratio
                        )
            scored = _present(scores.columns.items())
            for j, value in scored:
                if tracked.labels[j] != OTHER_COLUMNS:
                    column_psi.add_metric((mv.name, mv.version, tracked.labels[j]), value)
            if scored:
                max_psi.add_metric((mv.name, mv.version), max(v for _, v in scored))
            for method, value in _present(scores.outputs.items()):
                output_psi.add_metric((mv.name, mv.version, method), value)
        yield from (column_psi, max_psi, output_psi, reference_missing)


def _present(items: Iterable[tuple[Any, float | None]]) -> list[tuple[Any, float]]:
    return [(k, v) for k, v in items if v is not None]
