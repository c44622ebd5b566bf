"""XGBoost's leaf sums, bit for bit: float32, one tree after another from the base margin.

XGBoost adds each tree's leaf to a float32 prediction in turn. Any other order, or a float64 sum,
misses its answers by that rounding, beyond the tolerance for a many-tree gamma regressor, where
``exp`` turns the margin's absolute error into the prediction's relative one
(docs/exactness.md). An ``in_order`` ensemble
sums the same way on every strategy, on the host kernels and in XLA, in float32 and float64
graphs alike (the reference interpreter, which computes every float in float64, excepted).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import xgboost
from sklearn.datasets import load_diabetes, load_wine

import compiler
from compiler.trees import STRATEGIES

#: Strategies that can evaluate 500 trees of up to 64 leaves (bitvector takes 32 at most).
SUMMING = [s for s in STRATEGIES if s not in ("auto", "bitvector")]


@cache
def _regressor(objective: str) -> tuple[xgboost.XGBRegressor, np.ndarray]:
    x, y = load_diabetes(return_X_y=True)
    est = xgboost.XGBRegressor(
        n_estimators=200, max_depth=6, learning_rate=0.3, objective=objective, n_jobs=1
    )
    return est.fit(x, y), x


def _margins(est: xgboost.XGBModel, x: np.ndarray) -> np.ndarray:
    return est.get_booster().predict(xgboost.DMatrix(x), output_margin=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("strategy", ["auto", *SUMMING])
def test_margins_are_xgboosts_bit_for_bit(strategy: str, dtype: str) -> None:
    est, x = _regressor("reg:squarederror")
    options = compiler.CompileOptions(
        dtype=dtype, tree_strategy=strategy, max_batch=64, warmup=False
    )
    model = compiler.compile(est, sample=x, options=options)
    np.testing.assert_array_equal(model.predict(x).astype(np.float32), _margins(est, x))


# Not the interpreter: it computes every float in float64, stating what a graph means.
@pytest.mark.parametrize("backend", ["jax", "numpy"])
def test_every_backend_sums_in_order(backend: str) -> None:
    est, x = _regressor("reg:squarederror")
    options = compiler.CompileOptions(backend=backend, max_batch=64)
    model = compiler.compile(est, sample=x, options=options)
    np.testing.assert_array_equal(model.predict(x).astype(np.float32), _margins(est, x))


@pytest.mark.parametrize("objective", ["reg:gamma", "count:poisson", "reg:tweedie"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exponential_objectives_meet_the_tolerance(objective: str, dtype: str) -> None:
    est, x = _regressor(objective)
    options = compiler.CompileOptions(dtype=dtype, max_batch=64, warmup=False)
    model = compiler.compile(est, sample=x, options=options)
    expected = est.predict(x)
    # Only exp's own float32 rounding is left.
    np.testing.assert_allclose(model.predict(x), expected, rtol=3e-7, atol=0)


def test_multiclass_margins_sum_each_class_in_order() -> None:
    x, y = load_wine(return_X_y=True)
    est = xgboost.XGBClassifier(n_estimators=200, max_depth=4, n_jobs=1).fit(x, y)
    model = compiler.compile(est, sample=x)
    np.testing.assert_allclose(model.predict_proba(x), est.predict_proba(x), rtol=0, atol=3e-7)
    assert np.array_equal(model.predict(x), est.predict(x))
