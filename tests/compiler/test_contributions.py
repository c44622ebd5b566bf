"""Per-column contributions (TreeSHAP) equal the source libraries' own, add up to the raw output
on every row, and are attributed to the input columns a client sends."""

from __future__ import annotations

from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest
import shap
import xgboost as xgb
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_iris, load_wine
from sklearn.decomposition import PCA
from sklearn.ensemble import (
    ExtraTreesRegressor,
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
    IsolationForest,
    RandomForestClassifier,
)
from sklearn.ensemble._iforest import _average_path_length
from sklearn.impute import SimpleImputer
from sklearn.naive_bayes import GaussianNB
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn.tree import DecisionTreeRegressor

import compiler
from compiler.errors import UnsupportedError

# The host's native kernel (buckets compile on first use: a test scores one or two batch
# sizes); test_the_device_formulation_agrees runs the XLA graph.
EXPLAIN = compiler.CompileOptions(explain=True, warmup=False, backend="numpy")


def _with_nan(x: np.ndarray, seed: int = 0) -> np.ndarray:
    """A copy with NaN in a tenth of two columns' rows."""
    x = np.array(x, np.float64)
    rng = np.random.default_rng(seed)
    for column in (1, 3):
        x[rng.random(len(x)) < 0.1, column] = np.nan
    return x


def _raw(model: Any, x: Any) -> np.ndarray:
    """The raw output contributions explain: the margin, log-odds or regression value (a forest
    classifier's class probabilities)."""
    if isinstance(model, RandomForestClassifier):
        return model.predict_proba(x)
    if hasattr(model, "decision_function"):
        return model.decision_function(x)
    return model.predict(x)


def _assert_close(got: np.ndarray, want: np.ndarray, raw: np.ndarray) -> None:
    """Within 1e-5 of the raw outputs' scale."""
    scale = max(1.0, float(np.max(np.abs(raw))))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)


def _assert_adds_up(contributions: np.ndarray, raw: np.ndarray) -> None:
    """Every row's contributions and bias sum to its raw output."""
    _assert_close(contributions.sum(axis=1), raw.reshape(contributions.sum(axis=1).shape), raw)


def _threshold_rows(model: Any, x: np.ndarray) -> np.ndarray:
    """Rows whose values sit exactly on split thresholds and one float64 step either side."""
    estimators = getattr(model, "estimators_", [model])
    trees = [e.tree_ for e in np.ravel(estimators)]
    rows = []
    for tree in trees[:5]:
        for node in np.flatnonzero(tree.children_left >= 0)[:20]:
            t = tree.threshold[node]
            for value in (t, np.nextafter(t, np.inf), np.nextafter(t, -np.inf)):
                row = x[len(rows) % len(x)].copy()
                row[tree.feature[node]] = value
                rows.append(row)
    return np.asarray(rows)


SKLEARN = [
    ("tree_diabetes", lambda: DecisionTreeRegressor(max_depth=6, random_state=0), load_diabetes),
    ("forest_iris", lambda: RandomForestClassifier(20, max_depth=6, random_state=0), load_iris),
    ("forest_digits", lambda: RandomForestClassifier(10, max_depth=5, random_state=0), load_digits),
    ("extra_diabetes", lambda: ExtraTreesRegressor(15, max_depth=6, random_state=0), load_diabetes),
    ("gbc_cancer", lambda: GradientBoostingClassifier(n_estimators=30, random_state=0), load_breast_cancer),
    ("gbr_diabetes", lambda: GradientBoostingRegressor(n_estimators=30, random_state=0), load_diabetes),
    ("hgb_wine_nan", lambda: HistGradientBoostingClassifier(max_iter=20, random_state=0), load_wine),
    ("hgbr_diabetes_nan", lambda: HistGradientBoostingRegressor(max_iter=30, random_state=0), load_diabetes),
]  # fmt: skip


