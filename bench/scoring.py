"""Kestrel against scikit-learn, ONNX Runtime and Hummingbird, in one process (issue 6).

For each pipeline (``scoring_pipelines.PIPELINES``, a–j) and batch size, every system
(``scoring_systems.SYSTEMS``) scores the same host rows with ``predict_proba`` — numpy matrix or
DataFrame in, numpy out — in interleaved rounds with one thread count for all; cells are medians.
Each cell also records agreement with scikit-learn (max |Δp|, argmax agreement) and the system's
convert/compile time; the machine's GEMM and memory limits are measured in the same run. A cell
that cannot run says why: ``unsup`` (no conversion), ``err`` (it raised), ``!`` (wrong output:
still timed), ``skip`` (over the per-cell time budget) or ``not installed``.

Prints rich tables, writes the results as JSON (``--out``) and, with ``--report``, the
docs/performance.md page and its plot (see ``report.py``). Performance targets are printed as
pass/fail, never asserted.

Usage: python bench/scoring.py [--threads N] [--pipelines a,b,...] [--batches 1,100,...]
           [--systems sklearn,ort,hb-torch,hb-ts,kestrel-jax,kestrel-torch] [--rounds R]
           [--min-time S] [--cell-budget S] [--max-batch M] [--tol T] [--quick]
           [--out results.json] [--report [docs/performance.md]]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scoring_limits
from scoring_pipelines import PIPELINES, Data, Pipeline, Scale, fit, make_data, work
from scoring_systems import SYSTEMS, Context, System, Unsupported
from scoring_threads import Pins, pinned_threads

ROOT = Path(__file__).resolve().parents[1]
FULL_BATCHES = (1, 100, 10_000, 100_000)
QUICK_BATCHES = (1, 100)

OK, WRONG, UNSUP, ERR, SKIP, MISSING = "ok", "!", "unsup", "err", "skip", "not installed"
TIMED = (OK, WRONG)  # statuses with a latency
# Versions recorded with the results (distribution names).
PACKAGES = (
    "numpy",
    "scipy",
    "scikit-learn",
    "pandas",
    "jax",
    "jaxlib",
    "torch",
    "onnxruntime",
    "onnx",
    "protobuf",
    "skl2onnx",
    "onnxmltools",
    "hummingbird-ml",
    "lightgbm",
    "xgboost",
    "matplotlib",
)


@dataclass(frozen=True)
class Config:
    threads: int
    pipelines: tuple[str, ...]
    batches: tuple[int, ...]
    systems: tuple[str, ...]
    rounds: int
    min_time: float  # seconds of calls per timed sample
    cell_budget: float  # seconds one system may spend on one cell's rounds
    max_batch: int  # Kestrel's compile option
    tol: float  # max |Δp| beyond which an output is wrong
    quick: bool


@dataclass
class Cell:
    """One (pipeline, batch, system) measurement."""

    pipeline: str
    batch: int
    system: str
    status: str
    ms: float | None = None  # median ms per call
    samples_ms: list[float] = field(default_factory=list)
    max_abs_diff: float | None = None
    argmax_agreement: float | None = None
    reason: str = ""
    speedup_sklearn: float | None = None
    best_other: str | None = None
    speedup_best_other: float | None = None
    work: float | None = None  # bytes or FLOPs a call must move or compute (a work model)
    work_unit: str | None = None
    achieved: float | None = None  # GB/s or GFLOP/s
    achieved_unit: str | None = None
    limit_fraction: float | None = None


@dataclass
class Converted:
    status: str
    convert_s: float | None = None
    reason: str = ""
    predict: Callable[[Any], Any] | None = None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = _config(args)
    with pinned_threads(config.threads) as pins:
        results = run(config, pins)
    results["config"]["argv"] = list(argv if argv is not None else sys.argv[1:])

    import report

    report.print_tables(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if args.report:
        md = Path(args.report)
        written = report.write(results, md, md.with_suffix(".png"))
        print("wrote " + ", ".join(map(str, written)), file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", type=int, default=1, help="threads (and CPUs) for every system"
    )
    parser.add_argument(
        "--pipelines", type=_choices(PIPELINES), default=tuple(PIPELINES), help="e.g. a,b,i"
    )
    parser.add_argument("--batches", type=_batches, help=f"rows per call (default {FULL_BATCHES})")
    parser.add_argument(
        "--systems", type=_choices(SYSTEMS), default=tuple(SYSTEMS), help=",".join(SYSTEMS)
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds per cell (default 5)")
    parser.add_argument("--min-time", type=float, help="seconds of calls per sample (0.1)")
    parser.add_argument(
        "--cell-budget", type=float, help="seconds one system may spend on one cell (30)"
    )
    parser.add_argument(
        "--max-batch", type=int, default=None, help="Kestrel max_batch (compiler default)"
    )
    parser.add_argument("--tol", type=float, default=1e-3, help="max |Δp| of a correct output")
    parser.add_argument("--quick", action="store_true", help="small models, a smoke run")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument(
        "--report",
        nargs="?",
        const=str(ROOT / "docs" / "performance.md"),
        help="write this Markdown page and a .png beside it (default docs/performance.md)",
    )
    return parser


def _config(args: argparse.Namespace) -> Config:
    import compiler

    quick = args.quick
    config = Config(
        threads=args.threads,
        pipelines=args.pipelines,
        batches=args.batches or (QUICK_BATCHES if quick else FULL_BATCHES),
        systems=args.systems,
        rounds=args.rounds or (3 if quick else 5),
        min_time=args.min_time if args.min_time is not None else (0.02 if quick else 0.1),
        cell_budget=args.cell_budget or (5.0 if quick else 30.0),
        max_batch=args.max_batch or compiler.CompileOptions().max_batch,
        tol=args.tol,
        quick=quick,
    )
    for name in ("threads", "rounds", "max_batch"):
        if getattr(config, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if config.min_time < 0 or config.cell_budget <= 0 or config.tol <= 0:
        raise SystemExit("--min-time must be >= 0, --cell-budget and --tol > 0")
    return config


def _choices(known: dict[str, Any]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(v.strip() for v in text.split(",") if v.strip())
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; known: {','.join(known)}")
        return names

    return parse


def _batches(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(v) for v in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch sizes must be integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1, got {text!r}")
    return values


# -- the run -------------------------------------------------------------------------------------
def run(config: Config, pins: Pins) -> dict[str, Any]:
    """Measure every requested cell; the results as a JSON-ready dict."""
    _log(f"machine limits ({config.threads} thread(s)) …")
    limit_runs = [scoring_limits.measure(quick=config.quick)]
    _log(scoring_limits.describe(limit_runs[0]))
    scale = Scale.quick() if config.quick else Scale.full()
    pipelines: dict[str, Any] = {}
    cells: list[Cell] = []
    for key in config.pipelines:
        record, pipeline_cells = _bench_pipeline(PIPELINES[key], scale, config, pins)
        pipelines[key] = record
        cells += pipeline_cells
    # Measured again at the end: on a shared machine the less disturbed run is the limit.
    limit_runs.append(scoring_limits.measure(quick=config.quick))
    limits = scoring_limits.best_of(limit_runs)
    _log(scoring_limits.describe(limits))
    _speedups(cells)
    _efficiency(cells, limits)
    results = {
        "config": asdict(config),
        "env": _environment(config),
        "limits": limits,
        "limit_runs": limit_runs,
        "systems": {n: {"title": s.title, "family": s.family} for n, s in SYSTEMS.items()},
        "pipelines": pipelines,
        "cells": [asdict(c) for c in cells],
        "notes": pins.notes,
    }
    results["targets"] = targets(results)
    return results


def _bench_pipeline(
    pipeline: Pipeline, scale: Scale, config: Config, pins: Pins
) -> tuple[dict[str, Any], list[Cell]]:
    record: dict[str, Any] = {"label": pipeline.label, "title": pipeline.title}
    record |= {"kind": pipeline.kind, "frame": pipeline.frame}
    missing = pipeline.missing()
    if missing:
        reason = f"{', '.join(missing)} not installed"
        record |= {"status": MISSING, "reason": reason, "systems": {}}
        return record, [
            Cell(pipeline.key, b, s, MISSING, reason=reason)
            for b in config.batches
            for s in config.systems
        ]
    _log(f"[{pipeline.label}] fitting …")
    data = make_data(pipeline.frame, scale.train_rows, max(config.batches))
    t0 = time.perf_counter()
    est = fit(pipeline, scale, data)
    record |= {"status": OK, "fit_s": time.perf_counter() - t0}
    context = Context(threads=config.threads, max_batch=config.max_batch)
    converted = {}
    for name in config.systems:
        converted[name] = _convert(SYSTEMS[name], pipeline, est, data, context)
        pins.sync()  # torch may have been imported just now
        c = converted[name]
        _log(f"[{pipeline.label}] {name}: {c.status} {_seconds(c.convert_s)} {c.reason}")
    record["systems"] = {
        n: {"status": c.status, "convert_s": c.convert_s, "reason": c.reason}
        for n, c in converted.items()
    }
    # An MLP's floor: the bare products of its layers, timed in the same rounds (not a scorer).
    floors = scoring_limits.products_floor(est.coefs_) if pipeline.kind == "mlp" else {}
    if floors:
        record["floor_ms"] = {}
    cells = []
    previous: dict[str, tuple[int, float]] = {}  # system → (batch, ms) of its last call
    for batch in config.batches:
        row, floor_ms = _bench_batch(
            pipeline, est, data, batch, converted, previous, config, floors
        )
        if floor_ms:
            record["floor_ms"][str(batch)] = floor_ms
        for cell in row:
            amount = work(pipeline, est, batch)
            if amount is not None:
                cell.work, cell.work_unit = amount
        cells += row
        _log(
            f"[{pipeline.label}] batch {batch}: "
            + ", ".join(f"{c.system} {_cell_log(c)}" for c in row)
        )
    del converted, est
    gc.collect()
    return record, cells


def _convert(system: System, pipeline: Pipeline, est: Any, data: Data, ctx: Context) -> Converted:
    missing = system.missing()
    if missing:
        return Converted(MISSING, reason=f"{', '.join(missing)} not installed")
    # A private copy: no system can affect another through a shared fitted estimator.
    model = est if system.name == "sklearn" else copy.deepcopy(est)
    for module in system.preload:
        importlib.import_module(module)
    t0 = time.perf_counter()
    try:
        predict = system.convert(pipeline, model, data.rows(min(64, len(data.pool))), ctx)
    except Unsupported as exc:
        return Converted(UNSUP, reason=str(exc))
    except Exception as exc:
        return Converted(ERR, reason=f"convert: {type(exc).__name__}: {_short(exc)}")
    seconds = 0.0 if system.name == "sklearn" else time.perf_counter() - t0
    return Converted(OK, convert_s=seconds, predict=predict)


def _bench_batch(
    pipeline: Pipeline,
    est: Any,
    data: Data,
    batch: int,
    converted: dict[str, Converted],
    previous: dict[str, tuple[int, float]],
    config: Config,
    floors: dict[str, Callable[[Any], Any]],
) -> tuple[list[Cell], dict[str, float]]:
    """The batch's cells, and the median ms of each of ``floors`` (timed in the same rounds)."""
    rows = data.rows(batch)
    reference = est.predict_proba(rows)
    cells = {}
    active: dict[str, Callable[[], Any]] = {}
    for name, conv in converted.items():
        cell = cells[name] = Cell(pipeline.key, batch, name, conv.status, reason=conv.reason)
        if conv.predict is None:
            continue
        guess = _expected_ms(previous.get(name), batch)
        if guess is not None and _over_budget(guess, config):
            cell.status, cell.reason = SKIP, _budget_reason(guess, config, "expected ")
            continue
        # Each system gets its own copy of the rows: Hummingbird's PCA writes into its input.
        mine = _copy_rows(rows)
        run = _bind(conv.predict, mine)
        try:
            # The first call checks the output and warms caches (TorchScript optimizes on its
            # first calls, XLA copies parameters); a second, warm call sizes the budget.
            t0 = time.perf_counter()
            out = run()
            warm_ms = (time.perf_counter() - t0) * 1e3
            if warm_ms / 1e3 <= config.cell_budget:
                warm_ms = _call_ms(run)
        except Exception as exc:
            cell.status, cell.reason = ERR, f"predict: {type(exc).__name__}: {_short(exc)}"
            continue
        previous[name] = (batch, warm_ms)  # refined by the median below
        problem = _agreement(cell, out, reference, config.tol)
        if not _same_rows(mine, rows):
            problem = "wrote into the caller's input rows" + (f"; {problem}" if problem else "")
        if problem:
            cell.status, cell.reason = WRONG, problem
        if _over_budget(warm_ms, config):
            reason = _budget_reason(warm_ms, config, "")
            cell.status, cell.reason = (
                SKIP,
                f"{reason}; wrong output: {problem}" if problem else reason,
            )
            continue
        active[name] = run
    for name, floor in floors.items():
        active[f"floor:{name}"] = run = _bind(floor, _copy_rows(rows))
        run()  # compiles XLA's
    samples: dict[str, list[float]] = {name: [] for name in active}
    names = list(active)
    for r in range(config.rounds if names else 0):
        gc.collect()
        # Interleaved, each round in a rotated order: every system sees the same machine noise.
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(per_call_ms(active[name], config.min_time))
    floor_ms = {}
    for name, values in samples.items():
        if name.startswith("floor:"):
            floor_ms[name.removeprefix("floor:")] = statistics.median(values)
            continue
        cell = cells[name]
        cell.samples_ms = values
        cell.ms = statistics.median(values)
        previous[name] = (batch, cell.ms)
    return list(cells.values()), floor_ms


