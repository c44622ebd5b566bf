"""Tree strategies side by side with the other systems: the measurements issue 6's target is
checked against and ``tree_strategy="auto"``'s cost model (compiler/trees/cost.py) is fitted from.

For each tree ensemble and batch size, every implemented strategy, the source library's own
``predict_proba`` and, where installed, ONNX Runtime and Hummingbird (torch) are timed in one
process, interleaved round by round, medians. Each compiled strategy is checked against the
source first (max |Δp| ≤ 1e-5); the other systems' deviations are reported, not asserted.

Times are CPU seconds of the whole process per call (``time.process_time``), not wall time: on
a shared machine another process's time slices then do not count, and a system that spins up
extra threads pays for them. Every system is pinned to one thread (``--threads``): XLA:CPU
through ``--xla_cpu_multi_thread_eigen=false`` plus CPU affinity, OpenMP and BLAS through
threadpoolctl, ONNX Runtime, LightGBM and XGBoost through their own thread settings.

Each strategy is compiled with ``max_batch`` equal to the batch (one executable, no padding,
no chunking), or with ``--max-batch`` where that is smaller: the library's own chunking, as
``bench/scoring.py`` runs it (its default is 1024). A system whose single call takes longer than
``--budget-s`` is timed once and skipped at larger batches.

``--flush-mb M`` times every call cold: M MB are read and written before each call (outside the
timing), evicting the node tables and rows the previous call left in the caches — what a
system meets when other work runs between requests.

Presets: ``issue6`` (the default) — RF 100 trees of depth 8 and of unlimited depth,
GradientBoosting 100 × depth 3, HistGradientBoosting 100 iterations, LightGBM 100 × 31 leaves,
XGBoost 100 × depth 6 at 1, 100, 10k and 100k rows; ``grid`` — the cost model's grid (RF and
GB across depth and tree count, HistGB, LightGBM and XGBoost at 1, 100 and 10k rows).

Usage: python bench/tree_strategies.py [--preset issue6|grid] [--cases rf:8:100,hgb:31:100]
           [--batches 1,100,10000] [--rounds R] [--threads N] [--budget-s S] [--max-batch M]
           [--flush-mb M] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Predict = Callable[[Any], Any]

FAMILIES = ("rf", "gb", "hgb", "lgbm", "xgb")


@dataclass(frozen=True)
class Case:
    """A model to fit: ``size`` is max_depth (rf, gb, xgb; 0: unlimited) or max leaves (hgb,
    lgbm: 31 is both libraries' default)."""

    family: str
    size: int
    trees: int

    @property
    def label(self) -> str:
        if self.family in ("hgb", "lgbm"):
            return f"{self.family} {self.trees}×{self.size} leaves"
        return f"{self.family} {self.trees}×depth {self.size or '∞'}"


PRESETS: dict[str, tuple[tuple[Case, ...], tuple[int, ...]]] = {
    "issue6": (
        (
            Case("rf", 8, 100),
            Case("rf", 0, 100),
            Case("gb", 3, 100),
            Case("hgb", 31, 100),
            Case("lgbm", 31, 100),
            Case("xgb", 6, 100),
        ),
        (1, 100, 10_000, 100_000),
    ),
    "grid": (
        (
            *(Case("rf", d, t) for d in (2, 3, 4, 6, 8, 10, 0) for t in (10, 100)),
            *(Case("gb", d, t) for d in (2, 3, 4, 6, 8) for t in (10, 100)),
            *(Case("hgb", 31, t) for t in (10, 100)),
            Case("hgb", 15, 100),
            Case("lgbm", 31, 100),
            Case("lgbm", 63, 100),
            *(Case("xgb", d, 100) for d in (4, 6, 8)),
        ),
        (1, 100, 10_000),
    ),
}


def _pin_threads(threads: int) -> None:
    # Before jax is imported. XLA ignores the whole flag string if a token is unknown.
    if threads == 1:
        flags = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
        os.environ["XLA_FLAGS"] = flags.strip()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])


def _fit(case: Case, x: Any, y: Any, threads: int) -> Any:
    if case.family == "rf":
        from sklearn.ensemble import RandomForestClassifier

        depth = case.size or None
        est = RandomForestClassifier(case.trees, max_depth=depth, random_state=0, n_jobs=threads)
    elif case.family == "gb":
        from sklearn.ensemble import GradientBoostingClassifier

        est = GradientBoostingClassifier(
            n_estimators=case.trees, max_depth=case.size, random_state=0
        )
    elif case.family == "hgb":
        from sklearn.ensemble import HistGradientBoostingClassifier

        est = HistGradientBoostingClassifier(
            max_iter=case.trees, max_leaf_nodes=case.size, early_stopping=False, random_state=0
        )
    elif case.family == "lgbm":
        import lightgbm

        est = lightgbm.LGBMClassifier(
            n_estimators=case.trees, num_leaves=case.size, n_jobs=threads, verbose=-1
        )
    elif case.family == "xgb":
        import xgboost

        est = xgboost.XGBClassifier(n_estimators=case.trees, max_depth=case.size, n_jobs=threads)
    else:
        raise ValueError(f"unknown model family {case.family!r}; known: {', '.join(FAMILIES)}")
    return est.fit(x, y)


