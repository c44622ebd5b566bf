"""``python -m compiler.docs``: the operator reference (docs/operators.md), from the registry."""

from __future__ import annotations

import sys
from collections import defaultdict

from .registry import Registration, supported

_HEADER = """# Supported operators

Generated from the converter registry by `python -m compiler.docs > docs/operators.md`; a test
fails when this file is stale. Every class listed here is enrolled in the conformance suite
(`tests/compiler/test_conformance.py`): parity with the source estimator on every method, on the
numpy interpreter and on JAX, and on the registration gate's probe rows (every raw value where the
compiled model decides, its float64 and float32 neighbours, NaN, ±inf, known and unseen
categories; `service/parity_probes.py`). Anything not listed raises `UnsupportedError` at compile
time, as does any hyper-parameter a converter cannot reproduce exactly.

The *exactness* column says where a class's decisions are made exact and in what precision it
computes. Graphs are float32 unless compiled with `dtype="float64"`. Decisions — tree splits, bin
edges, quantile knots — must decide as the source does for float64 inputs, so:

- **folded**: a step that maps each column by a non-decreasing function of one raw column (a
  scaler, an imputer's fill) is replayed in float64, in the source's own order of operations,
  at compile time, and the decisions that read it become comparisons of the raw float64 column
  against thresholds found by bisection over the float64 line (`compiler/trees/folding.py`).
  Exact for every float64 input, and the folded steps cost nothing per row.
- **float64 input**: a model with such a decision takes its input table in float64 and makes
  those comparisons in float64 (the rest of the graph stays float32).
- **float32**: sources that themselves compare `float32(x)` (scikit-learn's `tree_` models,
  XGBoost) keep float32 input on raw columns: the host's rounding is the source's.
- **exact values**: one-hot flags, ordinal codes, NaN indicators, bin indices and binarized
  flags hold the source's values in any precision, so the decisions that read them need nothing.
- **float64 features**: a decision on a column no map describes and whose values are not exact
  (a projection, polynomial terms) puts the steps computing it in float64 by itself (see
  *precision* below; the report names them). It then decides as the source does up to float64
  rounding: a value within that rounding of a threshold is decided by the last bit of a float64
  sum, which scikit-learn itself decides differently with the row's position in the batch.

The *precision* column names the classes whose float32 answers can miss the conformance tolerance
(relative 1e-5, scaled by the output's magnitude) and why. In a float32 graph the compiler
promotes such a step to float64 by itself (`compiler/precision.py`): *with the steps feeding it*
(they compute in float64 too, and the input table arrives in float64) or *its own arithmetic
only*; every other step stays float32, and the compile report's `promoted` lists each promoted
step and why. `dtype="float64"` computes everything in float64; `promote=False` keeps every step
in float32 (faster, and those heads may then miss the tolerance).
"""


def _family(reg: Registration) -> str:
    parts = reg.cls.__module__.split(".")
    return ".".join(p for p in parts[:2] if not p.startswith("_"))


def render() -> str:
    groups: dict[str, list[Registration]] = defaultdict(list)
    for reg in supported():
        groups[_family(reg)].append(reg)
    lines = [_HEADER]
    for family in sorted(groups):
        lines += [
            f"## `{family}`",
            "",
            "| class | methods | limits | exactness | precision |",
            "|---|---|---|---|---|",
        ]
        for reg in groups[family]:
            methods = ", ".join(f"`{m}`" for m in reg.methods)
            precision = reg.precision.describe() if reg.precision else "—"
            row = (
                f"| `{reg.name}` | {methods} | {reg.limits or '—'} | {reg.exactness or '—'} "
                f"| {precision} |"
            )
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
