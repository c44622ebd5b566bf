"""bench/threads_peers.py end to end on one small pipeline: Kestrel timed with one thread and
with two, a speed-up derived from the two (ONNX Runtime where installed: the bench extra).
Timings are reported, never asserted."""

from __future__ import annotations

import re

from tests.bench.scripts import run_bench


def test_the_peers_threads_bench_times_one_and_two_threads() -> None:
    stdout = run_bench(
        "threads_peers.py",
        ["--quick", "--pipelines", "a", "--batches", "30000", "--rounds", "1"],
    )
    line = next(row for row in stdout.splitlines() if row.startswith("| a lr | 30,000 | kestrel"))
    one, two, speedup = re.findall(r"\| ([\d.]+)x? ", line + " ")[-3:]
    # Rounded to 0.01 ms, a fast call's ratio is not its speed-up's: both only positive.
    assert float(one) > 0 and float(two) > 0 and float(speedup) > 0
    assert "| a lr | 30,000 | ort |" in stdout  # timed, or "not installed" without the extra
