"""XGBoost's, LightGBM's and (in float64 graphs) scikit-learn's boosted leaf sums, bit for bit:
one tree after another from +0, or from the init.

XGBoost adds each tree's leaf to a float32 prediction in turn, from the base margin. Any other
order, or a float64 sum, misses its answers by that rounding, beyond the tolerance for a
many-tree gamma regressor, where ``exp`` turns the margin's absolute error into the prediction's
relative one (docs/exactness.md). LightGBM adds them to a float64 score in turn; another order
moves the last bits of most scores, and a score on a decision's edge with them. An ``in_order``
ensemble sums the same way on every strategy, on the host kernels and in XLA, in float32 and
float64 graphs alike (the reference interpreter, which computes every float in float64, excepted).
scikit-learn's GradientBoosting and HistGradientBoosting add their trees to the init in float64 one
after another: a float64 graph does the same (a float32 graph's own rounding is the larger).
"""

from __future__ import annotations

from functools import cache

import lightgbm
import numpy as np
import pytest
import xgboost
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris, load_wine
from sklearn.ensemble import (
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
)

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


@cache
def _lightgbm(leaves: int) -> tuple[lightgbm.LGBMRegressor, np.ndarray]:
    """200 trees of up to ``leaves`` leaves: beyond 32, deeper than the bit-vector top."""
    x, y = load_diabetes(return_X_y=True)
    est = lightgbm.LGBMRegressor(
        n_estimators=200, num_leaves=leaves, min_child_samples=3, verbose=-1, random_state=0
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


@pytest.mark.parametrize("strategy", ["auto", "bitvector", *SUMMING])
def test_lightgbm_scores_are_lightgbms_bit_for_bit(strategy: str) -> None:
    est, x = _lightgbm(31 if strategy == "bitvector" else 80)
    if strategy != "bitvector":
        assert max(t["num_leaves"] for t in est.booster_.dump_model()["tree_info"]) > 32
    options = compiler.CompileOptions(tree_strategy=strategy, max_batch=64, warmup=False)
    model = compiler.compile(est, sample=x, options=options)
    # The training rows: every split threshold is one of their values; and NaN in every column
    # (LightGBM sends it down each split's missing side).
    holes, every_third = x.copy(), np.arange(0, len(x), 3)
    holes[every_third, every_third % x.shape[1]] = np.nan
    for rows in (x, x.astype(np.float32), holes):
        np.testing.assert_array_equal(model.predict(rows), est.predict(rows))


def test_lightgbm_multiclass_scores_sum_each_class_in_order() -> None:
    x, y = load_wine(return_X_y=True)
    est = lightgbm.LGBMClassifier(n_estimators=100, num_leaves=48, min_child_samples=2)
    est.set_params(verbose=-1, random_state=0).fit(x, y)
    options = compiler.CompileOptions(max_batch=64, warmup=False)
    model = compiler.compile(est, sample=x, options=options)
    np.testing.assert_array_equal(model.decision_function(x), est.predict(x, raw_score=True))
    assert np.array_equal(model.predict(x), est.predict(x))


# Not the interpreter: it computes every float in float64, stating what a graph means.
@pytest.mark.parametrize("backend", ["jax", "numpy"])
def test_every_backend_sums_in_order(backend: str) -> None:
    est, x = _regressor("reg:squarederror")
    options = compiler.CompileOptions(backend=backend, max_batch=64)
    model = compiler.compile(est, sample=x, options=options)
    np.testing.assert_array_equal(model.predict(x).astype(np.float32), _margins(est, x))
    est, x = _lightgbm(80)
    model = compiler.compile(est, sample=x, options=options)
    np.testing.assert_array_equal(model.predict(x), est.predict(x))


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


@cache
def _boosted(kind: str) -> tuple[object, np.ndarray]:
    """A scikit-learn booster on a bundled dataset, NaN in every column for HistGradientBoosting
    (each split's missing side learned): its training rows hold every threshold's value."""
    data = {"binary": load_breast_cancer, "multiclass": load_iris, "regression": load_diabetes}
    shape, family = kind.split("-")
    x, y = data[shape](return_X_y=True)
    if family == "hist":
        x = x.copy()
        x[np.arange(0, len(x), 4), np.arange(0, len(x), 4) % x.shape[1]] = np.nan
        cls = (
            HistGradientBoostingRegressor
            if shape == "regression"
            else HistGradientBoostingClassifier
        )
        est = cls(max_iter=60, max_leaf_nodes=40, random_state=0)
    else:
        cls = GradientBoostingRegressor if shape == "regression" else GradientBoostingClassifier
        est = cls(n_estimators=60, max_depth=6, random_state=0)
    return est.fit(x, y), x


BOOSTED = [
    f"{shape}-{family}"
    for shape in ("binary", "multiclass", "regression")
    for family in ("gb", "hist")
]


@pytest.mark.parametrize("backend", ["jax", "numpy"])
@pytest.mark.parametrize("strategy", ["auto", *SUMMING])
@pytest.mark.parametrize("kind", BOOSTED)
def test_scikit_learn_boosters_in_float64_are_bit_for_bit(
    kind: str, strategy: str, backend: str
) -> None:
    est, x = _boosted(kind)
    options = compiler.CompileOptions(
        dtype="float64", tree_strategy=strategy, backend=backend, max_batch=64, warmup=False
    )
    model = compiler.compile(est, sample=x, options=options)
    # The training rows (every threshold's value, ties, NaN for HistGradientBoosting), as
    # float64 and as float32 (GradientBoosting compares float32(x); the sums stay float64).
    for rows in (x, x.astype(np.float32)):
        if hasattr(est, "decision_function"):
            got, expected = model.decision_function(rows), est.decision_function(rows)
            assert np.array_equal(model.predict(rows), est.predict(rows))
        else:
            got, expected = model.predict(rows), est.predict(rows)
        np.testing.assert_array_equal(got, expected)
