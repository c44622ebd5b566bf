"""bench/load.py: the HTTP load bench end to end in its tiny mode, and its verdict logic.

The end-to-end test runs the real bench: three server processes (hello world, plain FastAPI +
scikit-learn, ``kestrel serve``), each answer checked against scikit-learn, then ``wrk`` against
each. It needs ``wrk`` and fails without it (``.ci/run`` installs it): a Python stand-in would test
another load generator than the one the published numbers come from. Timings are reported, never
asserted.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_load", ROOT / "bench" / "load.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_load"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def _m(server: str, model: str, rps: float, p99: float = 10.0, rows: int = 1, c: int = 64, **kw):
    fields = {
        "server": server,
        "model": model,
        "rows": rows,
        "concurrency": c,
        "rps": rps,
        "p50_ms": p99 / 2,
        "p90_ms": p99 * 0.8,
        "p99_ms": p99,
        "max_ms": p99 * 1.5,
        "requests": int(rps * 10),
        "non_2xx": 0,
        "socket_errors": 0,
        "cpu_us_per_request": 250.0,
    }
    fields.update(kw)
    return bench.Measurement(**fields)


@pytest.mark.slow  # three servers under wrk: make test-slow (CI)
def test_tiny_bench_runs_every_server_under_wrk(tmp_path: Path) -> None:
    assert shutil.which("wrk"), (
        "wrk is not installed: run `bash .ci/install-tools wrk` (Debian: wrk)"
    )
    out, doc = tmp_path / "load.json", tmp_path / "performance-http.md"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "load.py"),
            "--tiny",
            "--servers",
            "hello,plain,kestrel,kestrel-v2",
            "--workdir",
            str(tmp_path / "work"),
            "--out",
            str(out),
            "--doc",
            str(doc),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # seconds when the machine is idle; minutes when other jobs load it
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    results = json.loads(out.read_text())["results"]
    cells = {(r["server"], r["concurrency"]) for r in results}
    assert cells == {(s, c) for s in ("hello", "plain", "kestrel", "kestrel-v2") for c in (1, 4)}
    for r in results:
        assert r["requests"] > 0 and r["rps"] > 0, r
        assert r["non_2xx"] == 0 and r["socket_errors"] == 0, r
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"], r
        assert r["cpu_us_per_request"] > 0, r
    assert "Kestrel req/s / p50 / p99 ms" in done.stdout
    text = doc.read_text()
    assert text.startswith("## Over HTTP\n")
    assert "| lr | 1 | 4 |" in text


def test_missing_wrk_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    with pytest.raises(bench.BenchError, match="apt-get install wrk"):
        bench.require_wrk()


def test_verdict_passes_only_when_every_target_is_met() -> None:
    hello = _m("hello", "-", 3000)
    good = [hello, _m("plain", "rf", 60), _m("kestrel", "rf", 2600, p99=30)]
    (v,) = bench.verdicts(good)
    assert v.passed and v.reasons == ()

    slow = [hello, _m("plain", "rf", 60), _m("kestrel", "rf", 2000, p99=30)]
    (v,) = bench.verdicts(slow)
    assert not v.passed and "67% of hello world < 80%" in v.reasons

    tail = [hello, _m("plain", "lr", 500), _m("kestrel", "lr", 2900, p99=55)]
    (v,) = bench.verdicts(tail)
    assert v.reasons == ("p99 55.0 ms > 40 ms",)

    weak = [hello, _m("plain", "rf", 100), _m("kestrel", "rf", 2600, p99=30)]
    (v,) = bench.verdicts(weak)
    assert v.reasons == ("26.0x the plain server < 40x",)

    errors = [hello, _m("plain", "rf", 60), _m("kestrel", "rf", 2600, non_2xx=3)]
    (v,) = bench.verdicts(errors)
    assert v.reasons == ("3 non-2xx answers, 0 socket errors",)


def test_verdicts_only_judge_single_rows_at_the_target_concurrency() -> None:
    results = [
        _m("hello", "-", 3000, c=16),
        _m("kestrel", "lr", 100, c=16),
        _m("kestrel", "lr", 100, rows=100),
    ]
    assert bench.verdicts(results) == []
    header, rows = bench.table_rows(results)
    assert header[:3] == ["model", "rows", "conc."]
    assert [r[:3] for r in rows] == [["lr", "1", "16"], ["lr", "100", "64"]]
    assert all(r[-1] == "" for r in rows)  # no target verdict outside c=64, 1 row


def test_bad_arguments_name_the_problem() -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--models", "lr,svm"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--concurrency", "0"])
    config, _ = bench.parse_args(["--tiny"])
    assert config.models == ("lr",) and config.concurrency == (1, 4)


def test_a_checkout_before_is_measured_beside_this_one(tmp_path: Path) -> None:
    config, _ = bench.parse_args(["--before", str(tmp_path), "--servers", "kestrel"])
    assert config.servers == ("kestrel-before", "kestrel") and config.before_src == tmp_path
    results = [_m("kestrel-before", "lr", 4000.0, p99=8.0), _m("kestrel", "lr", 5000.0, p99=6.0)]
    header, rows = bench.table_rows(results)
    assert rows[0][header.index("Kestrel / Kestrel before: req/s, p99")] == "1.25x, 0.75x"
    # Only this checkout's endpoints are held to the targets.
    assert {v.server for v in bench.verdicts(results)} == {"kestrel"}
    with pytest.raises(SystemExit):  # the server without a checkout to run
        bench.parse_args(["--servers", "kestrel-before"])
