"""bench/device.py end to end on this machine's JAX backend: every pipeline and placement passes
the registration gate, agrees with scikit-learn at every batch, and is timed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.scripts import run_bench


def test_the_device_bench_checks_exactness_and_times_every_cell(tmp_path: Path) -> None:
    out = tmp_path / "device.jsonl"
    argv = [
        *("--quick", "--pipelines", "a,f", "--batches", "1,100", "--placements", "device,auto"),
        *("--rounds", "1", "--min-time", "0.001", "--out", str(out)),
    ]
    stdout = run_bench("device.py", argv)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert "devices" in records[0]["environment"]
    compiled = [r for r in records if "gate" in r]
    assert {(r["pipeline"], r["placement"]) for r in compiled} == {
        (p, placement) for p in ("a lr", "f ct_rf") for placement in ("device", "auto")
    }
    assert all(r["gate"]["ok"] for r in compiled), compiled
    assert next(r for r in compiled if r["pipeline"] == "f ct_rf")["gate"]["probes"] > 0
    cells = [r for r in records if "batch" in r]
    assert len(cells) == 2 * 2 * 2
    for cell in cells:
        assert cell["labels_differ"] == 0, cell
        assert cell["max_abs_dp"] < 1e-5, cell
        assert cell["sklearn_ms"] > 0 and cell["kestrel_ms"] > 0 and cell["speedup"] > 0
    assert "| f ct_rf | auto | 100 |" in stdout
