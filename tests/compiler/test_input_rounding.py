"""Float64 inputs of float64-comparing trees (HistGradientBoosting, LightGBM) are narrowed to
float32 rounding down, so that a value equal to a threshold — thresholds are data values — takes
the source's branch."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest
from sklearn.ensemble import (
    HistGradientBoostingClassifier,
    RandomForestClassifier,
    VotingClassifier,
)

import compiler
from compiler import narrowing
from compiler.narrowing import NARROW_BLOCK_ROWS, narrow_rounding_down
from compiler.schema import InputSchema
from lazy import native


def rounded_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A few decimals, as clients send: many training values are split thresholds."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=(3000, 6)), 4)
    y = (x[:, 0] + x[:, 1] * x[:, 2] - 0.3 * x[:, 3] > 0).astype(int)
    return x, y


@pytest.fixture(params=["native", "numpy"])
def narrowing_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both formulations, whatever the size: the native loop (numba is a dependency, so it is
    tested, never skipped) and the numpy blocks."""
    if request.param == "native":
        monkeypatch.setattr(narrowing, "NATIVE_VALUES", 1 << 40)
    else:
        monkeypatch.setattr(native, "AVAILABLE", False)
    return str(request.param)


def test_narrowing_rounds_the_chosen_columns_down_and_the_rest_to_nearest(
    narrowing_path: str,
) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 3)) * 10.0 ** rng.integers(-30, 30, size=(2000, 3))
    x[0] = [np.nan, np.inf, -np.inf]
    x[1] = [1e39, -1e39, 3.4e38]  # beyond float32's range
    x[2] = np.float32([0.1, -0.1, 1.5]).astype(np.float64)  # float32 values stay themselves
    got = narrow_rounding_down(x, frozenset({0, 1}))
    assert got.dtype == np.float32
    down, near = got[:, :2].astype(np.float64), got[:, 2]
    finite = np.isfinite(x[:, :2]) & (np.abs(x[:, :2]) <= np.finfo(np.float32).max)
    assert (down[finite] <= x[:, :2][finite]).all()
    with np.errstate(over="ignore"):
        above = np.nextafter(got[:, :2], np.float32(np.inf)).astype(np.float64)
    assert (above[finite] > x[:, :2][finite]).all()  # the largest float32 not above
    assert np.array_equal(near, x[:, 2].astype(np.float32), equal_nan=True)
    assert np.isnan(got[0, 0]) and got[0, 1] == np.inf
    assert got[1, 0] == np.finfo(np.float32).max and got[1, 1] == -np.inf
    assert np.array_equal(got[2], np.float32([0.1, -0.1, 1.5]))


def test_narrowing_in_blocks_equals_narrowing_each_row(narrowing_path: str) -> None:
    rng = np.random.default_rng(2)
    rows = 2 * NARROW_BLOCK_ROWS + 3  # two full blocks and a partial one
    x = rng.normal(size=(rows, 4)) * 10.0 ** rng.integers(-40, 40, size=(rows, 4))
    x[-1] = [-1e-50, 1e-50, -0.0, 1e39]  # round to -0.0 / +0.0 / -0.0 / inf first
    for columns in (frozenset(range(4)), frozenset({1, 3})):
        got = narrow_rounding_down(x, columns)
        np.testing.assert_array_equal(narrow_rounding_down(x[::-1], columns), got[::-1])
        each = np.concatenate([narrow_rounding_down(x[i : i + 1], columns) for i in range(rows)])
        assert np.array_equal(got.view(np.int32), each.view(np.int32))
    got = narrow_rounding_down(x[-1:], frozenset(range(4)))[0]
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    assert list(got) == [-tiny, 0.0, -0.0, np.finfo(np.float32).max]
    assert np.signbit(got[2]) and not np.signbit(got[1])


def test_float32_rows_skip_the_rounding_pass() -> None:
    """float32 values narrow exactly: the rows go to the graph as they are, not copied."""
    x, y = rounded_data()
    model = lgb.LGBMClassifier(n_estimators=10, verbose=-1, random_state=0).fit(x, y)
    schema: InputSchema = compiler.trace(model).schema
    assert schema.round_down
    rows = np.ascontiguousarray(x[:100], dtype=np.float32)
    feed, n = schema.to_feed(rows, np.float32)
    assert n == 100 and feed["x"] is rows
    widened, _ = schema.to_feed(rows.astype(np.float64), np.float32)
    assert np.array_equal(widened["x"], rows)
    frame = pd.DataFrame(rows, columns=[f"f{i}" for i in range(rows.shape[1])])
    feed, _ = schema.to_feed(frame, np.float32)
    assert np.array_equal(feed["x"], rows)


def _decision_paths_match(compiled: compiler.CompiledModel, model, x: np.ndarray) -> None:
    # A branch taken the other way moves a leaf value (>= 1e-3 here); float32 sums drift ~1e-6.
    got = compiled.predict_proba(x)
    np.testing.assert_allclose(got, model.predict_proba(x), rtol=0, atol=1e-5)
    assert np.array_equal(compiled.predict(x), model.predict(x))


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
    compiled = compiler.compile(model)
    assert compiled.traced.schema.round_down == frozenset(range(6))
    _decision_paths_match(compiled, model, x)  # the training rows: thresholds among them


def test_hist_gradient_boosting_thresholds_are_data_values_here() -> None:
    """The case the rounding is for exists: with nearest rounding some rows flip."""
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
    assert on_threshold > 0  # thresholds equal to data values that round up in float32


def test_columns_also_read_by_float32_comparing_trees_keep_nearest_rounding() -> None:
    x, y = rounded_data()
    hist = HistGradientBoostingClassifier(max_iter=10, random_state=0)
    forest = RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0)
    both = VotingClassifier([("h", hist), ("f", forest)], voting="soft").fit(x, y)
    assert compiler.trace(both).schema.round_down == frozenset()
    alone = hist.fit(x, y)
    options = compiler.CompileOptions(dtype="float64")
    assert compiler.trace(alone, options=options).schema.round_down == frozenset()
