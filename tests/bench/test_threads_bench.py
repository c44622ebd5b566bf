"""bench/threads.py end to end on small batches: each pipeline and batch timed on one thread and
on two, with a speed-up derived from the two. Timings are reported, never asserted."""

from __future__ import annotations

import re

from tests.bench.scripts import run_bench


def test_the_threads_bench_times_one_and_two_threads() -> None:
    stdout = run_bench(
        "threads.py", ["--pipelines", "scaled_lr", "--batches", "5000", "--rounds", "1"]
    )
    line = next(row for row in stdout.splitlines() if row.startswith("| scaled_lr | 5,000 |"))
    one, two, speedup = re.findall(r"\| ([\d.]+)x? ", line + " ")[-3:]
    t1, t2, ratio = float(one), float(two), float(speedup)
    assert t1 > 0 and t2 > 0
    # The speed-up comes from the unrounded times; each is printed to 0.01 ms.
    half = 0.005
    assert (t1 - half) / (t2 + half) - half <= ratio <= (t1 + half) / (t2 - half) + half, line
