"""bench/workers.py end to end, as short as it goes: Kestrel with 1 and 2 worker processes and a
hello world under ``wrk``, each answer checked against scikit-learn first. Timings are reported,
never asserted. Needs ``wrk`` (``.ci/run`` installs it) and fails without it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a minute of benching: make test-slow runs it
def test_the_bench_measures_one_and_two_workers_in_one_run(tmp_path: Path) -> None:
    assert shutil.which("wrk"), "wrk is not installed: run `bash .ci/install-tools wrk`"
    out = tmp_path / "workers.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "workers.py"),
            *("--duration", "1", "--rounds", "1", "--warmup", "1", "--concurrency", "8"),
            *("--out", str(out)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # a minute when the machine is idle; more when other jobs load it
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    cells = {c["server"]: c for c in json.loads(out.read_text())}
    assert set(cells) == {"hello world", "kestrel, 1 worker", "kestrel, 2 workers"}
    for cell in cells.values():
        assert cell["rps"] > 0 and cell["non_2xx"] == 0 and cell["socket_errors"] == 0, cell
        assert 0 < cell["p50_ms"] <= cell["p99_ms"] and cell["cpu_us_per_request"] > 0, cell
    assert "| kestrel, 2 workers |" in done.stdout
