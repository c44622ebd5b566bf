"""Prometheus histograms and counters cheap enough to update several times per request.

prometheus_client's ``Histogram.observe`` takes two locks and scans the buckets in Python, and
``Counter.inc`` takes one lock, each called several times per single-row score (request,
decode, encode and queue durations, the request count): a visible share of the CPU one request
costs. The classes here record an update by appending it to a list of the child; the list is
folded into prometheus_client's own values in bulk, under one lock, whenever a scrape reads the
child (``_child_samples``, which every exposition and ``registry.collect()`` goes through) or
when it holds :data:`FLUSH_EVERY` updates. A scrape therefore sees exactly what an unbuffered metric
would show: the same series, the same bucket counts, and sums added in the same order.

Updates may come from any thread: ``list.append`` is atomic, and a flush takes the prefix it has
copied with ``del pending[:n]`` (also atomic), so an update landing during a flush stays queued
for the next one. In prometheus_client's multi-process mode values live in shared files read
without calling the children, so :func:`histogram_class` / :func:`counter_class` give the plain
classes there.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Any

from prometheus_client import Counter, Histogram, values

__all__ = [
    "FLUSH_EVERY",
    "BufferedCounter",
    "BufferedHistogram",
    "counter_class",
    "histogram_class",
]

# Updates a child holds before folding them in: bounds the memory of an unscraped process, and
# makes the fold (a bisect and an add per value, one lock) a small cost per update.
FLUSH_EVERY = 256


class _Buffered:
    """What both kinds share: updates appended to ``_pending``, folded in under ``_fold_lock``
    by the subclass's ``_fold`` (prometheus_client's direct path keeps exemplars)."""

    _pending: list[float]
    _fold_lock: threading.Lock

    def _init_buffer(self) -> None:
        self._pending = []
        self._fold_lock = threading.Lock()

    def _record(self, amount: float, exemplar: Any, direct: Any) -> None:
        try:
            pending = self._pending
        except AttributeError:  # a parent with label names: prometheus_client's error
            self._raise_if_not_observable()  # type: ignore[attr-defined]
            raise
        if exemplar:
            with self._fold_lock:
                self._fold()
                direct(amount, exemplar)
            return
        pending.append(amount)
        if len(pending) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Fold the pending updates into the metric's values now."""
        with self._fold_lock:
            self._fold()

    def _take_pending(self) -> list[float]:
        """The updates queued so far (later appends stay queued for the next fold)."""
        pending = self._pending
        n = len(pending)
        taken = pending[:n]
        del pending[:n]
        return taken

    def _fold(self) -> None:
        raise NotImplementedError


class BufferedHistogram(_Buffered, Histogram):
    """A :class:`~prometheus_client.Histogram` whose ``observe`` appends to a list (see the
    module docstring); exemplars take prometheus_client's own path."""

    def _metric_init(self) -> None:
        super()._metric_init()
        self._init_buffer()

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        self._record(amount, exemplar, super().observe)

    def _fold(self) -> None:
        observed = self._take_pending()
        if not observed:
            return
        bounds = self._upper_bounds
        counts = [0] * len(bounds)
        total = self._sum.get()
        for amount in observed:
            total += amount  # one at a time, as observe() adds: the same float sum
            if amount == amount:  # NaN falls in no bucket (observe: ``amount <= bound`` fails)
                counts[bisect_left(bounds, amount)] += 1  # the first bound >= amount
        self._sum.set(total)
        for bucket, count in zip(self._buckets, counts, strict=True):
            if count:
                bucket.inc(count)

    def _child_samples(self) -> Any:
        self.flush()
        return super()._child_samples()


class BufferedCounter(_Buffered, Counter):
    """A :class:`~prometheus_client.Counter` whose ``inc`` appends to a list (see the module
    docstring); exemplars take prometheus_client's own path."""

    def _metric_init(self) -> None:
        super()._metric_init()
        self._init_buffer()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._record(amount, exemplar, super().inc)

    def _fold(self) -> None:
        added = self._take_pending()
        if not added:
            return
        total = self._value.get()
        for amount in added:
            total += amount
        self._value.set(total)

    def reset(self) -> None:
        with self._fold_lock:
            del self._pending[:]
            super().reset()

    def _child_samples(self) -> Any:
        self.flush()
        return super()._child_samples()


def _buffering() -> bool:
    """Whether values live in this process (not multi-process mode's shared files)."""
    return values.ValueClass is values.MutexValue


def histogram_class() -> type[Histogram]:
    """:class:`BufferedHistogram`, or prometheus_client's in multi-process mode."""
    return BufferedHistogram if _buffering() else Histogram


def counter_class() -> type[Counter]:
    """:class:`BufferedCounter`, or prometheus_client's in multi-process mode."""
    return BufferedCounter if _buffering() else Counter
