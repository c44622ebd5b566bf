"""Dynamic batcher: many concurrent requests become few calls of a model's compiled program.

One :class:`Batcher` per model. Callers ``await submit(feed, rows)``; a single worker task takes
whatever is queued whenever it is free (greedy), packs it in arrival order into batches of at most
``max_batch_rows`` rows — splitting a request across consecutive batches when it does not fit —
and runs the program in the caller's executor, so the event loop is never blocked by compute.
Each caller gets exactly its own rows back.

The queue is bounded in rows; requests carry optional deadlines and may be cancelled. The batcher
knows nothing about HTTP or metrics: the service maps its exceptions to status codes
(:class:`QueueFullError` → 429, :class:`DeadlineExceededError` → 504,
:class:`BatcherClosedError` → 503) and records metrics from the ``on_batch`` callback.

Overlap: when a batch finishes, the worker first dispatches the next batch and only then hands
out the finished batch's rows, so slicing results on the event loop overlaps the next compute
(a failed batch is handed out first, so the rest of a split request it failed never computes).
Concatenating a batch's feeds happens in the executor thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import DTypeLike

__all__ = [
    "BatchInfo",
    "Batcher",
    "BatcherClosedError",
    "BatcherError",
    "DeadlineExceededError",
    "QueueFullError",
    "RequestTooLargeError",
]

RunFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
Clock = Callable[[], float]

_log = logging.getLogger(__name__)

RETRY_AFTER_MIN_S = 0.05
RETRY_AFTER_MAX_S = 30.0
# Before the first batch there is no throughput to estimate from.
_RETRY_AFTER_UNKNOWN_S = 1.0
# Weight of the newest batch in the rows/s average: smooths one slow batch, follows load changes.
_THROUGHPUT_ALPHA = 0.2


class BatcherError(Exception):
    """Base of the errors :meth:`Batcher.submit` raises for reasons of the batcher itself."""


class QueueFullError(BatcherError):
    """The queue has no room for the request's rows; retry after ``retry_after_s`` seconds."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestTooLargeError(QueueFullError):
    """The request has more rows than the queue can ever hold: retrying cannot help."""


class DeadlineExceededError(BatcherError):
    """The request's deadline passed before its batch formed; it was never computed."""


class BatcherClosedError(BatcherError):
    """The batcher is closed (or its worker stopped) and no longer takes or finishes requests."""


@dataclass(frozen=True)
class BatchInfo:
    """What one call of ``run`` did, for metrics.

    ``compute_s`` is the duration of ``run`` alone (``time.perf_counter``); ``queue_s`` has one
    entry per request part in the batch: enqueue → batch start, in ``clock`` units. ``error`` is
    the exception ``run`` raised, if any (every request part in the batch failed with it).
    """

    rows: int
    requests: int
    compute_s: float
    queue_s: tuple[float, ...]
    error: BaseException | None = None


@dataclass(eq=False)
class _Request:
    feed: dict[str, np.ndarray]
    rows: int
    deadline: float | None
    enqueued: float
    future: asyncio.Future[dict[str, np.ndarray]]
    taken: int = 0  # rows already placed into batches
    queued: bool = True  # still has untaken rows counted in the queue
    chunks: list[dict[str, np.ndarray]] = field(default_factory=list)
    received: int = 0


@dataclass(frozen=True)
class _Part:
    """Rows ``start:stop`` of a request, placed at ``offset`` in a batch."""

    request: _Request
    start: int
    stop: int
    offset: int
    queue_s: float


@dataclass(frozen=True)
class _Outcome:
    outputs: dict[str, np.ndarray] | None
    error: BaseException | None
    compute_s: float
    service_s: float  # concatenation + run: what bounds throughput


@dataclass(eq=False)
class _Batch:
    parts: list[_Part]
    rows: int
    future: asyncio.Future[_Outcome]


