"""Tree splits on computed features decide exactly as the source, on float64 inputs.

The rows that matter are the ones a float32 graph misjudges: raw values whose computed feature
(an imputer's fill, a scaler's output) lies on a split threshold or one float64 step beside it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import (
    ExtraTreesRegressor,
    GradientBoostingClassifier,
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
    IsolationForest,
    RandomForestClassifier,
)
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import (
    MaxAbsScaler,
    MinMaxScaler,
    OneHotEncoder,
    RobustScaler,
    StandardScaler,
)

import compiler
from compiler.monotone import largest_satisfying


def test_largest_satisfying_finds_the_last_member_of_each_down_set() -> None:
    t = np.array([0.5, -3e-16, 1e300, -np.inf, np.inf, 0.1, 5e-324])
    best, some = largest_satisfying(lambda x: (x - 0.25) / 3.0 <= t, len(t))
    assert some.all()
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.all((best - 0.25) / 3.0 <= t)
        above = np.nextafter(best, np.inf)
        finite = np.isfinite(best)
        assert not np.any(((above - 0.25) / 3.0 <= t)[finite])


def test_largest_satisfying_says_when_nothing_satisfies() -> None:
    best, some = largest_satisfying(lambda x: np.zeros(len(x), bool), 3)
    assert not some.any()
    best, some = largest_satisfying(lambda x: np.ones(len(x), bool), 2)
    assert some.all() and np.all(best == np.inf)


def _frame(n: int, seed: int) -> pd.DataFrame:
    """Real data shapes: an integer column, a binary one, a rounded continuous one with repeats,
    NaN in each numeric column, and strings."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "count": rng.integers(0, 7, n).astype(float),
            "flag": rng.integers(0, 2, n).astype(float),
            "amount": np.round(rng.lognormal(2.0, 1.0, n), 2),
            "score": np.round(rng.normal(size=n), 3) * 7.3,
            "plan": rng.choice(["free", "pro", "team"], n),
        }
    )
    for column, share in (("count", 0.15), ("amount", 0.1), ("score", 0.1)):
        df.loc[rng.random(n) < share, column] = np.nan
    return df


def _target(df: pd.DataFrame) -> np.ndarray:
    s = df["score"].fillna(0.0)
    return (
        (df["count"].fillna(3) > 2)
        ^ (df["plan"] == "pro")
        ^ (np.sin(s * 3) > 0)
        ^ (df["amount"] > 9)
    ).to_numpy(int)


NUMERIC = ["count", "flag", "amount", "score"]
SCALERS = {
    "standard": StandardScaler,
    "minmax": MinMaxScaler,
    "maxabs": MaxAbsScaler,
    "robust": RobustScaler,
}


def _pipeline(scaler: type, model: object) -> object:
    return make_pipeline(
        ColumnTransformer(
            [
                ("num", make_pipeline(SimpleImputer(), scaler()), NUMERIC),
                ("cat", OneHotEncoder(handle_unknown="ignore"), ["plan"]),
            ]
        ),
        model,
    )


