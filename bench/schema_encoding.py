"""Host input encoding (``InputSchema.to_feed``) of pipeline ``f``'s rows, in every input form.

Pipeline ``f`` (bench/scoring_pipelines.py) reads a DataFrame of 8 float columns with NaN and 4
string columns that a one-hot encoder reads as host-made codes. This times only the host phase
that turns rows into the graph's inputs (``x`` and one ``code:<column>`` vector per string column),
for a DataFrame, a dict of columns, a list of dict rows and a 2-D object array, at 1 / 100 / 10k /
100k rows: the median of interleaved rounds, each the mean of calls filling ``--min-time``.

``--out`` saves the timings as JSON; ``--baseline`` adds the saved timings of an earlier run (say,
before a change) as a column and the speed-up against them.

Usage: python bench/schema_encoding.py [--rows 1,100,10000,100000] [--out F] [--baseline F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scoring_pipelines import PIPELINES, Scale, fit, make_data

FORMS: dict[str, Callable[[Any], Any]] = {
    "frame": lambda frame: frame,
    "columns": lambda frame: {c: frame[c].tolist() for c in frame.columns},
    "dict rows": lambda frame: frame.to_dict(orient="records"),
    "object array": lambda frame: frame.to_numpy(dtype=object),
}


def _time(call: Callable[[], Any], min_time: float) -> float:
    """Mean seconds per call over at least ``min_time`` seconds of calls."""
    calls, start = 0, time.perf_counter()
    while True:
        call()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / calls


def measure(rows: list[int], rounds: int, min_time: float) -> dict[str, dict[str, float]]:
    """Milliseconds per ``to_feed`` call: ``{form: {rows: ms}}``."""
    import compiler

    pipeline = PIPELINES["f"]
    data = make_data(frame=True, train_rows=1_000, pool_rows=10_000)
    est = fit(pipeline, Scale.quick(), data)
    schema = compiler.trace(est, sample=data.x_train).schema
    inputs = {(form, n): make(data.rows(n)) for form, make in FORMS.items() for n in rows}
    samples: dict[tuple[str, int], list[float]] = {key: [] for key in inputs}
    for _ in range(rounds):  # interleaved: drift in machine load hits every cell alike
        for key, value in inputs.items():
            samples[key].append(_time(lambda v=value: schema.to_feed(v, "float32"), min_time))
    out: dict[str, dict[str, float]] = {form: {} for form in FORMS}
    for (form, n), times in samples.items():
        out[form][str(n)] = statistics.median(times) * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,100,10000,100000", help="rows per call")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per cell")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds of calls per sample")
    parser.add_argument("--out", type=Path, help="write the timings (ms) as JSON here")
    parser.add_argument("--baseline", type=Path, help="JSON of an earlier run to compare with")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    rows = [int(r) for r in args.rows.split(",")]
    result = measure(rows, args.rounds, args.min_time)
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None

    table = Table(title="InputSchema.to_feed, pipeline f (8 numeric + 4 string columns), ms/call")
    for name in ("input", "rows", *(("baseline", "now", "speed-up") if baseline else ("now",))):
        table.add_column(name, justify="left" if name == "input" else "right")
    for form, cells in result.items():
        for n, ms in cells.items():
            now = f"{ms:.3f}"
            before = (baseline or {}).get(form, {}).get(n)
            if baseline is None:
                table.add_row(form, n, now)
            elif before is None:
                table.add_row(form, n, "—", now, "—")
            else:
                table.add_row(form, n, f"{before:.3f}", now, f"{before / ms:.1f}x")
    Console(width=120).print(table)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
