"""XLA compile options side by side (issue 6): one estimator compiled by Kestrel's JAX backend
under each set of per-executable ``compiler_options``, next to ONNX Runtime, timed in
interleaved rounds in one process (every column sees the same machine noise).

Columns: ``kestrel`` (the backend's default, ``CPU_COMPILER_OPTIONS``), ``ynn-off`` (no YNNPACK
library fusions: XLA's own dot thunks), each ``--variant NAME=JSON`` given, and ``ort``. Cells:
median (min) ms per ``predict_proba`` call; ratios are to ``kestrel``. Every column is checked
against scikit-learn first (max |Δp| ≤ --tol).

Usage: python bench/xla_options.py [--pipelines a,i] [--batches 1,1024,10000] [--rounds R]
           [--variant NAME='{"xla_cpu_...": value}' ...] [--threads T]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scoring_pipelines import PIPELINES, Scale, fit, make_data
from scoring_threads import pinned_threads

POOL_ROWS = 10_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="a,i")
    parser.add_argument("--batches", default="1,1024,10000")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per cell")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per sample")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--quick", action="store_true", help="small fits (smoke run)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=JSON")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.pipelines.split(",") if k.strip()]
    unknown = [k for k in keys if k not in PIPELINES or PIPELINES[k].frame]
    if unknown:
        parser.error(f"unknown or DataFrame pipelines {unknown}")
    batches = [int(b) for b in args.batches.split(",")]
    if args.rounds < 1 or min(batches) < 1:
        parser.error("--rounds and every batch must be >= 1")
    variants: dict[str, dict[str, Any]] = {"ynn-off": {"xla_cpu_experimental_ynn_fusion_type": ""}}
    for spec in args.variant:
        name, sep, text = spec.partition("=")
        try:
            options = json.loads(text) if sep else None
        except json.JSONDecodeError as exc:
            parser.error(f"--variant {spec!r}: {exc}")
        if not name or not isinstance(options, dict):
            parser.error(f"--variant {spec!r}: expected NAME='{{\"option\": value}}'")
        variants[name] = options
    scale = Scale.quick() if args.quick else Scale.full()
    with pinned_threads(args.threads) as pins:  # before jax is imported
        for key in keys:
            pipeline = PIPELINES[key]
            data = make_data(False, scale.train_rows, POOL_ROWS)
            est = fit(pipeline, scale, data)
            pins.sync()
            systems = _systems(pipeline, est, data, variants, args.threads)
            for rows in batches:
                x = data.rows(rows)
                expected = est.predict_proba(x)
                calls = {}
                for name, predict in systems.items():
                    err = float(abs(predict(x) - expected).max())
                    if err > args.tol:
                        print(f"{pipeline.label} {rows}: {name} off by {err:.1e}", file=sys.stderr)
                    calls[name] = lambda p=predict, x=x: p(x)
                _report(pipeline.label, rows, _measure(calls, args.rounds, args.min_time))
        for note in pins.notes:
            print(f"note: {note}", file=sys.stderr)
    return 0


def _systems(
    pipeline: Any, est: Any, data: Any, variants: dict[str, dict[str, Any]], threads: int
) -> dict[str, Callable[[Any], Any]]:
    import compiler
    from lazy.backends.jax_backend import JaxBackend

    out: dict[str, Callable[[Any], Any]] = {}
    for name, options in {"kestrel": None, **variants}.items():
        backend = JaxBackend(compiler_options=options)
        model = compiler.compile(
            est,
            sample=data.rows(16),
            options=compiler.CompileOptions(methods=("predict_proba",), backend=backend),
        )
        out[name] = model.predict_proba
    from scoring_systems import SYSTEMS, Context

    if not SYSTEMS["ort"].missing():
        out["ort"] = SYSTEMS["ort"].convert(pipeline, est, data.rows(16), Context(threads, 1024))
    return out


def _measure(
    calls: dict[str, Callable[[], Any]], rounds: int, min_time: float
) -> dict[str, list[float]]:
    reps = {}
    for name, fn in calls.items():  # warm up, and size each sample to ~min_time
        fn()
        t0 = time.perf_counter()
        fn()
        reps[name] = max(1, int(min_time / max(time.perf_counter() - t0, 1e-7)))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            for _ in range(reps[name]):
                fn()
            times[name].append((time.perf_counter() - t0) / reps[name] * 1e3)
    return times


def _report(label: str, rows: int, times: dict[str, list[float]]) -> None:
    base_med = statistics.median(times["kestrel"])
    base_min = min(times["kestrel"])
    cells = [
        f"{name} {statistics.median(t):.3f} ({min(t):.3f}) "
        f"[{statistics.median(t) / base_med:.2f}/{min(t) / base_min:.2f}]"
        for name, t in times.items()
    ]
    print(f"{label} rows={rows}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
