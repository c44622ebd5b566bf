"""Conformance of every registered converter with its source estimator, generated from the
registry: a registered class without cases fails here."""

from __future__ import annotations

import importlib
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conformance_lib import RTOL32, Case, Unsupported
from sklearn.exceptions import NotFittedError

import compiler
from compiler.options import METHODS
from compiler.registry import lookup
from service import parity, parity_probes

_MODULES = [
    importlib.import_module(p.stem) for p in sorted(Path(__file__).parent.glob("cases_*.py"))
]
CASES: dict[type, list[Case]] = {}
UNSUPPORTED: dict[type, Unsupported | str] = {}
XFAIL: dict[tuple[str, str], str] = {}
for _module in _MODULES:
    for _cls, _cases in _module.CASES.items():
        CASES.setdefault(_cls, []).extend(_cases)
    for _cls, _spec in _module.UNSUPPORTED.items():
        assert _cls not in UNSUPPORTED, f"{_cls.__name__} declared twice"
        UNSUPPORTED[_cls] = _spec
    XFAIL.update(getattr(_module, "XFAIL", {}))

REGISTERED = compiler.supported()
CHECKS = (
    "parity_jax",
    "parity_interpreter",
    "float32_input",
    "single_row",
    "batch_vs_row",
    "row_order",
    "nan",
    "unfitted",
    "probes",
)


def _params() -> list[Any]:
    params = []
    for reg in REGISTERED:
        for i, case in enumerate(CASES.get(reg.cls, [])):
            for check in (*CHECKS, *(("parity_torch",) if i == 0 else ())):
                marks = []
                reason = XFAIL.get((case.id, check))
                if reason:
                    marks.append(pytest.mark.xfail(reason=reason, strict=True))
                params.append(pytest.param(reg, case, check, id=f"{case.id}-{check}", marks=marks))
    return params


def test_every_registered_class_has_a_case() -> None:
    missing = [r.name for r in REGISTERED if r.cls not in CASES]
    assert not missing, f"registered classes without conformance cases: {missing}"


def test_every_registered_class_declares_its_unsupported_parameters() -> None:
    missing = [r.name for r in REGISTERED if r.cls not in UNSUPPORTED]
    assert not missing, f"registered classes without an UNSUPPORTED entry: {missing}"


def test_case_ids_are_unique() -> None:
    ids = [c.id for cases in CASES.values() for c in cases]
    assert len(ids) == len(set(ids))


@cache
def _fitted(case: Case) -> tuple[Any, Any, Any]:
    return case.fitted()


@cache
def _model(case: Case, backend: str) -> compiler.CompiledModel:
    est, table, _ = _fitted(case)
    options = compiler.CompileOptions(backend=backend, max_batch=16)
    return compiler.compile(est, sample=table, options=options)


def _rows(table: Any, index: Any) -> Any:
    return table.iloc[index] if hasattr(table, "iloc") else table[index]


def _methods(est: Any, model: compiler.CompiledModel) -> list[str]:
    reg = lookup(est)  # the case's top estimator, which may wrap the class under test
    expected = [m for m in METHODS if hasattr(est, m) and m in reg.methods]
    assert set(expected) <= set(model.methods), (
        f"missing heads: {set(expected) - set(model.methods)}"
    )
    return expected


def _dense(a: Any) -> np.ndarray:
    return np.asarray(a.toarray() if hasattr(a, "toarray") else a)


def assert_same(method: str, got: Any, expected: Any, rtol: float = RTOL32) -> None:
    if isinstance(expected, list):  # one array per output (MultiOutputClassifier.predict_proba)
        assert isinstance(got, list) and len(got) == len(expected), (method, type(got))
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert_same(f"{method}[{i}]", g, e, rtol)
        return
    expected = _dense(expected)
    assert got.shape == expected.shape, (method, got.shape, expected.shape)
    if expected.dtype.kind in "fc":
        scale = max(1.0, float(np.nanmax(np.abs(expected), initial=0.0)))
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * scale, err_msg=method)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=method)


def _source(case: Case, est: Any, method: str) -> Any:
    """The source's ``method``; a case's ``extra["source"](est, method)`` says how to call it
    where it does not take a table (xgboost.Booster predicts on a DMatrix)."""
    call = case.extra.get("source")
    return call(est, method) if call else getattr(est, method)


def _parity(reg: compiler.Registration, case: Case, backend: str, table: Any = None) -> None:
    est, fitted_table, _ = _fitted(case)
    table = fitted_table if table is None else table
    model = _model(case, backend)
    for method in _methods(est, model):
        assert_same(method, getattr(model, method)(table), _source(case, est, method)(table))


def _flat(outputs: Any) -> dict[str, np.ndarray]:
    """Heads by name, a list-valued head as one entry per output array."""
    flat = {}
    for method, values in outputs.items():
        if isinstance(values, list):
            flat.update({f"{method}[{i}]": v for i, v in enumerate(values)})
        else:
            flat[method] = values
    return flat