def _execute(run: RunFn, feeds: list[Mapping[str, np.ndarray]], rows: int) -> _Outcome:
    """Runs in the executor thread: concatenate the parts, call ``run``, check its outputs."""
    t0 = time.perf_counter()
    t1 = t0
    try:
        if len(feeds) == 1:
            feed = feeds[0]
        else:
            feed = {k: np.concatenate([f[k] for f in feeds], axis=0) for k in feeds[0]}
        t1 = time.perf_counter()
        outputs = _checked_outputs(run(feed), rows)
    except Exception as exc:  # handed to every request of the batch
        t2 = time.perf_counter()
        return _Outcome(None, exc, t2 - t1, t2 - t0)
    t2 = time.perf_counter()
    return _Outcome(outputs, None, t2 - t1, t2 - t0)


def _execute_for(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[_Outcome],
    run: RunFn,
    feeds: list[Mapping[str, np.ndarray]],
    rows: int,
) -> None:
    """Runs in the executor thread: :func:`_execute`, then hand the outcome to the event loop.

    One ``call_soon_threadsafe`` instead of ``run_in_executor``'s chained concurrent and asyncio
    futures: less CPU per batch, which a single-row request pays in full.
    """
    if future.cancelled():  # the worker was cancelled before this batch started: skip it
        return
    outcome = _execute(run, feeds, rows)
    # RuntimeError: the loop closed meanwhile, and nobody waits for this batch any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_resolve, future, outcome)


def _resolve(future: asyncio.Future[_Outcome], outcome: _Outcome) -> None:
    if not future.done():  # cancelled while computing
        future.set_result(outcome)


