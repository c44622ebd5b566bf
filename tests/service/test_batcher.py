"""The dynamic batcher with a real numpy program in a one-thread executor.

A gate (``threading.Event``) holds the program inside ``run`` so that requests queue behind a
busy worker deterministically; ``Program.calls`` records every feed ``run`` saw. Time is a
:class:`FakeClock` the test moves wherever an outcome depends on it, so no assertion depends on
how fast the machine is.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, TypeVar

import numpy as np
import pytest

from service import batcher as batcher_module
from service.batcher import (
    RETRY_AFTER_MAX_S,
    RETRY_AFTER_MIN_S,
    Batcher,
    BatcherClosedError,
    BatchInfo,
    DeadlineExceededError,
    QueueFullError,
    RequestTooLargeError,
)

WIDTH = 3
# max_wait_s of the tests that wait to fill: on a clock that moves only when the test moves it,
# a wait that lasted it would hang the test, not pass it slowly.
HOUR = 3600.0
T = TypeVar("T")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Program:
    """``{"y": x.sum(axis=1) * 2, "x": x}``; rows with a negative value make it raise.

    With a ``clock``, every call takes ``delay_s`` on it: advanced, never slept.
    """

    def __init__(self, *, clock: FakeClock | None = None, delay_s: float = 0.0) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.clock = clock
        self.delay_s = delay_s
        self.calls: list[np.ndarray] = []

    def __call__(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = feed["x"]
        self.calls.append(x.copy())
        if not self.gate.wait(timeout=10):
            raise TimeoutError("the test never opened the gate")
        if self.clock is not None:
            self.clock.now += self.delay_s
        if (x < 0).any():
            raise ValueError("poisoned row")
        return {"y": x.sum(axis=1) * 2, "x": x}

    @property
    def sizes(self) -> list[int]:
        return [len(c) for c in self.calls]

    def saw(self, x: np.ndarray) -> bool:
        """Whether any row of ``x`` reached ``run``."""
        seen = np.concatenate(self.calls) if self.calls else np.empty((0, WIDTH))
        return any((seen == row).all(axis=1).any() for row in x)


@pytest.fixture
def program() -> Iterator[Program]:
    program = Program()
    yield program
    program.gate.set()  # never leave the executor thread stuck after a failed test


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as pool:
        yield pool


_next_value = 0


def rows(n: int) -> np.ndarray:
    """``n`` rows of values no other call of this function returns, to tell requests apart."""
    global _next_value
    x = np.arange(_next_value, _next_value + n * WIDTH, dtype=np.float32).reshape(n, WIDTH)
    _next_value += n * WIDTH
    return x


def check(x: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
    """The caller got exactly the outputs of its own rows, in order."""
    np.testing.assert_array_equal(out["x"], x)
    np.testing.assert_array_equal(out["y"], x.sum(axis=1) * 2)


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.001)


async def let_the_worker_run(turns: int = 20) -> None:
    """Give every ready task some turns of the loop: what the worker would do at once, it did
    (it dispatches synchronously: ``queued_rows`` and ``in_flight_rows`` show it at once)."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def without_waiting(awaitable: Awaitable[T]) -> T:
    """Await what must not wait for max_wait_s (an ``HOUR`` on a clock the test holds still);
    the real-time limit is only a safety net against hanging for that hour."""
    return await asyncio.wait_for(awaitable, timeout=10.0)


