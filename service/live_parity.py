"""Live parity: the production half of the registration gate. A share of the scored requests
(``KESTREL_LIVE_PARITY_SHARE``) hands its first rows and the answers served for them to one
background worker, which rescores them with the source estimator and compares, as the gate
does (:func:`service.parity.compare`): labels exactly, other outputs within the parity
tolerance. The worker keeps to a CPU budget (``KESTREL_LIVE_PARITY_CPU``, a share of one core:
after each check it sleeps long enough), and its queue is bounded: past it a sample is dropped
and counted, never waited for. Nothing here touches the request path beyond a queue put.
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service import parity
from service.codecs import head
from service.metrics import Metrics
from service.settings import Settings
from service.versions import ModelVersion
from service.workers import BudgetedWorker

log = logging.getLogger("kestrel.live_parity")

#: Samples waiting for the worker, at most.
QUEUE = 256


@dataclass(frozen=True)
class _Sample:
    version: ModelVersion
    rows: Any  # the request's first rows, as the client sent them
    served: dict[str, Any]  # the answers served for those rows
    n: int


class LiveParity:
    """The background worker and its bounded queue (started on the first sample)."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.share, self.rows = settings.live_parity_share, settings.live_parity_rows
        self.rtol, self.atol = settings.parity_rtol, settings.parity_atol
        self.metrics = metrics
        self._worker: BudgetedWorker[_Sample] = BudgetedWorker(
            self.check,
            self._failed,
            name="kestrel-live-parity",
            capacity=QUEUE,
            cpu=settings.live_parity_cpu,
        )

    def offer(self, mv: ModelVersion, data: Any, answer: Mapping[str, Any], rows: int) -> None:
        """Maybe sample one scored request (its share), for the worker to check."""
        if self.share <= 0 or random.random() >= self.share or mv.source is None or not rows:
            return
        n = min(rows, self.rows)
        cut = head(data, n)
        if cut is None:
            return
        served = {
            k: [a[:n] for a in v] if isinstance(v, list) else v[:n] for k, v in answer.items()
        }
        if not self._worker.submit(_Sample(mv, cut, served, n)):
            self._count(mv, "dropped")

    def _failed(self, sample: _Sample, exc: Exception) -> None:
        mv = sample.version
        log.info(
            "live parity of model %s version %s: the source raised %s",
            mv.name,
            mv.version,
            exc,
            extra={"model": mv.name, "version": mv.version},
        )
        self._count(mv, "failed")

    def check(self, sample: _Sample) -> None:
        """Rescore one sample with the source estimator and record how the served answers
        differ."""
        mv = sample.version
        estimator, model = mv.source, mv.model
        if estimator is None or model is None:  # retired meanwhile
            return
        rows = parity.source_input(model.schema, sample.rows)
        heads = [m for m in sample.served if m in model.methods]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = {
                m: parity.side_by_side(parity.source_method(estimator, m)(rows)) for m in heads
            }
        served = {m: parity.side_by_side(sample.served[m]) for m in heads}
        results, _ = parity.compare(
            served,
            expected,
            sample.n,
            labels=model.classes_ is not None,
            rtol=self.rtol,
            atol=self.atol,
        )
        m, labels = self.metrics, (mv.name, mv.version)
        self._count(mv, "checked")
        m.child(m.live_parity_rows, *labels).inc(sample.n)
        for result in results:
            m.child(m.live_parity_mismatches, *labels, result.method).inc(result.mismatched_rows)
            if result.max_abs_diff is not None:
                m.child(m.live_parity_abs_diff, *labels, result.method).observe(result.max_abs_diff)

    def _count(self, mv: ModelVersion, result: str) -> None:
        m = self.metrics
        m.child(m.live_parity_samples, mv.name, mv.version, result).inc()

    def close(self) -> None:
        """Stop the worker (samples still queued are left)."""
        self._worker.close()
