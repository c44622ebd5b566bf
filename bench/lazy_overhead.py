"""What the lazy layer costs on top of XLA, and what its caches save.

Prints two tables, every column measured in this one run:

1. Per-call time of a compiled graph (validate + pad + dispatch + slice) against a bare
   ``jax.jit`` call of the same computation (numpy in, numpy out), interleaved, medians.
   Goal: at batch 1 the lazy call costs at most 1.5x the bare call.
2. Trace, lower and compile seconds per bucket, and the seconds to load the same executable from
   the on-disk cache in a fresh cache instance, for a small MLP-like graph and a 100-tree forest
   graph. Goal: a disk load costs at most 10 % of a cold compile.

Usage: python bench/lazy_overhead.py [--threads N] [--rounds R] [--max-batch M]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def _pin_threads(threads: int) -> None:
    # Must run before jax is imported. XLA ignores the whole flag string if a token is unknown.
    if threads == 1:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
        ).strip()
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))[:threads]
        os.sched_setaffinity(0, cpus)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per cell")
    parser.add_argument("--calls", type=int, default=300, help="calls per round")
    parser.add_argument("--max-batch", type=int, default=1024)
    args = parser.parse_args(argv)
    _pin_threads(args.threads)

    import jax
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from graphs import forest_graph, mlp_graph, mlp_jax

    import lazy as lz

    console = Console(width=130)
    rng = np.random.default_rng(0)
    graph, weights = mlp_graph(rng, n_features=50, hidden=(100, 100), n_classes=3)
    compiled = lz.compile(graph, lz.Options(max_batch=args.max_batch), lz.ExecutableCache())
    runner = compiled.graphs[0]
    bare = jax.jit(mlp_jax)
    device_weights = [jax.device_put(w) for w in weights]

    table = Table(
        title=f"Per-call time, µs (median of {args.rounds} rounds × {args.calls} calls, "
        f"{args.threads} thread(s), {jax.devices()[0].platform})"
    )
    for column in ("rows", "bucket", "bare jax.jit", "lazy CompiledGraph", "lazy / bare"):
        table.add_column(column, justify="right")
    for rows in (1, 64, 1000, 1024):
        x = rng.standard_normal((rows, 50), dtype=np.float32)
        feed = {"x": x}
        expected = np.asarray(bare(x, *device_weights))
        np.testing.assert_allclose(runner(feed)["proba"], expected, rtol=1e-4, atol=1e-6)
        bare_t, lazy_t = [], []
        for _ in range(args.rounds):  # interleaved: both see the same machine noise
            bare_t.append(_per_call(lambda x=x: np.asarray(bare(x, *device_weights)), args.calls))
            lazy_t.append(_per_call(lambda feed=feed: runner(feed), args.calls))
        b, k = statistics.median(bare_t), statistics.median(lazy_t)
        bucket = runner.buckets.sizes[runner.buckets.index(rows)]
        table.add_row(str(rows), str(bucket), f"{b:.1f}", f"{k:.1f}", f"{k / b:.2f}×")
    console.print(table)

    table = Table(title="Compile vs disk-cache load, per bucket (ms)")
    for column in (
        "graph",
        "nodes",
        "bucket",
        "trace",
        "lower",
        "compile",
        "disk load",
        "load / cold",
    ):
        table.add_column(column, justify="right")
    forest, _ = forest_graph(rng, n_trees=100, depth=8, n_features=50)
    for name, g in (("mlp 50-100-100-3", graph), ("forest 100×depth 8", forest)):
        with tempfile.TemporaryDirectory() as tmp:
            cold = lz.ExecutableCache(disk_dir=tmp)
            cold_graph = lz.CompiledGraph(g, lz.Options(max_batch=args.max_batch), cold)
            warm = lz.ExecutableCache(disk_dir=tmp)
            warm_graph = lz.CompiledGraph(g, lz.Options(max_batch=args.max_batch), warm)
            for index, bucket in enumerate(cold_graph.buckets.sizes):
                before = cold.stats.snapshot()
                cold_graph._executable(index, lz.CompileCause.WARMUP)
                after = cold.stats.snapshot()
                t = {k: (after[k] - before[k]) * 1e3 for k in ("trace_s", "lower_s", "compile_s")}
                load0 = warm.stats.disk_load_s
                warm_graph._executable(index, lz.CompileCause.WARMUP)
                load = (warm.stats.disk_load_s - load0) * 1e3
                total = sum(t.values())
                table.add_row(
                    name,
                    str(len(cold_graph.graph.order)),
                    str(bucket),
                    f"{t['trace_s']:.1f}",
                    f"{t['lower_s']:.1f}",
                    f"{t['compile_s']:.1f}",
                    f"{load:.1f}",
                    f"{load / total:.1%}",
                )
            assert warm.stats.total_compiles == 0, "the warm cache compiled"
    console.print(table)
    return 0


def _per_call(fn, calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


if __name__ == "__main__":
    raise SystemExit(main())
