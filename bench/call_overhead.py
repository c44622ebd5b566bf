"""Per-call host overhead of a batch-1 ``predict_proba`` (issue 6: "batch 1 within 2x of ONNX
Runtime"): where a Kestrel call spends its time, stage by stage, next to its floors.

For each pipeline (``scoring_pipelines.PIPELINES``; default a, b, d, i) one row from the
held-out pool is scored by each of these, in interleaved rounds (every column sees the same
machine noise), medians and minima of µs per call:

- ``total``: ``CompiledModel.predict_proba(x)``, what a user calls;
- ``encode``: ``CompiledModel.encode(x)`` alone (input checks and the NaN check);
- ``program``: ``CompiledProgram(feed)`` alone (the device phase: everything below);
- ``executor``: ``CompiledGraph.run_list(feed)`` (validation, bucket, executable, outputs);
- ``exe``: the bucket's ``Executable(inputs, params)``: numpy in, numpy out;
- ``xla``: the AOT ``Compiled`` object's call + ``np.asarray``: the executable alone;
- ``jit``: ``jax.jit`` of the same graph as a jnp function, same resident params: the floor a
  hand-written JAX scorer would have;
- ``ort``: ONNX Runtime's ``session.run`` (``not installed`` without onnxruntime + skl2onnx).

Stages measured alone add up to less than ``total``: between two XLA calls every extra bytecode
also evicts runtime code from the caches, so host work costs more in place than alone.
``--profile`` adds cProfile's top functions of ``total`` per pipeline.

Runs with only jax, numpy and scikit-learn installed.

Tried on jaxlib 0.10.2, 1 thread, a loaded 2-core box (ratios within one interleaved run; the
executable's call + ``np.asarray``, lower is faster) — none moved the batch-1 call beyond noise:
- ``--xla_cpu_use_thunk_runtime=false``: "no longer supported", ignored; MLP 0.94x median /
  1.14x min, LR 0.97x / 1.00x (a second copy of the default: 0.95-1.01x).
- ``JAX_CPU_ENABLE_ASYNC_DISPATCH=false``: MLP 0.98x / 0.90x, LR 1.01x / 0.96x.
- multi-threaded Eigen (no ``--xla_cpu_multi_thread_eigen=false``): 0.97-1.01x.
- per-executable options (YNNPACK fusions off, XNNPACK/oneDNN dot fusions, fast math, opt
  presets): the same DotThunk at batch 1, 0.9-1.1x; a dot as multiply + reduce: 1.4-2.4x slower.
- entry points: ``Compiled.__call__`` 1.1x ``Compiled._call`` (what JaxExecutable uses);
  ``jax.jit`` and ``xla_executable.execute`` on device arrays no faster; ``block_until_ready``
  then ``np.asarray`` = ``np.asarray``.
Where the time goes (perf): the first dot of a call costs ~30 µs of the MLP's ~50 µs (1 row,
50→100: 46 µs vs 16 µs for an identity program; a second dot adds ~3 µs): XLA's DotThunk
hands it to the intra-op Eigen pool (a thread hop; the idle worker spins on the same core).
No jaxlib 0.10.2 option keeps a dot on the calling thread. See bench/xla_options.py.

Usage: python bench/call_overhead.py [--pipelines a,b,d,i] [--rounds R] [--calls N]
           [--threads T] [--quick] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scoring_pipelines import PIPELINES, Scale, fit, make_data
from scoring_threads import pinned_threads

COLUMNS = ("total", "encode", "program", "executor", "exe", "xla", "jit", "ort")
POOL_ROWS = 2_000


@dataclass
class Cell:
    """µs per call over the rounds of one column."""

    times: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="a,b,d,i")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds per column")
    parser.add_argument("--calls", type=int, default=200, help="calls per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="small fits (smoke run)")
    parser.add_argument("--profile", action="store_true", help="cProfile of `total` too")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.pipelines.split(",") if k.strip()]
    unknown = [k for k in keys if k not in PIPELINES]
    if unknown:
        parser.error(f"unknown pipelines {unknown}; known: {','.join(PIPELINES)}")
    frames = [k for k in keys if PIPELINES[k].frame]
    if frames:
        parser.error(f"pipelines {frames} read DataFrames; this benchmark times float rows")
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be >= 1")
    scale = Scale.quick() if args.quick else Scale.full()
    with pinned_threads(args.threads) as pins:  # before jax is imported
        rows: dict[str, dict[str, Cell | str]] = {}
        profiles: dict[str, str] = {}
        for key in keys:
            pipeline = PIPELINES[key]
            missing = pipeline.missing()
            if missing:
                print(f"{pipeline.label}: skipped, {missing} not installed", file=sys.stderr)
                continue
            data = make_data(False, scale.train_rows, POOL_ROWS)
            est = fit(pipeline, scale, data)
            pins.sync()
            callers = _callers(pipeline, est, data, args.threads)
            rows[pipeline.label] = _measure(callers, args.rounds, args.calls)
            total = callers["total"]
            if args.profile and callable(total):
                profiles[pipeline.label] = _profile(total, args.calls * 10)
        notes = list(pins.notes)
    _print_table(rows, args)
    for label, text in profiles.items():
        print(f"\ncProfile of `total`, {label} (top functions by own time)\n{text}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _callers(
    pipeline: Any, est: Any, data: Any, threads: int
) -> dict[str, Callable[[], Any] | str]:
    """One zero-argument callable per column (or why the column cannot run), all checked to
    agree with scikit-learn first."""
    import jax
    import numpy as np

    import compiler
    from lazy.backends.base import Lowering, run_rules
    from lazy.backends.jax_backend import RULES

    x = data.rows(1)
    expected = est.predict_proba(x)
    options = compiler.CompileOptions(methods=("predict_proba",), backend="jax")
    model = compiler.compile(est, options=options)
    program = model.compiled
    if len(program.graphs) != 1 or len(program.stages) != 1:
        raise SystemExit(f"{pipeline.label}: compiled to {len(program.stages)} stages, expected 1")
    graph = program.graphs[0]
    feed, _ = model.encode(x)
    inputs = [feed[name] for name in graph.input_names]
    exe = graph.executable(1)
    params = graph.params
    compiled = exe.compiled  # the JAX backend's AOT Compiled object
    position = graph.output_names.index(dict(program.program.outputs)["predict_proba"])

    names = graph.graph.input_names
    pnames = [n.attr("name") for n in graph.graph.param_nodes]
    policy = graph.options.dtype_policy

    def as_jnp(*args: Any) -> tuple[Any, ...]:  # the graph as one plain jnp function
        low = Lowering(
            dict(zip(names, args[: len(names)], strict=True)),
            dict(zip(pnames, args[len(names) :], strict=True)),
            1,
            policy,
        )
        return tuple(run_rules(RULES, graph.graph, low))

    jitted = jax.jit(as_jnp)
    callers: dict[str, Callable[[], Any] | str] = {
        "total": lambda: model.predict_proba(x),
        "encode": lambda: model.encode(x),
        "program": lambda: program(feed),
        "executor": lambda: graph.run_list(feed),
        "exe": lambda: exe(inputs, params)[position],
        "xla": lambda: np.asarray(compiled(*inputs, *params)[position]),
        "jit": lambda: np.asarray(jitted(*inputs, *params)[position]),
    }
    callers["ort"] = _ort(pipeline, est, data, threads)
    for name, fn in callers.items():
        if callable(fn) and name not in ("encode", "program", "executor"):
            got = np.asarray(fn())
            if not np.allclose(got, expected, rtol=1e-4, atol=1e-4):
                raise SystemExit(f"{pipeline.label}: {name} disagrees with scikit-learn")
    return callers


def _ort(pipeline: Any, est: Any, data: Any, threads: int) -> Callable[[], Any] | str:
    from scoring_systems import SYSTEMS, Context, Unsupported

    system = SYSTEMS["ort"]
    if system.missing():
        return "not installed"
    try:
        predict = system.convert(pipeline, est, data.rows(16), Context(threads, 1024))
    except Unsupported as exc:
        return f"unsup ({exc})"
    x = data.rows(1)
    return lambda: predict(x)


def _measure(
    callers: dict[str, Callable[[], Any] | str], rounds: int, calls: int
) -> dict[str, Cell | str]:
    timed = {k: fn for k, fn in callers.items() if callable(fn)}
    times: dict[str, list[float]] = {k: [] for k in timed}
    for fn in timed.values():  # warm every path (first calls bind C++ dispatch)
        for _ in range(10):
            fn()
    for _ in range(rounds):
        for key, fn in timed.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[key].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: Cell(times[k]) if k in times else str(callers[k]) for k in callers}


def _profile(fn: Callable[[], Any], calls: int) -> str:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(12)
    return out.getvalue().strip()


def _print_table(rows: dict[str, dict[str, Cell | str]], args: argparse.Namespace) -> None:
    print(
        f"\nµs per batch-1 predict_proba call: median (min) of {args.rounds} interleaved rounds "
        f"× {args.calls} calls, {args.threads} thread(s)\n"
    )
    header = [*COLUMNS, "total / ort", "total - xla"]
    print("| pipeline | " + " | ".join(header) + " |")
    print("|---|" + "---:|" * len(header))
    for label, cells in rows.items():
        out = [_fmt(cells[c]) for c in COLUMNS]
        total, ort, xla = cells["total"], cells["ort"], cells["xla"]
        assert isinstance(total, Cell) and isinstance(xla, Cell)  # always timed
        ratio = f"{total.median / ort.median:.1f}×" if isinstance(ort, Cell) else "—"
        out += [ratio, f"{total.median - xla.median:.1f}"]
        print(f"| {label} | " + " | ".join(out) + " |")


def _fmt(cell: Cell | str) -> str:
    if isinstance(cell, str):
        return cell
    return f"{cell.median:.1f} ({cell.min:.1f})"


if __name__ == "__main__":
    if importlib.util.find_spec("jax") is None:
        raise SystemExit("bench/call_overhead.py needs jax")
    raise SystemExit(main())
