"""The registration gate: a compiled model must agree with its source estimator before serving.

Base rows come from the uploaded sample or, without one, are synthesised from the input schema
(categories from each vocabulary, numbers from a few generators until the source accepts them).
Probe rows built from the fitted model itself follow them (:mod:`service.parity_probes`): every
value where the compiled model decides, its float64 and float32 neighbours, midpoints, NaN, ±inf,
known and unseen categories. Class labels must be identical, except on rows where the source
itself is at a tie (its two top scores within tolerance), where float32 may legitimately pick the
other class. Numeric outputs must agree within ``rtol``/``atol``. A failure names the first
failing row: the sample or synthetic row, or the probe (column, step, value).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

import compiler
from compiler.float32_inputs import arrives_float32
from compiler.schema import describe_mismatch

from . import parity_probes


@dataclass(frozen=True)
class MethodParity:
    method: str
    max_abs_diff: float | None = None
    mismatched_rows: int = 0
    tie_rows: int = 0  # label differences on rows where the source's top two scores tie


@dataclass(frozen=True)
class ParityResult:
    ok: bool
    rows: int
    source: str  # "sample" or "synthetic": where the base rows came from
    methods: list[MethodParity] = field(default_factory=list)
    problem: str | None = None
    probes: int = 0  # rows of ``rows`` built from the model's decisions

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ParityError(ValueError):
    """The compiled model disagrees with its source; the message says where."""


def synthesise_rows(
    schema: compiler.InputSchema, n: int, accepts: Callable[[Any], bool], seed: int = 0
) -> Any:
    """``n`` rows shaped like the schema that the source estimator accepts, or ParityError."""
    rng = np.random.default_rng(seed)
    generators: list[Callable[[], np.ndarray]] = [
        lambda: rng.standard_normal(n),
        lambda: rng.uniform(0.05, 1.0, n),  # positive: log / Box-Cox / Poisson inputs
        lambda: rng.integers(0, 3, n).astype(np.float64),  # small counts: naive Bayes, encoders
    ]
    for make in generators:
        columns: dict[str, Any] = {}
        for j, column in enumerate(schema.columns):
            vocab = schema.vocabularies.get(j)
            if vocab is not None and len(vocab.categories):
                picks = rng.integers(0, len(vocab.categories), n)
                columns[column.name] = np.asarray(vocab.categories, dtype=object)[picks]
            else:
                columns[column.name] = make()
        rows = _as_source_input(schema, columns)
        if accepts(rows):
            return rows
    raise ParityError(
        "could not synthesise rows the source model accepts; upload a 'sample' of real rows"
    )


def source_method(estimator: Any, method: str) -> Callable[[Any], Any]:
    """The source estimator's ``method`` as a function of rows (an array or DataFrame).

    An ``xgboost.Booster`` (a JSON / UBJSON upload) predicts only on a ``DMatrix``: the rows are
    wrapped in one with the booster's feature names and types and ``missing=NaN``, the
    ``DMatrix`` default that the converter follows. Its ``predict`` head is the transformed
    output (``output_margin=False``); a ``decision_function`` head would be the raw margin."""
    if _is_xgboost_booster(estimator):
        margin = method == "decision_function"
        return lambda rows: estimator.predict(_dmatrix(estimator, rows), output_margin=margin)
    categories = _lightgbm_categories(estimator)
    if categories:
        run = getattr(estimator, method)
        return lambda rows: run(_as_categories(rows, categories))
    return getattr(estimator, method)


def _lightgbm_categories(estimator: Any) -> list[list[Any]] | None:
    """The categories of a LightGBM model fitted on pandas ``category`` columns, in the order of
    those columns (None for any other model)."""
    if type(estimator).__module__.split(".")[0] != "lightgbm":
        return None
    booster = getattr(estimator, "booster_", estimator)
    return getattr(booster, "pandas_categorical", None) or None


def _as_categories(rows: Any, categories: list[list[Any]]) -> Any:
    """``rows`` with its non-numeric columns (the categorical ones, in order) as pandas
    categories of the fitted values, as LightGBM predicts only on those."""
    if not hasattr(rows, "columns"):
        return rows
    import pandas as pd

    columns = [c for c in rows.columns if rows[c].dtype.kind not in "fiub"]
    if len(columns) != len(categories):
        return rows
    rows = rows.copy()
    for column, values in zip(columns, categories, strict=True):
        rows[column] = pd.Categorical(rows[column], categories=values)
    return rows


def _is_xgboost_booster(estimator: Any) -> bool:
    cls = type(estimator)
    return cls.__name__ == "Booster" and cls.__module__.split(".")[0] == "xgboost"


def _dmatrix(booster: Any, rows: Any) -> Any:
    """``rows`` as the ``DMatrix`` ``booster`` reads: its feature names in order (a DataFrame's
    columns by name), categorical features (type ``c``) as pandas categories, missing values
    NaN."""
    import xgboost

    names, types = booster.feature_names, booster.feature_types
    categorical = bool(types) and "c" in types
    data = rows
    if hasattr(rows, "columns") and names:
        data = rows[list(names)]
        if categorical:
            data = data.copy()
            for column, kind in zip(data.columns, types, strict=True):
                if kind == "c" and data[column].dtype.kind not in "fiub":
                    data[column] = data[column].astype("category")
    elif not categorical:  # by position: float64, None and NaN missing
        data = np.asarray(rows, dtype=np.float64)
    return xgboost.DMatrix(
        data,
        missing=np.nan,
        feature_names=list(names) if names else None,
        feature_types=list(types) if types else None,
        enable_categorical=categorical,
    )


def source_accepts(estimator: Any, methods: Sequence[str], rows: Any) -> bool:
    """Whether every method of the source estimator runs on ``rows`` without raising."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            for method in methods:
                source_method(estimator, method)(rows)
    except Exception:  # the source refuses these rows (e.g. negative input to a log)
        return False
    return True