def _onnx_runtime(case: Case, est: Any, sample: Any, threads: int) -> Predict:
    import onnxruntime as ort

    if case.family in ("lgbm", "xgb"):
        import onnxmltools
        from onnxmltools.convert.common.data_types import FloatTensorType

        types = [("X", FloatTensorType([None, sample.shape[1]]))]
        if case.family == "lgbm":
            model = onnxmltools.convert_lightgbm(est, initial_types=types, zipmap=False)
        else:
            model = onnxmltools.convert_xgboost(est, initial_types=types)
    else:
        from skl2onnx import to_onnx

        model = to_onnx(est, sample, options={id(est): {"zipmap": False}})
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    outputs = [o.name for o in session.get_outputs()]
    proba = next((n for n in outputs if "prob" in n), outputs[-1])
    name = session.get_inputs()[0].name
    return lambda rows: session.run([proba], {name: rows})[0]


def _hummingbird(case: Case, est: Any, sample: Any, threads: int) -> Predict:
    import hummingbird.ml as hb

    return hb.convert(est, "torch", extra_config={"n_threads": threads}).predict_proba


OTHERS: dict[str, Callable[[Case, Any, Any, int], Predict]] = {
    "ort": _onnx_runtime,
    "hummingbird": _hummingbird,
}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:120]


def _cpu_ms(fn: Predict, rows: Any, sample_s: float = 0.05, flush: Any = None) -> float:
    """CPU ms per call: a warm-up call (the system timed before may have left every cache
    cold), one timed call, then as many more as fill ``sample_s`` if calls are fast. With
    ``flush`` (a large array), every call is timed alone after writing through it: cold caches."""
    if flush is not None:
        return _cold_cpu_ms(fn, rows, flush, sample_s)
    fn(rows)
    t0 = time.process_time()
    fn(rows)
    first = time.process_time() - t0
    calls = min(1000, int(sample_s / max(first, 1e-6)))
    if calls < 2:
        return first * 1e3
    t0 = time.process_time()
    for _ in range(calls):
        fn(rows)
    return (time.process_time() - t0) / calls * 1e3


def _cold_cpu_ms(fn: Predict, rows: Any, flush: Any, sample_s: float) -> float:
    """Median CPU ms of calls each made right after ``flush`` was read and written."""
    times: list[float] = []
    while len(times) < 3 or (sum(times) < sample_s * 1e3 and len(times) < 100):
        flush += 1.0  # reads and writes every cache line, outside the timing
        t0 = time.process_time()
        fn(rows)
        times.append((time.process_time() - t0) * 1e3)
    return statistics.median(times)


def _shape(report: Any) -> dict[str, Any]:
    """The compile report's tree note (one of a step's '; '-separated details) as fields:
    'trees: <strategy>[ (host: ...)] (<T> trees, depth <D>, <N> nodes, up to <L> leaves per tree,
    <S> levels in all)', S the sum of the trees' depths."""
    note = next(
        d for step in report.steps for d in step.detail.split("; ") if d.startswith("trees: ")
    )
    head, rest = note.removeprefix("trees: ").rsplit(" (", 1)
    name = head.split(" ", 1)[0]
    trees, depth, nodes, leaves, levels = rest.rstrip(")").split(", ")
    return {
        "auto": name,
        "n_trees": int(trees.removesuffix(" trees")),
        "depth": int(depth.removeprefix("depth ")),
        "nodes": int(nodes.removesuffix(" nodes")),
        "leaves": int(leaves.removeprefix("up to ").removesuffix(" leaves per tree")),
        "levels": int(levels.removesuffix(" levels in all")),
    }