def _checked_outputs(outputs: object, rows: int) -> dict[str, np.ndarray]:
    if not isinstance(outputs, Mapping):
        raise RuntimeError(f"run returned {type(outputs).__name__}, expected a mapping of arrays")
    checked: dict[str, np.ndarray] = {}
    for key, value in outputs.items():
        if not isinstance(value, np.ndarray) or value.ndim == 0 or value.shape[0] != rows:
            got = value.shape if isinstance(value, np.ndarray) else type(value).__name__
            raise RuntimeError(
                f"run returned output {key!r} as {got} for a batch of {rows} rows; "
                "every output needs the rows on axis 0"
            )
        checked[key] = value
    return checked


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class Batcher:
    """Greedy dynamic batcher for one model's synchronous ``run`` function.

    ``run(feed) -> outputs`` takes and returns arrays with the rows on axis 0 and must run off
    the event loop, in ``executor`` (one thread per model is the expected configuration; at most
    one batch computes at a time anyway). ``max_wait_s > 0`` lets a partial batch wait until its
    oldest request has waited that long for more rows to arrive. ``signature`` pins each feed
    key's (dtype, trailing shape); without it the first submitted feed defines it.
    ``clock`` gives deadlines and queue times (absolute, e.g. ``time.monotonic``).
    """

    def __init__(
        self,
        run: RunFn,
        *,
        max_batch_rows: int,
        max_queue_rows: int,
        executor: Executor,
        max_wait_s: float = 0.0,
        on_batch: Callable[[BatchInfo], None] | None = None,
        clock: Clock = time.monotonic,
        signature: Mapping[str, tuple[DTypeLike, tuple[int, ...]]] | None = None,
    ) -> None:
        if not callable(run):
            raise TypeError(f"run must be callable, got {type(run).__name__}")
        if (
            not (isinstance(max_wait_s, int | float) and math.isfinite(max_wait_s))
            or max_wait_s < 0
        ):
            raise ValueError(f"max_wait_s must be a finite number >= 0, got {max_wait_s!r}")
        self._run = run
        self._max_batch_rows = _positive_int("max_batch_rows", max_batch_rows)
        self._max_queue_rows = _positive_int("max_queue_rows", max_queue_rows)
        self._executor = executor
        self._max_wait_s = float(max_wait_s)
        self._on_batch = on_batch
        self._clock = clock
        self._signature: dict[str, tuple[np.dtype, tuple[int, ...]]] | None = None
        if signature is not None:
            self._signature = {k: (np.dtype(d), tuple(s)) for k, (d, s) in signature.items()}
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._in_flight_rows = 0
        self._rows_per_s: float | None = None
        self._wakeup = asyncio.Event()
        self._closing = False
        self._worker: asyncio.Task[None] | None = None

    # -- state -------------------------------------------------------------------------------
    @property
    def queued_rows(self) -> int:
        """Rows waiting for a batch (the untaken rest of split requests included)."""
        return self._queued_rows

    @property
    def in_flight_rows(self) -> int:
        """Rows of the batch computing now (0 when idle)."""
        return self._in_flight_rows

    @property
    def closed(self) -> bool:
        """True once :meth:`close` began (or the worker stopped): submit then fails."""
        return self._closing

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Create the worker task on the running event loop."""
        if self._closing:
            raise BatcherClosedError("the batcher is closed; create a new one")
        if self._worker is not None:
            raise RuntimeError("the batcher is already started")
        self._worker = asyncio.get_running_loop().create_task(self._work(), name="batcher")

    async def close(self, *, drain: bool = True) -> None:
        """Stop taking requests and wait for the worker to finish.

        ``drain=True`` computes every queued request first; ``drain=False`` fails queued
        requests with :class:`BatcherClosedError` (the batch already computing still completes).
        Safe to call more than once.
        """
        self._closing = True
        if not drain:
            self._fail_queued(
                BatcherClosedError("the batcher closed before computing this request")
            )
        self._wakeup.set()
        if self._worker is not None:
            await self._worker

    # -- requests ----------------------------------------------------------------------------
    async def submit(
        self, feed: Mapping[str, np.ndarray], rows: int, *, deadline: float | None = None
    ) -> dict[str, np.ndarray]:
        """Queue ``rows`` rows and return the outputs for exactly those rows, in order.

        ``deadline`` is absolute, in ``clock`` units. Raises :class:`QueueFullError`,
        :class:`DeadlineExceededError`, :class:`BatcherClosedError`, ``ValueError`` for a feed
        that does not match the batcher's signature, or whatever ``run`` raised for this batch.
        """
        if self._closing:
            raise BatcherClosedError("the batcher is closed")
        if self._worker is None:
            raise RuntimeError("call Batcher.start() before submit()")
        arrays = self._validated(feed, rows)
        now = self._clock()
        if deadline is not None and now >= deadline:
            raise DeadlineExceededError(
                f"deadline already passed {now - deadline:.3f}s ago on arrival"
            )
        if rows > self._max_queue_rows:
            raise RequestTooLargeError(
                f"request of {rows} rows can never fit: the queue holds at most "
                f"{self._max_queue_rows} rows; split it into smaller requests",
                RETRY_AFTER_MAX_S,
            )
        if self._queued_rows + rows > self._max_queue_rows:
            raise QueueFullError(
                f"queue full: {self._queued_rows} of {self._max_queue_rows} rows queued, "
                f"no room for {rows} more",
                self._retry_after(rows),
            )
        future: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        request = _Request(arrays, rows, deadline, now, future)
        self._queue.append(request)
        self._queued_rows += rows
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:
            self._abandon(request)  # caller gone: its untaken rows are never computed
            raise

    def _validated(self, feed: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        _positive_int("rows", rows)
        # A dict first: the same answer as the Mapping check, without its ABC lookup.
        if not (type(feed) is dict or isinstance(feed, Mapping)) or not feed:
            raise ValueError("feed must be a non-empty mapping of input name → array")
        arrays = dict(feed)
        for key, value in arrays.items():
            if not isinstance(value, np.ndarray):
                raise TypeError(f"feed[{key!r}] is {type(value).__name__}, not a numpy array")
            if value.ndim == 0 or value.shape[0] != rows:
                got = "a scalar" if value.ndim == 0 else f"{value.shape[0]} rows"
                raise ValueError(f"feed[{key!r}] has {got}, expected {rows} rows on axis 0")
        signature = self._signature
        if signature is None:
            self._signature = {k: (v.dtype, v.shape[1:]) for k, v in arrays.items()}
            return arrays
        for key in signature:
            if key not in arrays:
                raise ValueError(f"feed lacks input {key!r}; expected {sorted(signature)}")
        for key, value in arrays.items():
            if key not in signature:
                raise ValueError(f"feed has unexpected input {key!r}; expected {sorted(signature)}")
            dtype, trailing = signature[key]
            if value.dtype != dtype:
                raise ValueError(f"feed[{key!r}] has dtype {value.dtype}, expected {dtype}")
            if value.shape[1:] != trailing:
                raise ValueError(
                    f"feed[{key!r}] has rows of shape {value.shape[1:]}, expected {trailing}"
                )
        return arrays

    def _retry_after(self, rows: int) -> float:
        """Seconds until the queue has likely drained enough to take ``rows`` more rows."""
        if self._rows_per_s is None:
            estimate = _RETRY_AFTER_UNKNOWN_S
        else:
            excess = self._queued_rows + rows - self._max_queue_rows
            estimate = (self._in_flight_rows + excess) / self._rows_per_s
        return min(max(estimate, RETRY_AFTER_MIN_S), RETRY_AFTER_MAX_S)

    def _abandon(self, request: _Request) -> None:
        """Take a request's untaken rows out of the queue; the worker skips it from now on."""
        if request.queued:
            request.queued = False
            self._queued_rows -= request.rows - request.taken

    def _fail_queued(self, error: BaseException) -> None:
        while self._queue:
            request = self._queue.popleft()
            self._abandon(request)
            if not request.future.done():
                request.future.set_exception(error)

    # -- worker ------------------------------------------------------------------------------
    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        in_flight: _Batch | None = None
        finishing: _Batch | None = None  # computed, its rows not yet handed out
        try:
            while True:
                if in_flight is None:
                    await self._wait_for_work()
                    if self._queued_rows == 0:  # closing with nothing left
                        return
                    await self._wait_to_fill()
                else:
                    # Awaited directly (not through asyncio.wait, whose extra callback costs one
                    # more event-loop iteration per batch, a long one under load). Never
                    # raises: _execute returns the error in its outcome.
                    await in_flight.future
                    self._in_flight_rows = 0
                    partial = self._queued_rows < self._max_batch_rows
                    failed = in_flight.future.result().error is not None
                    finishing, in_flight = in_flight, None
                    if failed or (self._max_wait_s > 0 and partial and not self._closing):
                        # A failed batch fails its requests first, so the rest of a split
                        # request is never computed; a batch that may wait to fill hands
                        # out the finished rows before it waits.
                        self._finish(finishing)
                        finishing = None
                        continue
                in_flight = self._dispatch(loop)
                if finishing is not None:
                    self._finish(finishing)
                    finishing = None
        except asyncio.CancelledError:
            error = BatcherClosedError("the batcher's worker was cancelled")
            self._stop((in_flight, finishing), error)
            raise
        except Exception as exc:  # a bug here must not leave callers waiting forever
            _log.exception("batcher worker failed; failing its outstanding requests")
            error = BatcherClosedError(f"the batcher's worker failed: {exc!r}")
            error.__cause__ = exc
            self._stop((in_flight, finishing), error)

    def _stop(self, batches: tuple[_Batch | None, ...], error: BatcherClosedError) -> None:
        """Fail everything outstanding: the worker is gone and nothing else would answer."""
        self._closing = True
        self._in_flight_rows = 0
        self._fail_queued(error)
        for batch in batches:
            for part in batch.parts if batch is not None else ():
                if not part.request.future.done():
                    part.request.future.set_exception(error)

    async def _wait_for_work(self) -> None:
        while self._queued_rows == 0 and not self._closing:
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _wait_to_fill(self) -> None:
        """With ``max_wait_s``: wait until the batch is full or its oldest request waited enough.

        Never past a queued request's deadline: a request that would expire before the wait
        ends is dispatched now (waiting for company could only turn its answer into a 504).
        """
        while self._max_wait_s > 0 and self._queued_rows < self._max_batch_rows:
            if self._closing:
                return
            waiting = [r for r in self._queue if r.queued and not r.future.done()]
            if not waiting:
                return
            until = waiting[0].enqueued + self._max_wait_s
            if any(r.deadline is not None and r.deadline <= until for r in waiting):
                return
            remaining = until - self._clock()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._wakeup.wait()
            except TimeoutError:
                return

    def _dispatch(self, loop: asyncio.AbstractEventLoop) -> _Batch | None:
        """Form the next batch from the queue head and start computing it (None: nothing to do)."""
        now = self._clock()
        parts: list[_Part] = []
        room = self._max_batch_rows
        while room and self._queue:
            request = self._queue[0]
            if not request.queued or request.future.done():
                self._abandon(request)  # cancelled, or failed with an earlier part
                self._queue.popleft()
                continue
            if request.deadline is not None and now >= request.deadline:
                self._abandon(request)
                self._queue.popleft()
                request.future.set_exception(
                    DeadlineExceededError(
                        f"deadline passed {now - request.deadline:.3f}s before the request "
                        f"was computed (queued {now - request.enqueued:.3f}s)"
                    )
                )
                continue
            offset = self._max_batch_rows - room
            take = min(request.rows - request.taken, room)
            start = request.taken
            parts.append(_Part(request, start, start + take, offset, now - request.enqueued))
            request.taken += take
            self._queued_rows -= take
            room -= take
            if request.taken == request.rows:
                request.queued = False
                self._queue.popleft()
        if not parts:
            return None
        rows = self._max_batch_rows - room
        feeds = [_part_feed(p) for p in parts]
        future: asyncio.Future[_Outcome] = loop.create_future()
        try:
            self._executor.submit(_execute_for, loop, future, self._run, feeds, rows)
        except Exception as exc:  # e.g. the executor was shut down
            future.set_result(_Outcome(None, exc, 0.0, 0.0))
        self._in_flight_rows = rows
        return _Batch(parts, rows, future)

    def _finish(self, batch: _Batch) -> None:
        """Hand a computed batch's rows to their requests (or its error), then report it."""
        outcome = batch.future.result()  # _execute never raises
        if outcome.outputs is not None:
            rate = batch.rows / max(outcome.service_s, 1e-9)
            old = self._rows_per_s
            self._rows_per_s = rate if old is None else old + _THROUGHPUT_ALPHA * (rate - old)
            for part in batch.parts:
                try:
                    _deliver(part, outcome.outputs)
                except Exception as exc:  # e.g. run's outputs changed keys between batches
                    if not part.request.future.done():
                        self._abandon(part.request)
                        part.request.future.set_exception(exc)
        else:
            for part in batch.parts:
                request = part.request
                if not request.future.done():
                    self._abandon(request)  # drop a split request's remaining rows too
                    request.future.set_exception(outcome.error)  # type: ignore[arg-type]
        if self._on_batch is not None:
            info = BatchInfo(
                rows=batch.rows,
                requests=len(batch.parts),
                compute_s=outcome.compute_s,
                queue_s=tuple(p.queue_s for p in batch.parts),
                error=outcome.error,
            )
            try:
                self._on_batch(info)
            except Exception:
                _log.exception("on_batch callback failed; serving continues")


def _part_feed(part: _Part) -> dict[str, np.ndarray]:
    request = part.request
    if part.start == 0 and part.stop == request.rows:
        return request.feed
    return {k: v[part.start : part.stop] for k, v in request.feed.items()}


def _deliver(part: _Part, outputs: dict[str, np.ndarray]) -> None:
    request = part.request
    if request.future.done():  # cancelled, expired or failed while this part computed
        return
    stop = part.offset + part.stop - part.start
    request.chunks.append({k: v[part.offset : stop] for k, v in outputs.items()})
    request.received += part.stop - part.start
    if request.received == request.rows:
        chunks = request.chunks
        if len(chunks) == 1:
            result = chunks[0]
        else:
            result = {k: np.concatenate([c[k] for c in chunks], axis=0) for k in chunks[0]}
        request.chunks = []
        request.future.set_result(result)
