"""Decisions on computed features no map folds (a projection's output) see the source's values.

A tree split or a bin edge on a PCA component compares the value the source computed in float64.
A float32 graph computes that component about 1e-7 apart, and a row near the threshold then
takes the other branch; the compiler puts the steps computing such features in float64, and the
report says so. Exactly valued features (one-hot flags, ordinal codes, NaN indicators) and
features a map folds onto a raw column (scalers, imputers) need no float64, and get none.
"""

from __future__ import annotations

from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest
import xgboost as xgb
from sklearn.compose import ColumnTransformer
from sklearn.decomposition import PCA
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import (
    Binarizer,
    KBinsDiscretizer,
    OneHotEncoder,
    OrdinalEncoder,
    StandardScaler,
)
from sklearn.tree import DecisionTreeClassifier

import compiler

ROWS = 1500


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Integer, binary and rounded columns, as clients send them."""
    rng = np.random.default_rng(seed)
    x = np.column_stack(
        [
            rng.integers(0, 6, ROWS),
            rng.integers(0, 2, ROWS),
            np.round(rng.normal(size=ROWS), 2),
            np.round(rng.gamma(2.0, 3.0, size=ROWS), 1),
        ]
    ).astype(np.float64)
    y = (x[:, 0] - 2 * x[:, 1] + x[:, 2] * x[:, 3] > 2).astype(int)
    return x, y


def _splits(model: Any) -> list[tuple[int, float]]:
    """(component, threshold) of every split of the fitted tree model."""
    if isinstance(model, HistGradientBoostingClassifier):
        nodes = [p.nodes for predictors in model._predictors for p in predictors]
        return [
            (int(f), float(t))
            for n in nodes
            for f, t in zip(
                n["feature_idx"][~n["is_leaf"].astype(bool)],
                n["num_threshold"][~n["is_leaf"].astype(bool)],
                strict=True,
            )
        ]
    if isinstance(model, xgb.XGBClassifier):
        frame = model.get_booster().trees_to_dataframe()
        frame = frame[frame.Feature != "Leaf"]
        return [(int(f[1:]), float(t)) for f, t in zip(frame.Feature, frame.Split, strict=True)]
    trees = getattr(model, "estimators_", [model])
    return [
        (int(f), float(t))
        for tree in trees
        for f, t in zip(tree.tree_.feature, tree.tree_.threshold, strict=True)
        if f >= 0
    ]


def _rows_at(pca: Any, base: np.ndarray, points: list[tuple[int, float]]) -> np.ndarray:
    """Raw rows whose component ``k`` lies within three float32 steps of each ``t``: where
    float32 arithmetic decides at random. (Random offsets: a row within float64 rounding of a
    threshold, or of a float32 rounding midpoint for sources comparing float32, is decided by
    the last bit of a float64 sum, which no two libraries are bound to share.)"""
    per = 8
    rng = np.random.default_rng(1)
    # Off every threshold in the other components: a training row's own projection may be one.
    z = pca.transform(base).mean(axis=0) + rng.normal(scale=0.1, size=(len(points) * per, 4))
    for i, (k, t) in enumerate(points):
        ulp = float(np.spacing(np.float32(t)))
        z[i * per : (i + 1) * per, k] = t + ulp * rng.uniform(-3, 3, per)
    return pca.inverse_transform(z)


def _projected(head: Any) -> Any:
    return make_pipeline(StandardScaler(), PCA(n_components=4, random_state=0), head)


def _compiled(model: Any, promote: bool = True) -> compiler.CompiledModel:
    options = compiler.CompileOptions(max_batch=256, promote=promote, warmup=False)
    return compiler.compile(model, options=options)


def _mismatches(compiled: compiler.CompiledModel, model: Any, x: np.ndarray) -> int:
    # A branch taken the other way moves a leaf value by far more than float rounding.
    far = np.abs(compiled.predict_proba(x) - model.predict_proba(x)).max(axis=1) > 1e-5
    return int(np.count_nonzero(far | (compiled.predict(x) != model.predict(x))))


HEADS = {
    "hgb": lambda: HistGradientBoostingClassifier(max_iter=30, random_state=0),
    "forest": lambda: RandomForestClassifier(n_estimators=10, max_depth=8, random_state=0),
    "tree": lambda: DecisionTreeClassifier(max_depth=10, random_state=0),
    "xgboost": lambda: xgb.XGBClassifier(n_estimators=20, max_depth=4, n_jobs=1),
}


@pytest.mark.parametrize("head", sorted(HEADS))
def test_splits_on_projected_features_take_the_sources_branch(head: str) -> None:
    x, y = _data()
    model = _projected(HEADS[head]()).fit(x, y)
    probes = _rows_at(model[:2], x, _splits(model[-1])[:150])
    compiled = _compiled(model)
    assert _mismatches(compiled, model, probes) == 0
    # Fresh rows, not the training rows: HistGradientBoosting's thresholds are often training
    # rows' own projections, which float64 rounding decides (scikit-learn's own answer for such
    # a row changes with its position in the batch).
    assert _mismatches(compiled, model, _data(seed=1)[0]) == 0
    promoted = compiled.report.promoted
    assert "computed features" in promoted[f"model/{type(model[-1]).__name__.lower()}"]
    assert promoted["model/pca"].startswith("feeds ")


def test_a_float32_projection_misses_branches_the_source_takes() -> None:
    """What the promotion is for: the same probes, float32 throughout."""
    x, y = _data()
    model = _projected(HEADS["hgb"]()).fit(x, y)
    probes = _rows_at(model[:2], x, _splits(model[-1])[:150])
    assert _mismatches(_compiled(model, promote=False), model, probes) > 0


def test_bin_edges_on_projected_features_bin_as_the_source() -> None:
    x, _ = _data()
    model = _projected(KBinsDiscretizer(n_bins=7, encode="ordinal", strategy="quantile"))
    model.fit(x)
    inner = model[-1].bin_edges_
    points = [(k, float(e)) for k, edges in enumerate(inner) for e in edges[1:-1]]
    probes = _rows_at(model[:2], x, points)
    compiled = _compiled(model)
    np.testing.assert_array_equal(compiled.transform(probes), model.transform(probes))
    assert "model/pca" in compiled.report.promoted


def _customers(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "age": rng.integers(18, 80, ROWS).astype(float),
            "income": np.round(rng.lognormal(10, 1, ROWS), -2),
            "plan": rng.choice(["basic", "plus", "pro"], ROWS),
            "region": rng.choice(["north", "south", "east", "west"], ROWS),
        }
    )
    frame.loc[rng.random(ROWS) < 0.1, "age"] = np.nan
    frame.loc[rng.random(ROWS) < 0.1, "income"] = np.nan
    return frame


@pytest.mark.parametrize("head", ["hgb", "forest"])
def test_exact_and_folded_features_stay_float32(head: str) -> None:
    """The usual ColumnTransformer: imputed (with NaN flags) and scaled numbers, one-hot and
    ordinal categories. Every feature is folded or exact, so nothing is promoted."""
    frame = _customers()
    y = ((frame.age.fillna(40) > 45) ^ (frame.plan == "pro")).astype(int)
    numeric = make_pipeline(SimpleImputer(add_indicator=True), StandardScaler())
    columns = ColumnTransformer(
        [
            ("numeric", numeric, ["age", "income"]),
            ("plan", OneHotEncoder(), ["plan"]),
            ("region", OrdinalEncoder(), ["region"]),
        ]
    )
    model = make_pipeline(columns, HEADS[head]()).fit(frame, y)
    compiled = compiler.compile(model, sample=frame.head(64))
    assert compiled.report.promoted == {}
    assert _mismatches(compiled, model, frame) == 0


def test_a_binarizer_decides_on_the_raw_float64_value() -> None:
    x, _ = _data()
    model = make_pipeline(StandardScaler(), Binarizer(threshold=0.25)).fit(x)
    # Raw values whose standardized form sits on, just below and just above the threshold.
    on = 0.25 * model[0].scale_ + model[0].mean_
    rows = np.vstack([on, *(np.nextafter(on, s * np.inf) for s in (-1, 1)), x[:200]])
    compiled = compiler.compile(model)
    np.testing.assert_array_equal(compiled.transform(rows), model.transform(rows))
    assert compiled.report.promoted == {}


def _zero_as_missing() -> tuple[Any, np.ndarray]:
    """A LightGBM regressor reading its columns as missing where they are 0, and rows with a
    float64 value just below, on and just above every split threshold."""
    rng = np.random.default_rng(0)
    x = np.column_stack(
        [
            np.round(rng.normal(size=ROWS), 3),
            rng.integers(0, 4, ROWS),
            np.round(rng.normal(size=ROWS), 2),
        ]
    ).astype(np.float64)
    x[rng.random(ROWS) < 0.2, 0] = 0.0
    x[rng.random(ROWS) < 0.1, 2] = np.nan
    y = 2 * x[:, 0] + x[:, 1] + np.nan_to_num(x[:, 2])
    model = lgb.LGBMRegressor(
        n_estimators=30, zero_as_missing=True, min_child_samples=5, verbose=-1
    ).fit(x, y)
    trees = model.booster_.trees_to_dataframe()
    splits = trees[trees.split_feature.notna()]
    rows = []
    for name, threshold in zip(splits.split_feature, splits.threshold, strict=True):
        for value in (np.nextafter(threshold, -np.inf), threshold, np.nextafter(threshold, np.inf)):
            row = x[:3].copy()
            row[:, int(name.removeprefix("Column_"))] = value
            rows.append(row)
    return model, np.concatenate(rows)


def test_zero_as_missing_copies_decide_on_the_float64_value() -> None:
    """LightGBM compares doubles; its zero-as-missing copies of a column are computed in the
    graph, so they read the float64 input (a float32 copy sends rows near a threshold the other
    way), and their thresholds are decision points of the raw column for the gate."""
    model, rows = _zero_as_missing()
    compiled = _compiled(model)
    np.testing.assert_array_equal(compiled.predict(rows), model.predict(rows))
    assert "computed features" in compiled.report.promoted["model"]
    decided = {(p.column, v) for p in compiled.decisions for v in p.values.tolist()}
    trees = model.booster_.trees_to_dataframe()
    splits = trees[trees.split_feature.notna()]
    for name, threshold in zip(splits.split_feature, splits.threshold, strict=True):
        assert (int(name.removeprefix("Column_")), float(threshold)) in decided


def test_a_numeric_missing_marker_matches_only_itself_in_float64() -> None:
    """``missing_values=-1``: a float64 value one step from the marker is not missing (a float32
    graph took it for -1 and imputed it), and the flags are exact, so nothing is promoted."""
    rng = np.random.default_rng(3)
    x = np.round(rng.normal(size=(ROWS, 2)), 1)
    x[::5, 0] = -1.0
    rows = np.array([[v, 0.3] for v in (np.nextafter(-1.0, np.inf), -1.0, np.nextafter(-1.0, -2))])
    imputer = SimpleImputer(missing_values=-1.0, add_indicator=True).fit(x)
    compiled = _compiled(imputer)
    np.testing.assert_allclose(compiled.transform(rows), imputer.transform(rows), rtol=1e-6)
    y = (x[:, 0] > 0).astype(int)
    model = make_pipeline(SimpleImputer(missing_values=-1.0, add_indicator=True), HEADS["hgb"]())
    model.fit(x, y)
    tree = _compiled(model)
    probes = np.vstack([rows, x[:200]])
    np.testing.assert_array_equal(tree.predict(probes), model.predict(probes))
    np.testing.assert_allclose(tree.predict_proba(probes), model.predict_proba(probes), atol=1e-6)
    assert compiled.report.promoted == {} == tree.report.promoted
