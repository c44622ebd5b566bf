"""``kestrel compile FILE``: what registration would do, offline, with a timing per bucket.

Loads the file through the same trust boundary as an upload, traces it, compiles every bucket
under a progress bar, checks parity against the source, and prints the compile report.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import compiler
import lazy as lz
from service import artifacts, parity
from service.artifacts.skops_trust import HOST_STEP_SETTING
from service.settings import Settings


def compile_file(
    path: Path,
    *,
    sample: Path | None = None,
    max_batch: int = 1024,
    tree_strategy: str = "auto",
    dtype: str = "float32",
    cache_dir: Path | None = None,
    allow_pickle: bool = False,
    host_step_modules: Sequence[str] | None = None,
    console: Console | None = None,
) -> int:
    """``host_step_modules``: the modules whose functions and classes a skops file may reference,
    run as host steps (None: the service's setting, ``KESTREL_HOST_STEP_MODULES``); as in the
    service, steps run on the host only when some module is trusted."""
    console = console or Console(width=120)
    if host_step_modules is None:
        host_step_modules = Settings().host_step_modules
    try:
        loaded = artifacts.load_artifact(
            path.read_bytes(),
            filename=path.name,
            allow_pickle=allow_pickle,
            host_step_modules=host_step_modules,
        )
    except artifacts.ArtifactError as exc:
        console.print(f"[red]cannot load {path}: {exc}[/red]")
        return 1
    estimator = loaded.estimator
    cache = lz.ExecutableCache(disk_dir=cache_dir)
    options = compiler.CompileOptions(
        dtype=dtype,  # type: ignore[arg-type]
        tree_strategy=tree_strategy,  # type: ignore[arg-type]
        max_batch=max_batch,
        allow_host_steps=bool(host_step_modules),
        cache=cache,
        warmup=False,
    )
    rows = orjson.loads(sample.read_bytes()) if sample else None
    t0 = time.perf_counter()
    try:
        schema = compiler.trace(estimator, options=options).schema
        source_rows = parity.source_input(schema, rows) if rows is not None else None
        traced = compiler.trace(estimator, sample=source_rows, options=options)
    except compiler.CompilerError as exc:
        console.print(f"[red]cannot compile {type(estimator).__name__}: {exc}[/red]")
        if not host_step_modules and "host step" in str(exc):
            _fail(
                console,
                f"host steps are off: {HOST_STEP_SETTING} lists no trusted module (steps the "
                "compiler cannot convert run on the host only for modules listed there)",
            )
        return 1
    trace_s = time.perf_counter() - t0
    model = compiler.CompiledModel(traced, options)
    graphs = model.compiled.graphs
    timings: list[tuple[int, int, float]] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        total = sum(len(g.buckets) for g in graphs)
        task = progress.add_task("compiling buckets", total=total)
        for gi, graph in enumerate(graphs):
            for index, bucket in enumerate(graph.buckets.sizes):
                progress.update(task, description=f"graph {gi} · bucket {bucket}")
                b0 = time.perf_counter()
                graph.warm_bucket(index)
                timings.append((gi, bucket, time.perf_counter() - b0))
                progress.advance(task)
            graph.ready = True

    report = traced.report.as_dict()
    console.print(
        f"[bold]{type(estimator).__name__}[/bold] ({loaded.format}) traced in {trace_s:.2f} s"
    )
    steps = Table(title="compile report")
    for col in ("step", "estimator", "where", "notes"):
        steps.add_column(col)
    for step in report.get("steps", []):
        steps.add_row(
            str(step.get("path", "")),
            str(step.get("estimator", "")),
            str(step.get("where", "")),
            str(step.get("detail", "")),
        )
    console.print(steps)
    buckets = Table(title="buckets")
    for col in ("graph", "bucket", "seconds"):
        buckets.add_column(col, justify="right")
    for gi, bucket, seconds in timings:
        buckets.add_row(str(gi), str(bucket), f"{seconds:.3f}")
    console.print(buckets)
    s = cache.stats
    console.print(
        f"{s.total_compiles} compiled, {s.disk_hits} loaded from disk; "
        f"graph {report.get('graph_nodes')} nodes"
    )
    defaults = Settings()
    try:
        result = parity.gate(
            estimator,
            model,
            source_rows,
            synthetic_rows=defaults.parity_rows,
            probe_rows=defaults.parity_probe_rows,
            rtol=defaults.parity_rtol,
            atol=defaults.parity_atol,
        )
    except Exception as exc:  # the source refused the rows, or no rows could be made for it
        _fail(console, f"parity check failed: {type(exc).__name__}: {exc}")
        return 1
    if not result.ok:
        _fail(console, f"parity check failed on {result.source} and probe rows: {result.problem}")
        return 1
    console.print(
        f"parity with the source on {result.rows - result.probes} {result.source} rows and "
        f"{result.probes} probe rows: ok"
    )
    return 0


def _fail(console: Console, message: str) -> None:
    """One line (not wrapped, no markup read from ``message``), no traceback."""
    first = (message.strip().splitlines() or [message])[0]  # XGBoost appends a native trace
    console.print(first, style="red", markup=False, highlight=False, soft_wrap=True)
