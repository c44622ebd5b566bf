"""``kestrel demo``: fit a small pipeline, compile it through the lazy layer, and score with it.

Until ``compiler/`` converts estimators automatically, the demo traces its scikit-learn pipeline
(StandardScaler + LogisticRegression) by hand, exactly as a converter will: fitted attributes become
parameters, the input becomes lazy ops. It prints each step and how long it took.
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
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

import lazy as lz

N_FEATURES = 20


def trace_pipeline(pipeline: Pipeline) -> lz.Graph:
    """The fitted scaler + multinomial logistic regression as a lazy graph."""
    scaler: StandardScaler = pipeline[0]
    model: LogisticRegression = pipeline[-1]
    b = lz.Builder()
    x = b.input("x", (N_FEATURES,))
    with lz.scope("StandardScaler"):
        mean = b.param(scaler.mean_.astype(np.float32), "scaler.mean_")
        scale = b.param(scaler.scale_.astype(np.float32), "scaler.scale_")
        z = (x - mean) / scale
    with lz.scope("LogisticRegression"):
        coef = b.param(model.coef_.T.astype(np.float32), "model.coef_")
        intercept = b.param(model.intercept_.astype(np.float32), "model.intercept_")
        logits = z @ coef + intercept
        label_index = lz.argmax(logits)
        return b.graph({"predict_proba": lz.softmax(logits), "label_index": label_index})


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
    with _timed(steps, "trace to lazy graph", lambda: repr(state["graph"])):
        state["graph"] = trace_pipeline(pipeline)
    with _timed(steps, "start the JAX backend", lambda: state["backend"].fingerprint()):
        state["backend"] = lz.get_backend("jax")
    cache = lz.ExecutableCache(disk_dir=cache_dir)
    options = lz.Options(backend=state["backend"], max_batch=max_batch)
    with _timed(steps, "optimize + verify", lambda: f"{len(state['model'].graph.order)} nodes"):
        state["model"] = lz.CompiledGraph(state["graph"], options, cache)
    model: lz.CompiledGraph = state["model"]
    with _timed(steps, f"compile + warm {len(model.buckets)} buckets", lambda: _cache_line(cache)):
        model.warmup()
    for rows in (1, 1000, 5000):
        batch = x[:rows]
        out = model({"x": batch})
        expected = pipeline.predict_proba(batch)
        ours = _best_of(lambda batch=batch: model({"x": batch}))
        theirs = _best_of(lambda batch=batch: pipeline.predict_proba(batch))
        steps.append((f"score {rows} rows", f"{ours:,.2f}", _versus(ours, theirs)))
        diff = float(np.max(np.abs(out["predict_proba"] - expected)))
        agree = np.array_equal(pipeline.classes_[out["label_index"]], pipeline.predict(batch))
        steps.append(("  parity", "", f"max |Δp| = {diff:.1e}, labels agree: {agree}"))
        if not agree or diff > 1e-5:
            console.print(f"[red]parity check failed for {rows} rows[/red]")
            return 1

    table = Table(title="Kestrel demo: a scikit-learn pipeline compiled to XLA")
    table.add_column("step")
    table.add_column("ms", justify="right")
    table.add_column("what happened")
    for row in steps:
        table.add_row(*row)
    console.print(table)
    console.print(
        f"buckets: {list(model.buckets.sizes)}; compiles after warm-up: "
        f"{model.compiles.get('after_ready', 0)}; digest {model.graph.digest[:16]}…"
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


def _cache_line(cache: lz.ExecutableCache) -> str:
    s = cache.stats
    return (
        f"{s.total_compiles} compiled (trace {s.trace_s:.2f}s, lower {s.lower_s:.2f}s, "
        f"XLA {s.compile_s:.2f}s), {s.disk_hits} loaded from disk ({s.disk_load_s:.2f}s)"
    )
