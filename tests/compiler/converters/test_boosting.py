"""LightGBM / XGBoost converters beyond the conformance cases: every objective, LightGBM's zero
band, exact float32 parsing, Boosters compiled without a sample, and what is rejected."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import lightgbm
import numpy as np
import pandas as pd
import pytest
import xgboost
from sklearn.exceptions import NotFittedError

import compiler
from compiler.converters._gbdt import float32_from_text

INTERPRETER = compiler.CompileOptions(backend="interpreter", dtype="float64")
JAX = compiler.CompileOptions(backend="jax", max_batch=256, warmup=False)


def _data(rows: int = 160) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4))
    x[rng.random(x.shape) < 0.1] = np.nan
    y = np.nan_to_num(x[:, 0]) * 2 + np.nan_to_num(x[:, 1]) + rng.normal(0, 0.1, rows)
    return x, y


def _assert_parity(model: Any, source: Any, x: np.ndarray) -> None:
    np.testing.assert_allclose(model.predict(x), source(x), rtol=1e-9, atol=1e-9)


# --- objectives ---------------------------------------------------------------------------------

_POSITIVE = {"poisson", "gamma", "tweedie"}
_UNIT = {"cross_entropy", "binary"}


@pytest.mark.parametrize(
    "objective",
    [
        "huber",
        "fair",
        "quantile",
        "mape",
        "poisson",
        "gamma",
        "tweedie",
        "cross_entropy",
        "binary",
        "lambdarank",
        "rank_xendcg",
        "multiclassova",
        "regression_l1 sqrt",
    ],
)
def test_lightgbm_objectives(objective: str) -> None:
    x, y = _data()
    objective, *flags = objective.split()
    params = {"objective": objective, "verbose": -1, "num_leaves": 5, "min_data_in_leaf": 5}
    params["reg_sqrt"] = "sqrt" in flags
    if objective == "multiclassova":
        y, params["num_class"] = np.digitize(y, [-1.0, 1.0]), 3
    if objective in _POSITIVE:
        y = np.exp(y / 4)
    elif objective in _UNIT:
        y = (y > 0).astype(float)
        params["sigmoid"] = 0.7
    dataset = lightgbm.Dataset(x, y)
    if objective in ("lambdarank", "rank_xendcg"):
        dataset = lightgbm.Dataset(x, np.digitize(y, [-1.0, 1.0]), group=[20] * 8)
    booster = lightgbm.train(params, dataset, num_boost_round=4)
    _assert_parity(compiler.compile(booster, options=INTERPRETER), booster.predict, x)


@pytest.mark.parametrize(
    ("objective", "params"),
    [
        ("reg:absoluteerror", {}),
        ("reg:pseudohubererror", {}),
        ("reg:logistic", {}),
        ("binary:logistic", {}),
        ("reg:tweedie", {}),
        ("rank:pairwise", {}),
        ("multi:softmax", {"num_class": 3}),
        ("multi:softprob", {"num_class": 3}),
    ],
)
def test_xgboost_objectives(objective: str, params: dict[str, Any]) -> None:
    x, y = _data()
    if objective in ("reg:logistic", "binary:logistic"):
        y = (y > 0).astype(float)
    elif objective == "reg:tweedie":
        y = np.exp(y / 4)
    elif objective.startswith("multi"):
        y = np.digitize(y, [-1.0, 1.0])
    dtrain = xgboost.DMatrix(x, y, qid=np.repeat(np.arange(8), 20))
    booster = xgboost.train(
        {"objective": objective, "max_depth": 3, **params}, dtrain, num_boost_round=4
    )
    model = compiler.compile(booster, options=INTERPRETER)
    # XGBoost sums in float32: compare at float32 precision.
    got, expected = model.predict(x), booster.predict(xgboost.DMatrix(x))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# --- decisions ----------------------------------------------------------------------------------


def test_lightgbm_reads_the_zero_band_as_zero() -> None:
    """|x| <= float32(1e-35) reaches LightGBM's trees as 0.0, also against thresholds in the band."""
    x, y = _data()
    x[::3, 2] = 0.0
    y = y + 3.0 * (x[:, 2] == 0)
    booster = lightgbm.train(
        {"use_missing": False, "verbose": -1, "num_leaves": 5, "min_data_in_leaf": 5},
        lightgbm.Dataset(x, y),
        num_boost_round=4,
    )
    tiny = np.float32(1e-35).item()
    query = np.repeat(x[:8], 6, axis=0)
    query[:, 2] = np.tile([0.0, tiny, -tiny, tiny / 2, -np.nextafter(tiny, 1.0), np.nan], 8)
    _assert_parity(compiler.compile(booster, options=INTERPRETER), booster.predict, query)


