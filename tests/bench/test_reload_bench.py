"""bench/reload.py end to end on one small pipeline: every request finds its version UNLOADED
and the bench checks that no reload compiled. Timings are reported, never asserted."""

from __future__ import annotations

from tests.bench.scripts import run_bench


def test_the_reload_bench_reloads_without_compiling() -> None:
    stdout = run_bench("reload.py", ["--pipelines", "lr", "--rounds", "2", "--max-batch", "8"])
    rows = [line for line in stdout.splitlines() if "logistic regression" in line]
    assert len(rows) == 2, stdout  # measured placement, and every bucket on the device
    for row in rows:
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert all(float(ms) >= 0 for ms in cells[2:5]), row
