"""The scoring load: a hard in-flight cap, and load shedding by queueing delay (CoDel's control
law on each model's batch queue, service/queue_delay.py), on a simulated clock."""

from __future__ import annotations

import pytest

from service.admission import Admission, ScoringLoad
from service.metrics import Metrics
from service.queue_delay import REENTRY_INTERVALS, QueueDelay

TARGET, INTERVAL, BATCH = 0.010, 0.100, 1024


class Queue:
    """A model's queue as the delay controller sees it, on a simulated clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def delay(self, load: ScoringLoad | None = None, name: str = "m") -> QueueDelay:
        args = {"target_s": TARGET, "interval_s": INTERVAL, "batch_rows": BATCH}
        args["clock"] = lambda: self.now
        return load.track(name, **args) if load is not None else QueueDelay(**args)

    def batches(
        self, delay: QueueDelay, wait_s: float, seconds: float, *, part_rows: int = 128
    ) -> None:
        """Full batches of ``part_rows``-row parts, one every 10 ms for ``seconds``, their
        freshest part having waited ``wait_s``, with rows still queued behind each."""
        for _ in range(round(seconds / 0.01)):
            self.now += 0.01
            delay.observe(wait_s, waiting=True, rows=BATCH, parts=BATCH // part_rows)


def test_the_cap_saturates_at_the_cap() -> None:
    load = ScoringLoad(2)
    assert not load.saturated and not load.may_refuse
    load.enter("a")
    load.enter("b")
    assert load.saturated and load.may_refuse
    load.leave("a")
    assert not load.saturated and load.in_flight == 1
    assert not ScoringLoad(None).saturated
    with pytest.raises(ValueError, match="positive integer"):
        ScoringLoad(0)


def test_a_burst_shorter_than_the_interval_is_absorbed() -> None:
    queue = Queue()
    delay = queue.delay()
    queue.batches(delay, wait_s=0.050, seconds=INTERVAL * 0.9)  # far above target, briefly
    delay.observe(0.001, waiting=True, rows=BATCH, parts=8)  # then a batch with a fresh part
    queue.batches(delay, wait_s=0.050, seconds=INTERVAL * 0.9)
    assert not delay.shedding


def test_a_standing_queue_sheds_after_one_interval_and_only_while_a_batch_waits() -> None:
    queue = Queue()
    delay = queue.delay()
    queue.batches(delay, wait_s=TARGET, seconds=INTERVAL - 0.01)  # at the target counts
    assert not delay.shedding
    queue.batches(delay, wait_s=TARGET, seconds=0.03)
    assert delay.shedding
    # 128-row parts: 16 requests in progress fill the batch computing and the next one. Fewer
    # are admitted, so the compute never starves.
    assert not delay.refuses(15) and delay.refuses(16)
    queue.batches(delay, wait_s=TARGET, seconds=1, part_rows=1)  # now single-row requests
    assert not delay.refuses(1000) and delay.refuses(2 * BATCH)


def test_shedding_lasts_until_an_interval_passes_with_nothing_to_refuse() -> None:
    queue = Queue()
    delay = queue.delay()
    queue.batches(delay, wait_s=0.05, seconds=INTERVAL * 2)
    assert delay.shedding
    # Admitting only two batches' worth keeps the waits short: that is no reason to stop, while
    # there is more to refuse.
    for _ in range(30):
        assert delay.refuses(100)
        queue.batches(delay, wait_s=TARGET / 2, seconds=0.01)
    assert delay.shedding
    queue.batches(delay, wait_s=TARGET / 2, seconds=INTERVAL - 0.02)
    assert delay.shedding
    queue.batches(delay, wait_s=TARGET / 2, seconds=0.03)  # an interval without a refusal
    assert not delay.shedding


def test_a_recent_overload_sheds_again_without_the_interval_of_grace() -> None:
    queue = Queue()
    delay = queue.delay()
    queue.batches(delay, wait_s=0.05, seconds=INTERVAL * 2)
    assert delay.shedding
    queue.batches(delay, wait_s=0.0, seconds=INTERVAL * 1.5)  # nothing refused: it stops
    assert not delay.shedding
    queue.now += (REENTRY_INTERVALS - 3) * INTERVAL  # within its memory of the overload
    queue.batches(delay, wait_s=0.05, seconds=0.01)
    assert delay.shedding
    queue.batches(delay, wait_s=0.0, seconds=INTERVAL * 1.5)
    queue.now += (REENTRY_INTERVALS + 1) * INTERVAL  # long ago: a new overload gets its grace
    queue.batches(delay, wait_s=0.05, seconds=INTERVAL / 2)
    assert not delay.shedding


def test_the_load_counts_shedding_models_and_forgets_replaced_ones() -> None:
    queue = Queue()
    load = ScoringLoad(None)
    old = queue.delay(load, "a")
    for _ in range(100):
        load.enter("a")
    queue.batches(old, wait_s=0.05, seconds=INTERVAL * 2)
    assert load.may_refuse and load.shedding("a") is old and load.shedding("b") is None
    new = queue.delay(load, "a")  # a new version of "a" serves: its queue starts empty
    assert not load.may_refuse and load.shedding("a") is None
    # The retired version drains and sheds or not: no effect on the count.
    queue.batches(old, wait_s=0.0, seconds=INTERVAL * 2)
    queue.batches(old, wait_s=0.05, seconds=INTERVAL * 2)
    assert not load.may_refuse
    queue.batches(new, wait_s=0.05, seconds=INTERVAL * 2)
    assert load.shedding("a") is new
    load.untrack("a", old)  # retiring the old version leaves the new one
    assert load.shedding("a") is new
    load.untrack("a", new)
    assert not load.may_refuse and load.shedding("a") is None


def test_admission_refuses_only_the_shedding_models_requests() -> None:
    queue = Queue()
    load = ScoringLoad(None)
    admission = Admission(
        metrics=Metrics(), limit_for=lambda path, method: 1 << 20, model_label=str, scoring=load
    )
    for _ in range(100):
        load.enter("slow")
    queue.batches(queue.delay(load, "slow"), wait_s=0.05, seconds=INTERVAL * 2)
    for path, query in [
        ("/models/slow/predict", b""),
        ("/v2/models/slow/infer", b""),
        ("/predict", b"model=slow"),
    ]:
        refused = admission.decide(path, "POST", [], query).refused
        assert refused is not None and refused.status == 429 and refused.code == "overloaded"
        assert "'slow'" in str(refused) and "10 ms" in str(refused)
    assert admission.decide("/models/other/predict", "POST", []).refused is None
    assert admission.decide("/models/slow", "GET", []).refused is None  # management: never shed
