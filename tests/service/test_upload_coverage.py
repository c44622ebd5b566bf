"""Every class Kestrel compiles can be uploaded as skops: each conformance case's fitted
estimator loads through the server's allow-list and content checks, and answers as it did
before it was saved. Refused on purpose, with the reason the refusal gives: a user's own
functions (host steps, which only the operator can trust) and KD trees (fit with
``algorithm='brute'``)."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path
from typing import Any

import lightgbm
import numpy as np
import pandas as pd
import pytest
import skops.io as sio
import xgboost
from sklearn.compose import ColumnTransformer, make_column_selector
from sklearn.feature_selection import SelectKBest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import SplineTransformer, StandardScaler

import compiler
from service.artifacts import ArtifactError, load_artifact

_CASES_DIR = Path(__file__).resolve().parents[1] / "compiler"
if str(_CASES_DIR) not in sys.path:
    sys.path.insert(0, str(_CASES_DIR))

#: Native boosters upload as their own files (tests/service/test_native_boosters.py).
NATIVE = (xgboost.Booster, lightgbm.Booster)
CASES = [
    case
    for path in sorted(_CASES_DIR.glob("cases_*.py"))
    for cls, cases in importlib.import_module(path.stem).CASES.items()
    if not issubclass(cls, NATIVE)
    for case in cases
]

#: Cases refused on purpose, and what the refusal must say.
REFUSED = {
    "function-ufunc-composite": "KESTREL_HOST_STEP_MODULES",
    "function-remainder": "KESTREL_HOST_STEP_MODULES",
    "ttr-func": "KESTREL_HOST_STEP_MODULES",
    "knn-uniform": "algorithm='brute'",
    "knn-distance-manhattan": "algorithm='brute'",
    "knn-regressor-distance": "algorithm='brute'",
    "knn-regressor-minkowski3": "algorithm='brute'",
}

METHODS = ("predict", "predict_proba", "decision_function", "transform", "score_samples")


def _answers(estimator: Any, table: Any) -> dict[str, Any]:
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in METHODS:
            if hasattr(estimator, method):
                value = getattr(estimator, method)(table)
                parts = value if isinstance(value, list) else [value]  # per output
                out[method] = [
                    p.toarray() if hasattr(p, "toarray") else np.asarray(p) for p in parts
                ]
    return out


def test_the_refusals_name_cases_that_exist() -> None:
    assert set(REFUSED) <= {case.id for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_every_conformance_case_uploads_as_skops(case: Any) -> None:
    estimator, table, _ = case.fitted()
    data = sio.dumps(estimator)
    if case.id in REFUSED:
        with pytest.raises(ArtifactError, match=REFUSED[case.id]):
            load_artifact(data, filename="model.skops")
        return
    loaded = load_artifact(data, filename="model.skops").estimator
    expected, got = _answers(estimator, table), _answers(loaded, table)
    assert got.keys() == expected.keys()
    for method, parts in expected.items():
        assert len(got[method]) == len(parts)
        for mine, theirs in zip(got[method], parts, strict=True):
            np.testing.assert_array_equal(mine, theirs, err_msg=method)


def _bundled_upload_families() -> Any:
    """A pipeline of each fitted state that needed more than skops' defaults: a column
    selector, a univariate selector's score function, B-splines."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=200), "b": rng.integers(0, 5, 200).astype(float)})
    y = (frame.a + frame.b > 2).astype(int)
    selected = ColumnTransformer(
        [("num", StandardScaler(), make_column_selector(dtype_include=float))]
    )
    return (
        frame,
        y,
        make_pipeline(selected, SplineTransformer(), SelectKBest(k=4), LogisticRegression()),
    )


def test_a_loaded_pipeline_of_those_types_compiles_to_its_answers() -> None:
    frame, y, model = _bundled_upload_families()
    model.fit(frame, y)
    loaded = load_artifact(sio.dumps(model), filename="model.skops").estimator
    compiled = compiler.compile(loaded, sample=frame.head(20))
    assert compiled.predict(frame).tolist() == model.predict(frame).tolist()
    np.testing.assert_allclose(compiled.predict_proba(frame), model.predict_proba(frame), atol=1e-6)


@pytest.mark.parametrize(
    ("tamper", "needle"),
    [
        (lambda s: setattr(s, "k", 40), "knots"),
        (lambda s: setattr(s, "_t", s._t[::-1].copy()), "non-decreasing"),
        (lambda s: setattr(s, "_c", s._c[:2]), "BSpline"),
        # A function skops trusts on its own: only scipy's constructor passes.
        (lambda s: setattr(s, "_asarray", np.negative), "array constructor"),
    ],
    ids=["degree-beyond-knots", "unsorted-knots", "too-few-coefficients", "foreign-constructor"],
)
def test_a_tampered_spline_is_refused(tamper: Any, needle: str) -> None:
    x = np.random.default_rng(1).normal(size=(100, 2))
    model = SplineTransformer().fit(x)
    tamper(model.bsplines_[0])
    with pytest.raises(ArtifactError, match=needle):
        load_artifact(sio.dumps(model), filename="model.skops")
