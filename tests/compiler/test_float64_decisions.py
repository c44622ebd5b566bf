"""Float64-comparing trees (HistGradientBoosting, LightGBM) read their raw columns in float64:
a float64 input on a threshold, or one step beside it, takes the source's branch in a float32
graph too; float32-comparing trees keep float32 input."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest
from sklearn.ensemble import (
    HistGradientBoostingClassifier,
    RandomForestClassifier,
    VotingClassifier,
)

import compiler


def rounded_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A few decimals, as clients send: many training values are split thresholds."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=(3000, 6)), 4)
    y = (x[:, 0] + x[:, 1] * x[:, 2] - 0.3 * x[:, 3] > 0).astype(int)
    return x, y


def _decision_paths_match(compiled: compiler.CompiledModel, model, x: np.ndarray) -> None:
    # A branch taken the other way moves a leaf value (>= 1e-3 here); float32 sums drift ~1e-6.
    got = compiled.predict_proba(x)
    np.testing.assert_allclose(got, model.predict_proba(x), rtol=0, atol=1e-5)
    assert np.array_equal(compiled.predict(x), model.predict(x))


def _beside(x: np.ndarray, steps: int) -> np.ndarray:
    out = x.copy()
    for _ in range(abs(steps)):
        out = np.nextafter(out, np.inf if steps > 0 else -np.inf)
    return out


@pytest.mark.parametrize(
    "model",
    [
        HistGradientBoostingClassifier(max_iter=50, random_state=0),
        lgb.LGBMClassifier(n_estimators=50, num_leaves=31, verbose=-1, random_state=0),
    ],
    ids=["histgb", "lightgbm"],
)
def test_float64_comparing_trees_take_the_sources_branch_at_thresholds(model) -> None:
    x, y = rounded_data()
    model.fit(x, y)
    compiled = compiler.compile(model, options=compiler.CompileOptions(max_batch=256))
    assert compiled.traced.input_dtype == "float64"
    # The training rows hold the thresholds; the float64 steps beside them are what float32
    # input used to misjudge.
    for steps in (0, 1, -1):
        _decision_paths_match(compiled, model, _beside(x[:1500], steps))


def test_hist_gradient_boosting_thresholds_are_data_values_here() -> None:
    """The case exists: thresholds equal to data values that round up in float32."""
    x, y = rounded_data()
    model = HistGradientBoostingClassifier(max_iter=50, random_state=0).fit(x, y)
    thresholds = {
        (int(n["feature_idx"]), float(n["num_threshold"]))
        for predictors in model._predictors
        for p in predictors
        for n in p.nodes
        if not n["is_leaf"]
    }
    on_threshold = sum(
        1 for f, t in thresholds if np.any(x[:, f] == t) and np.float32(t) > np.float64(t)
    )
    assert on_threshold > 0


def test_float32_comparing_trees_keep_float32_input() -> None:
    """scikit-learn's forests compare float32(x): the host's float32 rounding is the source's."""
    x, y = rounded_data()
    forest = RandomForestClassifier(n_estimators=5, max_depth=6, random_state=0).fit(x, y)
    compiled = compiler.compile(forest, options=compiler.CompileOptions(max_batch=256))
    assert compiled.traced.input_dtype == "float32"
    _decision_paths_match(compiled, forest, x[:1000])


def test_columns_read_by_both_kinds_of_trees_decide_as_each_source() -> None:
    x, y = rounded_data()
    hist = HistGradientBoostingClassifier(max_iter=10, random_state=0)
    forest = RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0)
    both = VotingClassifier([("h", hist), ("f", forest)], voting="soft").fit(x, y)
    compiled = compiler.compile(both, options=compiler.CompileOptions(max_batch=256))
    assert compiled.traced.input_dtype == "float64"
    for steps in (0, 1, -1):
        _decision_paths_match(compiled, both, _beside(x[:1000], steps))


def test_a_float64_graph_needs_no_environment_variable() -> None:
    x, y = rounded_data()
    model = HistGradientBoostingClassifier(max_iter=10, random_state=0).fit(x, y)
    compiled = compiler.compile(
        model, options=compiler.CompileOptions(dtype="float64", max_batch=64)
    )
    got = compiled.predict_proba(x[:500])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, model.predict_proba(x[:500]), rtol=1e-12, atol=1e-14)
