"""Tree strategies side by side: the measurements a cost model for ``tree_strategy="auto"`` is
fitted from.

For random forests and gradient boosting across depth, tree count and batch size, every
implemented strategy (and scikit-learn for reference) is timed in one run, interleaved, medians;
each compiled model is checked against scikit-learn first. Prints one row per (model, batch) with
ms per call and the fastest strategy, plus what ``auto`` picks today.

Usage: python bench/tree_strategies.py [--threads N] [--quick] [--rounds R]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from typing import Any


def _pin_threads(threads: int) -> None:
    # Before jax is imported. XLA ignores the whole flag string if a token is unknown.
    if threads == 1:
        flags = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
        os.environ["XLA_FLAGS"] = flags.strip()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a small grid (a smoke run)")
    args = parser.parse_args(argv)
    _pin_threads(args.threads)

    import numpy as np
    from rich.console import Console
    from rich.table import Table
    from sklearn.datasets import make_classification
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier

    import compiler
    from compiler.trees.strategies import IMPLEMENTED

    depths = (3, 6) if args.quick else (2, 3, 4, 6, 8)
    tree_counts = (10,) if args.quick else (10, 100)
    batches = (1, 1000) if args.quick else (1, 100, 10_000)
    x, y = make_classification(4000, 20, n_informative=10, random_state=0)
    x = x.astype(np.float32)

    table = Table(title=f"Tree strategies, ms per predict_proba call ({args.threads} thread(s))")
    strategies = list(IMPLEMENTED)
    for column in (
        "model",
        "depth",
        "trees",
        "nodes",
        "batch",
        "sklearn",
        *strategies,
        "best",
        "auto picks",
    ):
        table.add_column(column, justify="right")
    for family, depth, n_trees in itertools.product(("rf", "gb"), depths, tree_counts):
        est: Any
        if family == "rf":
            est = RandomForestClassifier(n_trees, max_depth=depth, random_state=0, n_jobs=1)
        else:
            est = GradientBoostingClassifier(n_estimators=n_trees, max_depth=depth, random_state=0)
        est.fit(x, y)
        models = {}
        for name in strategies:
            options = compiler.CompileOptions(
                tree_strategy=name, max_batch=max(batches), methods=("predict_proba",)
            )
            try:
                models[name] = compiler.compile(est, options=options)
            except compiler.UnsupportedError:
                continue  # e.g. GEMM or perfect trees too large for this ensemble
        auto = compiler.trace(est, options=compiler.CompileOptions(methods=("predict_proba",)))
        nodes = sum(t.tree_.node_count for t in np.ravel(getattr(est, "estimators_", [])))
        for batch in batches:
            rows = x[np.arange(batch) % len(x)]
            expected = est.predict_proba(rows)
            for model in models.values():
                np.testing.assert_allclose(
                    model.predict_proba(rows), expected, rtol=1e-5, atol=1e-5
                )
            runners = {"sklearn": lambda est=est, rows=rows: est.predict_proba(rows)}
            runners |= {
                n: (lambda m=m, rows=rows: m.predict_proba(rows)) for n, m in models.items()
            }
            times: dict[str, list[float]] = {n: [] for n in runners}
            for _ in range(args.rounds):
                for name, run in runners.items():
                    times[name].append(_ms(run, batch))
            med = {n: statistics.median(t) for n, t in times.items()}
            best = min((n for n in med if n != "sklearn"), key=med.__getitem__)
            table.add_row(
                family,
                str(depth),
                str(n_trees),
                str(nodes),
                str(batch),
                f"{med['sklearn']:.3f}",
                *(f"{med[n]:.3f}" if n in med else "—" for n in strategies),
                best,
                auto.report.steps[0].detail.split(" (")[0].removeprefix("trees: "),
            )
    Console(width=160).print(table)
    return 0


def _ms(fn: Any, batch: int) -> float:
    calls = max(1, 2000 // max(batch, 1)) if batch < 2000 else 1
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


if __name__ == "__main__":
    raise SystemExit(main())