def test_lightgbm_categorical_codes_truncate() -> None:
    rng = np.random.default_rng(1)
    x = np.column_stack([rng.normal(size=300), rng.integers(0, 12, 300).astype(float)])
    y = np.isin(x[:, 1], [2, 5, 9]) * 4.0 + x[:, 0]
    booster = lightgbm.train(
        {"verbose": -1, "num_leaves": 6, "min_data_per_group": 5, "cat_smooth": 1.0},
        lightgbm.Dataset(x, y, categorical_feature=[1]),
        num_boost_round=3,
    )
    codes = [np.nan, -2.0, -1.0, -0.5, 0.0, 1.9, 2.0, 2.99, 5.5, 9.0, 11.0, 12.0, 1e12, np.inf]
    query = np.column_stack([np.zeros(len(codes)), codes])
    _assert_parity(compiler.compile(booster, options=INTERPRETER), booster.predict, query)


@pytest.mark.parametrize("max_cat_to_onehot", [1, 64], ids=["partition", "one-hot"])
def test_xgboost_categorical_codes_truncate_and_invalid_ones_go_left(
    max_cat_to_onehot: int,
) -> None:
    """A model trained on numeric codes reads the float32 value: NaN takes the default child;
    0 <= v < 2**24 goes right iff int(v) is in the node's set; anything else goes left."""
    rng = np.random.default_rng(1)
    x = np.column_stack([rng.normal(size=300), rng.integers(0, 12, 300).astype(float)])
    x[rng.random(300) < 0.1, 1] = np.nan
    y = np.isin(x[:, 1], [2, 5, 9]) * 4.0 + x[:, 0]
    params = {"max_depth": 3, "max_cat_to_onehot": max_cat_to_onehot, "min_child_weight": 0.5}
    types = ["q", "c"]
    train = xgboost.DMatrix(x, y, feature_types=types, enable_categorical=True)
    booster = xgboost.train(params, train, num_boost_round=4)
    codes = [np.nan, -2.0, -1.0, -0.5, -0.0, 0.0, 1.9, 2.0, 2.99, 5.5, 9.0, 11.0, 12.0, 1e6]
    codes += [2.0**24 - 1, 2.0**24, 16777215.5, 1e12]  # the last two round to 2**24 in float32
    query = np.column_stack([np.zeros(len(codes)), codes])
    expected = booster.predict(xgboost.DMatrix(query, feature_types=types, enable_categorical=True))
    assert len(np.unique(expected.round(3))) >= 2  # the codes take different paths
    for options in (INTERPRETER, JAX):
        got = compiler.compile(booster, options=options).predict(query)
        # XGBoost sums in float32: compare at float32 precision.
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_xgboost_reads_dataframe_categories_by_value() -> None:
    """A model fitted on pandas categories: rows are encoded by category value (any category
    order, dict rows too); missing ones take the default child; unknown ones are refused."""
    rng = np.random.default_rng(2)
    colors = ["red", "green", "blue", "teal", "plum"]
    frame = pd.DataFrame(
        {
            "a": rng.normal(size=200),
            "color": pd.Categorical(rng.choice(colors, 200), categories=colors),
            "unused": pd.Categorical(rng.choice(["p", "q"], 200)),
        }
    )
    frame.loc[rng.random(200) < 0.1, "color"] = None
    y = frame["a"] + 3.0 * frame["color"].isin(["green", "plum"])
    est = xgboost.XGBRegressor(
        n_estimators=3, max_depth=2, enable_categorical=True, max_cat_to_onehot=1
    ).fit(frame, y)
    model = compiler.compile(est, sample=frame, options=JAX)
    expected = est.predict(frame)
    np.testing.assert_allclose(model.predict(frame), expected, rtol=1e-5, atol=1e-5)
    reordered = frame.assign(color=frame["color"].cat.reorder_categories(colors[::-1]))
    np.testing.assert_allclose(model.predict(reordered), expected, rtol=1e-5, atol=1e-5)
    rows = frame.head(8).astype(object).where(frame.head(8).notna(), None).to_dict("records")
    np.testing.assert_allclose(model.predict(rows), expected[:8], rtol=1e-5, atol=1e-5)
    unknown = frame.head(3).assign(color=pd.Categorical(["red", "olive", "blue"]))
    with pytest.raises(compiler.SchemaError, match=r"'color', row 1: unknown category 'olive'"):
        model.predict(unknown)
    with pytest.raises(compiler.SchemaError, match=r"'unused', row 0: unknown category 'r'"):
        model.predict(frame.head(1).assign(unused=pd.Categorical(["r"])))