def run_async(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


async def occupy(batcher: Batcher, program: Program, n: int = 1, **kw: float) -> asyncio.Task:
    """Close the gate and submit a request that holds the worker inside ``run``."""
    program.gate.clear()
    before = len(program.calls)
    task = asyncio.create_task(batcher.submit({"x": rows(n)}, n, **kw))
    await wait_until(lambda: len(program.calls) > before)
    return task


def make(program: Program, executor: ThreadPoolExecutor, **kw) -> Batcher:
    kw.setdefault("max_batch_rows", 8)
    kw.setdefault("max_queue_rows", 1000)
    return Batcher(program, executor=executor, **kw)


# -- batching --------------------------------------------------------------------------------


def test_queued_requests_pack_into_fewest_batches_and_get_their_own_rows(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=8)
        batcher.start()
        blocker = await occupy(batcher, program)
        inputs = [rows(n) for n in (1, 3, 8, 13, 2, 5, 1)]  # 33 rows, two larger than a batch
        tasks = [asyncio.create_task(batcher.submit({"x": x}, len(x))) for x in inputs]
        await wait_until(lambda: batcher.queued_rows == 33)
        program.gate.set()
        outs = await asyncio.gather(*tasks)
        await blocker
        assert program.sizes[1:] == [8, 8, 8, 8, 1]  # ceil(33 / 8) batches, full ones first
        assert len(program.sizes[1:]) == math.ceil(33 / 8)
        for x, out in zip(inputs, outs, strict=True):
            check(x, out)
        np.testing.assert_array_equal(np.concatenate(program.calls[1:]), np.concatenate(inputs))
        assert (batcher.queued_rows, batcher.in_flight_rows) == (0, 0)
        await batcher.close()

    run_async(scenario)


def test_request_larger_than_a_batch_is_split_and_reassembled(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=8)
        batcher.start()
        x = rows(20)
        check(x, await batcher.submit({"x": x}, 20))
        assert program.sizes == [8, 8, 4]
        await batcher.close()

    run_async(scenario)


def test_next_batch_computes_while_the_previous_results_are_handed_out(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=4)
        batcher.start()
        blocker = await occupy(batcher, program, 2)
        queued = asyncio.create_task(batcher.submit({"x": rows(3)}, 3))
        await wait_until(lambda: batcher.queued_rows == 3)
        program.gate.set()
        await blocker
        # The worker dispatched the queued batch before handing out the first one's rows.
        assert batcher.in_flight_rows == 3 and not queued.done()
        assert len((await queued)["y"]) == 3
        await batcher.close()

    run_async(scenario)


def test_max_wait_lets_a_partial_batch_fill_but_a_full_one_goes_at_once(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    clock = FakeClock()

    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=4, max_wait_s=HOUR, clock=clock)
        batcher.start()
        first_x, second_x = rows(1), rows(2)
        first = asyncio.create_task(batcher.submit({"x": first_x}, 1))
        await wait_until(lambda: batcher.queued_rows == 1)
        await let_the_worker_run()
        assert (batcher.queued_rows, batcher.in_flight_rows) == (1, 0)  # partial: it waits
        # Nearly max_wait_s later by the clock, company arrives; the rest of the wait (on the
        # clock) runs out on its own, with nothing else arriving.
        clock.now += HOUR - 0.05
        second = asyncio.create_task(batcher.submit({"x": second_x}, 2))
        check(first_x, await without_waiting(first))
        check(second_x, await second)
        assert program.sizes == [3]  # the second request joined the waiting batch

        full_x = rows(4)  # full: no waiting for max_wait_s, with the clock standing still
        check(full_x, await without_waiting(batcher.submit({"x": full_x}, 4)))
        assert program.sizes == [3, 4]
        await batcher.close()

    run_async(scenario)


def test_waiting_to_fill_never_outlasts_a_queued_requests_deadline(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    """A deadline before the wait would end: the request goes at once (a waited batch could only
    answer it 504), and a later one with such a deadline cuts the wait of those before it."""
    clock = FakeClock()

    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=8, max_wait_s=HOUR, clock=clock)
        batcher.start()
        await without_waiting(batcher.submit({"x": rows(1)}, 1, deadline=clock.now + 10))
        assert program.sizes == [1]

        patient = asyncio.create_task(batcher.submit({"x": rows(1)}, 1))
        await wait_until(lambda: batcher.queued_rows == 1)
        await let_the_worker_run()  # the patient request waits for company...
        assert batcher.queued_rows == 1 and program.sizes == [1]
        await without_waiting(batcher.submit({"x": rows(2)}, 2, deadline=clock.now + 10))
        await patient  # ...until a request that cannot wait arrives: both go together
        assert program.sizes == [1, 3]
        await batcher.close()

    run_async(scenario)


# -- bounded queue ---------------------------------------------------------------------------


def test_queue_full_is_rejected_with_retry_after_and_counters_return_to_zero(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=4, max_queue_rows=10)
        batcher.start()
        blocker = await occupy(batcher, program, 4)
        assert batcher.in_flight_rows == 4
        queued = asyncio.create_task(batcher.submit({"x": rows(7)}, 7))
        await wait_until(lambda: batcher.queued_rows == 7)
        with pytest.raises(QueueFullError, match="7 of 10 rows queued") as info:
            await batcher.submit({"x": rows(4)}, 4)
        assert RETRY_AFTER_MIN_S <= info.value.retry_after_s <= RETRY_AFTER_MAX_S
        assert batcher.queued_rows == 7  # the rejected rows were never queued
        program.gate.set()
        await asyncio.gather(blocker, queued)
        assert (batcher.queued_rows, batcher.in_flight_rows) == (0, 0)
        await batcher.close()

    run_async(scenario)


def test_request_larger_than_the_queue_is_rejected_saying_it_never_fits(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor, max_queue_rows=10)
        batcher.start()
        with pytest.raises(RequestTooLargeError, match=r"can never fit.*at most 10 rows"):
            await batcher.submit({"x": rows(11)}, 11)
        assert batcher.queued_rows == 0 and program.calls == []
        await batcher.close()

    run_async(scenario)


def test_retry_after_follows_measured_throughput(
    executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Throughput is timed with time.perf_counter around run, not with the batcher's clock: a fake
    # one, advanced by the program itself, makes every batch take exactly delay_s.
    timer = FakeClock()
    monkeypatch.setattr(batcher_module, "time", SimpleNamespace(perf_counter=timer))
    program = Program(clock=timer, delay_s=0.2)  # 4 rows per 0.2 s: 20 rows/s

    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=4, max_queue_rows=4)
        batcher.start()
        await batcher.submit({"x": rows(4)}, 4)
        blocker = await occupy(batcher, program, 4)
        queued = asyncio.create_task(batcher.submit({"x": rows(4)}, 4))
        await wait_until(lambda: batcher.queued_rows == 4)
        with pytest.raises(QueueFullError) as info:
            await batcher.submit({"x": rows(2)}, 2)
        # 4 rows in flight + the 2 rows that do not fit, at 20 rows/s.
        assert info.value.retry_after_s == pytest.approx((4 + 2) / 20)
        program.gate.set()
        await asyncio.gather(blocker, queued)
        await batcher.close()

    try:
        run_async(scenario)
    finally:
        program.gate.set()


# -- deadlines -------------------------------------------------------------------------------


def test_deadline_passed_while_queued_fails_and_is_never_computed(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    clock = FakeClock()

    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=4, clock=clock)
        batcher.start()
        # A 6-row request with a deadline: 4 rows compute, 2 wait for the next batch.
        split = await occupy(batcher, program, 6, deadline=clock.now + 10)
        split_x = program.calls[0]
        late_x, fine_x = rows(2), rows(3)
        late = asyncio.create_task(batcher.submit({"x": late_x}, 2, deadline=clock.now + 10))
        fine = asyncio.create_task(batcher.submit({"x": fine_x}, 3, deadline=clock.now + 60))
        await wait_until(lambda: batcher.queued_rows == 2 + 2 + 3)
        clock.now += 20
        program.gate.set()
        with pytest.raises(DeadlineExceededError, match="deadline passed"):
            await split
        with pytest.raises(DeadlineExceededError):
            await late
        check(fine_x, await fine)
        assert program.sizes == [4, 3]
        assert not program.saw(late_x)
        np.testing.assert_array_equal(program.calls[0], split_x)  # its last 2 rows never ran
        assert (batcher.queued_rows, batcher.in_flight_rows) == (0, 0)
        await batcher.close()

    run_async(scenario)


def test_already_expired_deadline_is_rejected_on_arrival(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    clock = FakeClock()

    async def scenario() -> None:
        batcher = make(program, executor, clock=clock)
        batcher.start()
        with pytest.raises(DeadlineExceededError, match="already passed"):
            await batcher.submit({"x": rows(1)}, 1, deadline=clock.now - 1)
        assert batcher.queued_rows == 0 and program.calls == []
        await batcher.close()

    run_async(scenario)


# -- failures and cancellation ---------------------------------------------------------------


def test_run_error_fails_every_request_of_its_batch_and_serving_continues(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=8)
        batcher.start()
        blocker = await occupy(batcher, program)
        poisoned = -rows(2) - 1
        tasks = [
            asyncio.create_task(batcher.submit({"x": x}, len(x)))
            for x in (rows(1), poisoned, rows(3))
        ]
        await wait_until(lambda: batcher.queued_rows == 6)
        program.gate.set()
        await blocker
        errors = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(e, ValueError) for e in errors)
        assert errors[0] is errors[1] is errors[2]  # the original exception object
        assert str(errors[0]) == "poisoned row"
        x = rows(2)
        check(x, await batcher.submit({"x": x}, 2))
        await batcher.close()

    run_async(scenario)


def test_run_error_also_drops_the_rest_of_a_split_request(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=4)
        batcher.start()
        x = rows(10)
        x[0, 0] = -1
        with pytest.raises(ValueError, match="poisoned"):
            await batcher.submit({"x": x}, 10)
        assert program.sizes == [4]  # its later batches never computed
        assert batcher.queued_rows == 0
        await batcher.close()

    run_async(scenario)


def test_malformed_run_output_fails_the_batch_naming_the_output(
    executor: ThreadPoolExecutor,
) -> None:
    async def scenario() -> None:
        def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {"y": feed["x"][:1]}

        batcher = Batcher(run, max_batch_rows=8, max_queue_rows=8, executor=executor)
        batcher.start()
        with pytest.raises(RuntimeError, match=r"output 'y'.*batch of 2 rows"):
            await batcher.submit({"x": rows(2)}, 2)
        await batcher.close()

    run_async(scenario)


def test_cancelled_request_is_dropped_from_the_queue_and_never_computed(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor)
        batcher.start()
        blocker = await occupy(batcher, program)
        gone_x = rows(5)
        gone = asyncio.create_task(batcher.submit({"x": gone_x}, 5))
        await wait_until(lambda: batcher.queued_rows == 5)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert batcher.queued_rows == 0
        stay_x = rows(2)
        stay = asyncio.create_task(batcher.submit({"x": stay_x}, 2))
        program.gate.set()
        await blocker
        check(stay_x, await stay)
        assert not program.saw(gone_x)
        await batcher.close()

    run_async(scenario)


# -- closing ---------------------------------------------------------------------------------


def test_close_with_drain_completes_queued_requests(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=4)
        batcher.start()
        blocker = await occupy(batcher, program)
        inputs = [rows(3), rows(6)]
        tasks = [asyncio.create_task(batcher.submit({"x": x}, len(x))) for x in inputs]
        await wait_until(lambda: batcher.queued_rows == 9)
        closing = asyncio.create_task(batcher.close(drain=True))
        await asyncio.sleep(0.01)
        assert batcher.closed and not closing.done()
        with pytest.raises(BatcherClosedError):
            await batcher.submit({"x": rows(1)}, 1)
        program.gate.set()
        await closing
        await blocker
        for x, task in zip(inputs, tasks, strict=True):
            check(x, task.result())
        await batcher.close()  # closing twice is harmless

    run_async(scenario)


def test_close_without_drain_fails_queued_requests_but_finishes_the_running_batch(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=4)
        batcher.start()
        running_x = rows(6)  # 4 rows computing, 2 still queued
        program.gate.clear()
        split = asyncio.create_task(batcher.submit({"x": running_x}, 6))
        await wait_until(lambda: len(program.calls) == 1)
        queued_x = rows(3)
        queued = asyncio.create_task(batcher.submit({"x": queued_x}, 3))
        await wait_until(lambda: batcher.queued_rows == 5)
        closing = asyncio.create_task(batcher.close(drain=False))
        with pytest.raises(BatcherClosedError, match="before computing"):
            await queued
        with pytest.raises(BatcherClosedError):
            await split
        assert batcher.queued_rows == 0
        program.gate.set()
        await closing
        assert program.sizes == [4] and not program.saw(queued_x)

    run_async(scenario)


def test_submit_after_close_or_before_start_is_refused(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor)
        with pytest.raises(RuntimeError, match="start"):
            await batcher.submit({"x": rows(1)}, 1)
        batcher.start()
        await batcher.close()
        with pytest.raises(BatcherClosedError):
            await batcher.submit({"x": rows(1)}, 1)
        with pytest.raises(BatcherClosedError):
            batcher.start()

    run_async(scenario)


def test_cancelled_worker_fails_outstanding_requests_instead_of_leaving_them_waiting(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor)
        batcher.start()
        running = await occupy(batcher, program)
        queued = asyncio.create_task(batcher.submit({"x": rows(2)}, 2))
        await wait_until(lambda: batcher.queued_rows == 2)
        assert batcher._worker is not None
        batcher._worker.cancel()  # what loop shutdown does to a batcher nobody closed
        for task in (running, queued):
            with pytest.raises(BatcherClosedError, match="cancelled"):
                await task
        assert batcher.closed and batcher.queued_rows == 0
        program.gate.set()

    run_async(scenario)


# -- on_batch --------------------------------------------------------------------------------


def test_on_batch_reports_rows_requests_and_queue_times(executor: ThreadPoolExecutor) -> None:
    infos: list[BatchInfo] = []
    clock = FakeClock()
    program = Program(clock=clock, delay_s=5.0)  # every batch takes 5 s on the clock

    async def scenario() -> None:
        batcher = make(program, executor, max_batch_rows=8, on_batch=infos.append, clock=clock)
        batcher.start()
        blocker = await occupy(batcher, program, 2)
        tasks = [asyncio.create_task(batcher.submit({"x": rows(n)}, n)) for n in (3, 7)]
        await wait_until(lambda: batcher.queued_rows == 10)
        clock.now += 20.0  # the blocked batch holds them 20 s, then computes 5 s
        program.gate.set()
        await asyncio.gather(blocker, *tasks)
        await batcher.close()

    try:
        run_async(scenario)
    finally:
        program.gate.set()
    assert [(i.rows, i.requests) for i in infos] == [(2, 1), (8, 2), (2, 1)]
    assert all(i.error is None and i.compute_s >= 0 for i in infos)
    # Both waited behind the blocked batch; the split rest also behind the batch of its start.
    assert [i.queue_s for i in infos] == [(0.0,), (25.0, 25.0), (30.0,)]


def test_raising_on_batch_is_logged_and_serving_continues(
    program: Program, executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(info: BatchInfo) -> None:
        raise KeyError("metrics down")

    async def scenario() -> None:
        batcher = make(program, executor, on_batch=broken)
        batcher.start()
        for n in (1, 2):
            x = rows(n)
            check(x, await batcher.submit({"x": x}, n))
        await batcher.close()

    with caplog.at_level(logging.ERROR, logger="service.batcher"):
        run_async(scenario)
    assert caplog.text.count("on_batch callback failed") == 2


# -- feed validation -------------------------------------------------------------------------

_X = np.zeros((2, WIDTH), np.float32)


@pytest.mark.parametrize(
    ("feed", "n", "message"),
    [
        ({"z": _X}, 2, "feed lacks input 'x'"),
        ({"x": _X, "z": _X}, 2, "unexpected input 'z'"),
        ({"x": _X.astype(np.float64)}, 2, r"feed\['x'\] has dtype float64, expected float32"),
        ({"x": np.zeros((2, 4), np.float32)}, 2, r"feed\['x'\] has rows of shape \(4,\)"),
        ({"x": _X}, 3, r"feed\['x'\] has 2 rows, expected 3"),
        ({"x": np.float32(1)}, 1, "not a numpy array"),
        ({"x": _X}, 0, "rows must be a positive integer"),
        ({}, 1, "non-empty mapping"),
    ],
)
def test_mismatched_feeds_are_rejected_naming_the_problem(
    program: Program, executor: ThreadPoolExecutor, feed: dict, n: int, message: str
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor)
        batcher.start()
        await batcher.submit({"x": rows(2)}, 2)  # the first feed defines the signature
        with pytest.raises((ValueError, TypeError), match=message):
            await batcher.submit(feed, n)
        assert batcher.queued_rows == 0
        await batcher.close()

    run_async(scenario)


def test_pinned_signature_rejects_even_the_first_feed(
    program: Program, executor: ThreadPoolExecutor
) -> None:
    async def scenario() -> None:
        batcher = make(program, executor, signature={"x": ("float32", (WIDTH,))})
        batcher.start()
        with pytest.raises(ValueError, match="dtype int64, expected float32"):
            await batcher.submit({"x": np.zeros((1, WIDTH), np.int64)}, 1)
        await batcher.close()

    run_async(scenario)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_batch_rows": 0}, "max_batch_rows must be a positive integer"),
        ({"max_queue_rows": 2.5}, "max_queue_rows must be a positive integer"),
        ({"max_wait_s": -1}, "max_wait_s must be a finite number"),
    ],
)
def test_bad_options_are_rejected(
    program: Program, executor: ThreadPoolExecutor, kw: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make(program, executor, **kw)
