"""bench/contributions.py end to end on small batches: every model and batch timed beside its
reference (shap behind a ColumnTransformer, LightGBM, XGBoost, shap.LinearExplainer), Kestrel's
contributions agreeing with each, and a reference timed on fewer rows than the batch marked as
scaled. Timings are reported, never asserted."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.scripts import run_bench

REFERENCE = {"ct_hgb": "shap", "lgbm_raw": "lightgbm", "xgb_raw": "xgboost", "scaled_lr": "shap"}


def test_the_contributions_bench_checks_every_reference_and_times_every_cell(
    tmp_path: Path,
) -> None:
    out = tmp_path / "contributions.json"
    argv = [
        *("--models", ",".join(REFERENCE), "--batches", "1,5", "--max-reference-rows", "3"),
        *("--min-time", "0", "--max-calls", "1", "--json", str(out)),
    ]
    stdout = run_bench("contributions.py", argv)
    cells = json.loads(out.read_text())
    assert {(c["model"], c["batch"]) for c in cells} == {(m, b) for m in REFERENCE for b in (1, 5)}
    for cell in cells:
        reference = REFERENCE[cell["model"]]
        assert set(cell["reference_ms"]) == {reference}, cell
        assert cell["rows"][reference] == min(cell["batch"], 3), cell
        assert cell["max_diff"][reference] < 1e-6, cell  # XGBoost sums in float32
        assert cell["kestrel_ms"] > 0 and cell["speedup"] > 0, cell
    assert "| ct_hgb | 1 | " in stdout
    scaled = next(line for line in stdout.splitlines() if line.startswith("| ct_hgb | 5 |"))
    assert "*" in scaled
