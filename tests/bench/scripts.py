"""Running a bench script as its users do: from the repository root, in this interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, argv: list[str], timeout: float = 300) -> str:
    """``bench/<script>`` with ``argv``: its standard output; fails the test with its output's
    tail unless it exits 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout
