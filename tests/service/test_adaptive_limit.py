"""The adaptive in-flight limit on a simulated clock: it holds still while it is not reached,
shrinks in proportion to queueing beyond its tolerance, settles where a CPU-bound server's
median is within it, and grows back when load falls."""

from __future__ import annotations

import pytest

from service.adaptive_limit import AdaptiveLimit

WINDOW_S = 0.1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def limit(ceiling: int = 64, **kw: float) -> tuple[AdaptiveLimit, Clock]:
    clock = Clock()
    options = {"tolerance": 1.5, "initial": 16, "window_s": WINDOW_S, "min_samples": 8, **kw}
    return AdaptiveLimit(ceiling, clock=clock, **options), clock  # type: ignore[arg-type]


def window(adaptive: AdaptiveLimit, clock: Clock, latency_s: float, *, in_flight: int) -> int:
    """One window of 10 requests admitted with ``in_flight`` in progress, each answered after
    ``latency_s``; the limit after it."""
    for _ in range(10):
        adaptive.admitted(in_flight)
        clock.now += WINDOW_S * 0.11  # the tenth closes the window
        adaptive.completed(latency_s)
    return adaptive.value


def test_a_limit_not_reached_never_moves_whatever_the_latency() -> None:
    adaptive, clock = limit()
    assert adaptive.value == 16 and adaptive.baseline_s is None
    for latency in (0.002, 0.002, 0.050, 0.200):  # a slow model or large requests, not queueing
        assert window(adaptive, clock, latency, in_flight=15) == 16
    # The baseline follows those windows (a moving average): the normal latency of now.
    assert adaptive.baseline_s is not None and 0.002 < adaptive.baseline_s < 0.05


def test_queueing_at_the_limit_shrinks_it_in_proportion_and_freezes_the_baseline() -> None:
    adaptive, clock = limit()
    window(adaptive, clock, 0.002, in_flight=3)  # normal: 2 ms
    # At the limit, 4x the normal median: scaled by 1.5 x 2 / 8 = 0.375, at most halved a window.
    assert window(adaptive, clock, 0.008, in_flight=16) == 8
    assert window(adaptive, clock, 0.008, in_flight=8) == 4
    # 2.4 ms at the limit is within 1.5x of 2 ms: it grows again (by a quarter, at least one).
    assert window(adaptive, clock, 0.0024, in_flight=4) == 5
    assert adaptive.baseline_s == pytest.approx(0.002)  # only unconstrained windows move it


def test_a_cpu_bound_server_settles_where_its_median_is_within_the_tolerance() -> None:
    """Latency in proportion to the requests in flight (1 ms each), normal 2 ms: the limit
    settles at 3 (3 ms = 1.5x normal), oscillating by at most one."""
    adaptive, clock = limit()
    window(adaptive, clock, 0.002, in_flight=2)
    seen = []
    for _ in range(40):
        n = adaptive.value
        seen.append(window(adaptive, clock, 0.001 * n, in_flight=n))
    assert set(seen[10:]) <= {2, 3, 4}, seen
    assert max(seen[10:]) <= 4 and 3 in seen[10:]


def test_it_grows_back_to_the_ceiling_when_load_falls_and_never_passes_its_bounds() -> None:
    adaptive, clock = limit(ceiling=20, floor=2)
    window(adaptive, clock, 0.002, in_flight=1)
    for _ in range(10):  # heavy queueing: down to the floor, not below
        window(adaptive, clock, 0.1, in_flight=adaptive.value)
    assert adaptive.value == 2
    grown = [window(adaptive, clock, 0.002, in_flight=adaptive.value) for _ in range(12)]
    assert grown[:4] == [3, 4, 5, 6]  # one at a time, then a quarter a window
    assert grown[-1] == 20 and max(grown) == 20


def test_a_window_needs_its_time_and_its_samples() -> None:
    adaptive, clock = limit()
    window(adaptive, clock, 0.002, in_flight=1)
    for _ in range(7):  # time enough, too few samples: no decision yet
        adaptive.admitted(16)
        clock.now += WINDOW_S
        adaptive.completed(0.1)
    assert adaptive.value == 16
    adaptive.completed(0.1)
    assert adaptive.value == 8


@pytest.mark.parametrize(
    ("ceiling", "kw", "message"),
    [
        (4, {"floor": 5}, "floor <= ceiling"),
        (4, {"floor": 0}, "floor <= ceiling"),
        (4, {"tolerance": 0.9}, "at least 1"),
    ],
)
def test_nonsense_bounds_are_refused(ceiling: int, kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdaptiveLimit(ceiling, **kw)
