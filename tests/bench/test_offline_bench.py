"""bench/offline.py end to end on a small file: both engines timed on every core count the
machine has, each a positive rate, and their ratio printed; on two cores, Ray Data with one
worker and with two, in the same run. Timings are reported, never asserted."""

from __future__ import annotations

import os
import re

import pytest

from tests.bench.scripts import run_bench


def _rates(stdout: str, prefix: str) -> list[float]:
    line = next(row for row in stdout.splitlines() if row.startswith(prefix))
    rates = [float(v.replace(",", "")) for v in re.findall(r"\| ([\d,]+) ", line)]
    assert rates and all(rate > 0 for rate in rates), line
    return rates


@pytest.mark.slow  # a minute of benching: make test-slow runs it
def test_the_offline_bench_times_both_engines_on_each_core_count() -> None:
    argv = ["--pipelines", "scaled_lr", "--rows", "2000", "--row-group", "500", "--rounds", "1"]
    stdout = run_bench("offline.py", argv)
    assert "2,000 rows in row groups of 500" in stdout
    for engine in ("kestrel", "sklearn"):
        _rates(stdout, f"| scaled_lr | {engine} |")
    assert "| scaled_lr | kestrel / sklearn |" in stdout
    if len(os.sched_getaffinity(0)) >= 2:  # Ray's 1 against 2 workers needs two cores
        assert "Ray Data on 2 cores, 1 and 2 workers" in stdout
        for measure in ("job", "scoring"):
            assert len(_rates(stdout, f"| scaled_lr | {measure} |")) == 2
    else:
        assert "Ray Data" not in stdout