def _on_thresholds(pipe: object, df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose scaled numeric features sit on the fitted trees' own thresholds, and one and
    two float64 steps either side, found by inverting the scaler on those thresholds."""
    ct = pipe[0]
    num = ct.named_transformers_["num"]
    model = pipe[-1]
    thresholds: dict[int, list[float]] = {j: [] for j in range(len(NUMERIC))}
    if hasattr(model, "_predictors"):
        for iteration in model._predictors:
            for p in iteration:
                nodes = p.nodes[~p.nodes["is_leaf"].astype(bool)]
                for f, t in zip(nodes["feature_idx"], nodes["num_threshold"], strict=True):
                    if f < len(NUMERIC):
                        thresholds[int(f)].append(float(t))
    else:
        members = getattr(model, "estimators_", [model])
        for m in np.ravel(members):
            tree = m.tree_
            for f, t in zip(tree.feature, tree.threshold, strict=True):
                if 0 <= f < len(NUMERIC):
                    thresholds[int(f)].append(float(t))
    scaler = num[-1]
    rows = []
    for j, ts in thresholds.items():
        ts = np.unique(ts)[:40]
        if not len(ts):
            continue
        # Raw values mapping near t: invert the scaler, then walk a few float64 steps.
        raw = scaler.inverse_transform(np.tile(ts[:, None], (1, len(NUMERIC))))[:, j]
        for steps in (-2, -1, 0, 1, 2):
            v = raw.copy()
            for _ in range(abs(steps)):
                v = np.nextafter(v, np.inf if steps > 0 else -np.inf)
            block = df.sample(len(v), replace=True, random_state=j).reset_index(drop=True)
            block[NUMERIC[j]] = v
            rows.append(block)
    # The imputers' fill values themselves (their scaled forms are the classic near-zero case).
    fills = num[0].statistics_
    block = df.sample(len(NUMERIC), random_state=0).reset_index(drop=True)
    for j in range(len(NUMERIC)):
        block.loc[j, NUMERIC[j]] = fills[j]
    rows.append(block)
    return pd.concat(rows, ignore_index=True)


MODELS = {
    "hgb": lambda: HistGradientBoostingClassifier(max_iter=30, random_state=0),
    "rf": lambda: RandomForestClassifier(n_estimators=15, max_depth=10, random_state=0),
    "gbc": lambda: GradientBoostingClassifier(n_estimators=15, random_state=0),
    "gbc-small": lambda: GradientBoostingClassifier(n_estimators=4, max_depth=2, random_state=0),
}
#: How each reads the scaled features: HistGradientBoosting compares float64, so its splits fold
#: onto the raw columns; scikit-learn's other trees compare float32(v), which the host replays
#: where each feature is compared often enough per row (compiler/trees/cost.py), and a small
#: ensemble's splits fold.
READS = {"hgb": "folded", "rf": "replayed", "gbc": "replayed", "gbc-small": "folded"}


@pytest.mark.parametrize("scaler", sorted(SCALERS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_splits_behind_imputer_and_scaler_decide_as_the_source(scaler: str, model: str) -> None:
    df = _frame(6000, 0)
    pipe = _pipeline(SCALERS[scaler], MODELS[model]()).fit(df, _target(df))
    compiled = compiler.compile(pipe, options=compiler.CompileOptions(max_batch=64))
    replayed = READS[model] == "replayed"
    how = "the host replays in float32" if replayed else "folded into thresholds"
    assert how in " ".join(s.detail for s in compiled.report.steps)
    probe = pd.concat([_on_thresholds(pipe, df), _frame(2000, 1)], ignore_index=True)
    np.testing.assert_array_equal(compiled.predict(probe), pipe.predict(probe))
    np.testing.assert_allclose(
        compiled.predict_proba(probe), pipe.predict_proba(probe), rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("strategy", ["traversal", "bitvector", "hybrid", "treewise"])
def test_every_tree_strategy_reads_the_folded_splits(strategy: str) -> None:
    df = _frame(3000, 2)
    model = HistGradientBoostingClassifier(max_iter=10, max_depth=4, random_state=0)
    pipe = _pipeline(StandardScaler, model).fit(df, _target(df))
    options = compiler.CompileOptions(max_batch=64, tree_strategy=strategy, host_rows=0)
    compiled = compiler.compile(pipe, options=options)
    probe = pd.concat([_on_thresholds(pipe, df), _frame(500, 3)], ignore_index=True)
    np.testing.assert_array_equal(compiled.predict(probe), pipe.predict(probe))


def test_regressors_and_isolation_forest_behind_scalers() -> None:
    df = _frame(3000, 4)
    y = df["score"].fillna(0).to_numpy() + df["count"].fillna(0).to_numpy()
    for model in (
        HistGradientBoostingRegressor(max_iter=20, random_state=0),
        ExtraTreesRegressor(n_estimators=10, max_depth=8, random_state=0),
    ):
        pipe = _pipeline(StandardScaler, model).fit(df, y)
        compiled = compiler.compile(pipe, options=compiler.CompileOptions(max_batch=64))
        probe = pd.concat([_on_thresholds(pipe, df), _frame(500, 5)], ignore_index=True)
        np.testing.assert_allclose(
            compiled.predict(probe), pipe.predict(probe), rtol=1e-6, atol=1e-5
        )
    pipe = _pipeline(RobustScaler, IsolationForest(n_estimators=20, random_state=0)).fit(df)
    compiled = compiler.compile(pipe, options=compiler.CompileOptions(max_batch=64))
    probe = pd.concat([_on_thresholds(pipe, df), _frame(500, 6)], ignore_index=True)
    np.testing.assert_array_equal(compiled.predict(probe), pipe.predict(probe))
    np.testing.assert_allclose(compiled.score_samples(probe), pipe.score_samples(probe), rtol=1e-6)


def test_raw_columns_of_a_float64_comparing_source_are_compared_in_float64() -> None:
    """HistGradientBoosting on raw columns: a float64 value just above a threshold goes right
    (a float32 input would round it onto the threshold)."""
    rng = np.random.default_rng(7)
    x = np.round(rng.normal(size=(4000, 3)), 4)
    y = (x[:, 0] + np.sin(3 * x[:, 1]) > 0).astype(int)
    model = HistGradientBoostingClassifier(max_iter=20, random_state=0).fit(x, y)
    compiled = compiler.compile(model, options=compiler.CompileOptions(max_batch=64))
    t = np.unique(
        [
            (int(n["feature_idx"]), float(n["num_threshold"]))
            for it in model._predictors
            for p in it
            for n in p.nodes
            if not n["is_leaf"]
        ],
        axis=0,
    )
    rows = np.tile(x[:1], (len(t) * 3, 1))
    for i, (f, v) in enumerate(t):
        for k, w in enumerate((v, np.nextafter(v, np.inf), np.nextafter(v, -np.inf))):
            rows[3 * i + k, int(f)] = w
    np.testing.assert_array_equal(compiled.predict(rows), model.predict(rows))
