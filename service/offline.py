"""``kestrel compile FILE``: what registration would do, offline, with a timing per bucket.

Loads the file through the same trust boundary as an upload, traces it, compiles and warms up
every bucket (progress on stderr), checks parity against the source, and prints the compile
report (``as_json``: as one JSON document). Failures raise :class:`CommandError`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

import compiler
import lazy as lz
from service import artifacts, parity
from service.artifacts.skops_trust import HOST_STEP_SETTING
from service.settings import Settings
from service.terminal import CommandError, LoadDisplay, joined, parse_json, read_file
from service.versions import ModelOptions


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
    as_json: bool = False,
    console: Console | None = None,
    progress: Console | None = None,
) -> int:
    """``host_step_modules``: the modules whose functions and classes a skops file may reference,
    run as host steps (None: the service's setting, ``KESTREL_HOST_STEP_MODULES``); as in the
    service, steps run on the host only when some module is trusted. ``max_batch`` is the largest
    bucket compiled: larger calls run in chunks of ``max_batch`` rows. ``console``: the report
    (default stdout); ``progress``: the live progress (default stderr)."""
    console = console or Console(width=120)
    if host_step_modules is None:
        host_step_modules = Settings().host_step_modules
    data = read_file(path)
    rows = None
    if sample is not None:
        rows = parse_json(read_file(sample, "--sample"), f"--sample {sample}", allow_nan=True)
    try:
        loaded = artifacts.load_artifact(
            data,
            filename=path.name,
            allow_pickle=allow_pickle,
            host_step_modules=host_step_modules,
        )
    except artifacts.ArtifactError as exc:
        raise CommandError(f"cannot load {path}: {joined(str(exc))}") from None
    estimator = loaded.estimator
    cache = lz.ExecutableCache(disk_dir=cache_dir)
    model_options = ModelOptions.model_validate({"dtype": dtype, "tree_strategy": tree_strategy})
    options = model_options.compile_options(
        max_batch=max_batch,
        call_rows=max_batch,
        allow_host_steps=bool(host_step_modules),
        cache=cache,
        warmup=False,  # below, bucket by bucket under the progress display
    )
    t0 = time.perf_counter()
    try:
        schema = compiler.trace(estimator, options=options).schema
        source_rows = _source_rows(schema, rows, sample) if rows is not None else None
        traced = compiler.trace(estimator, sample=source_rows, options=options)
    except compiler.CompilerError as exc:
        message = f"cannot compile {type(estimator).__name__}: {exc}"
        if not host_step_modules and "host step" in str(exc):
            message += (
                f"; host steps are off: {HOST_STEP_SETTING} lists no trusted module (steps the "
                "compiler cannot convert run on the host only for modules listed there)"
            )
        raise CommandError(message) from None
    trace_s = time.perf_counter() - t0
    model = compiler.CompiledModel(traced, options)
    warmed: list[lz.WarmedBucket] = []
    defaults = Settings()
    with LoadDisplay(progress or Console(stderr=True)) as display:
        display.show("compiling", 0, model.compiled.bucket_count)

        def on_bucket(bucket: lz.WarmedBucket) -> None:
            warmed.append(bucket)
            display.show("compiling", bucket.done, bucket.total)

        model.compiled.warmup(on_bucket=on_bucket)
        display.show("parity")
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
            raise CommandError(f"parity check failed: {type(exc).__name__}: {exc}") from None

    report = {
        "file": str(path),
        "estimator": type(estimator).__name__,
        "format": loaded.format,
        "trace_seconds": trace_s,
        "report": traced.report.as_dict(),
        "buckets": [_bucket_entry(model, b) for b in sorted(warmed, key=_position)],
        "compiled": cache.stats.total_compiles,
        "loaded_from_disk": cache.stats.disk_hits,
        "on_host": sum(p.runs_on == lz.HOST for p in _placements(model)),
        "parity": result.as_dict(),
    }
    if as_json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        _print_report(console, report)
    if not result.ok:
        raise CommandError(
            f"parity check failed on {result.source} and probe rows: {result.problem}"
        )
    return 0


def _placements(model: compiler.CompiledModel) -> list[lz.Placement]:
    return [p for graph in model.compiled.graphs for p in graph.placements.values()]


def _position(bucket: lz.WarmedBucket) -> tuple[int, int]:
    return bucket.graph, bucket.bucket  # warm-up runs largest first; the report reads upward


def _bucket_entry(model: compiler.CompiledModel, bucket: lz.WarmedBucket) -> dict[str, Any]:
    """One warmed bucket: its time, and where the execution plan runs it and why."""
    placement = model.compiled.graphs[bucket.graph].placements[bucket.bucket]
    return {
        "graph": bucket.graph,
        "bucket": bucket.bucket,
        "seconds": bucket.seconds,
        "runs_on": placement.runs_on,
        "reason": placement.reason,
    }


def _source_rows(schema: compiler.InputSchema, rows: Any, sample: Path | None) -> Any:
    """The sample's rows as the source model takes them; a CommandError if they don't fit."""
    try:
        return parity.source_input(schema, rows)
    except (compiler.CompilerError, ValueError, TypeError) as exc:
        raise CommandError(f"--sample {sample}: {exc}") from None


def _print_report(console: Console, report: dict[str, Any]) -> None:
    console.print(
        f"[bold]{report['estimator']}[/bold] ({report['format']}) traced in "
        f"{report['trace_seconds']:.2f} s"
    )
    steps = Table(title="compile report")
    for col in ("step", "estimator", "where", "notes"):
        steps.add_column(col)
    for step in report["report"].get("steps", []):
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
    for col in ("runs on", "why"):
        buckets.add_column(col)
    for b in report["buckets"]:
        row = (str(b["graph"]), str(b["bucket"]), f"{b['seconds']:.3f}", b["runs_on"], b["reason"])
        buckets.add_row(*row)
    console.print(buckets)
    console.print(
        f"{len(report['buckets'])} buckets: {report['on_host']} on the host, "
        f"{report['compiled']} compiled, {report['loaded_from_disk']} loaded from disk; "
        f"graph {report['report'].get('graph_nodes')} nodes"
    )
    result = report["parity"]
    if result["ok"]:
        console.print(
            f"parity with the source on {result['rows'] - result['probes']} {result['source']} "
            f"rows and {result['probes']} probe rows: ok"
        )
