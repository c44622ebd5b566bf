"""SVC / NuSVC ``predict_proba``: libsvm's Platt scaling and pairwise coupling, reproduced in float64
(the conformance suite covers float32 on JAX). The coupling alone, on pairwise probabilities the
data sets do not reach, is tested as the ``lz.couple`` op (tests/lazy/test_coupling.py)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_iris, make_blobs, make_classification
from sklearn.svm import SVC, NuSVC

import compiler

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
