"""Load shedding by queueing delay: CoDel's control law, applied to admission.

A count of requests in progress is a latency budget only at the throughput it was sized for
(Little's law), and a burst of single-row requests that the batcher would answer in one batch
is refused by it all the same. What clients feel is how long a request waits, so that is what
is measured: for every batch a model's batcher starts, the wait of its *freshest* request part
(enqueue to batch start). A queue that keeps even its freshest request waiting beyond
``target_s`` for a whole ``interval_s`` is a standing queue — more work than the model
computes — and not a burst, which one or two batches absorb. As in CoDel (RFC 8289):

- the model starts shedding once the freshest wait has stayed at or above the target for an
  interval, and at once if it was shedding less than ``REENTRY_INTERVALS`` intervals ago (the
  same overload coming back, as CoDel resumes dropping);
- it stops once a whole interval has passed without a request to refuse: the overload is over.

While shedding, a new scoring request for that model is refused (429, on its headers: cheap)
only while the model's requests in progress (admitted and not answered: queued, decoding or
waiting on the event loop) would already fill the batch computing and one more, by the rows of
a request part in recent batches. The compute is never starved, what is admitted waits about
one batch behind the one computing, and admitted requests are never dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# CoDel's memory of a recent overload: re-entering within it skips the interval of grace.
REENTRY_INTERVALS = 16
# Weight of the newest batch in the rows-per-request-part average.
PART_ROWS_WEIGHT = 0.2


class QueueDelay:
    """Whether one model's batch queue stands above its delay target.

    ``observe`` is fed once per batch (the batcher's ``on_batch``); ``batch_rows`` is the
    largest batch. ``on_change(shedding)`` is called on every transition (the application's
    count of shedding models).
    """

    __slots__ = (
        "_above_since",
        "_clock",
        "_last_refusal",
        "_last_shed",
        "_part_rows",
        "batch_rows",
        "interval_s",
        "on_change",
        "shedding",
        "target_s",
    )

    def __init__(
        self,
        *,
        target_s: float,
        interval_s: float,
        batch_rows: int,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not target_s > 0 or not interval_s > 0:
            raise ValueError(
                f"the delay target and interval must be positive, got {target_s}, {interval_s}"
            )
        self.target_s, self.interval_s = float(target_s), float(interval_s)
        self.batch_rows = batch_rows
        self.on_change, self._clock = on_change, clock
        self.shedding = False
        self._above_since: float | None = None  # when the freshest wait reached the target
        self._last_shed = -float("inf")  # when shedding last stopped
        self._last_refusal = -float("inf")
        self._part_rows: float | None = None  # rows of a request part in recent batches

    def observe(self, freshest_wait_s: float, *, waiting: bool, rows: int, parts: int) -> None:
        """A batch of ``rows`` rows from ``parts`` request parts ran; ``freshest_wait_s`` is the
        wait of its freshest part, ``waiting`` whether rows were still queued behind it."""
        now = self._clock()
        if parts > 0:
            old, new = self._part_rows, rows / parts
            self._part_rows = new if old is None else old + PART_ROWS_WEIGHT * (new - old)
        if self.shedding:
            # The waits of a shedding model are short because what it admits is bounded: they
            # say nothing of whether the overload is over. That it had nothing to refuse does.
            if now - self._last_refusal >= self.interval_s:
                self._last_shed = now
                self._set(False)
            return
        if not waiting or freshest_wait_s < self.target_s:
            self._above_since = None  # not a standing queue
            return
        if self._above_since is None:
            self._above_since = now
            if now - self._last_shed < REENTRY_INTERVALS * self.interval_s:
                self._set(True)
        elif now - self._above_since >= self.interval_s:
            self._set(True)

    def refuses(self, in_progress: int) -> bool:
        """Whether a new request should be refused now, with ``in_progress`` of the model's
        requests admitted and not yet answered."""
        if not self.shedding or in_progress * (self._part_rows or 1.0) < 2 * self.batch_rows:
            return False
        self._last_refusal = self._clock()
        return True

    def _set(self, shedding: bool) -> None:
        self.shedding = shedding
        if shedding:  # a first interval to find what to refuse
            self._last_refusal = self._clock()
        if self.on_change is not None:
            self.on_change(shedding)