@pytest.mark.parametrize(("make", "load"), [c[1:] for c in SKLEARN], ids=[c[0] for c in SKLEARN])
def test_scikit_learn_trees_match_shap(make: Any, load: Any) -> None:
    x, y = load(return_X_y=True)
    model = make()
    if isinstance(model, HistGradientBoostingClassifier | HistGradientBoostingRegressor):
        x = _with_nan(x)
    model.fit(x, y)
    compiled = compiler.compile(model, options=EXPLAIN)
    got = compiled.contributions(x)
    raw = _raw(model, x)
    _assert_adds_up(got, raw)
    explainer = shap.TreeExplainer(model)
    want = np.asarray(explainer.shap_values(x, check_additivity=False))
    _assert_close(got[:, :-1], want, raw)
    _assert_close(got[:, -1], np.broadcast_to(explainer.expected_value, got[:, -1].shape), raw)
    assert compiled.contribution_columns[-1] == "bias"
    # Float32 rows, and rows on the thresholds: decided as the source decides them.
    as32 = x.astype(np.float32)
    _assert_adds_up(compiled.contributions(as32), _raw(model, as32))
    if hasattr(model, "estimators_") or hasattr(model, "tree_"):
        edges = _threshold_rows(model, x)
        _assert_adds_up(compiled.contributions(edges), _raw(model, edges))


def test_isolation_forest_explains_its_mean_path_length_as_shap_does() -> None:
    x, _ = load_diabetes(return_X_y=True)
    model = IsolationForest(n_estimators=20, max_features=0.7, random_state=0).fit(x)
    got = compiler.compile(model, options=EXPLAIN).contributions(x)
    c = _average_path_length([model._max_samples])[0]
    depth = -np.log2(-model.score_samples(x)) * c  # score_samples = -2 ** (-E[h(x)] / c)
    _assert_adds_up(got, depth)
    explainer = shap.TreeExplainer(model)
    _assert_close(got[:, :-1], explainer.shap_values(x), depth)


def _lightgbm_frame() -> tuple[np.ndarray, np.ndarray]:
    """breast_cancer with NaN, exact zeros and an integer column LightGBM splits as categorical."""
    x, y = load_breast_cancer(return_X_y=True)
    x = _with_nan(x)
    x[::5, 7] = 0.0
    x[:, 0] = np.random.default_rng(1).integers(0, 6, len(x))
    return x, y


@pytest.mark.parametrize(
    "params",
    [{}, {"zero_as_missing": True}, {"categorical_feature": [0]}],
    ids=["nan", "zero_as_missing", "categorical"],
)
def test_lightgbm_matches_pred_contrib(params: dict[str, Any]) -> None:
    x, y = _lightgbm_frame()
    params = dict(params)
    fit = {k: params.pop(k) for k in ("categorical_feature",) if k in params}
    model = lgb.LGBMClassifier(n_estimators=40, verbose=-1, random_state=0, **params)
    model.fit(x, y, **fit)
    got = compiler.compile(model, options=EXPLAIN).contributions(x)
    raw = model.predict(x, raw_score=True)
    _assert_adds_up(got, raw)
    _assert_close(got, model.predict(x, pred_contrib=True), raw)


def test_lightgbm_multiclass_and_regression_match_pred_contrib() -> None:
    x, y = load_wine(return_X_y=True)
    model = lgb.LGBMClassifier(n_estimators=20, verbose=-1, random_state=0).fit(x, y)
    got = compiler.compile(model, options=EXPLAIN).contributions(x)  # (n, F + 1, K)
    raw = model.predict(x, raw_score=True)
    _assert_adds_up(got, raw)
    # LightGBM: (n, K · (F + 1)), class by class.
    _assert_close(
        np.transpose(got, (0, 2, 1)).reshape(len(x), -1), model.predict(x, pred_contrib=True), raw
    )
    x, y = load_diabetes(return_X_y=True)
    model = lgb.LGBMRegressor(n_estimators=30, verbose=-1, random_state=0).fit(x, y)
    got = compiler.compile(model, options=EXPLAIN).contributions(x)
    _assert_close(got, model.predict(x, pred_contrib=True), model.predict(x))