def _copy_rows(rows: Any) -> Any:
    return rows.copy(deep=True) if hasattr(rows, "iloc") else rows.copy()


def _same_rows(a: Any, b: Any) -> bool:
    import numpy as np

    if hasattr(a, "iloc"):
        return bool(a.equals(b))
    return bool(np.array_equal(a, b, equal_nan=True))


def _bind(predict: Callable[[Any], Any], rows: Any) -> Callable[[], Any]:
    return lambda: predict(rows)


def _call_ms(run: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1e3


def per_call_ms(run: Callable[[], Any], min_time: float) -> float:
    """Mean ms per call over at least ``min_time`` seconds (at least one call)."""
    calls = 0
    t0 = time.perf_counter()
    while True:
        run()
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time:
            return elapsed / calls * 1e3


def _expected_ms(previous: tuple[int, float] | None, batch: int) -> float | None:
    """A lower-bound guess of one call's ms from the system's call at a smaller batch: at least
    as slow, and proportional to rows once calls are large enough to be dominated by them."""
    if previous is None:
        return None
    rows, ms = previous
    return ms * batch / rows if rows >= 1000 else ms


def _over_budget(call_ms: float, config: Config) -> bool:
    return config.rounds * max(call_ms / 1e3, config.min_time) > config.cell_budget


def _budget_reason(call_ms: float, config: Config, how: str) -> str:
    return (
        f"{how}{call_ms / 1e3:.2f} s per call × {config.rounds} rounds > "
        f"{config.cell_budget:g} s budget"
    )


def _agreement(cell: Cell, out: Any, reference: Any, tol: float) -> str | None:
    """Record max |Δp| and argmax agreement; the problem if the output is wrong."""
    import numpy as np

    out = np.asarray(out)
    if out.shape != reference.shape:
        return f"output shape {out.shape}, scikit-learn's {reference.shape}"
    diff = np.abs(out.astype(np.float64) - reference)
    cell.max_abs_diff = float(np.max(diff)) if diff.size else 0.0
    # A class tied with scikit-learn's top class (within tol) agrees: 50/50 forest votes are
    # broken by float rounding, not by the model.
    chosen = np.take_along_axis(reference, out.argmax(axis=1)[:, None], axis=1)[:, 0]
    cell.argmax_agreement = float(np.mean(reference.max(axis=1) - chosen <= tol))
    if not np.all(np.isfinite(out)):
        return "non-finite probabilities"
    if cell.max_abs_diff > tol:
        return (
            f"max |Δp| {cell.max_abs_diff:.3g} > {tol:g} "
            f"(argmax agreement {cell.argmax_agreement:.4g})"
        )
    return None


def _efficiency(cells: list[Cell], limits: dict[str, Any]) -> None:
    """Achieved GB/s or GFLOP/s of cells with a work model, and their share of the limit."""
    for cell in cells:
        if cell.ms is None or cell.work is None:
            continue
        rate = cell.work / (cell.ms / 1e3) / 1e9
        if cell.work_unit == "bytes":
            cell.achieved, cell.achieved_unit = rate, "GB/s"
            cell.limit_fraction = rate / limits["read_gbs"]
        else:
            cell.achieved, cell.achieved_unit = rate, "GFLOP/s"
            cell.limit_fraction = rate / limits["gemm_gflops"]


def _speedups(cells: list[Cell]) -> None:
    """Speed-up vs scikit-learn and vs the fastest correct system of another family."""
    family = {n: s.family for n, s in SYSTEMS.items()}
    groups: dict[tuple[str, int], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.pipeline, cell.batch), []).append(cell)
    for group in groups.values():
        correct = {c.system: c.ms for c in group if c.status == OK and c.ms is not None}
        sklearn_ms = correct.get("sklearn")
        for cell in group:
            if cell.ms is None:
                continue
            if sklearn_ms is not None:
                cell.speedup_sklearn = sklearn_ms / cell.ms
            others = {s: ms for s, ms in correct.items() if family[s] != family[cell.system]}
            if others:
                cell.best_other = min(others, key=others.__getitem__)
                cell.speedup_best_other = others[cell.best_other] / cell.ms


