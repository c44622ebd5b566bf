"""Forests average as scikit-learn does, so that ``predict`` is its answer on tied votes too.

scikit-learn adds the trees' leaf values (class fractions, regression values) to a float64 array
one tree after another from zeros, divides by the number of trees, and predicts the first largest
class. On repeated rows with conflicting labels (any integer or binary column) many rows tie, or
tie but for that order's rounding: a sum in another order or precision then picks another class.
Where every sum is exact (vote counts, halves) any order gives scikit-learn's; otherwise the graph
adds the trees in order in float64, a float32 graph's classifier too (its compile report says so),
and the float64 means are scikit-learn's bit for bit. Bagging and soft voting average their
children's probabilities in float64 with them. IsolationForest sums path lengths likewise, and
its predict compares that sum with the edge scikit-learn's arithmetic puts between outliers and
inliers, where rows repeating a training row sit when ``offset_`` is a percentile. Hard voting
counts weighted votes as ``np.bincount`` does, in float64 where float32 would round.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_diabetes
from sklearn.ensemble import (
    BaggingClassifier,
    ExtraTreesClassifier,
    ExtraTreesRegressor,
    IsolationForest,
    RandomForestClassifier,
    RandomForestRegressor,
    VotingClassifier,
)
from sklearn.tree import DecisionTreeClassifier

import compiler
from compiler.converters.trees import _isolation_denominator, _isolation_outlier, _outlier_depths
from compiler.trees import STRATEGIES, leaf_sums_exact

#: Strategies that evaluate trees of any depth (bitvector takes 32 leaves at most).
DEEP = [s for s in STRATEGIES if s != "bitvector"]


def _repeated_rows(seed: int, rows: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Few distinct integer rows, each with labels drawn at random: impure leaves (thirds,
    fifths), and test rows whose classes tie or nearly tie."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, size=(rows, 4)).astype(np.float64)
    x[:, 3] = x[:, 3] > 2  # a binary column
    return x, rng.integers(0, classes, size=rows)


def _grid() -> np.ndarray:
    """Every distinct row of the repeated-rows domain, values between them (the splits'
    thresholds among them), and rows with NaN in one column (the fitted missing side)."""
    axes = [np.arange(-0.5, 6.0, 0.5)] * 3 + [np.array([0.0, 1.0])]
    rows = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 4)
    missing = np.repeat(rows[::97], 4, axis=0)
    missing[np.arange(len(missing)), np.arange(len(missing)) % 4] = np.nan
    return np.concatenate([rows, missing])


CLASSIFIERS = {
    # 10 trees of random labels on repeated rows: several rows' two classes tie at 0.5.
    "forest-binary": lambda: RandomForestClassifier(n_estimators=10, random_state=0),
    "forest-thirds": lambda: RandomForestClassifier(
        n_estimators=12, min_samples_leaf=3, random_state=1
    ),
    "extra-trees-3-classes": lambda: ExtraTreesClassifier(n_estimators=9, random_state=2),
    "tree-weighted": lambda: DecisionTreeClassifier(min_samples_leaf=3, random_state=0),
    # Ensembles averaging their children's probabilities: promoted to float64, children too.
    "bagging-thirds": lambda: BaggingClassifier(
        DecisionTreeClassifier(min_samples_leaf=3), n_estimators=12, random_state=0
    ),
    "voting-soft": lambda: VotingClassifier(
        [
            ("a", RandomForestClassifier(n_estimators=5, random_state=0)),
            ("b", ExtraTreesClassifier(n_estimators=7, min_samples_leaf=2, random_state=1)),
        ],
        voting="soft",
    ),
}
FORESTS = sorted(k for k in CLASSIFIERS if not k.startswith(("bagging", "voting")))


@cache
def _classifier(kind: str) -> tuple[Any, np.ndarray]:
    classes = 3 if "3-classes" in kind else 2
    x, y = _repeated_rows(len(kind), 1500, classes)
    weights = np.random.default_rng(0).uniform(0.5, 2.0, len(y)) if "weighted" in kind else None
    return CLASSIFIERS[kind]().fit(x, y, sample_weight=weights), x


def test_the_domain_has_tied_rows() -> None:
    """The data this file relies on: rows whose scikit-learn probabilities tie exactly."""
    est, _ = _classifier("forest-binary")
    proba = np.sort(est.predict_proba(_grid()), axis=1)
    assert np.sum(proba[:, -1] == proba[:, -2]) > 10


@pytest.mark.parametrize("backend", ["jax", "numpy"])
@pytest.mark.parametrize("strategy", DEEP)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", sorted(CLASSIFIERS))
def test_forest_classifiers_predict_scikit_learns_class_on_ties(
    kind: str, dtype: str, strategy: str, backend: str
) -> None:
    est, x = _classifier(kind)
    options = compiler.CompileOptions(
        dtype=dtype, tree_strategy=strategy, backend=backend, max_batch=64, warmup=False
    )
    model = compiler.compile(est, sample=x[:50], options=options)
    rows = _grid()
    for batch in (rows, rows.astype(np.float32)):
        np.testing.assert_array_equal(model.predict(batch), est.predict(batch))
        expected = est.predict_proba(batch)
        got = model.predict_proba(batch)
        if dtype == "float64":
            np.testing.assert_array_equal(got, expected)
        else:
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def _sums_in_float64(model: compiler.CompiledModel) -> bool:
    return "summed in float64" in model.report.steps[-1].detail


@pytest.mark.parametrize("kind", FORESTS)
def test_a_float32_graph_sums_in_float64_where_float32_sums_are_not_exact(kind: str) -> None:
    """Only the sums: nothing is promoted. A single tree's leaves are not summed: float32 needs
    only to keep each leaf's first largest class, which these weighted fractions do."""
    est, x = _classifier(kind)
    model = compiler.compile(est, sample=x[:50])
    assert model.report.promoted == {}
    assert _sums_in_float64(model) is not kind.startswith("tree")


