"""An in-flight limit that follows measured latency: a gradient concurrency limit.

A fixed cap on scoring requests in progress is a latency budget only while throughput is what it
was sized at (Little's law: wait = in flight / throughput). When the process gets less CPU (a
noisy neighbour, a load generator on the same host, larger requests) throughput drops and the
same cap queues longer; when the process is CPU-bound, raising the cap only adds waiting. This
limit is measured instead, in the manner of Netflix's gradient concurrency limiters:

- Completed requests are grouped into short windows (``window_s``, at least ``min_samples``);
  each window's median latency is its sample.
- The baseline is the latency of normal operation: a moving average of the medians of windows in
  which the limit was never reached (nothing was or could have been refused). Under sustained
  overload every window reaches the limit, so the baseline stays what it was before: the
  admitted requests are held to the latency they had when nobody was refused. Until such a
  window has been seen, the lowest window median stands in.
- At the end of a window in which the limit was reached, the limit is scaled by
  ``tolerance × baseline / median``, clamped to [½, 1¼]: queueing beyond the tolerance shrinks
  it in proportion, a median within it lets it grow (by at least one). While the limit is not
  reached it does not move: latency that is not caused by queueing behind the limit (a slow
  model, large requests) is no reason to refuse.

For a CPU-bound process, where latency grows in proportion to the requests in flight, one step
lands near the limit that holds the median at ``tolerance`` times the baseline; once load falls
back, windows that reach the limit do so with normal latency and it grows back within a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable

SHRINK_AT_MOST, GROW_AT_MOST = 0.5, 1.25  # per window: bounded steps against noisy medians


class AdaptiveLimit:
    """The number of scoring requests admitted at once, between ``floor`` and ``ceiling``."""

    def __init__(
        self,
        ceiling: int,
        *,
        tolerance: float = 2.0,
        floor: int = 1,
        initial: int | None = None,
        window_s: float = 0.1,
        min_samples: int = 8,
        smoothing: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, got floor {floor}, ceiling {ceiling}")
        if tolerance < 1:
            raise ValueError(f"the latency tolerance must be at least 1, got {tolerance}")
        self.ceiling, self.floor, self.tolerance = ceiling, floor, tolerance
        self.window_s, self.min_samples, self.smoothing = window_s, min_samples, smoothing
        self._clock = clock
        self._limit = float(min(ceiling, max(floor, initial if initial is not None else 16)))
        self.value = int(self._limit)
        self._samples: list[float] = []
        self._reached = False  # whether the limit was reached in this window
        self._window_start = clock()
        self._baseline: float | None = None  # from windows that did not reach the limit
        self._lowest = float("inf")  # the lowest window median: the baseline until there is one

    @property
    def baseline_s(self) -> float | None:
        """The median latency of normal operation (None until a window has closed)."""
        if self._baseline is not None:
            return self._baseline
        return None if self._lowest == float("inf") else self._lowest

    def admitted(self, in_flight: int) -> None:
        """A request was admitted; ``in_flight`` counts it."""
        if in_flight >= self.value:
            self._reached = True

    def completed(self, seconds: float) -> None:
        """An admitted request was answered successfully after ``seconds`` of handling."""
        self._samples.append(seconds)
        now = self._clock()
        if now - self._window_start >= self.window_s and len(self._samples) >= self.min_samples:
            self._close_window(now)

    def _close_window(self, now: float) -> None:
        samples = sorted(self._samples)
        median = samples[len(samples) // 2]
        self._lowest = min(self._lowest, median)
        if not self._reached:
            old = self._baseline
            self._baseline = median if old is None else old + self.smoothing * (median - old)
        else:
            baseline = self._baseline if self._baseline is not None else self._lowest
            gradient = self.tolerance * baseline / max(median, 1e-9)
            gradient = min(GROW_AT_MOST, max(SHRINK_AT_MOST, gradient))
            limit = self._limit * gradient
            if gradient > 1:  # growth from a small limit must reach the next integer (1 x 1.25)
                limit = max(limit, self.value + 1.0)
            self._limit = min(float(self.ceiling), max(float(self.floor), limit))
            self.value = int(self._limit)
        self._samples.clear()
        self._reached = False
        self._window_start = now
