"""Overload: a minute of offered load at three times the server's measured capacity.

A real server scoring 128-row requests with a 300-tree forest: requests that cost the server
milliseconds, as batch scoring does, so that a generator process sharing two cores with it can
offer three times what it serves without taking the server's core (a cheaper model's capacity
is more than a Python generator can offer three times over). A closed-loop ramp finds its
capacity (the best rate of successful predictions) and the latency at it. Nothing is sized by the operator: the server sheds by
queueing delay on its default settings (service/queue_delay.py). An open-loop generator in a
separate process (tests/service/loadgen.py: fixed arrival rate, latency counted from each
arrival's due time) then measures normal load (half of capacity), overload (three times
capacity, the server's RSS sampled from /proc) and normal load again.

The test asserts what must hold on any machine: only 200 or 429, no errors, the server alive,
most of the excess refused, goodput kept, memory bounded. The latency figures (each a ratio
between phases of the same run) are printed for docs/reliability.md, not asserted: they are speed
targets.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import skops.io as sio
from sklearn.ensemble import RandomForestClassifier

from tests.service.live import LiveServer
from tests.service.loadgen import run_process

pytestmark = [pytest.mark.slow, pytest.mark.overload]

OVERLOAD_FACTOR = 3.0
OVERLOAD_S = 60.0
NORMAL_FACTOR = 0.5
NORMAL_S = 10.0
RAMP = (1, 2, 4, 8, 16, 32)  # closed-loop connections
CONNECTIONS = 256  # open loop: enough that arrivals rarely wait for a free connection
RSS_GROWTH_MB = 100

FEATURES, ROWS = 16, 128
TREES = 300
X = np.random.default_rng(0).normal(size=(ROWS, FEATURES)).astype(np.float32)
PATH = "/models/m/predict"
BODY = json.dumps(X.tolist())


def _load(live: LiveServer, *args: str) -> dict[str, Any]:
    return run_process(live.url, PATH, BODY, *args)


def _open(live: LiveServer, rate: float, seconds: float) -> dict[str, Any]:
    args = ("--rate", f"{rate:.1f}", "--duration", str(seconds), "--connections", str(CONNECTIONS))
    return _load(live, *args)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used: how much of the machine it got."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class RssSampler(threading.Thread):
    """Samples a process's resident set size every ``interval_s`` until stopped."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[float] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.samples.append(_rss_mb(self.pid))

    def stop(self) -> list[float]:
        self._stop_event.set()
        self.join()
        return self.samples


class Batches(NamedTuple):
    """The model's batches so far, from one /metrics scrape."""

    count: float
    rows: float
    compute_s: float

    def __sub__(self, other: Batches) -> Batches:  # type: ignore[override]
        return Batches(*(a - b for a, b in zip(self, other, strict=True)))


def _batches(live: LiveServer) -> Batches:
    labels = {"model": "m"}
    return Batches(
        live.metric("kestrel_compute_duration_seconds_count", **labels),
        live.metric("kestrel_batch_rows_sum", **labels),
        live.metric("kestrel_compute_duration_seconds_sum", **labels),
    )


def _count(summary: dict[str, Any], status: str) -> int:
    return summary["by_status"].get(status, {}).get("count", 0)