def test_pure_leaves_stay_in_float32() -> None:
    """Fully grown trees on distinct rows: every leaf a whole vote, every sum exact."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(800, 5))
    y = (x[:, 0] + rng.normal(size=800) > 0).astype(int)
    est = RandomForestClassifier(n_estimators=24, random_state=0).fit(x, y)
    model = compiler.compile(est, sample=x[:50])
    assert not _sums_in_float64(model)
    rows = rng.normal(size=(3000, 5))
    assert np.sum(est.predict_proba(rows)[:, 0] == 0.5) > 10  # 12 votes each
    np.testing.assert_array_equal(model.predict(rows), est.predict(rows))


@pytest.mark.parametrize("backend", ["jax", "numpy"])
@pytest.mark.parametrize("strategy", DEEP)
@pytest.mark.parametrize("cls", [RandomForestRegressor, ExtraTreesRegressor])
def test_forest_regressors_in_float64_are_bit_for_bit(
    cls: type, strategy: str, backend: str
) -> None:
    x, y = load_diabetes(return_X_y=True)
    targets = np.stack([y, np.round(y / 7.0)], axis=1)  # multi-output, one of repeated values
    est = cls(n_estimators=15, min_samples_leaf=2, random_state=0).fit(x, targets)
    options = compiler.CompileOptions(
        dtype="float64", tree_strategy=strategy, backend=backend, max_batch=64, warmup=False
    )
    model = compiler.compile(est, sample=x[:50], options=options)
    for rows in (x, x.astype(np.float32)):
        np.testing.assert_array_equal(model.predict(rows), est.predict(rows))


@pytest.mark.parametrize(
    ("leaves", "dtype", "exact"),
    [
        ([np.array([[1.0, 0.0], [0.0, 1.0]])] * 100, "float32", True),  # votes
        ([np.array([[0.5, 0.5], [0.25, 0.75]])] * 100, "float32", True),  # quarters
        ([np.array([[1 / 3, 2 / 3]])] * 2, "float64", False),  # thirds
        ([np.array([[1.0, 2.0**-30]])] * 2, "float32", False),  # 1 + 2**-30 needs 31 bits
        ([np.array([[1.0, 2.0**-30]])] * 2, "float64", True),
        ([np.array([[2.0**24]]), np.array([[1.0]])], "float32", False),  # 2**24 + 1
        ([np.array([[np.inf]])], "float64", False),
        ([np.zeros((3, 2))], "float32", True),
    ],
)
def test_leaf_sums_exact(leaves: list[np.ndarray], dtype: str, exact: bool) -> None:
    assert leaf_sums_exact(leaves, dtype) is exact


@pytest.mark.parametrize("kind", ["bagging-thirds", "voting-soft"])
def test_ensembles_of_probabilities_compute_in_float64_with_their_children(kind: str) -> None:
    est, x = _classifier(kind)
    model = compiler.compile(est, sample=x[:50])
    promoted = model.report.promoted
    assert promoted["model"].startswith("predict is the first largest")
    inside = [path for path, why in promoted.items() if why == "inside model"]
    assert len(inside) >= 2
    rows = _grid()
    np.testing.assert_array_equal(model.predict(rows), est.predict(rows))
    np.testing.assert_array_equal(model.predict_proba(rows), est.predict_proba(rows))


@pytest.mark.parametrize("backend", ["jax", "numpy"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("weights", [[0.1, 0.2, 0.3], [1.0, 2.0, 0.5], None])
def test_hard_voting_counts_weights_as_bincount_does(
    weights: list[float] | None, dtype: str, backend: str
) -> None:
    """np.bincount adds the weights in float64: 0.1 + 0.2 > 0.3 there, not in float32."""
    x, y = _repeated_rows(7, 1500, 3)
    children = [
        (f"tree{i}", DecisionTreeClassifier(max_depth=3, max_features=1, random_state=i))
        for i in range(3)
    ]
    est = VotingClassifier(children, voting="hard", weights=weights).fit(x, y)
    options = compiler.CompileOptions(dtype=dtype, backend=backend, warmup=False)
    model = compiler.compile(est, sample=x[:50], options=options)
    for rows in (x, _grid()):
        np.testing.assert_array_equal(model.predict(rows), est.predict(rows))


@cache
def _isolation(contamination: float | str, seed: int) -> tuple[IsolationForest, np.ndarray]:
    x, _ = _repeated_rows(seed, 2000, 2)
    est = IsolationForest(n_estimators=50, contamination=contamination, random_state=seed)
    return est.fit(x), x


@pytest.mark.parametrize("backend", ["jax", "numpy"])
@pytest.mark.parametrize("strategy", DEEP)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("contamination", "seed"), [(0.1, 2), (0.05, 0), ("auto", 1)])
def test_isolation_forest_predicts_scikit_learns_answer_on_its_edge(
    contamination: float | str, seed: int, dtype: str, strategy: str, backend: str
) -> None:
    est, x = _isolation(contamination, seed)
    if contamination != "auto":  # the training rows repeating the percentile's row
        assert np.sum(est.decision_function(x) == 0) > 5
    options = compiler.CompileOptions(
        dtype=dtype, tree_strategy=strategy, backend=backend, max_batch=256, warmup=False
    )
    model = compiler.compile(est, sample=x[:50], options=options)
    for rows in (x, _grid(), x.astype(np.float32)):
        np.testing.assert_array_equal(model.predict(rows), est.predict(rows))
        tolerance = 1e-15 if dtype == "float64" else 1e-7
        np.testing.assert_allclose(
            model.decision_function(rows), est.decision_function(rows), rtol=0, atol=tolerance
        )


def test_isolation_forest_of_one_sample_trees_scores_as_scikit_learn() -> None:
    """Every tree grown on one sample: scikit-learn's exponent is -1 (score -0.5), all inliers."""
    x = np.random.default_rng(0).normal(size=(50, 2))
    est = IsolationForest(max_samples=1, n_estimators=3, random_state=0).fit(x)
    model = compiler.compile(est, sample=x[:5])
    np.testing.assert_array_equal(model.score_samples(x), est.score_samples(x))
    np.testing.assert_array_equal(model.predict(x), est.predict(x))


@pytest.mark.parametrize("contamination", [0.1, 0.05, "auto"])
def test_the_outlier_edge_is_scikit_learns(contamination: float | str) -> None:
    est, _ = _isolation(contamination, 0)
    denominator = _isolation_denominator(est)
    edge = _outlier_depths(est, denominator)
    above = np.nextafter(edge, np.inf)
    assert _isolation_outlier(est, np.array([edge]), denominator)[0]
    assert not _isolation_outlier(est, np.array([above]), denominator)[0]
