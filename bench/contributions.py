"""Per-row contributions (TreeSHAP; linear SHAP): Kestrel's compiled graph against each model's
own explainer.

For each model and batch size, Kestrel's ``CompiledModel.contributions`` (compiled with
``CompileOptions(explain=True)``) is timed beside the references that apply to the model, all in
this one process, on one core, one thread:

- ``shap.TreeExplainer(estimator).shap_values(rows, check_additivity=False)`` for scikit-learn's
  tree models; for a pipeline the explainer gets the final estimator, and each timed call
  includes ``pipeline[:-1].transform(rows)``;
- LightGBM's ``predict(rows, pred_contrib=True, num_threads=1)``;
- XGBoost's ``Booster.predict(DMatrix(rows, nthread=1), pred_contribs=True)``, the booster's
  ``nthread`` set to 1;
- ``shap.LinearExplainer`` for a linear model, its masker holding every background row: the
  training frame, which Kestrel gets as its sample (its one-hot columns record no training
  means).

The models are bench/exactness.py's fitted pipelines (``hgb_raw``, ``ct_hgb``, ``scaled_rf``,
``scaled_gbc``, ``lgbm_raw``, ``scaled_lr``) and ``xgb_raw``, an XGBoost classifier (100 trees of depth 6)
fitted as ``lgbm_raw`` is: on the numeric columns of the same frame, with the same labels. Rows
are drawn from the training frame (``exactness._sample``, seed 2).

Kestrel's program is compiled before any timing, by one call (``warmup``, on by default, compiles
every batch bucket then; larger batches run in chunks of ``max_batch`` rows). Each figure is the
median of the calls that fit in ``--min-time`` seconds, at least one, at most ``--max-calls``:
a single call where one takes longer (Kestrel on the random forest at 10k rows). A
reference is timed on at most ``--max-reference-rows`` rows (the first rows of the batch) and
its time scaled per row to the batch: such figures are marked ``*``. The speed-up is the fastest
reference's time over Kestrel's.

Beside each reference's time, the largest absolute difference between its contributions and
Kestrel's on the rows it was timed on, bias included (shap's expected value; LightGBM's and
XGBoost's last column). Kestrel answers per input column (``contribution_columns``): shap's
values of a ColumnTransformer's output features are summed per input column first (a one-hot
encoder's columns into their string column); where no such mapping is known, ``n/a``.

Prints a markdown table; never asserts. ``--json PATH`` also writes one record per cell.

Usage: python bench/contributions.py [--models hgb_raw,xgb_raw] [--batches 1,100,10000]
       [--max-reference-rows 2000] [--min-time S] [--max-calls N] [--core C] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import exactness

if TYPE_CHECKING:
    import numpy as np

MODELS = ("hgb_raw", "ct_hgb", "scaled_rf", "scaled_gbc", "lgbm_raw", "xgb_raw", "scaled_lr")
REFERENCES = ("shap", "lightgbm", "xgboost")


@dataclass(frozen=True)
class Reference:
    """A reference explainer: ``call`` is what is timed; ``split`` turns its answer into
    contributions (n, F, K) per feature the final estimator reads, and the bias (n, K)."""

    call: Callable[[Any], Any]
    split: Callable[[Any], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Case:
    """A fitted model, the rows to draw from, its compiled form, and the references that apply;
    ``placement`` (F, R + 1): the input column of each feature the final estimator reads."""

    name: str
    frame: Any
    compiled: Any
    references: dict[str, Reference]
    placement: np.ndarray | None


@dataclass(frozen=True)
class Cell:
    """One model at one batch size."""

    model: str
    batch: int
    kestrel_ms: float
    #: Per reference: milliseconds per call at ``batch`` rows (scaled when ``rows`` < batch).
    reference_ms: dict[str, float]
    #: Per reference: the rows it was timed on.
    rows: dict[str, int]
    #: Per reference: max |Kestrel − reference| on those rows; None where not comparable.
    max_diff: dict[str, float | None]

    @property
    def speedup(self) -> float | None:
        if not self.reference_ms:
            return None
        return min(self.reference_ms.values()) / self.kestrel_ms


def _pin_one_thread(core: int | None) -> None:
    """One thread for numpy, OpenMP, XLA and the tree libraries, on one core; before numpy and
    jax are imported (XLA reads its flags when its CPU client starts)."""
    for name, value in exactness.ONE_THREAD.items():
        if name == "XLA_FLAGS":
            value = f"{os.environ.get(name, '')} {value}".strip()
        os.environ[name] = value
    if hasattr(os, "sched_setaffinity"):
        cpus = {core} if core is not None else set(sorted(os.sched_getaffinity(0))[:1])
        os.sched_setaffinity(0, cpus)


def _fit(name: str) -> tuple[Any, Any]:
    """(fitted model, its training frame)."""
    return _fit_xgboost() if name == "xgb_raw" else exactness._fit(name)


def _fit_xgboost() -> tuple[Any, Any]:
    """XGBoost where exactness._fit's ``lgbm_raw`` has LightGBM: the same frame's numeric
    columns, the same labels."""
    import numpy as np
    import xgboost

    df = exactness._frame(20_000, 0)
    s = df["score"].fillna(0.0)
    y = ((df["count"].fillna(3) > 2) ^ (df["plan"] == "pro") ^ (np.sin(s * 3) > 0)).to_numpy(int)
    raw = df[[c for c in df.columns if c != "plan"]]
    model = xgboost.XGBClassifier(n_estimators=100, max_depth=6, random_state=0, n_jobs=1)
    return model.fit(raw, y), raw


def _case(name: str) -> Case:
    import compiler

    model, frame = _fit(name)
    linear = hasattr(_steps(model)[0], "coef_")
    options = compiler.CompileOptions(explain=True)
    compiled = compiler.compile(model, sample=frame if linear else None, options=options)
    compiled.contributions(exactness._sample(frame, 1, seed=2))  # compiles every batch bucket
    columns = compiled.contribution_columns
    return Case(name, frame, compiled, _references(model, frame), _placement(model, columns))


def _steps(model: Any) -> tuple[Any, Any | None]:
    """(final estimator, the pipeline before it or None)."""
    from sklearn.pipeline import Pipeline

    if isinstance(model, Pipeline):
        return model[-1], model[:-1]
    return model, None


def _references(model: Any, frame: Any) -> dict[str, Reference]:
    final, before = _steps(model)

    def prepare(rows: Any) -> Any:
        return rows if before is None else before.transform(rows)

    if hasattr(final, "coef_"):
        return {"shap": _shap_linear(final, prepare, prepare(frame))}
    library = type(final).__module__.split(".")[0]
    if library == "lightgbm":
        return {"lightgbm": _lightgbm(final, prepare)}
    if library == "xgboost":
        return {"xgboost": _xgboost(final, prepare)}
    return {"shap": _shap(final, prepare)}


def _shap(final: Any, prepare: Callable[[Any], Any]) -> Reference:
    import numpy as np
    import shap

    explainer = shap.TreeExplainer(final)
    expected = np.atleast_1d(np.asarray(explainer.expected_value, np.float64))

    def split(values: Any) -> tuple[np.ndarray, np.ndarray]:
        values = _three_d(np.asarray(values))
        return values, np.broadcast_to(expected, (len(values), len(expected)))

    return Reference(
        lambda rows: explainer.shap_values(prepare(rows), check_additivity=False), split
    )


def _shap_linear(final: Any, prepare: Callable[[Any], Any], background: Any) -> Reference:
    import numpy as np
    import shap

    masker = shap.maskers.Independent(background, max_samples=len(background))
    explainer = shap.LinearExplainer(final, masker)
    expected = np.atleast_1d(np.asarray(explainer.expected_value, np.float64))

    def split(values: Any) -> tuple[np.ndarray, np.ndarray]:
        values = _three_d(np.asarray(values))
        return values, np.broadcast_to(expected, (len(values), len(expected)))

    return Reference(lambda rows: explainer.shap_values(prepare(rows)), split)


def _lightgbm(final: Any, prepare: Callable[[Any], Any]) -> Reference:
    def split(out: Any) -> tuple[np.ndarray, np.ndarray]:
        # (n, (F + 1) * K), class-major: each class's F contributions, then its bias.
        width = final.n_features_in_ + 1
        by_class = out.reshape(len(out), out.shape[1] // width, width).transpose(0, 2, 1)
        return _last_is_bias(by_class)

    return Reference(
        lambda rows: final.predict(prepare(rows), pred_contrib=True, num_threads=1), split
    )


def _xgboost(final: Any, prepare: Callable[[Any], Any]) -> Reference:
    import xgboost

    booster = final.get_booster()
    booster.set_param({"nthread": 1})

    def call(rows: Any) -> Any:
        return booster.predict(xgboost.DMatrix(prepare(rows), nthread=1), pred_contribs=True)

    def split(out: Any) -> tuple[np.ndarray, np.ndarray]:
        # (n, F + 1), or (n, K, F + 1) for K classes.
        return _last_is_bias(out[:, :, None] if out.ndim == 2 else out.transpose(0, 2, 1))

    return Reference(call, split)


def _three_d(values: np.ndarray) -> np.ndarray:
    """(n, C) as (n, C, 1); (n, C, K) as is."""
    return values[:, :, None] if values.ndim == 2 else values


def _last_is_bias(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return values[:, :-1], values[:, -1]


def _placement(model: Any, columns: Sequence[str]) -> np.ndarray | None:
    """(F, R + 1): 1 where the final estimator's feature f comes from input column r (Kestrel's
    ``contribution_columns``, bias last); None where that is not known. Behind a lone
    ColumnTransformer, each transformer maps one to one (as wide out as in) or all to its one
    input column; otherwise features are taken as the input columns where they are as many."""
    import numpy as np
    from sklearn.compose import ColumnTransformer

    final, before = _steps(model)
    inputs = columns[:-1]
    pairs: list[tuple[int, str]] | None = None
    if before is not None and len(before) == 1 and isinstance(before[0], ColumnTransformer):
        pairs = _column_transformer_pairs(before[0])
    elif final.n_features_in_ == len(inputs):
        pairs = list(enumerate(inputs))
    if pairs is None:
        return None
    placement = np.zeros((len(pairs), len(columns)))
    for feature, column in pairs:
        placement[feature, columns.index(column)] = 1.0
    return placement


def _column_transformer_pairs(ct: Any) -> list[tuple[int, str]] | None:
    """(output feature, input column) of a fitted ColumnTransformer, or None."""
    pairs = []
    for name, _, selected in ct.transformers_:
        out = ct.output_indices_.get(name, slice(0, 0))
        if out.stop == out.start:
            continue
        selected = [selected] if isinstance(selected, str | int) else list(selected)
        names = [c if isinstance(c, str) else str(ct.feature_names_in_[c]) for c in selected]
        width = out.stop - out.start
        if width == len(names):
            pairs += [(out.start + i, c) for i, c in enumerate(names)]
        elif len(names) == 1:
            pairs += [(f, names[0]) for f in range(out.start, out.stop)]
        else:
            return None
    return sorted(pairs)


def _by_column(reference: Reference, out: Any, placement: np.ndarray | None) -> np.ndarray | None:
    """A reference's answer as Kestrel's: (n, R + 1, K), input columns then the bias."""
    import numpy as np

    if placement is None:
        return None
    features, bias = reference.split(out)
    if features.shape[1] != placement.shape[0]:
        return None
    by_column = np.einsum("nfk,fr->nrk", features, placement)
    by_column[:, -1] += bias
    return by_column


def _max_diff(kestrel: np.ndarray, reference: np.ndarray | None) -> float | None:
    import numpy as np

    kestrel = _three_d(kestrel)
    if reference is None or reference.shape != kestrel.shape:
        return None
    return float(np.max(np.abs(kestrel - reference)))


def _timed(
    call: Callable[[Any], Any], rows: Any, min_time: float, max_calls: int
) -> tuple[float, Any]:
    """(median seconds per call, the last answer) of calls until ``min_time`` seconds have
    passed, at least one, at most ``max_calls``."""
    samples: list[float] = []
    while not samples or (sum(samples) < min_time and len(samples) < max_calls):
        start = time.perf_counter()
        out = call(rows)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), out


def _cell(case: Case, batch: int, args: argparse.Namespace) -> Cell:
    rows = exactness._sample(case.frame, batch, seed=2)
    seconds, kestrel = _timed(case.compiled.contributions, rows, args.min_time, args.max_calls)
    reference_ms, timed_rows, max_diff = {}, {}, {}
    for name, reference in case.references.items():
        n = min(batch, args.max_reference_rows)
        ref_seconds, out = _timed(reference.call, _head(rows, n), args.min_time, args.max_calls)
        reference_ms[name] = ref_seconds * 1e3 * batch / n
        timed_rows[name] = n
        max_diff[name] = _max_diff(kestrel[:n], _by_column(reference, out, case.placement))
    return Cell(case.name, batch, seconds * 1e3, reference_ms, timed_rows, max_diff)


def _head(rows: Any, n: int) -> Any:
    return rows.iloc[:n] if hasattr(rows, "iloc") else rows[:n]


def _row(cell: Cell, references: Sequence[str]) -> str:
    cells = [cell.model, str(cell.batch), f"{cell.kestrel_ms:.3f}"]
    for name in references:
        if name not in cell.reference_ms:
            cells += ["–", "–"]
            continue
        scaled = "*" if cell.rows[name] < cell.batch else ""
        diff = cell.max_diff[name]
        cells += [
            f"{cell.reference_ms[name]:.3f}{scaled}",
            "n/a" if diff is None else f"{diff:.1e}",
        ]
    speedup = cell.speedup
    cells.append("–" if speedup is None else f"{speedup:.1f}x")
    return "| " + " | ".join(cells) + " |"


def _header(references: Sequence[str]) -> str:
    names = ["model", "batch", "Kestrel ms"]
    for name in references:
        names += [f"{name} ms", f"{name} max abs diff"]
    names.append("speed-up")
    return "| " + " | ".join(names) + " |\n|" + "---|" * len(names)


def _environment(args: argparse.Namespace) -> str:
    from importlib.metadata import version

    libraries = ("jax", "scikit-learn", "shap", "lightgbm", "xgboost")
    versions = ", ".join(f"{name} {version(name)}" for name in libraries)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return (
        f"{versions}; CPUs {cpus}, one thread. Median ms per call; * : timed on the first "
        f"{args.max_reference_rows} rows and scaled per row to the batch. speed-up: the "
        "fastest reference's ms / Kestrel's (below 1: Kestrel is slower)."
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1,100,10000", help="comma-separated batch sizes")
    parser.add_argument(
        "--max-reference-rows", type=int, default=2000, help="rows a reference is timed on"
    )
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of calls per figure")
    parser.add_argument("--max-calls", type=int, default=200, help="timed calls per figure")
    parser.add_argument("--core", type=int, default=None, help="CPU to run on (default: first)")
    parser.add_argument("--json", type=Path, default=None, help="write the cells here")
    args = parser.parse_args(argv)
    names = args.models.split(",")
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    batches = [int(b) for b in args.batches.split(",")]
    _pin_one_thread(args.core)

    cases = [_case(name) for name in names]
    references = [r for r in REFERENCES if any(r in case.references for case in cases)]
    print(_environment(args), end="\n\n", flush=True)
    print(_header(references), flush=True)
    cells = []
    for case in cases:
        for batch in batches:
            cells.append(_cell(case, batch, args))
            print(_row(cells[-1], references), flush=True)
    if args.json is not None:
        records = [{**asdict(cell), "speedup": cell.speedup} for cell in cells]
        args.json.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