def test_three_times_capacity_for_a_minute_sheds_fast_and_keeps_admitted_latency(
    tmp_path: Path,
) -> None:
    x = np.random.default_rng(1).normal(size=(2000, FEATURES)).astype(np.float32)
    y = x[:, 0] + x[:, 1] * x[:, 2] > 0
    model = RandomForestClassifier(n_estimators=TREES, max_depth=8, random_state=0).fit(x, y)
    quiet = {"KESTREL_LOG_LEVEL": "warning"}
    live = LiveServer(tmp_path, **quiet).start()
    try:
        r = live.register("m", sio.dumps(model), options='{"max_batch": 512}')
        assert r.status_code == 201, r.text
        _load(live, "--closed", "--connections", "4", "--duration", "2")  # warm up
        ramp = {
            n: _load(live, "--closed", "--connections", str(n), "--duration", "3") for n in RAMP
        }
        capacity = max(s["ok_per_s"] for s in ramp.values())
        assert live.proc is not None
        pid = live.proc.pid
        cpu0 = _cpu_s(pid)
        normal = _open(live, NORMAL_FACTOR * capacity, NORMAL_S)
        rss_before, cpu1 = _rss_mb(pid), _cpu_s(pid)
        batches_before = _batches(live)
        sampler = RssSampler(pid)
        sampler.start()
        overload = _open(live, OVERLOAD_FACTOR * capacity, OVERLOAD_S)
        rss_during, cpu2 = sampler.stop(), _cpu_s(pid)
        batches = _batches(live) - batches_before
        after = _open(live, NORMAL_FACTOR * capacity, NORMAL_S)
        rss_after = _rss_mb(pid)
        alive = live.alive()
        logs = live.logs()
    finally:
        live.stop()

    shed = _count(overload, "429") / overload["answered"]
    at_capacity = max(ramp.values(), key=lambda s: s["ok_per_s"])
    admitted = _p50_p99(overload, "200")
    report = {
        "capacity_per_s": round(capacity),
        "ramp_ok_per_s": {n: round(s["ok_per_s"]) for n, s in ramp.items()},
        "capacity_p50_p99_ms": _p50_p99(at_capacity, "200"),
        "normal_p50_p99_ms": _p50_p99(normal, "200"),
        "normal_429": _count(normal, "429"),
        "normal_server_cpu_cores": round((cpu1 - cpu0) / normal["elapsed_s"], 2),
        "overload_offered_per_s": round(overload["offered_per_s"]),
        "overload_elapsed_s": round(overload["elapsed_s"], 1),
        "overload_server_cpu_cores": round((cpu2 - cpu1) / overload["elapsed_s"], 2),
        "overload_admitted_per_s": round(overload["ok_per_s"]),
        "overload_admitted_p50_p99_ms": admitted,
        "overload_batch_rows_compute_ms": (
            round(batches.rows / batches.count),
            round(batches.compute_s / batches.count * 1e3, 2),
        ),
        "overload_admitted_p99_vs_capacity_normal_after": tuple(
            round(admitted[1] / base[1], 2) if admitted and base else None
            for base in (
                _p50_p99(at_capacity, "200"),
                _p50_p99(normal, "200"),
                _p50_p99(after, "200"),
            )
        ),
        "overload_admitted_p99_in_batch_computes": (
            round(admitted[1] / (batches.compute_s / batches.count * 1e3), 1) if admitted else None
        ),
        "overload_429_p50_p99_ms": _p50_p99(overload, "429"),
        "overload_429_fraction": round(shed, 3),
        "generator_lateness_p50_p99_ms": (
            overload["lateness"]["p50_ms"],
            overload["lateness"]["p99_ms"],
        ),
        "rss_mb_before_max_after": (
            round(rss_before),
            round(max(rss_during, default=rss_before)),
            round(rss_after),
        ),
        "after_p50_p99_ms": _p50_p99(after, "200"),
        "after_429": _count(after, "429"),
        "load_average": os.getloadavg(),
    }
    print("\noverload report:", json.dumps(report, indent=1))

    # Nothing crashes: every arrival got an answer, only 200 or 429, and the server lives on.
    for phase in (normal, overload, after):
        assert phase["errors"] == 0, phase["error_examples"]
        assert set(phase["by_status"]) <= {"200", "429"}, phase["by_status"]
    assert alive and "Traceback" not in logs, logs
    # The server kept pace by shedding rather than with an unbounded backlog, and goodput did
    # not collapse: 3x capacity must be mostly refused, yet a quarter of capacity still served.
    assert shed > 0.3, f"three times capacity must be mostly refused: {report}"
    assert overload["ok_per_s"] > 0.25 * capacity, report
    # Memory stays bounded.
    assert max(rss_during) < rss_before + RSS_GROWTH_MB, report
    # The latency criterion (admitted p99 within 2x of the p99 at capacity, docs/reliability.md)
    # is a speed figure: the guide keeps those out of timed assertions, so the report above
    # carries it to docs/reliability.md, where it is judged.


def _p50_p99(summary: dict[str, Any], status: str) -> tuple[float, float] | None:
    stats = summary["by_status"].get(status)
    return None if stats is None else (round(stats["p50_ms"], 1), round(stats["p99_ms"], 1))
