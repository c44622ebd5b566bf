"""Kestrel's benchmark pipelines on the accelerator JAX sees: exactness first, then speed.

For each pipeline of ``scoring_pipelines`` and each placement (``device``: every bucket on JAX's
default device, ``host_rows=0``; ``auto``: the plan warm-up decides, as the service compiles):

1. the registration gate (``service.parity.gate``) run on that device: 64 held-out rows plus the
   probe rows built from the fitted model (thresholds and their neighbours, edges, NaN, …);
2. on held-out rows at each batch size: labels that differ from scikit-learn's ``predict`` and
   the largest |Δp| of ``predict_proba``;
3. ms per ``predict_proba`` call, Kestrel against scikit-learn on the host's CPUs as users call
   it, in interleaved rounds (median of the rounds; the ratio is per round, then the median).

Results print as they come (a device lease can end mid-run) and, with ``--out``, as JSON lines.
On a machine without an accelerator the same run measures JAX's CPU backend.

Usage: python bench/device.py [--pipelines a,b,...] [--batches 1,100,10000,100000]
           [--placements device,auto] [--rounds 5] [--min-time 0.05] [--quick] [--out F]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scoring import per_call_ms  # a script: its directory is not a package
from scoring_pipelines import PIPELINES, Pipeline, Scale, fit, make_data

GATE_SAMPLE_ROWS = 64
GATE_PROBE_ROWS = 8192  # the service's default (``parity_probe_rows``)
GATE_RTOL, GATE_ATOL = 1e-4, 1e-5  # the service's defaults
PLACEMENTS = {"device": 0, "auto": None}  # host_rows; None: the compiler's default


@dataclass
class Row:
    pipeline: str
    placement: str
    batch: int
    sklearn_ms: float
    kestrel_ms: float
    speedup: float  # median over rounds of sklearn_ms / kestrel_ms
    labels_differ: int
    max_abs_dp: float


def environment() -> dict[str, Any]:
    import jax
    import sklearn

    return {
        "jax": jax.__version__,
        "scikit-learn": sklearn.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "devices": [str(d) for d in jax.devices()],
        "cpus": os.cpu_count(),
    }


def compile_for(est: Any, sample: Any, host_rows: int | None) -> tuple[Any, float]:
    import compiler

    extra = {} if host_rows is None else {"host_rows": host_rows}
    options = compiler.CompileOptions(methods=("predict", "predict_proba"), **extra)
    t0 = time.perf_counter()
    model = compiler.compile(est, sample=sample, options=options)
    return model, time.perf_counter() - t0


def placements(model: Any) -> str:
    """How many buckets of the model's graphs run on the device and on the host."""
    plan = model.plan
    if plan is None:
        return "no plan"
    where = [p.runs_on for g in plan.graphs for p in g.placements]
    return f"{where.count('device')} device / {where.count('host')} host buckets"


def gate(est: Any, model: Any, sample: Any) -> dict[str, Any]:
    from service import parity

    result = parity.gate(
        est,
        model,
        sample,
        synthetic_rows=GATE_SAMPLE_ROWS,
        probe_rows=GATE_PROBE_ROWS,
        rtol=GATE_RTOL,
        atol=GATE_ATOL,
    )
    return {
        "ok": result.ok,
        "rows": result.rows,
        "probes": result.probes,
        "problem": result.problem,
        "methods": [asdict(m) for m in result.methods],
    }


def agreement(est: Any, model: Any, rows: Any) -> tuple[int, float]:
    labels = int(np.sum(np.asarray(model.predict(rows)) != np.asarray(est.predict(rows))))
    dp = np.abs(np.asarray(model.predict_proba(rows), np.float64) - est.predict_proba(rows))
    return labels, float(dp.max())


def timed(
    ours: Callable[[], Any], theirs: Callable[[], Any], rounds: int, min_time: float
) -> tuple[float, float, float]:
    """Median ms per call of each, and the median of the per-round ratios theirs / ours."""
    mine, source, ratios = [], [], []
    for r in range(rounds):
        order = (ours, theirs) if r % 2 == 0 else (theirs, ours)
        ms = {id(f): per_call_ms(f, min_time) for f in order}
        mine.append(ms[id(ours)])
        source.append(ms[id(theirs)])
        ratios.append(ms[id(theirs)] / ms[id(ours)])
    return statistics.median(mine), statistics.median(source), statistics.median(ratios)


def bench_pipeline(pipeline: Pipeline, args: argparse.Namespace, emit: Callable) -> None:
    scale = Scale.quick() if args.quick else Scale.full()
    data = make_data(pipeline.frame, scale.train_rows, max(args.batches))
    t0 = time.perf_counter()
    est = fit(pipeline, scale, data)
    emit({"pipeline": pipeline.label, "fit_s": round(time.perf_counter() - t0, 2)})
    sample = data.rows(GATE_SAMPLE_ROWS)
    for placement in args.placements:
        try:
            model, compile_s = compile_for(est, sample, PLACEMENTS[placement])
            emit(
                {
                    "pipeline": pipeline.label,
                    "placement": placement,
                    "compile_s": round(compile_s, 2),
                    "plan": placements(model),
                    "gate": gate(est, model, sample),
                }
            )
        except Exception as exc:  # one pipeline's failure must not end a device lease's run
            emit({"pipeline": pipeline.label, "placement": placement, "error": repr(exc)[:500]})
            continue
        for batch in args.batches:
            rows = data.rows(batch)
            labels, dp = agreement(est, model, rows)
            ours, theirs, ratio = timed(
                functools.partial(model.predict_proba, rows),
                functools.partial(est.predict_proba, rows),
                args.rounds,
                args.min_time,
            )
            emit(Row(pipeline.label, placement, batch, theirs, ours, ratio, labels, dp))


def _emitter(out: Path | None) -> Callable[[Any], None]:
    sink = out.open("a") if out else None

    def emit(item: Any) -> None:
        record = asdict(item) if isinstance(item, Row) else item
        if isinstance(item, Row):
            print(
                f"| {item.pipeline} | {item.placement} | {item.batch} | {item.sklearn_ms:.3f} "
                f"| {item.kestrel_ms:.3f} | {item.speedup:.2f}x | {item.labels_differ} "
                f"| {item.max_abs_dp:.1e} |",
                flush=True,
            )
        else:
            print(json.dumps(record), flush=True)
        if sink:
            sink.write(json.dumps(record) + "\n")
            sink.flush()

    return emit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default=",".join(PIPELINES), help="e.g. a,b,e")
    parser.add_argument("--batches", default="1,100,10000,100000")
    parser.add_argument("--placements", default="device,auto", help="device, auto or both")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per sample")
    parser.add_argument("--quick", action="store_true", help="small models, a smoke run")
    parser.add_argument("--out", type=Path, help="append the results here as JSON lines")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.placements = args.placements.split(",")
    unknown = [p for p in args.placements if p not in PLACEMENTS]
    keys = args.pipelines.split(",")
    if unknown or any(k not in PIPELINES for k in keys):
        parser.error(f"unknown placement or pipeline in {args.placements} / {keys}")
    emit = _emitter(args.out)
    emit({"environment": environment()})
    print(
        "| pipeline | placement | batch | sklearn ms | kestrel ms | speedup | labels ≠ | max |Δp| |"
    )
    for key in keys:
        pipeline = PIPELINES[key]
        if pipeline.missing():
            emit({"pipeline": pipeline.label, "skipped": f"not installed: {pipeline.missing()}"})
            continue
        bench_pipeline(pipeline, args, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