def _with_nan(table: Any) -> Any:
    out = table.copy()
    rows = np.arange(0, len(out), 7)
    if hasattr(out, "iloc"):
        numeric = [j for j, d in enumerate(out.dtypes) if d.kind == "f"]
        for k, j in enumerate(numeric[:3]):
            out.iloc[rows[k::3], j] = np.nan
    elif out.ndim == 1:  # a 1-D input: LabelEncoder's labels
        out = out.astype(np.float64)
        out[rows] = np.nan
    else:
        out = out.astype(np.float64)
        out[rows, 0] = np.nan
        out[rows[1::2], out.shape[1] - 1] = np.nan
    return out


def _probe_parity(case: Case) -> None:
    """The registration gate's probes (the model's own decision values and their neighbours,
    NaN, ±inf, categories) over the case's table: every head as the source answers them."""
    est, table, _ = _fitted(case)
    model = _model(case, "jax")

    def accepts(rows: Any) -> bool:
        return parity.source_accepts(est, model.methods[:1], rows)

    probes = parity_probes.build(model.schema, table, model.decisions, accepts, limit=_PROBES)
    if not len(probes):
        assert not model.decisions, "the source refused every probe of a deciding model"
        return
    scale = 1.0  # atol as assert_same scales it: by the largest numeric output
    for method in _methods(est, model):
        want = parity.side_by_side(_source(case, est, method)(probes.rows))
        if want.dtype.kind in "fc":
            scale = max(scale, float(np.nanmax(np.abs(want), initial=0.0)))
    result = parity.check_parity(
        est,
        model,
        probes.rows,
        source="probes",
        rtol=RTOL32,
        atol=RTOL32 * scale,
        labels=probes.labels,
    )
    assert result.ok, result.problem


#: Probe rows per case: enough for every decision's neighbourhood of a small fitted case.
_PROBES = 2048


@pytest.mark.parametrize(("reg", "case", "check"), _params())
def test_conformance(reg: compiler.Registration, case: Case, check: str) -> None:
    if check == "parity_jax":
        _parity(reg, case, "jax")
    elif check == "parity_interpreter":
        _parity(reg, case, "interpreter")
    elif check == "parity_torch":
        _parity(reg, case, "torch")
    elif check == "float32_input":
        est, table, _ = _fitted(case)
        if hasattr(table, "iloc"):
            floats = [c for c, d in table.dtypes.items() if d.kind == "f"]
            table = table.astype({c: np.float32 for c in floats})
        else:
            table = table.astype(np.float32)
        _parity(reg, case, "jax", table)
    elif check == "single_row":
        est, table, _ = _fitted(case)
        _parity(reg, case, "jax", _rows(table, slice(0, 1)))
    elif check == "batch_vs_row":
        est, table, _ = _fitted(case)
        model = _model(case, "jax")
        batch = _flat(model.outputs(_rows(table, slice(0, 12))))
        # Within float32 tolerance, not bit for bit: a single row may run on the host (numpy,
        # where warm-up timed it faster; lazy/executor.py HOST_ROWS) and a batch on the device,
        # whose dots sum in different orders. Rows that leak into each other differ grossly.
        for i in range(12):
            row = _flat(model.outputs(_rows(table, slice(i, i + 1))))
            for method, values in row.items():
                assert_same(method, values[0], batch[method][i])
    elif check == "row_order":
        est, table, _ = _fitted(case)
        model = _model(case, "jax")
        order = np.random.default_rng(0).permutation(len(table))
        straight = _flat(model.outputs(table))
        shuffled = _flat(model.outputs(_rows(table, order)))
        # Rows that leak into each other differ grossly; within one float32 tolerance a row's
        # answer may round differently with its place: which bucket's executable runs its chunk
        # (large calls, lazy/buckets.py) and where in a dot's tiles it falls.
        for method, values in shuffled.items():
            assert_same(method, values, straight[method][order])
    elif check == "nan":
        est, table, _ = _fitted(case)
        bad = _with_nan(table)
        model = _model(case, "jax")
        if case.nan:
            _parity(reg, case, "jax", bad)
        else:
            method = _methods(est, model)[0]
            with pytest.raises(ValueError):
                _source(case, est, method)(bad)
            with pytest.raises(compiler.SchemaError, match="NaN"):
                getattr(model, method)(bad)
    elif check == "probes":
        _probe_parity(case)
    elif check == "unfitted":
        with pytest.raises(NotFittedError):
            compiler.compile(case.make())
    else:  # pragma: no cover
        raise AssertionError(check)


@pytest.mark.parametrize("reg", REGISTERED, ids=lambda r: r.name)
def test_unsupported_hyperparameter_raises(reg: compiler.Registration) -> None:
    spec = UNSUPPORTED.get(reg.cls)
    if spec is None:
        pytest.fail(f"{reg.name} has no UNSUPPORTED entry")
    if isinstance(spec, str):
        assert spec.startswith("none:"), "a string entry must say 'none: <why>'"
        return
    case = Case("unsupported", spec.make, spec.data)
    est, table, _ = case.fitted()
    with pytest.raises(compiler.UnsupportedError, match=spec.match):
        compiler.compile(est, sample=table)
