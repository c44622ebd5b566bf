"""bench/offline.py end to end on a small file: both engines timed on every core count the
machine has, each a positive rate, and their ratio printed. Timings are reported, never
asserted."""

from __future__ import annotations

import re

from tests.bench.scripts import run_bench


def test_the_offline_bench_times_both_engines_on_each_core_count() -> None:
    argv = ["--pipelines", "scaled_lr", "--rows", "2000", "--row-group", "500", "--rounds", "1"]
    stdout = run_bench("offline.py", argv)
    assert "2,000 rows in row groups of 500" in stdout
    for engine in ("kestrel", "sklearn"):
        line = next(
            row for row in stdout.splitlines() if row.startswith(f"| scaled_lr | {engine} |")
        )
        rates = [float(v.replace(",", "")) for v in re.findall(r"\| ([\d,]+) ", line)]
        assert rates and all(rate > 0 for rate in rates), line
    assert "| scaled_lr | kestrel / sklearn |" in stdout
