"""``kestrel demo``: fit a small pipeline, compile it with Kestrel, and score with it.

It prints each step and how long it took: fitting with scikit-learn, tracing the whole pipeline
into a lazy graph, compiling every batch bucket with XLA (or loading them from the disk cache;
progress on stderr), and scoring against scikit-learn with a parity check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import compiler
import lazy as lz
from service.terminal import CommandError, LoadDisplay

N_FEATURES = 20


@contextmanager
def _timed(
    rows: list[tuple[str, str, str]], step: str, detail: Callable[[], str]
) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    rows.append((step, f"{(time.perf_counter() - t0) * 1e3:,.1f}", detail()))


def run_demo(cache_dir: Path | None = None, max_batch: int = 1024) -> int:
    console = Console(width=120)
    steps: list[tuple[str, str, str]] = []
    state: dict[str, Any] = {}

    with _timed(steps, "fit scikit-learn pipeline", lambda: "StandardScaler → LogisticRegression"):
        x, y = make_classification(
            n_samples=5000, n_features=N_FEATURES, n_informative=8, n_classes=3, random_state=0
        )
        x = x.astype(np.float32)
        pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    cache = lz.ExecutableCache(disk_dir=cache_dir)
    # max_batch is the largest bucket: larger calls run in chunks of max_batch rows.
    options = compiler.CompileOptions(
        max_batch=max_batch, call_rows=max_batch, cache=cache, warmup=False
    )
    with _timed(steps, "trace the pipeline", lambda: _report_line(state["traced"].report)):
        state["traced"] = compiler.trace(pipeline, options=options)
    with _timed(steps, "start the JAX backend", lambda: state["backend"].fingerprint()):
        state["backend"] = lz.get_backend("jax")
    model = compiler.CompiledModel(state["traced"], options)
    buckets = model.compiled.bucket_count
    with (
        _timed(steps, f"compile + warm {buckets} buckets", lambda: _cache_line(model, cache)),
        LoadDisplay(Console(stderr=True)) as display,
    ):
        display.show("compiling", 0, buckets)
        model.compiled.warmup(on_bucket=lambda b: display.show("compiling", b.done, b.total))
    for rows in (1, 1000, 5000):
        batch = x[:rows]
        proba = model.predict_proba(batch)
        expected = pipeline.predict_proba(batch)
        ours = _best_of(lambda batch=batch: model.predict_proba(batch))
        theirs = _best_of(lambda batch=batch: pipeline.predict_proba(batch))
        steps.append((f"score {rows} rows", f"{ours:,.2f}", _versus(ours, theirs)))
        diff = float(np.max(np.abs(proba - expected)))
        agree = np.array_equal(model.predict(batch), pipeline.predict(batch))
        steps.append(("  parity", "", f"max |Δp| = {diff:.1e}, labels agree: {agree}"))
        if not agree or diff > 1e-5:
            raise CommandError(
                f"parity check failed for {rows} rows: max |Δp| = {diff:.1e}, labels agree: {agree}"
            )

    table = Table(title="Kestrel demo: a scikit-learn pipeline compiled to XLA")
    table.add_column("step")
    table.add_column("ms", justify="right")
    table.add_column("what happened")
    for row in steps:
        table.add_row(*row)
    console.print(table)
    (graph,) = model.compiled.graphs
    console.print(
        f"buckets: {list(graph.buckets.sizes)}; compiles after warm-up: "
        f"{graph.compiles.get('after_ready', 0)}; graph digest {graph.graph.digest[:16]}…"
    )
    return 0


def _versus(ours: float, theirs: float) -> str:
    ratio = theirs / ours
    verdict = f"{ratio:.1f}× faster" if ratio >= 1 else f"{1 / ratio:.1f}× slower"
    return f"scikit-learn predict_proba: {theirs:,.2f} ms; Kestrel is {verdict}"


def _best_of(fn: Callable[[], Any], repeat: int = 7) -> float:
    """Best wall time in ms: single calls on a shared machine are noisy."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times)


def _report_line(report: compiler.CompileReport) -> str:
    steps = " → ".join(s.estimator for s in report.steps[1:])
    return f"{steps}: {report.graph_nodes} nodes, {report.parameters} fitted values on the device"


def _cache_line(model: compiler.CompiledModel, cache: lz.ExecutableCache) -> str:
    s = cache.stats
    placements = [p for graph in model.compiled.graphs for p in graph.placements.values()]
    on_host = sum(p.runs_on == lz.HOST for p in placements)
    return (
        f"{on_host} on the host, {s.total_compiles} compiled (trace {s.trace_s:.2f}s, lower {s.lower_s:.2f}s, "
        f"XLA {s.compile_s:.2f}s), {s.disk_hits} loaded from disk ({s.disk_load_s:.2f}s)"
    )
