"""MeanShift and the weighted neighbour metrics (seuclidean, mahalanobis) on integer data with
repeated rows and exact ties — beyond what the generated conformance suite probes."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import MeanShift
from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor

import compiler

F64 = compiler.CompileOptions(backend="interpreter", dtype="float64")
RNG = np.random.default_rng(21)
X = RNG.integers(0, 5, (150, 3)).astype(np.float64)  # repeated rows
Q = np.vstack([X, RNG.integers(-1, 6, (200, 3)).astype(np.float64)])


def test_mean_shift_predicts_the_first_nearest_center_even_on_exact_ties() -> None:
    est = MeanShift(bandwidth=2.0).fit(X)
    centers = est.cluster_centers_
    assert len(centers) >= 2
    midpoints = (centers[:-1] + centers[1:]) / 2  # equidistant from two centers
    rows = np.vstack([Q, centers, midpoints])
    model = compiler.compile(est, options=F64)
    np.testing.assert_array_equal(model.predict(rows), est.predict(rows))
    assert model.methods == ("predict",)


def test_mean_shift_float32_graph_agrees_off_ties() -> None:
    est = MeanShift(bin_seeding=True, cluster_all=False).fit(X)  # orphans: labels_ only
    model = compiler.compile(est, options=compiler.CompileOptions(max_batch=16))
    np.testing.assert_array_equal(model.predict(Q), est.predict(Q))


@pytest.mark.parametrize("weights", ["uniform", "distance"])
def test_seuclidean_one_neighbour_takes_the_first_of_equally_near_rows(weights) -> None:
    y = np.random.default_rng(9).integers(0, 3, len(X))  # duplicates carry different labels
    est = KNeighborsClassifier(
        1,
        metric="seuclidean",
        metric_params={"V": X.var(axis=0)},
        weights=weights,
        algorithm="brute",
    ).fit(X, y)
    model = compiler.compile(est, options=F64)
    np.testing.assert_array_equal(model.predict(Q), est.predict(Q))
    np.testing.assert_array_equal(model.predict_proba(Q), est.predict_proba(Q))


@pytest.mark.parametrize("params", ["VI", "V"])
def test_mahalanobis_regressor_matches_on_continuous_rows(params) -> None:
    rng = np.random.default_rng(8)
    mix = np.eye(4) + 0.5 * rng.normal(size=(4, 4))  # correlated, well-conditioned features
    x = rng.normal(size=(120, 4)) @ mix
    cov = np.cov(x.T)
    metric_params = {"VI": np.linalg.inv(cov)} if params == "VI" else {"V": cov}
    # scikit-learn's brute force takes only VI; with V its ball tree computes VI = inv(V)
    algorithm = "brute" if params == "VI" else "ball_tree"
    est = KNeighborsRegressor(
        5,
        metric="mahalanobis",
        metric_params=metric_params,
        weights="distance",
        algorithm=algorithm,
    ).fit(x, x @ [1.0, -1.0, 2.0, 0.5])
    queries = np.vstack([x, rng.normal(size=(50, 4)) @ mix])
    for options in (F64, compiler.CompileOptions(max_batch=16)):
        got = compiler.compile(est, options=options).predict(queries)
        np.testing.assert_allclose(got, est.predict(queries), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("metric", "missing"), [("seuclidean", "metric_params V"), ("mahalanobis", "VI or V")]
)
def test_weighted_metrics_without_their_matrix_are_refused(metric, missing) -> None:
    # without them scipy estimates them from each call's rows: no fixed model to compile
    est = KNeighborsRegressor(metric=metric, algorithm="brute").fit(X, X[:, 0])
    with pytest.raises(compiler.UnsupportedError, match=missing):
        compiler.compile(est, options=F64)
