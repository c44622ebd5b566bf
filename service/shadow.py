"""Shadow traffic: a share of a model's live requests scored again by another version, off the
request path, and the two answers compared.

The client's answer is computed and returned first; a mirrored request is then scored by the
shadow version on its own batcher and device thread, as a task of its own, and never delays or
changes the answer. At most :data:`MAX_IN_FLIGHT` mirrored requests wait at once per process:
past that a mirror is dropped (counted), so a slow shadow cannot pile up memory. The divergence
goes to the ``kestrel_shadow_*`` metrics per (model, serving version, shadow version): rows
compared, rows whose label differs, and per request the largest |Δ| of each numeric output.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from service import scoring
from service.metrics import Metrics
from service.versions import ModelVersion, State

log = logging.getLogger("kestrel.shadow")

#: Mirrored requests in flight at once, per process.
MAX_IN_FLIGHT = 64


@dataclass(frozen=True)
class Divergence:
    """Two answers to the same rows: how many rows were compared, how many predicted labels
    differ, and the largest |Δ| of each numeric output both have."""

    rows: int
    label_disagreements: int
    max_abs_diff: dict[str, float]


def divergence(
    serving: Mapping[str, Any], shadow: Mapping[str, Any], rows: int, *, labels: bool
) -> Divergence | None:
    """Compare the heads both answers have (``labels``: ``predict`` answers class labels, a
    classifier's; else it is numeric like the rest); None where one differs in shape (other
    classes, another output width): such versions cannot be compared row by row."""
    disagreements, diffs = 0, {}
    for head in serving.keys() & shadow.keys():
        a, b = serving[head], shadow[head]
        if isinstance(a, list) or isinstance(b, list):  # per-output arrays: compare each
            if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
                return None
            pairs = list(zip(a, b, strict=True))
        else:
            pairs = [(a, b)]
        for x, y in pairs:
            x, y = np.asarray(x), np.asarray(y)
            if x.shape != y.shape:
                return None
            if head == "predict" and labels:
                differs = x != y if x.ndim == 1 else np.any(x != y, axis=tuple(range(1, x.ndim)))
                disagreements = max(disagreements, int(np.count_nonzero(differs)))
            elif x.dtype.kind in "fiu" and y.dtype.kind in "fiu" and x.size:
                with np.errstate(invalid="ignore"):
                    gap = float(np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64))))
                diffs[head] = max(diffs.get(head, 0.0), 0.0 if np.isnan(gap) else gap)
    return Divergence(rows, disagreements, diffs)


class Mirror:
    """Sends a share of one process's scored requests to shadow versions."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.in_flight = 0

    def wants(self, share: float) -> bool:
        """Whether to mirror one request, for a shadow taking ``share`` of them."""
        return random.random() < share

    def admit(self, serving: ModelVersion, shadow: ModelVersion) -> bool:
        """Whether a mirror may start now: the shadow serves, and fewer than
        :data:`MAX_IN_FLIGHT` wait (else it is dropped and counted)."""
        if shadow.state is not State.READY or shadow.batcher is None or shadow.model is None:
            self._count(serving, shadow, "dropped")
            return False
        if self.in_flight >= MAX_IN_FLIGHT:
            self._count(serving, shadow, "dropped")
            return False
        self.in_flight += 1
        return True

    async def run(
        self,
        serving: ModelVersion,
        shadow: ModelVersion,
        data: Any,
        outputs: tuple[str, ...] | None,
        answer: Mapping[str, Any],
        rows: int,
    ) -> Divergence | None:
        """Score ``data`` on ``shadow`` (after :meth:`admit`), record how its answer differs
        from ``answer``, ``serving``'s, and return that (None: not compared)."""
        try:
            assert shadow.model is not None and shadow.batcher is not None
            # Read now: the serving version may be retired while the shadow scores.
            labels = serving.model is not None and serving.model.classes_ is not None
            wanted = tuple(answer) if outputs is None else outputs
            try:
                scored = await scoring.score(
                    shadow.model,
                    shadow.batcher,
                    data,
                    outputs=tuple(h for h in wanted if h in shadow.model.methods) or None,
                    deadline=None,
                    strict_columns=False,
                    dtype=shadow.options.dtype,
                    decode_seconds=self.metrics.child(
                        self.metrics.codec_seconds, shadow.name, shadow.version, "decode"
                    ),
                )
            except Exception as exc:  # the shadow's trouble: never the client's
                log.info(
                    "shadow %s version %s failed: %s",
                    shadow.name,
                    shadow.version,
                    exc,
                    extra={"model": shadow.name, "version": shadow.version},
                )
                self._count(serving, shadow, "failed")
                return None
            found = divergence(answer, scored.outputs, rows, labels=labels)
            if found is None:
                self._count(serving, shadow, "incomparable")
                return None
            self._record(serving, shadow, found)
            return found
        finally:
            self.in_flight -= 1

    def _record(self, serving: ModelVersion, shadow: ModelVersion, found: Divergence) -> None:
        m, labels = self.metrics, (serving.name, serving.version, shadow.version)
        self._count(serving, shadow, "compared")
        m.child(m.shadow_rows, *labels).inc(found.rows)
        m.child(m.shadow_label_disagreements, *labels).inc(found.label_disagreements)
        for head, gap in found.max_abs_diff.items():
            m.child(m.shadow_abs_diff, *labels, head).observe(gap)

    def _count(self, serving: ModelVersion, shadow: ModelVersion, result: str) -> None:
        m = self.metrics
        m.child(m.shadow_requests, serving.name, serving.version, shadow.version, result).inc()
