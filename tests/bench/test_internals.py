"""bench/internals.py and bench/kestrel_without.py: each switch really turns its mechanism off in
the modules a server runs, and the verdict follows the 10 % rule."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(
            f"bench_{name}", ROOT / "bench" / f"{name}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"bench_{name}"] = module  # dataclasses resolve their module by name
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


# Run in a fresh interpreter: the switches patch service modules for the whole process.
SWITCHED_OFF = """
import sys
sys.path.insert(0, "bench")
import kestrel_without
for switch in kestrel_without.SWITCHES.values():
    switch()
from service import fastpath, shedding
from service.app import create_app
from service.settings import Settings

app = create_app(Settings(store_url=sys.argv[1]))
assert not isinstance(app.build_middleware_stack(), fastpath.ScoringFastPath)
assert shedding.protocol_for(app.state.admission) == "httptools"
print("all off")
"""

ALL_ON = """
import sys
from service import fastpath, shedding
from service.app import create_app
from service.settings import Settings

app = create_app(Settings(store_url=sys.argv[1]))
assert isinstance(app.build_middleware_stack(), fastpath.ScoringFastPath)
assert issubclass(shedding.protocol_for(app.state.admission), shedding.SheddingHttpProtocol)
print("all on")
"""


def test_each_switch_turns_its_mechanism_off(tmp_path: Path) -> None:
    # The same checks pass the other way round without the switches: they observe the mechanism.
    for code, expected in ((ALL_ON, "all on"), (SWITCHED_OFF, "all off")):
        done = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "store")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected


def test_an_unknown_mechanism_is_refused() -> None:
    assert _script("kestrel_without").main(["fastpth", "serve"]) == 2


def test_a_mechanism_keeps_its_place_only_for_ten_percent() -> None:
    bench = _script("internals")
    cell = bench.Cell

    def cells(variant: str, ok_rps: float, p99_ms: float) -> list[object]:
        return [cell(variant, "rf", 64, ok_rps, ok_rps, 1.0, p99_ms, 100.0, 0.0)]

    report = bench.report(
        [
            *cells("all", 1000.0, 10.0),
            *cells("no-fastpath", 800.0, 10.0),  # 25 % more requests/s with it
            *cells("no-shedding", 990.0, 10.5),  # 5 % better p99 with it: not enough
        ]
    )
    assert "- fastpath: at best +25% (requests/s, p99 or CPU) → keeps its place" in report
    assert "- shedding: at best +5% (requests/s, p99 or CPU) → does not earn its place" in report


def test_older_checkouts_are_rows_of_the_table_not_verdicts() -> None:
    bench = _script("internals")
    cell = bench.Cell
    report = bench.report(
        [
            cell("all", "lr", 64, 1000.0, 1000.0, 1.0, 10.0, 100.0, 0.0),
            cell("before:old", "lr", 64, 1100.0, 1100.0, 1.0, 9.0, 90.0, 0.0),
        ]
    )
    assert "| lr | 64 | before:old | 1100 | 1.10 | 9.00 | 0.90 | 90 | 0.90 | 0% |" in report
    assert "earn" not in report and "keeps its place" not in report
