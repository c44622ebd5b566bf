"""HistGradientBoosting's categorical splits explained: path-dependent TreeSHAP by its
definition (every coalition's expected output, absent features following the training counts),
computed here by brute force, on rows with missing and unknown categories; attributed to the
string column an OrdinalEncoder read."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OrdinalEncoder

import compiler

EXPLAIN = compiler.CompileOptions(explain=True, warmup=False, backend="numpy")


def _goes_left(node: Any, v: float, bitsets: np.ndarray) -> bool:
    """A HistGradientBoosting node's decision on the preprocessed value ``v``."""
    if np.isnan(v):
        return bool(node["missing_go_to_left"])
    if node["is_categorical"]:
        code = int(v)
        word = bitsets[node["bitset_idx"]][code // 32]
        return bool((int(word) >> (code % 32)) & 1)
    return bool(v <= node["num_threshold"])


def _expected(nodes: np.ndarray, bitsets: np.ndarray, row: np.ndarray, known: frozenset) -> float:
    """The tree's expected output when only the features in ``known`` are the row's: the
    others follow both branches, weighted by the training counts."""

    def value(i: int) -> float:
        node = nodes[i]
        if node["is_leaf"]:
            return float(node["value"])
        left, right = int(node["left"]), int(node["right"])
        if int(node["feature_idx"]) in known:
            return value(left if _goes_left(node, row[node["feature_idx"]], bitsets) else right)
        counts = nodes[left]["count"], nodes[right]["count"]
        return (counts[0] * value(left) + counts[1] * value(right)) / sum(counts)

    return value(0)


def _shapley(model: Any, rows: np.ndarray) -> np.ndarray:
    """(n, F, K): Shapley values of the preprocessed features, by enumerating coalitions."""
    features = rows.shape[1]
    k = model.n_trees_per_iteration_
    out = np.zeros((len(rows), features, k))
    weight = [
        math.factorial(s) * math.factorial(features - s - 1) / math.factorial(features)
        for s in range(features)
    ]
    for iteration in model._predictors:
        for j, predictor in enumerate(iteration):
            nodes, bitsets = predictor.nodes, predictor.raw_left_cat_bitsets
            for n, row in enumerate(rows):
                coalitions = [
                    frozenset(s)
                    for size in range(features + 1)
                    for s in itertools.combinations(range(features), size)
                ]
                value = {s: _expected(nodes, bitsets, row, s) for s in coalitions}
                for i in range(features):
                    out[n, i, j] += sum(
                        weight[len(s)] * (value[s | {i}] - v)
                        for s, v in value.items()
                        if i not in s
                    )
    return out


def _preprocessed(model: Any, rows: Any) -> tuple[np.ndarray, list[int]]:
    """The matrix the trees read (categorical columns first, as codes), and the input column
    of each of its columns."""
    mask = model.is_categorical_
    return model._preprocessor.transform(rows), [*np.flatnonzero(mask), *np.flatnonzero(~mask)]


def _rows(n: int, seed: int) -> np.ndarray:
    """Category codes 0..4 and 0..2 (missing in a tenth), and a decimal column."""
    rng = np.random.default_rng(seed)
    x = np.column_stack(
        [rng.integers(0, 5, n), rng.normal(size=n).round(2), rng.integers(0, 3, n)]
    ).astype(np.float64)
    x[rng.random(n) < 0.1, 0] = np.nan
    return x


def test_categorical_splits_match_the_definition() -> None:
    x = _rows(600, 0)
    y = (np.nan_to_num(x[:, 0], nan=1) % 2 == 0) ^ (x[:, 1] > 0) ^ (x[:, 2] == 1)
    model = HistGradientBoostingClassifier(
        categorical_features=[0, 2], max_iter=8, random_state=0
    ).fit(x, y)
    rows = x[:40].copy()
    rows[0, 0] = 7.0  # a category never seen in training: goes where missing values go
    rows[1, 2] = np.nan
    compiled = compiler.compile(model, options=EXPLAIN)
    got = compiled.contributions(rows)
    np.testing.assert_allclose(got.sum(axis=1), model.decision_function(rows), atol=1e-12)
    xp, order = _preprocessed(model, rows)
    want = _shapley(model, xp)[:, :, 0]
    np.testing.assert_allclose(got[:, order], want, rtol=0, atol=1e-12)


def test_multiclass_and_regression_categorical_splits_match_the_definition() -> None:
    x = _rows(600, 1)
    label = (np.nan_to_num(x[:, 0], nan=0) + (x[:, 1] > 0)).astype(int) % 3
    classifier = HistGradientBoostingClassifier(
        categorical_features=[0, 2], max_iter=4, random_state=0
    ).fit(x, label)
    regressor = HistGradientBoostingRegressor(
        categorical_features=[0, 2], max_iter=6, random_state=0
    ).fit(x, label * 2.0 + x[:, 1])
    rows = x[:25]
    for model, raw in (
        (classifier, classifier.decision_function(rows)),
        (regressor, regressor.predict(rows)),
    ):
        got = compiler.compile(model, options=EXPLAIN).contributions(rows)
        np.testing.assert_allclose(got.sum(axis=1), raw, atol=1e-12)
        xp, order = _preprocessed(model, rows)
        want = _shapley(model, xp)
        got = got if got.ndim == 3 else got[:, :, np.newaxis]
        np.testing.assert_allclose(got[:, order], want, rtol=0, atol=1e-12)


def test_a_string_column_ordinal_encoded_for_categorical_splits_is_explained_by_itself() -> None:
    """The OrdinalEncoder's codes are the string column's: its contribution is theirs."""
    rng = np.random.default_rng(2)
    n = 600
    frame = pd.DataFrame(
        {
            "plan": rng.choice(["free", "pro", "team", "enterprise"], n),
            "amount": rng.lognormal(2.0, 1.0, n).round(2),
        }
    )
    y = frame["plan"].isin(["pro", "team"]) ^ (frame["amount"] > 8)
    pre = ColumnTransformer(
        [
            ("cat", OrdinalEncoder(), ["plan"]),
            ("num", "passthrough", ["amount"]),
        ]
    ).set_output(transform="pandas")
    pipe = make_pipeline(
        pre,
        HistGradientBoostingClassifier(
            categorical_features=["cat__plan"], max_iter=8, random_state=0
        ),
    ).fit(frame, y)
    compiled = compiler.compile(pipe, options=EXPLAIN)
    assert compiled.contribution_columns == ("plan", "amount", "bias")
    rows = frame.iloc[:30]
    got = compiled.contributions(rows)
    np.testing.assert_allclose(got.sum(axis=1), pipe.decision_function(rows), atol=1e-12)
    xp, order = _preprocessed(pipe[-1], pipe[0].transform(rows))
    want = _shapley(pipe[-1], xp)[:, :, 0]
    np.testing.assert_allclose(got[:, order], want, rtol=0, atol=1e-12)


def test_the_device_formulation_agrees_with_the_host_kernel() -> None:
    x = _rows(400, 3)
    y = (np.nan_to_num(x[:, 0], nan=1) % 2 == 0) ^ (x[:, 1] > 0)
    model = HistGradientBoostingClassifier(
        categorical_features=[0, 2], max_iter=5, random_state=0
    ).fit(x, y)
    device = compiler.CompileOptions(explain=True, warmup=False, host_rows=0)
    on_device = compiler.compile(model, options=device).contributions(x)
    on_host = compiler.compile(model, options=EXPLAIN).contributions(x)
    np.testing.assert_allclose(on_device, on_host, rtol=0, atol=1e-12)
