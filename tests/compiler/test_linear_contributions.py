"""Linear models' contributions: interventional SHAP against the training rows (where the
scalers and imputers record the features' means) or the sample rows, equal to
``shap.LinearExplainer``'s with the same background, summed by the input column a client sends,
and adding up to the raw output on every row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import shap
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris, load_wine
from sklearn.decomposition import PCA
from sklearn.impute import SimpleImputer
from sklearn.linear_model import (
    LinearRegression,
    LogisticRegression,
    PoissonRegressor,
    Ridge,
    SGDClassifier,
)
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import (
    KBinsDiscretizer,
    OneHotEncoder,
    PolynomialFeatures,
    StandardScaler,
)
from sklearn.svm import LinearSVC

import compiler
from compiler.errors import UnsupportedError
from tests.compiler.test_contributions import _mixed_frame

EXPLAIN = compiler.CompileOptions(explain=True, warmup=False, backend="numpy")


def _raw(model: Any, x: Any) -> np.ndarray:
    """A pipeline's raw output: the decision function, or the linear predictor of a GLM."""
    if hasattr(model, "decision_function"):
        return model.decision_function(x)
    if isinstance(model[-1], PoissonRegressor):
        return np.log(model.predict(x))
    return model.predict(x)


def _linear_shap(model: Any, background: np.ndarray, x: np.ndarray) -> np.ndarray:
    """shap's interventional values (n, F) or (n, F, K), every background row in the mean
    (shap's own masker samples 100 of them by default)."""
    masker = shap.maskers.Independent(background, max_samples=len(background))
    values = np.asarray(shap.LinearExplainer(model, masker).shap_values(x))
    return values[:, :, 0] if values.ndim == 3 and values.shape[2] == 1 else values


def _assert_close(got: np.ndarray, want: np.ndarray, raw: np.ndarray, atol: float) -> None:
    scale = max(1.0, float(np.max(np.abs(raw))))
    np.testing.assert_allclose(got, want, rtol=0, atol=atol * scale)


def _assert_adds_up(contributions: np.ndarray, raw: np.ndarray, atol: float = 1e-12) -> None:
    total = contributions.sum(axis=1)
    _assert_close(total, raw.reshape(total.shape), raw, atol)


CASES = [
    ("logistic_breast_cancer", lambda: LogisticRegression(max_iter=5000), load_breast_cancer),
    ("logistic_iris", lambda: LogisticRegression(max_iter=1000), load_iris),
    ("logistic_wine", lambda: LogisticRegression(max_iter=5000), load_wine),
    ("ridge_diabetes", lambda: Ridge(alpha=0.5), load_diabetes),
    ("linear_diabetes", LinearRegression, load_diabetes),
    ("sgd_iris", lambda: SGDClassifier(random_state=0), load_iris),
    ("linear_svc_wine", lambda: LinearSVC(max_iter=20_000), load_wine),
    ("poisson_diabetes", PoissonRegressor, load_diabetes),
]