def _as_source_input(schema: compiler.InputSchema, columns: dict[str, Any]) -> Any:
    if schema.named or schema.vocabularies:
        import pandas as pd

        frame = pd.DataFrame(columns)
        return frame
    return np.column_stack([np.asarray(v, dtype=np.float64) for v in columns.values()])


def source_input(schema: compiler.InputSchema, sample: Any) -> Any:
    """The sample in the form the source estimator was fitted on (a DataFrame when named).
    Dict rows or columns must hold every column of the schema, as a scoring request must."""
    _check_columns(schema, sample)
    if schema.named and not hasattr(sample, "columns"):
        import pandas as pd

        if isinstance(sample, list) and sample and isinstance(sample[0], dict):
            return pd.DataFrame(sample, columns=schema.names)
        if isinstance(sample, dict):
            return pd.DataFrame(sample, columns=schema.names)
        return pd.DataFrame(np.asarray(sample, dtype=object), columns=schema.names).infer_objects()
    if isinstance(sample, (list, dict)) and not schema.named:
        if isinstance(sample, dict) or (sample and isinstance(sample[0], dict)):
            import pandas as pd  # dict rows or columns by the schema's names, in its order

            return pd.DataFrame(sample, columns=schema.names).to_numpy(dtype=np.float64)
        return np.asarray(sample, dtype=np.float64)
    return sample


def gate(
    estimator: Any,
    model: compiler.CompiledModel,
    sample: Any,
    *,
    synthetic_rows: int,
    probe_rows: int,
    rtol: float,
    atol: float,
) -> ParityResult:
    """The registration gate: the sample (source form; None: ``synthetic_rows`` synthesised
    rows) and about ``probe_rows`` probe rows, compared with :func:`check_parity`."""

    def accepts(rows: Any) -> bool:
        return source_accepts(estimator, model.methods, rows)

    def accepts_probes(rows: Any) -> bool:  # one head tells whether the source takes the rows
        return source_accepts(estimator, model.methods[:1], rows)

    if sample is not None:
        base, source = sample, "sample"
    else:
        base, source = synthesise_rows(model.schema, synthetic_rows, accepts), "synthetic"
    probes = parity_probes.build(
        model.schema, base, model.decisions, accepts_probes, limit=probe_rows
    )
    labels = [f"{source} row {i}" for i in range(len(base))]
    rows = base
    if len(probes):
        rows = parity_probes.joined(base, probes.rows)
        labels += probes.labels
    result = check_parity(
        estimator, model, rows, source=source, rtol=rtol, atol=atol, labels=labels
    )
    return replace(result, probes=len(probes))


