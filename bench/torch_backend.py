"""Kestrel's torch backend on the tree-ensemble pipelines, next to Hummingbird's torch backend.

For each pipeline (``scoring_pipelines.PIPELINES``; default b, d, e, g, h) and batch size,
``predict_proba`` of Kestrel compiled with ``backend="torch"`` and, where installed, of
Hummingbird's ``hb.convert(est, "torch")`` are timed in interleaved rounds on the same rows, one
thread for both. Cells are the median over rounds of the CPU time of the whole process per call
(``time.process_time``: another process's time slices on a shared machine do not count). Each
Kestrel cell is checked against the source's own ``predict_proba`` first (max |Δp| printed).

A Hummingbird column reads ``not installed`` without ``hummingbird-ml``, ``unsup`` where it
cannot convert the pipeline.

Usage: python bench/torch_backend.py [--pipelines b,d,e,g,h] [--batches 1,100,10000]
           [--rounds R] [--min-time S] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scoring_pipelines import PIPELINES, Scale, fit, make_data
from scoring_threads import pinned_threads

Predict = Callable[[Any], np.ndarray]
NOT_INSTALLED, UNSUP = "not installed", "unsup"


def _kestrel(est: Any) -> Predict:
    import compiler

    options = compiler.CompileOptions(methods=("predict_proba",), backend="torch")
    return compiler.compile(est, options=options).predict_proba


def _hummingbird(est: Any) -> Predict | str:
    if importlib.util.find_spec("hummingbird") is None:
        return NOT_INSTALLED
    import hummingbird.ml as hb

    try:
        return hb.convert(est, "torch", extra_config={"n_threads": 1}).predict_proba
    except Exception as exc:  # MissingConverter and friends: what it cannot convert
        return f"{UNSUP} ({type(exc).__name__})"


def _per_call(predict: Predict, x: Any, min_time: float) -> float:
    """CPU seconds per call, averaged over enough calls to last ``min_time``."""
    calls, start = 0, time.process_time()
    while True:
        predict(x)
        calls += 1
        spent = time.process_time() - start
        if spent >= min_time:
            return spent / calls


def _cell(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1e3:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="b,d,e,g,h", help="comma-separated keys")
    parser.add_argument("--batches", default="1,100,10000", help="comma-separated row counts")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per cell")
    parser.add_argument("--min-time", type=float, default=0.2, help="CPU seconds per timing")
    parser.add_argument("--quick", action="store_true", help="10 trees, 1k training rows")
    args = parser.parse_args()
    keys = args.pipelines.split(",")
    unknown = [k for k in keys if k not in PIPELINES]
    if unknown:
        parser.error(f"unknown pipelines {unknown}; known: {','.join(PIPELINES)}")
    batches = [int(b) for b in args.batches.split(",")]
    if any(b < 1 for b in batches) or args.rounds < 1:
        parser.error("batches and --rounds must be positive")
    scale = Scale.quick() if args.quick else Scale.full()

    print("| pipeline | batch | kestrel-torch ms | hb-torch ms | ratio | max abs dp |")
    print("|---|---:|---:|---:|---:|---:|")
    with pinned_threads(1) as pins:
        for key in keys:
            pipeline = PIPELINES[key]
            if pipeline.missing():
                print(f"| {pipeline.label} | - | {NOT_INSTALLED}: {pipeline.missing()} | | | |")
                continue
            data = make_data(pipeline.frame, scale.train_rows, max(batches))
            est = fit(pipeline, scale, data)
            kestrel = _kestrel(est)
            hb = _hummingbird(est)
            pins.sync()  # libraries imported by fitting / converting: one thread too
            for rows in batches:
                x = data.rows(rows)
                error = float(np.max(np.abs(kestrel(x) - est.predict_proba(x))))
                systems = [kestrel] + ([hb] if callable(hb) else [])
                times: list[list[float]] = [[] for _ in systems]
                for _ in range(args.rounds):
                    for k, predict in enumerate(systems):
                        times[k].append(_per_call(predict, x, args.min_time))
                ours = _cell(times[0])
                theirs = _cell(times[1]) if callable(hb) else hb
                ratio = (
                    f"{statistics.median(times[0]) / statistics.median(times[1]):.2f}"
                    if callable(hb)
                    else "-"
                )
                print(f"| {pipeline.label} | {rows} | {ours} | {theirs} | {ratio} | {error:.1e} |")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