@pytest.mark.parametrize(("make", "load"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_linear_models_match_shap_against_the_sample(make: Any, load: Any) -> None:
    """Raw columns: their training means are recorded nowhere, so the sample is the background;
    scaled ones: the StandardScaler's output has training mean 0, so the training rows are
    (with or without a sample)."""
    x, y = load(return_X_y=True)
    if make is PoissonRegressor:
        y = np.round(y / 25.0)  # counts
    background = x[::3]
    raw_model = make().fit(x, y)
    compiled = compiler.compile(raw_model, sample=background, options=EXPLAIN)
    got = compiled.contributions(x)
    raw = _raw(make_pipeline(raw_model), x)
    _assert_adds_up(got, raw)
    _assert_close(got[:, :-1], _linear_shap(raw_model, background, x), raw, 1e-12)

    pipe = make_pipeline(StandardScaler(), make()).fit(x, y)
    scaled = pipe[0].transform(x)
    want = _linear_shap(pipe[-1], scaled, scaled)  # the training rows as background
    raw = _raw(pipe, x)
    for sample in (None, background):
        compiled = compiler.compile(pipe, sample=sample, options=EXPLAIN)
        assert "against the training rows" in compiled.report.steps[-1].detail
        got = compiled.contributions(x)
        _assert_adds_up(got, raw)
        _assert_close(got[:, :-1], want, raw, 1e-12)


def _by_column(pipe: Any, values: np.ndarray, columns: list[str]) -> np.ndarray:
    """shap's values of the transformed features summed by the input column of each (one-hot
    columns ``plan_pro``, indicators ``missingindicator_count``)."""
    origin = [name.split("__")[1] for name in pipe[:-1].get_feature_names_out()]
    origin = [o.removeprefix("missingindicator_") for o in origin]
    return np.stack(
        [
            values[:, [i for i, o in enumerate(origin) if o.startswith(c)]].sum(axis=1)
            for c in columns
        ],
        axis=1,
    )


@pytest.mark.parametrize("indicator", [False, True], ids=["impute", "impute_with_indicator"])
def test_a_pipeline_is_explained_by_the_columns_a_client_sends(indicator: bool) -> None:
    """One-hot columns count for their string column; an imputed, scaled column and its
    missing-value indicator for the raw column; centred on the sample's rows."""
    df, y = _mixed_frame(2000)
    numeric = ["count", "flag", "amount"]
    pipe = make_pipeline(
        ColumnTransformer(
            [
                (
                    "num",
                    make_pipeline(SimpleImputer(add_indicator=indicator), StandardScaler()),
                    numeric,
                ),
                ("cat", OneHotEncoder(handle_unknown="ignore"), ["plan"]),
            ]
        ),
        LogisticRegression(max_iter=1000),
    ).fit(df, y)
    background = df.sample(300, random_state=2)
    compiled = compiler.compile(pipe, sample=background, options=EXPLAIN)
    assert compiled.contribution_columns == ("count", "flag", "amount", "plan", "bias")
    rows = df.sample(500, random_state=1)
    got = compiled.contributions(rows)
    raw = pipe.decision_function(rows)
    _assert_adds_up(got, raw)
    transformed = pipe[:-1].transform(rows)
    want = _linear_shap(pipe[-1], pipe[:-1].transform(background), transformed)
    _assert_close(got[:, :-1], _by_column(pipe, want, [*numeric, "plan"]), raw, 1e-12)
    # Float32 rows are explained as the source computes them (float32 scaling).
    floats = rows[numeric].astype(np.float32).assign(plan=rows["plan"])
    _assert_adds_up(compiled.contributions(floats), pipe.decision_function(floats), 1e-6)


def test_binned_columns_are_explained_by_their_column() -> None:
    """A column's part need not be linear in it (bins, one-hot of bins): still one input
    column's, so its Shapley value is the part minus its mean."""
    x, y = load_breast_cancer(return_X_y=True)
    pipe = make_pipeline(
        KBinsDiscretizer(n_bins=5, encode="onehot-dense", quantile_method="averaged_inverted_cdf"),
        LogisticRegression(max_iter=5000),
    ).fit(x, y)
    # Rows exactly on bin edges, where a float32 graph would put a value in the next bin.
    edges = pipe[0].bin_edges_
    rows = np.repeat(x[:10], 3, axis=0)
    for j in range(x.shape[1]):
        rows[:, j] = np.resize(edges[j][1:-1], len(rows))
    compiled = compiler.compile(pipe, sample=x, options=EXPLAIN)
    got = compiled.contributions(rows)
    raw = pipe.decision_function(rows)
    _assert_adds_up(got, raw)
    binned = pipe[0].transform(rows)
    want = _linear_shap(pipe[-1], pipe[0].transform(x), binned)
    per_column = want.reshape(len(rows), x.shape[1], -1).sum(axis=2)
    _assert_close(got[:, :-1], per_column, raw, 1e-12)


def test_mean_imputed_columns_are_centred_on_their_training_means() -> None:
    """A mean imputer's output keeps the training mean of the observed values."""
    x, y = load_diabetes(return_X_y=True)
    x = x.copy()
    x[np.random.default_rng(0).random(x.shape) < 0.1] = np.nan
    pipe = make_pipeline(SimpleImputer(), Ridge()).fit(x, y)
    compiled = compiler.compile(pipe, options=EXPLAIN)
    got = compiled.contributions(x)
    raw = pipe.predict(x)
    _assert_adds_up(got, raw)
    imputed = pipe[0].transform(x)
    _assert_close(got[:, :-1], _linear_shap(pipe[-1], imputed, imputed), raw, 1e-12)


def test_a_linear_model_needs_background_rows() -> None:
    """Raw columns (or a median imputer's) record no training mean."""
    x, y = load_iris(return_X_y=True)
    for model in (
        LogisticRegression(max_iter=1000),
        make_pipeline(SimpleImputer(strategy="median"), LogisticRegression(max_iter=1000)),
    ):
        model.fit(x, y)
        for sample in (None, x[:0]):
            with pytest.raises(UnsupportedError, match=r"background rows.*sample"):
                compiler.compile(model, sample=sample, options=EXPLAIN)


@pytest.mark.parametrize("whiten", [False, True])
def test_a_projection_before_the_linear_model_is_read_through(whiten: bool) -> None:
    """Scaled columns, a PCA, a logistic regression: additive in the scaled columns, with
    coefficients ``components_.T @ coef_``; shap's values of that linear map on them."""
    x, y = load_wine(return_X_y=True)
    pipe = make_pipeline(
        StandardScaler(), PCA(5, whiten=whiten), LogisticRegression(max_iter=5000)
    ).fit(x, y)
    background = x[::4]
    compiled = compiler.compile(pipe, sample=background, options=EXPLAIN)
    got = compiled.contributions(x)
    raw = pipe.decision_function(x)
    _assert_adds_up(got, raw)
    scaled, pca, lr = pipe[0].transform(x), pipe[1], pipe[2]
    projection = pca.components_.T
    if whiten:
        projection = projection / np.sqrt(pca.explained_variance_)
    beta = projection @ lr.coef_.T  # (columns, classes)
    intercept = lr.intercept_ - pca.mean_ @ beta
    want = _linear_shap((beta.T, intercept), pipe[0].transform(background), scaled)
    _assert_close(got[:, :-1], want, raw, 1e-12)


def test_features_mixing_columns_other_than_linearly_are_refused() -> None:
    x, y = load_iris(return_X_y=True)
    products = PolynomialFeatures(2, interaction_only=True, include_bias=False)
    pipe = make_pipeline(products, LogisticRegression(max_iter=1000)).fit(x, y)
    with pytest.raises(UnsupportedError, match=r"feature \d+ is computed from several"):
        compiler.compile(pipe, sample=x, options=EXPLAIN)


def test_predictions_are_unchanged_by_explaining() -> None:
    """Explaining reads the float64 input table; predictions stay the source's."""
    x, y = load_breast_cancer(return_X_y=True)
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(x, y)
    compiled = compiler.compile(pipe, sample=x[:50], options=EXPLAIN)
    assert (compiled.predict(x) == pipe.predict(x)).all()
    np.testing.assert_allclose(compiled.predict_proba(x), pipe.predict_proba(x), atol=1e-6)


def test_the_device_formulation_agrees() -> None:
    """XLA and the numpy backend explain alike."""
    df, y = _mixed_frame(500)
    pipe = make_pipeline(
        ColumnTransformer(
            [
                ("num", make_pipeline(SimpleImputer(), StandardScaler()), ["count", "amount"]),
                ("cat", OneHotEncoder(handle_unknown="ignore"), ["plan"]),
            ]
        ),
        LogisticRegression(max_iter=1000),
    ).fit(df, y)
    device = compiler.CompileOptions(explain=True, warmup=False, host_rows=0)
    on_device = compiler.compile(pipe, sample=df, options=device).contributions(df)
    on_host = compiler.compile(pipe, sample=df, options=EXPLAIN).contributions(df)
    np.testing.assert_allclose(on_device, on_host, rtol=0, atol=1e-12)