def _check_columns(schema: compiler.InputSchema, sample: Any) -> None:
    """Dict rows and columns must name every column of the schema, array rows hold one value
    per column: else an error naming the sample's row, its unknown keys and what it lacks."""
    if isinstance(sample, dict):
        keyed = [list(sample)]
    elif isinstance(sample, list) and sample and isinstance(sample[0], dict):
        keyed = [list(row) for row in sample]
    else:
        if isinstance(sample, list) and sample and isinstance(sample[0], list):
            n = len(schema.columns)
            bad = next(
                (i for i, row in enumerate(sample) if not isinstance(row, list) or len(row) != n),
                None,
            )
            if bad is not None:
                row = sample[bad]
                has = f"{len(row)} values" if isinstance(row, list) else f"a {type(row).__name__}"
                more = f" and {n - 10} more" if n > 10 else ""
                raise compiler.SchemaError(
                    f"sample row {bad} has {has}; the model reads {n} columns "
                    f"{schema.names[:10]}{more}"
                )
        return
    names = set(schema.names)
    for i, given in enumerate(keyed):
        present = set(given)
        missing = [c for c in schema.names if c not in present]
        if missing:
            where = f"sample row {i}" if isinstance(sample, list) else "sample"
            unknown = [k for k in given if k not in names]
            raise compiler.SchemaError(f"{where}: {describe_mismatch(missing, unknown)}")


def check_parity(
    estimator: Any,
    model: compiler.CompiledModel,
    rows: Any,
    *,
    source: str,
    rtol: float,
    atol: float,
    labels: Sequence[str] | None = None,
) -> ParityResult:
    """Compare every compiled method with the source on ``rows`` (``labels``: what each row is,
    for the failure message), on each formulation the model's graphs have: the device lowering
    and the host plan, whatever the buckets' placement. A plan made on another machine, or
    another measurement on this one, may place a bucket on either, and each must answer as the
    source does."""
    n = len(rows)

    def what(row: int) -> str:
        return labels[row] if labels is not None else f"row {row}"

    formulations = model.formulations
    pinned = formulations if len(formulations) > 1 else (None,)
    # (what the run is called, the rows): a float32 table runs a program of its own where the
    # model narrows one for it (lazy.narrowing).
    tables: list[tuple[str | None, Any]] = [(None, rows)]
    as_float32 = _float32_table(model, rows) if model.narrows_float32 else None
    if as_float32 is not None:
        tables.append(("float32 table", as_float32))
    runs: list[tuple[str | None, list[MethodParity], list[str]]] = []
    for table, table_rows in tables:
        expected = {m: side_by_side(source_method(estimator, m)(table_rows)) for m in model.methods}
        for formulation in pinned:
            with model.pinned(formulation) if formulation else contextlib.nullcontext():
                compiled = {m: side_by_side(v) for m, v in model.outputs(table_rows).items()}
            results, problems = compare(
                compiled,
                expected,
                n,
                labels=model.classes_ is not None,
                rtol=rtol,
                atol=atol,
                what=what,
            )
            where = [f"the {formulation} plan" if formulation else None, table]
            runs.append((", ".join(w for w in where if w) or None, results, problems))
    problems = [
        f"on {where}: {problem}" if where else problem
        for where, _, found in runs
        for problem in found
    ]
    results = [_worst(per_method) for per_method in zip(*(r for _, r, _ in runs), strict=True)]
    return ParityResult(not problems, n, source, results, "; ".join(problems) or None)