def test_float32_from_text_rounds_once() -> None:
    values = np.random.default_rng(2).normal(size=200).astype(np.float32)
    assert np.array_equal(float32_from_text([repr(float(v)) for v in values]), values)
    # Just above the midpoint between 1 and the next float32: float64 parsing lands on the
    # midpoint, and rounding that to float32 (ties to even) would give 1.
    midpoint = Decimal(1) + Decimal(2) ** -24
    above = float32_from_text([str(midpoint + Decimal(2) ** -80)])[0]
    below = float32_from_text([str(midpoint - Decimal(2) ** -80)])[0]
    assert above == np.nextafter(np.float32(1), np.float32(2))
    assert below == np.float32(1)


# --- schema, fitting, rejections ----------------------------------------------------------------


def test_boosters_compile_without_a_sample() -> None:
    x, y = _data()
    lgb = lightgbm.train({"verbose": -1, "num_leaves": 4}, lightgbm.Dataset(x, y), 2)
    xgb = xgboost.train({"max_depth": 2}, xgboost.DMatrix(x, y), 2)
    assert len(compiler.compile(lgb, options=INTERPRETER).schema.columns) == 4
    assert len(compiler.compile(xgb, options=INTERPRETER).schema.columns) == 4


def test_an_untrained_xgboost_booster_is_not_fitted() -> None:
    with pytest.raises(NotFittedError):
        compiler.compile(xgboost.Booster(), sample=np.zeros((1, 3)))


def test_rejections() -> None:
    x, y = _data()
    linear = lightgbm.train(
        {"linear_tree": True, "verbose": -1, "num_leaves": 4}, lightgbm.Dataset(x, y), 2
    )
    with pytest.raises(compiler.UnsupportedError, match="linear trees"):
        compiler.compile(linear)
    frame = pd.DataFrame({"a": x[:, 0], "c": pd.Categorical(np.where(y > 0, "p", "n"))})
    fitted = lightgbm.LGBMRegressor(n_estimators=2, verbose=-1, min_data_per_group=5).fit(frame, y)
    # pandas category columns compile (tests/compiler/test_categorical_pipelines.py)
    compiled = compiler.compile(fitted, sample=frame, options=INTERPRETER)
    np.testing.assert_allclose(compiled.predict(frame), fitted.predict(frame), rtol=1e-9)
    dart = xgboost.train({"booster": "dart", "max_depth": 2}, xgboost.DMatrix(x, y), 2)
    with pytest.raises(compiler.UnsupportedError, match="dart"):
        compiler.compile(dart)
    custom = lightgbm.train(
        {"objective": "cross_entropy_lambda", "verbose": -1},
        lightgbm.Dataset(x, (y > 0).astype(float)),
        2,
    )
    with pytest.raises(compiler.UnsupportedError, match="cross_entropy_lambda"):
        compiler.compile(custom)
