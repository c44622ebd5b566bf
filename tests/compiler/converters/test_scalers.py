"""Scaler edge cases the conformance suite's training-set rows do not reach."""

from __future__ import annotations

import numpy as np
from sklearn.impute import MissingIndicator, SimpleImputer
from sklearn.preprocessing import MinMaxScaler, Normalizer

import compiler

FAST = compiler.CompileOptions(backend="interpreter")


def _rows() -> np.ndarray:
    rng = np.random.default_rng(5)
    return rng.normal(size=(40, 3))


def test_min_max_clip_on_rows_outside_the_fitted_range() -> None:
    scaler = MinMaxScaler(feature_range=(-1.0, 1.0), clip=True).fit(_rows())
    rows = np.array([[10.0, -10.0, 0.0], [np.nan, 1e6, -1e6]])
    model = compiler.compile(scaler, options=FAST)
    np.testing.assert_allclose(model.transform(rows), scaler.transform(rows), rtol=1e-6)


def test_normalizer_leaves_zero_rows_alone() -> None:
    rows = np.array([[0.0, 0.0, 0.0], [3.0, -4.0, 0.0], [1e-20, 0.0, 0.0]])
    for norm in ("l1", "l2", "max"):
        normalizer = Normalizer(norm=norm).fit(rows)
        model = compiler.compile(normalizer, options=FAST)
        np.testing.assert_allclose(model.transform(rows), normalizer.transform(rows), rtol=1e-6)


def test_indicator_columns_come_from_fit_not_from_the_rows() -> None:
    x = _rows()
    x[::4, 1] = np.nan
    imputer = SimpleImputer(add_indicator=True).fit(x)
    indicator = MissingIndicator(error_on_new=False).fit(x)
    rows = np.array([[np.nan, np.nan, np.nan], [0.0, 1.0, 2.0]])
    for est in (imputer, indicator):
        model = compiler.compile(est, options=FAST)
        np.testing.assert_allclose(model.transform(rows), est.transform(rows), rtol=1e-6)
        assert model.transform(rows).shape[1] == est.transform(rows).shape[1]