# -- targets -------------------------------------------------------------------------------------
def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 6's targets for each Kestrel cell: pass/fail, the value, and the shortfall factor
    (how many times faster Kestrel must get; < 1 where it passes)."""
    kinds = {k: p["kind"] for k, p in results["pipelines"].items()}
    kestrel = {n for n, s in results["systems"].items() if s["family"] == "kestrel"}
    by_key = {(c["pipeline"], c["batch"], c["system"]): c for c in results["cells"]}
    one_thread = results["config"]["threads"] == 1
    out = []
    for cell in results["cells"]:
        if cell["system"] not in kestrel or kinds.get(cell["pipeline"]) is None:
            continue
        kind, batch = kinds[cell["pipeline"]], cell["batch"]
        checks: list[tuple[str, str, float]] = []  # (target, quantity, required)
        if batch >= 10_000 and kind == "trees":
            checks.append(("≥ 3× the best other system", "speedup_best_other", 3.0))
        if batch >= 10_000 and kind in ("linear", "mlp"):
            checks.append(("≥ 1.5× the best other system", "speedup_best_other", 1.5))
            checks.append(("within 3× of the machine's limit", "limit_fraction", 1 / 3))
        if batch == 1:
            checks.append(("≤ 2× ONNX Runtime's latency", "vs_ort", 2.0))
        for target, quantity, required in checks:
            entry = {"pipeline": cell["pipeline"], "batch": batch, "system": cell["system"]}
            entry |= {"target": target, "required": required, "applies": one_thread}
            if quantity == "vs_ort":
                ort = by_key.get((cell["pipeline"], batch, "ort"))
                ok = ort is not None and ort["status"] == OK and cell["ms"] is not None
                value = cell["ms"] / ort["ms"] if ok else None
                shortfall = value / required if value is not None else None
                missing = "ONNX Runtime has no result" if not ok else ""
            else:
                value = cell[quantity]
                shortfall = required / value if value else None
                missing = "no comparison" if value is None else ""
            if cell["status"] == MISSING:
                entry |= {"value": None, "result": "n/a", "shortfall": None}
                entry["note"] = f"not run: {cell['reason']}"
            elif cell["status"] != OK:
                entry |= {"value": value, "result": "fail", "shortfall": None}
                entry["note"] = f"Kestrel: {cell['status']} {cell['reason']}".strip()
            elif value is None:
                entry |= {"value": None, "result": "n/a", "shortfall": None, "note": missing}
            else:
                passed = shortfall is not None and shortfall <= 1.0
                entry |= {"value": value, "result": "pass" if passed else "fail"}
                note = "" if passed else _below_floor(results, cell, required)
                entry |= {"shortfall": shortfall, "note": note}
            out.append(entry)
    return out


def _below_floor(results: dict[str, Any], cell: dict[str, Any], required: float) -> str:
    """Why a speed-up target is out of any float32 scorer's reach, where it is: the time it
    asks for is below the bare products of the pipeline's layers (its floor) in the same run."""
    floors = results["pipelines"][cell["pipeline"]].get("floor_ms", {}).get(str(cell["batch"]))
    best = cell.get("best_other")
    if not floors or best is None:
        return ""
    other = next(
        c
        for c in results["cells"]
        if (c["pipeline"], c["batch"], c["system"]) == (cell["pipeline"], cell["batch"], best)
    )
    allowed, floor = other["ms"] / required, min(floors.values())
    if allowed >= floor:
        return ""
    each = ", ".join(f"{lib} {ms:.3g}" for lib, ms in floors.items())
    note = (
        f"{required:g}× {best} ({other['ms']:.3g} ms) allows {allowed:.3g} ms: less than the "
        f"MLP's float32 layer products alone take in the same rounds, without bias or activation "
        f"(ms: {each})"
    )
    limit = results.get("limits", {}).get("gemm_gflops")
    if cell.get("work") and limit:
        rate = cell["work"] / (allowed / 1e3) / 1e9
        if rate > limit:
            note += f"; they would have to run at {rate:.0f} GFLOP/s, past the {limit:.0f} limit"
    return note


# -- environment ---------------------------------------------------------------------------------
def _environment(config: Config) -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "threads": config.threads,
        "versions": versions,
    }


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# -- logging -------------------------------------------------------------------------------------
def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f} s"


def _cell_log(cell: Cell) -> str:
    return f"{cell.ms:.3g} ms" if cell.ms is not None else cell.status


def _short(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


if __name__ == "__main__":
    raise SystemExit(main())
