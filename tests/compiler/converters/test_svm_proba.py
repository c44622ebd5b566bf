"""SVC / NuSVC ``predict_proba``: libsvm's Platt scaling and pairwise coupling, reproduced in float64
(the conformance suite covers float32 on JAX), plus the coupling alone against a port of libsvm's
``multiclass_probability`` on pairwise probabilities the data sets do not reach."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_iris, make_blobs, make_classification
from sklearn.svm import SVC, NuSVC

import compiler
import lazy as lz
from compiler.context import Context
from compiler.converters._libsvm_proba import couple
from compiler.schema import InputSchema

INTERPRETER = compiler.CompileOptions(backend="interpreter", dtype="float64")

_DATA = {
    "iris-3-classes": lambda: load_iris(return_X_y=True),
    "blobs-5-classes": lambda: make_blobs(300, 4, centers=5, cluster_std=3.0, random_state=0),
    "binary": lambda: make_classification(200, 6, random_state=1),
}
_KERNELS = {"linear": {}, "poly": {"degree": 2}, "rbf": {}, "sigmoid": {"gamma": 0.01}}


def _fit(cls: type, x: np.ndarray, y: np.ndarray, **params: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # scikit-learn 1.9 deprecates probability
        return cls(probability=True, random_state=0, **params).fit(x, y)


@pytest.mark.parametrize("kernel", _KERNELS)
@pytest.mark.parametrize("cls", [SVC, NuSVC], ids=lambda c: c.__name__)
@pytest.mark.parametrize("data", _DATA)
def test_predict_proba_matches_libsvm_in_float64(data: str, cls: type, kernel: str) -> None:
    x, y = _DATA[data]()
    est = _fit(cls, x, y, kernel=kernel, **_KERNELS[kernel])
    model = compiler.compile(est, options=INTERPRETER)
    assert "predict_proba" in model.methods
    np.testing.assert_allclose(model.predict_proba(x), est.predict_proba(x), rtol=1e-9, atol=0)


def test_two_classes_are_coupled_too_not_just_platt_scaled() -> None:
    # libsvm runs its coupling iteration for k = 2 as well; its early stop leaves p short of the
    # Platt probability by up to ~1e-3, which a Platt-only head would miss.
    x, y = _DATA["binary"]()
    est = _fit(SVC, x, y)
    decision = est.decision_function(x)  # scikit-learn's sign: -libsvm's
    platt = 1.0 / (1.0 + np.exp(-decision * est._probA[0] + est._probB[0]))
    got = compiler.compile(est, options=INTERPRETER).predict_proba(x)
    assert np.abs(got[:, 0] - np.clip(platt, 1e-7, 1 - 1e-7)).max() > 1e-4
    np.testing.assert_allclose(got, est.predict_proba(x), rtol=1e-9, atol=0)


def test_without_probability_there_is_no_predict_proba() -> None:
    x, y = _DATA["iris-3-classes"]()
    est = SVC().fit(x, y)
    assert "predict_proba" not in compiler.compile(est, options=INTERPRETER).methods
    options = compiler.CompileOptions(backend="interpreter", methods=("predict_proba",))
    with pytest.raises(compiler.UnsupportedError, match="predict_proba"):
        compiler.compile(est, options=options)


# --- the coupling alone ---------------------------------------------------------------------------


def _libsvm_coupling(r: np.ndarray) -> np.ndarray:
    """A line-by-line port of libsvm's ``multiclass_probability`` for one row of a full (k, k)
    pairwise matrix (``r[i, j]`` the probability of i over j)."""
    k = len(r)
    q = np.zeros((k, k))
    p = np.full(k, 1.0 / k)
    for t in range(k):
        for j in range(t):
            q[t, t] += r[j, t] * r[j, t]
            q[t, j] = q[j, t]
        for j in range(t + 1, k):
            q[t, t] += r[j, t] * r[j, t]
            q[t, j] = -r[j, t] * r[t, j]
    eps = 0.005 / k
    for _ in range(max(100, k)):
        qp = np.zeros(k)
        pqp = 0.0
        for t in range(k):
            for j in range(k):
                qp[t] += q[t, j] * p[j]
            pqp += p[t] * qp[t]
        if max(abs(qp[t] - pqp) for t in range(k)) < eps:
            break
        for t in range(k):
            diff = (-qp[t] + pqp) / q[t, t]
            p[t] += diff
            pqp = (pqp + diff * (diff * q[t, t] + 2 * qp[t])) / (1 + diff) / (1 + diff)
            for j in range(k):
                qp[j] = (qp[j] + diff * q[t, j]) / (1 + diff)
                p[j] /= 1 + diff
    return p


def _pairwise_rows(k: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, n_pairs) pairwise probabilities: uniform ones, clipped extremes, a contradictory cycle
    (0 beats 1 beats 2 beats 0) and the all-even row that stops before the first sweep."""
    n = k * (k - 1) // 2
    uniform = rng.uniform(1e-7, 1 - 1e-7, (rows, n))
    extremes = rng.choice([1e-7, 1 - 1e-7, 0.5, 0.01, 0.99], (rows, n))
    cycle = np.full((1, n), 0.5)
    if k >= 3:
        cycle[0, [0, 1, k - 1]] = [1 - 1e-7, 1e-7, 1 - 1e-7]  # pairs (0,1), (0,2), (1,2)
    return np.concatenate([uniform, extremes, cycle, np.full((1, n), 0.5)])


@pytest.mark.parametrize("k", [2, 3, 4, 6])
def test_coupling_matches_libsvm_row_by_row(k: int) -> None:
    # Rows stopping after 0 to 4 sweeps share a batch: each must stop exactly when libsvm does.
    b = lz.Builder()
    ctx = Context(b, compiler.CompileOptions(dtype="float64"), InputSchema((), named=False))
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    r_in = b.input("r", (len(pairs),), "float64")
    graph = b.graph({"p": couple(r_in, k, ctx)})
    rows = _pairwise_rows(k, 40, np.random.default_rng(k))
    got = lz.evaluate(graph, {"r": rows})["p"]
    for row, p in zip(rows, got, strict=True):
        full = np.zeros((k, k))
        for (i, j), value in zip(pairs, row, strict=True):
            full[i, j], full[j, i] = value, 1.0 - value
        np.testing.assert_allclose(p, _libsvm_coupling(full), rtol=1e-12, atol=1e-15)
