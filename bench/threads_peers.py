"""Kestrel and ONNX Runtime with one thread and with two, side by side in one run.

For each pipeline of ``bench/scoring.py`` (``scoring_pipelines.PIPELINES``) and batch size, each
system converts the fitted pipeline twice, with ``Context(threads=1)`` and ``threads=2``
(Kestrel: ``CompileOptions(threads=...)``, its chunks spread over a pool; ONNX Runtime:
``intra_op_num_threads``), and all four score the same host rows with ``predict_proba`` in
alternating order, ``--rounds`` times; a figure is the median. XLA's and OpenMP's own pools are
held to one thread before anything loads them, so Kestrel's two threads are its own. Prints a
markdown table; never asserts.

Usage: python bench/threads_peers.py [--pipelines a,b,...] [--batches 10000,100000]
       [--systems kestrel-jax,ort] [--rounds 5] [--quick]
"""

from __future__ import annotations

import os

os.environ.update(  # before numpy, jax and onnxruntime load
    {
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMBA_NUM_THREADS": "1",
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    }
)

import argparse
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scoring_pipelines import PIPELINES, Pipeline, Scale, fit, make_data
from scoring_systems import SYSTEMS, Context, System, Unsupported

THREADS = (1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--batches", default="10000,100000")
    parser.add_argument("--systems", default="kestrel-jax,ort")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small models (a smoke run)")
    args = parser.parse_args()
    scale = Scale.quick() if args.quick else Scale.full()
    batches = [int(b) for b in args.batches.split(",")]
    systems = [SYSTEMS[name] for name in args.systems.split(",")]
    print(f"CPUs {sorted(os.sched_getaffinity(0))}; median ms of {args.rounds} calls each\n")
    print("| pipeline | batch | system | 1 thread ms | 2 threads ms | speed-up |")
    print("|---|---|---|---|---|---|")
    for key in args.pipelines.split(","):
        pipeline = PIPELINES[key]
        if pipeline.missing():
            print(f"| {pipeline.label} | | | not installed: {', '.join(pipeline.missing())} | | |")
            continue
        data = make_data(pipeline.frame, scale.train_rows, max(batches))
        est = fit(pipeline, scale, data)
        sample = data.rows(64)
        for batch in batches:
            rows = data.rows(batch)
            for system in systems:
                print(_row(pipeline, batch, system, est, sample, rows, args.rounds))


def _row(
    pipeline: Pipeline, batch: int, system: System, est: Any, sample: Any, rows: Any, rounds: int
) -> str:
    """One table row: ``system`` on ``pipeline`` at ``batch`` rows, with one and two threads."""
    head = f"| {pipeline.label} | {batch:,} | {system.name} |"
    if system.missing():
        return f"{head} not installed: {', '.join(system.missing())} | | |"
    try:
        predict = {
            t: system.convert(pipeline, est, sample, Context(threads=t, max_batch=1024))
            for t in THREADS
        }
    except Unsupported as exc:
        return f"{head} unsupported: {exc} | | |"
    for t in THREADS:  # warm: first calls compile, build plans and vote on spreading
        for _ in range(3):
            predict[t](rows)
    times: dict[int, list[float]] = {t: [] for t in THREADS}
    for r in range(rounds):
        for t in THREADS if r % 2 else THREADS[::-1]:
            t0 = time.perf_counter()
            predict[t](rows)
            times[t].append(time.perf_counter() - t0)
    one, two = (1e3 * statistics.median(times[t]) for t in THREADS)
    return f"{head} {one:.2f} | {two:.2f} | {one / two:.2f}x |"


if __name__ == "__main__":
    main()
