"""service/buffered_metrics.py: buffered histograms and counters expose exactly what
prometheus_client's own classes expose for the same updates."""

from __future__ import annotations

import math
import random
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from service.buffered_metrics import FLUSH_EVERY, BufferedCounter, BufferedHistogram
from service.metrics import LATENCY_BUCKETS


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for family in registry.collect():
        for s in family.samples:
            if not s.name.endswith("_created"):
                out.append((s.name, s.labels, s.value))
    return sorted(out, key=lambda x: (x[0], sorted(x[1].items())))


def _pair(kind: str) -> tuple[CollectorRegistry, CollectorRegistry, object, object]:
    plain_r, fast_r = CollectorRegistry(), CollectorRegistry()
    if kind == "histogram":
        args = ("h_seconds", "help", ("model",))
        plain = Histogram(*args, buckets=LATENCY_BUCKETS, registry=plain_r)
        fast = BufferedHistogram(*args, buckets=LATENCY_BUCKETS, registry=fast_r)
    else:
        plain = Counter("c", "help", ("model",), registry=plain_r)
        fast = BufferedCounter("c", "help", ("model",), registry=fast_r)
    return plain_r, fast_r, plain, fast


def test_histogram_matches_prometheus_client_value_for_value() -> None:
    plain_r, fast_r, plain, fast = _pair("histogram")
    rng = random.Random(7)
    edge = [0.0, -1.0, 0.0001, 0.00025, 1.0, 10.0, 11.0, math.inf, math.nan, 1e-300]
    values = edge + [rng.lognormvariate(-7, 2) for _ in range(3 * FLUSH_EVERY + 5)]
    for i, v in enumerate(values):
        label = "a" if i % 3 else "b"
        plain.labels(label).observe(v)
        fast.labels(label).observe(v)
        if i in (4, FLUSH_EVERY + 1):  # scrapes in between fold what is pending
            assert repr(_samples(fast_r)) == repr(_samples(plain_r))
    # repr: NaN sums compare equal too, and float sums must match to the last bit
    assert repr(_samples(fast_r)) == repr(_samples(plain_r))
    # The exposition too, but for the _created timestamps (the two families were made apart).
    assert _without_created(generate_latest(fast_r)) == _without_created(generate_latest(plain_r))


def _without_created(text: bytes) -> list[bytes]:
    return [line for line in text.splitlines() if b"_created" not in line]


def test_counter_matches_prometheus_client_and_resets() -> None:
    plain_r, fast_r, plain, fast = _pair("counter")
    for i in range(2 * FLUSH_EVERY + 3):
        amount = (i % 5) * 0.1
        plain.labels("a").inc(amount)
        fast.labels("a").inc(amount)
    assert repr(_samples(fast_r)) == repr(_samples(plain_r))
    fast.labels("a").inc(3)
    fast.labels("a").reset()  # pending increments go with the reset
    assert fast_r.get_sample_value("c_total", {"model": "a"}) == 0.0
    with pytest.raises(ValueError, match="non-negative"):
        fast.labels("a").inc(-1)


def test_a_parent_with_labels_refuses_updates_as_prometheus_client_does() -> None:
    _, _, plain_h, fast_h = _pair("histogram")
    _, _, plain_c, fast_c = _pair("counter")
    for plain, fast, update in ((plain_h, fast_h, "observe"), (plain_c, fast_c, "inc")):
        with pytest.raises(ValueError) as want:
            getattr(plain, update)(1)
        with pytest.raises(ValueError) as got:
            getattr(fast, update)(1)
        assert str(got.value) == str(want.value)


def test_exemplars_take_the_unbuffered_path_in_order() -> None:
    registry = CollectorRegistry()
    h = BufferedHistogram("x_seconds", "help", registry=registry, buckets=(1, 2))
    h.observe(0.5)
    h.observe(1.5, {"trace_id": "abc"})
    assert registry.get_sample_value("x_seconds_count") == 2
    assert registry.get_sample_value("x_seconds_bucket", {"le": "2.0"}) == 2


def test_updates_from_many_threads_are_all_counted() -> None:
    registry = CollectorRegistry()
    h = BufferedHistogram("t_seconds", "help", registry=registry, buckets=LATENCY_BUCKETS)
    c = BufferedCounter("t", "help", registry=registry)
    threads, per_thread = 4, 5 * FLUSH_EVERY + 17

    def work() -> None:
        for _ in range(per_thread):
            h.observe(0.001)
            c.inc()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for _ in range(50):  # scrapes racing the updates
        registry.get_sample_value("t_total")
    for t in pool:
        t.join()
    assert registry.get_sample_value("t_seconds_count") == threads * per_thread
    assert registry.get_sample_value("t_total") == threads * per_thread
