"""The input schema of native boosters: the feature names the booster records."""

from __future__ import annotations

import lightgbm
import numpy as np
import pandas as pd
import pytest
import xgboost

import compiler

RNG = np.random.default_rng(0)
X = np.column_stack(
    [RNG.integers(0, 5, 200), RNG.integers(0, 2, 200), RNG.normal(size=200).round(1)]
).astype(float)
X[::9, 2] = np.nan
Y = X[:, 0] + X[:, 1]
FRAME = pd.DataFrame(X, columns=["count", "flag", "level"])


def _schema(estimator: object) -> compiler.InputSchema:
    options = compiler.CompileOptions(backend="interpreter", warmup=False)
    return compiler.trace(estimator, options=options).schema


def _lgb_booster(data: object) -> lightgbm.Booster:
    params = {"objective": "regression", "min_data_in_leaf": 5, "verbose": -1}
    return lightgbm.train(params, lightgbm.Dataset(data, label=Y), num_boost_round=3)


def test_a_lightgbm_booster_reads_its_columns_by_their_names() -> None:
    booster = lightgbm.Booster(model_str=_lgb_booster(FRAME).model_to_string())  # an upload
    schema = _schema(booster)
    assert schema.names == ["count", "flag", "level"] and schema.named
    model = compiler.compile(booster, options=compiler.CompileOptions(max_batch=4))
    rows = FRAME.iloc[:10].to_dict(orient="records")
    np.testing.assert_allclose(model.predict(rows), booster.predict(X[:10]), rtol=1e-5)
    shuffled = FRAME.iloc[:10][["level", "count", "flag"]]  # a frame is read by name
    np.testing.assert_allclose(model.predict(shuffled), booster.predict(X[:10]), rtol=1e-5)


def test_lightgbm_default_names_are_the_schema_but_columns_stay_positional() -> None:
    names = [f"Column_{i}" for i in range(3)]
    booster = _lgb_booster(X)
    wrapper = lightgbm.LGBMRegressor(n_estimators=3, min_child_samples=5, verbose=-1).fit(X, Y)
    for estimator in (booster, wrapper):
        schema = _schema(estimator)
        assert schema.names == names and not schema.named
    model = compiler.compile(booster, options=compiler.CompileOptions(max_batch=4))
    rows = [dict(zip(names, row, strict=True)) for row in X[:10].tolist()]
    np.testing.assert_allclose(model.predict(rows), booster.predict(X[:10]), rtol=1e-5)
    np.testing.assert_allclose(model.predict(X[:10]), booster.predict(X[:10]), rtol=1e-5)


def test_an_lgbm_model_fitted_on_a_frame_keeps_its_feature_names() -> None:
    wrapper = lightgbm.LGBMRegressor(n_estimators=3, min_child_samples=5, verbose=-1)
    schema = _schema(wrapper.fit(FRAME, Y))
    assert schema.names == ["count", "flag", "level"] and schema.named


def test_an_xgboost_booster_uses_its_feature_names_when_it_has_them() -> None:
    named = xgboost.train({}, xgboost.DMatrix(X, Y, feature_names=list(FRAME.columns)), 3)
    schema = _schema(named)
    assert schema.names == ["count", "flag", "level"] and schema.named
    model = compiler.compile(named, options=compiler.CompileOptions(max_batch=4))
    rows = FRAME.iloc[:10].to_dict(orient="records")
    expected = named.predict(xgboost.DMatrix(X[:10], feature_names=list(FRAME.columns)))
    np.testing.assert_allclose(model.predict(rows), expected, rtol=1e-5)
    unnamed = xgboost.train({}, xgboost.DMatrix(X, Y), 3)
    schema = _schema(unnamed)
    assert schema.names == ["x0", "x1", "x2"] and not schema.named


def test_lightgbm_reads_its_columns_by_the_names_before_it_replaced_spaces() -> None:
    spaced = FRAME.rename(columns={"count": "visit count", "level": "risk level"})
    model = lightgbm.LGBMRegressor(n_estimators=5, min_child_samples=5, verbose=-1)
    model.fit(spaced, Y)
    assert list(model.feature_names_in_) == ["visit_count", "flag", "risk_level"]
    compiled = compiler.compile(model, options=compiler.CompileOptions(max_batch=16))
    want = model.predict(spaced)
    np.testing.assert_allclose(compiled.predict(spaced), want, rtol=1e-5)
    rows = spaced.iloc[:5].to_dict("records")
    np.testing.assert_allclose(compiled.predict(rows), want[:5], rtol=1e-5)
    columns = {c: spaced[c].to_numpy() for c in spaced.columns}
    np.testing.assert_allclose(compiled.predict(columns), want, rtol=1e-5)
    stored = FRAME.rename(columns={"count": "visit_count", "level": "risk_level"})
    np.testing.assert_allclose(compiled.predict(stored), want, rtol=1e-5)
    with pytest.raises(
        compiler.SchemaError, match=r"unknown columns 'count' \(did you mean 'visit_count'\?\)"
    ):
        compiled.predict(FRAME)  # 'count' is not 'visit count'
