"""The scoring load: a fixed cap, or an adaptive limit below it fed by the requests it admits."""

from __future__ import annotations

import pytest

from service.adaptive_limit import AdaptiveLimit
from service.admission import ScoringLoad


def test_a_fixed_cap_saturates_at_the_cap() -> None:
    load = ScoringLoad(2)
    assert load.limit == 2 and not load.saturated
    load.enter()
    load.enter()
    assert load.saturated
    load.leave(0.001)
    assert not load.saturated and load.in_flight == 1
    assert not ScoringLoad(None).saturated and ScoringLoad(None).limit is None


def test_an_adaptive_load_admits_up_to_its_limit_and_feeds_it_successes_only() -> None:
    now = [0.0]
    adaptive = AdaptiveLimit(8, initial=2, window_s=0.0, min_samples=1, clock=lambda: now[0])
    load = ScoringLoad(8, adaptive=adaptive)
    load.enter()
    load.leave(0.002)  # a window below the limit: the baseline is 2 ms
    assert adaptive.baseline_s == pytest.approx(0.002) and load.limit == 2
    load.enter()
    load.enter()  # the limit is reached
    assert load.saturated
    load.leave(None)  # a failure says nothing of load: no window closes
    load.leave(0.1)  # 50x the baseline at the limit: halved
    assert load.limit == 1 and load.in_flight == 0


def test_an_adaptive_limit_must_answer_to_the_cap() -> None:
    with pytest.raises(ValueError, match="ceiling must be the cap"):
        ScoringLoad(8, adaptive=AdaptiveLimit(16))
    with pytest.raises(ValueError, match="positive integer"):
        ScoringLoad(0)