@pytest.mark.parametrize("task", ["binary", "multiclass", "regression"])
def test_xgboost_matches_pred_contribs(task: str) -> None:
    load = {"binary": load_breast_cancer, "multiclass": load_wine, "regression": load_diabetes}
    x, y = load[task](return_X_y=True)
    x = _with_nan(x)
    kind = xgb.XGBRegressor if task == "regression" else xgb.XGBClassifier
    model = kind(n_estimators=30, max_depth=4, random_state=0).fit(x, y)
    got = compiler.compile(model, options=EXPLAIN).contributions(x)
    booster = model.get_booster()
    raw = booster.predict(xgb.DMatrix(x), output_margin=True)
    _assert_adds_up(got, raw)
    want = booster.predict(xgb.DMatrix(x), pred_contribs=True)  # (n, K, F + 1) for K > 1
    _assert_close(got, np.transpose(want, (0, 2, 1)) if want.ndim == 3 else want, raw)


def _mixed_frame(n: int = 3000, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """Integer, binary and decimal columns with NaN, and a string column."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "count": rng.integers(0, 7, n).astype(float),
            "flag": rng.integers(0, 2, n).astype(float),
            "amount": np.round(rng.lognormal(2.0, 1.0, n), 2),
            "plan": rng.choice(["free", "pro", "team"], n),
        }
    )
    for column in ("count", "amount"):
        df.loc[rng.random(n) < 0.1, column] = np.nan
    y = (df["count"].fillna(3) > 2) ^ (df["plan"] == "pro") ^ (df["amount"].fillna(5) > 8)
    return df, y.to_numpy(int)


@pytest.mark.parametrize(
    "model",
    [
        HistGradientBoostingClassifier(max_iter=30, random_state=0),
        RandomForestClassifier(20, max_depth=6, random_state=0),
        GradientBoostingClassifier(n_estimators=30, random_state=0),
    ],
    ids=["hgb", "forest", "gbc"],
)
def test_a_pipeline_is_explained_by_the_columns_a_client_sends(model: Any) -> None:
    """One-hot columns are their string column, imputed and scaled ones the raw column: shap's
    values of the transformed features, summed by the column they come from."""
    df, y = _mixed_frame()
    numeric = ["count", "flag", "amount"]
    pipe = make_pipeline(
        ColumnTransformer(
            [
                ("num", make_pipeline(SimpleImputer(), StandardScaler()), numeric),
                ("cat", OneHotEncoder(handle_unknown="ignore"), ["plan"]),
            ]
        ),
        model,
    ).fit(df, y)
    compiled = compiler.compile(pipe, options=EXPLAIN)
    assert compiled.contribution_columns == ("count", "flag", "amount", "plan", "bias")
    # The report names what each column sums: "plan" the one-hot columns the trees split on.
    assert compiled.report.contributions["plan"]
    assert set(compiled.report.contributions["plan"]) <= {3, 4, 5}
    rows = df.sample(500, random_state=1)
    got = compiled.contributions(rows)
    raw = _raw(pipe[-1], pipe[:-1].transform(rows))
    _assert_adds_up(got, raw)
    transformed = pipe[:-1].transform(rows)
    want = np.asarray(shap.TreeExplainer(pipe[-1]).shap_values(transformed, check_additivity=False))
    origin = [name.split("__")[1] for name in pipe[:-1].get_feature_names_out()]
    by_column = np.stack(
        [
            want[:, [i for i, o in enumerate(origin) if o.startswith(c)]].sum(axis=1)
            for c in (*numeric, "plan")
        ],
        axis=1,
    )
    _assert_close(got[:, :-1], by_column, raw)


def test_any_max_batch_explains_in_buckets_of_its_own() -> None:
    """The explanation's buckets stop at 128 rows whatever the model's (200 is no power of two
    times 128): larger calls run in chunks."""
    x, y = load_diabetes(return_X_y=True)
    model = GradientBoostingRegressor(n_estimators=10, random_state=0).fit(x, y)
    options = compiler.CompileOptions(explain=True, backend="numpy", max_batch=200)
    _assert_adds_up(compiler.compile(model, options=options).contributions(x), model.predict(x))


def test_warm_up_places_every_bucket_of_the_explanation() -> None:
    """Unwarmed buckets would run on the backend untimed: warm-up (on first use where the
    options warm, or ``warm_explanation``) times the host kernel against the device."""
    x, y = load_breast_cancer(return_X_y=True)
    model = GradientBoostingClassifier(n_estimators=5, random_state=0).fit(x, y)
    for warmup in (True, False):
        options = compiler.CompileOptions(explain=True, max_batch=8, warmup=warmup)
        compiled = compiler.compile(model, options=options)
        if warmup:  # warmed by the first call
            compiled.contributions(x[:1])
        else:
            compiled.warm_explanation()
        plan = compiled._explainer().plan
        assert plan is not None and all(len(g.placements) == 4 for g in plan.graphs)
        _assert_adds_up(compiled.contributions(x[:20]), model.decision_function(x[:20]))


def test_an_input_column_named_bias_keeps_its_own_contribution() -> None:
    x, y = load_diabetes(return_X_y=True)
    frame = pd.DataFrame(x[:, :3], columns=["bias", "_bias", "age"])
    model = GradientBoostingRegressor(n_estimators=5, random_state=0).fit(frame, y)
    compiled = compiler.compile(model, options=EXPLAIN)
    assert compiled.contribution_columns == ("bias", "_bias", "age", "__bias")
    _assert_adds_up(compiled.contributions(frame), model.predict(frame))


def test_features_mixing_columns_are_refused_naming_them() -> None:
    x, y = load_iris(return_X_y=True)
    pipe = make_pipeline(PCA(2), GradientBoostingClassifier(n_estimators=5)).fit(x, y)
    with pytest.raises(UnsupportedError, match=r"feature 0 is computed from several"):
        compiler.compile(pipe, options=EXPLAIN)


def test_models_without_an_explanation_say_so() -> None:
    x, y = load_iris(return_X_y=True)
    with pytest.raises(UnsupportedError, match="contributions are not supported"):
        compiler.compile(GaussianNB().fit(x, y), options=EXPLAIN)
    tree = DecisionTreeRegressor(max_depth=3).fit(x, y)
    with pytest.raises(UnsupportedError, match="explain=True"):
        compiler.compile(tree).contributions(x)


@pytest.mark.parametrize(
    "model",
    [
        GradientBoostingClassifier(n_estimators=10, random_state=0),
        HistGradientBoostingClassifier(max_iter=10, random_state=0),
        RandomForestClassifier(10, max_depth=5, random_state=0),
    ],
    ids=["gbc", "hgb_nan", "forest"],
)
def test_the_device_formulation_agrees_with_the_host_kernel(model: Any) -> None:
    """The XLA graph (the explanation's device formulation) and the host's native kernel: the
    same contributions, on rows with NaN where the model takes them."""
    x, y = load_wine(return_X_y=True)
    x = _with_nan(x) if isinstance(model, HistGradientBoostingClassifier) else x
    model.fit(x, y)
    device = compiler.CompileOptions(explain=True, warmup=False, host_rows=0)
    on_device = compiler.compile(model, options=device).contributions(x)
    on_host = compiler.compile(model, options=EXPLAIN).contributions(x)
    np.testing.assert_allclose(on_device, on_host, rtol=0, atol=1e-12)
    _assert_adds_up(on_device, _raw(model, x))