def _float32_table(model: compiler.CompiledModel, rows: Any) -> Any:
    """``rows`` as a float32 table (an array, or a frame with its numeric columns float32),
    where the model reads it so; None where rows of this form never arrive as float32 (dict
    rows, values that are not numbers)."""
    numeric = [c.name for c in model.schema.columns if c.kind == "numeric"]
    if isinstance(rows, np.ndarray) and rows.dtype.kind == "f":
        table = rows.astype(np.float32)
    elif hasattr(rows, "astype") and hasattr(rows, "columns") and numeric:
        try:
            table = rows.astype({name: np.float32 for name in numeric})
        except (KeyError, TypeError, ValueError):
            return None
    else:
        return None
    return table if arrives_float32(table, numeric) else None


def _worst(results: Sequence[MethodParity]) -> MethodParity:
    """One method's results on several formulations, as the worst of them."""
    diffs = [r.max_abs_diff for r in results if r.max_abs_diff is not None]
    return MethodParity(
        results[0].method,
        max(diffs) if diffs else None,
        max(r.mismatched_rows for r in results),
        max(r.tie_rows for r in results),
    )


def compare(
    compiled: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    n: int,
    *,
    labels: bool,
    rtol: float,
    atol: float,
    what: Callable[[int], str] = lambda row: f"row {row}",
) -> tuple[list[MethodParity], list[str]]:
    """Each head of ``expected`` (the source's, :func:`side_by_side`) against ``compiled`` on
    the same ``n`` rows: ``predict`` label by label where ``labels`` (a classifier; a label
    differing where the source's top two scores tie within the tolerance is counted apart),
    every other head within ``rtol`` / ``atol``. The per-head results and the problems found."""
    results: list[MethodParity] = []
    problems: list[str] = []
    scores = next(
        (expected[m] for m in ("predict_proba", "decision_function") if m in expected), None
    )
    for method in expected:
        want, got = expected[method], np.asarray(compiled[method])
        if want.shape != got.shape and want.size == got.size:
            got = got.reshape(want.shape)
        if want.shape != got.shape:
            problems.append(f"{method}: shape {got.shape}, source {want.shape}")
            results.append(MethodParity(method, mismatched_rows=n))
            continue
        if method == "predict" and labels:
            differ = _row_any(want != got)
            ties = differ & _ties(scores, atol, rtol) if scores is not None else differ & False
            bad = int((differ & ~ties).sum())
            results.append(MethodParity(method, None, bad, int(ties.sum())))
            if bad:
                row = int(np.argmax(differ & ~ties))
                problems.append(
                    f"predict: {bad} of {n} labels differ (first: {what(row)}; "
                    f"compiled {got[row]!r}, source {want[row]!r})"
                )
            continue
        w, g = want.astype(np.float64), got.astype(np.float64)
        same_nan = np.isnan(w) == np.isnan(g)
        close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True) & same_nan
        diff = np.abs(np.where(np.isnan(w) | np.isnan(g), 0.0, g - w))
        bad_rows = _row_any(~close)
        results.append(
            MethodParity(method, float(diff.max()) if diff.size else 0.0, int(bad_rows.sum()))
        )
        if bad_rows.any():
            row = int(np.argmax(bad_rows))
            problems.append(
                f"{method}: {int(bad_rows.sum())} of {n} rows differ beyond rtol={rtol}, "
                f"atol={atol} (max |Δ| {float(diff.max()):.3g}; first: {what(row)})"
            )
    return results, problems


def side_by_side(output: Any) -> np.ndarray:
    """One dense array per output; a per-target list (MultiOutputClassifier) is joined on
    axis 1."""
    if isinstance(output, list):
        return np.concatenate([side_by_side(a).reshape(len(a), -1) for a in output], axis=1)
    return np.asarray(output.toarray() if hasattr(output, "toarray") else output)  # sparse


def _row_any(mask: np.ndarray) -> np.ndarray:
    return mask.reshape(mask.shape[0], -1).any(axis=1) if mask.ndim > 1 else mask


def _ties(scores: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 1:  # binary decision function: the tie is at 0
        return np.abs(s) <= atol + rtol
    if s.shape[1] < 2:
        return np.zeros(s.shape[0], bool)
    top2 = np.sort(s, axis=1)[:, -2:]
    return np.abs(top2[:, 1] - top2[:, 0]) <= atol + rtol * np.abs(top2[:, 1])
