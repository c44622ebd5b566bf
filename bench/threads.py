"""A large call on one thread and on two: Kestrel's chunks spread over the cores (lazy.threads).

Each pipeline (bench/exactness.py's, fitted on its mixed frame) is compiled twice, with
``CompileOptions(threads=1)`` and ``threads=2`` (warm-up on, default buckets), and both score
the same encoded rows (``run_encoded``: the graph's call alone, no host encoding) at each batch
size, in alternating order, ``--rounds`` times; a figure is the median. XLA's and OpenMP's own
pools are held to one thread, so the two threads are Kestrel's. Prints a table; never asserts.

Usage: python bench/threads.py [--pipelines ct_hgb,scaled_rf] [--batches 10000,100000]
       [--rounds 7]
"""

from __future__ import annotations

import os

# Before numpy, jax and numba load: one thread each, so that the threads compared are ours.
os.environ.update(
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
import time

import exactness

PIPELINES = ("hgb_raw", "ct_hgb", "scaled_rf", "scaled_gbc", "lgbm_raw", "scaled_lr")


def main() -> None:
    import compiler

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--batches", default="10000,100000")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    print(f"CPUs {cores}; median ms of {args.rounds} calls each, alternating\n")
    print("| pipeline | batch | 1 thread ms | 2 threads ms | speed-up |")
    print("|---|---|---|---|---|")
    for name in args.pipelines.split(","):
        model, frame = exactness._fit(name)
        compiled = {
            t: compiler.compile(model, options=compiler.CompileOptions(threads=t)) for t in (1, 2)
        }
        for batch in batches:
            feed, _ = compiled[1].encode(exactness._sample(frame, batch, seed=2))
            for _ in range(3):  # the first three calls decide whether spreading pays
                for c in compiled.values():
                    c.run_encoded(feed)
            times: dict[int, list[float]] = {1: [], 2: []}
            for r in range(args.rounds):
                for t in (1, 2) if r % 2 else (2, 1):
                    t0 = time.perf_counter()
                    compiled[t].run_encoded(feed)
                    times[t].append(time.perf_counter() - t0)
            one, two = (1e3 * statistics.median(times[t]) for t in (1, 2))
            print(f"| {name} | {batch:,} | {one:.2f} | {two:.2f} | {one / two:.2f}x |")


if __name__ == "__main__":
    main()