def _parse_cases(text: str) -> tuple[Case, ...]:
    cases = []
    for item in text.split(","):
        family, size, trees = item.split(":")
        cases.append(Case(family.strip(), int(size), int(trees)))
    return tuple(cases)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="issue6")
    parser.add_argument("--cases", type=_parse_cases, help="family:size:trees,... (see Case)")
    parser.add_argument("--batches", type=_ints, help="rows per call")
    parser.add_argument("--strategies", help="a subset of the strategies, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=3.0, help="slower calls: timed once")
    parser.add_argument(
        "--max-batch", type=int, help="compile with at most this max_batch (the library chunks)"
    )
    parser.add_argument(
        "--flush-mb", type=int, default=0, help="time each call after evicting the caches"
    )
    parser.add_argument("--no-others", action="store_true", help="skip ONNX Runtime/Hummingbird")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args(argv)
    if args.max_batch is not None and args.max_batch < 1:
        parser.error(f"--max-batch must be at least 1, got {args.max_batch}")
    if args.flush_mb < 0:
        parser.error(f"--flush-mb must be non-negative, got {args.flush_mb}")
    _pin_threads(args.threads)

    import numpy as np
    from rich.console import Console
    from rich.table import Table
    from sklearn.datasets import make_classification
    from threadpoolctl import threadpool_limits

    import compiler
    from compiler.trees.strategies import IMPLEMENTED

    threadpool_limits(args.threads)
    preset_cases, preset_batches = PRESETS[args.preset]
    cases = args.cases or preset_cases
    batches = args.batches or preset_batches
    strategies = args.strategies.split(",") if args.strategies else list(IMPLEMENTED)
    x, y = make_classification(4000, 20, n_informative=10, random_state=0)
    x = x.astype(np.float32)
    flush = np.zeros(args.flush_mb << 17) if args.flush_mb else None  # float64: 8 bytes each
    console = Console(width=200)
    records: list[dict[str, Any]] = []

    cold = f", cold: {args.flush_mb} MB flushed before each call" if flush is not None else ""
    title = f"Tree ensembles, CPU ms per predict_proba call ({args.threads} thread{cold})"
    table = Table(title=title)
    for column in ("model", "batch", "source", *OTHERS, *strategies, "auto", "auto vs best other"):
        table.add_column(column, justify="right")
    for case in cases:
        est = _fit(case, x, y, args.threads)
        traced = compiler.trace(est, options=compiler.CompileOptions(methods=("predict_proba",)))
        shape = _shape(traced.report)
        others: dict[str, Predict] = {}
        for name, convert in ({} if args.no_others else OTHERS).items():
            try:
                others[name] = convert(case, est, x[:1], args.threads)
            except Exception as exc:  # a converter that lacks this model: reported, not fatal
                console.print(f"{case.label}: {name} unavailable ({_first_line(exc)})")
        too_slow: dict[str, int] = {}
        for batch in batches:
            rows = x[np.arange(batch) % len(x)]
            expected = est.predict_proba(rows)
            runners: dict[str, Predict] = {"source": est.predict_proba, **others}
            deviation: dict[str, float] = {}
            compile_s: dict[str, float] = {}
            for name in strategies:
                if name in too_slow:
                    continue
                max_batch = min(batch, args.max_batch or batch)
                options = compiler.CompileOptions(
                    tree_strategy=name,
                    max_batch=max_batch,
                    warmup=False,
                    methods=("predict_proba",),
                )
                try:
                    model = compiler.compile(est, options=options)
                except compiler.UnsupportedError:
                    continue  # e.g. bit-vectors for trees of more than 32 leaves
                t0 = time.perf_counter()
                got = model.predict_proba(rows)  # compiles this batch's bucket
                compile_s[name] = time.perf_counter() - t0
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=name)
                runners[name] = model.predict_proba
            for name, predict in others.items():
                if name in too_slow:
                    runners.pop(name)
                    continue
                deviation[name] = float(np.max(np.abs(np.asarray(predict(rows)) - expected)))
            times: dict[str, list[float]] = {n: [] for n in runners}
            for round_ in range(args.rounds):
                for name, predict in runners.items():
                    if round_ and times[name][0] > args.budget_s * 1e3:
                        continue
                    times[name].append(_cpu_ms(predict, rows, flush=flush))
            med = {n: statistics.median(t) for n, t in times.items()}
            for name, ms in med.items():
                if ms > args.budget_s * 1e3:
                    too_slow.setdefault(name, batch)
            auto_ms = med.get(shape["auto"])
            best_other = min(v for n, v in med.items() if n == "source" or n in OTHERS)
            records.append(
                {"family": case.family, "size": case.size, "trees": case.trees, **shape}
                | {"batch": batch, "max_batch": min(batch, args.max_batch or batch)}
                | {"flush_mb": args.flush_mb, "ms": med, "deviation": deviation}
                | {"compile_s": compile_s}
            )
            table.add_row(
                case.label,
                str(batch),
                *(
                    f"{med[n]:.3f}" if n in med else ("slow" if n in too_slow else "—")
                    for n in ("source", *OTHERS, *strategies)
                ),
                shape["auto"],
                f"{best_other / auto_ms:.1f}×" if auto_ms else "—",
            )
            console.print(
                f"{case.label} ({shape['depth']} deep, {shape['nodes']} nodes), batch {batch}: "
                + ", ".join(f"{n} {v:.3f}" for n, v in med.items())
            )
    console.print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
