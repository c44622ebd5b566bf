"""Kernel SVMs in float32 on the JAX backend: their dual sums cancel, and must still be as correct
as the float64 source (pipeline j of the scoring benchmark lost 1e-4 on decisions, 4e-3 on
probabilities, to float32 matmul rounding before :mod:`compiler.converters._split_sum`)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.decomposition import PCA
from sklearn.pipeline import make_pipeline
from sklearn.svm import SVC, SVR, OneClassSVM

import compiler
import lazy as lz
from compiler.context import Context
from compiler.converters._split_sum import bounded_matmul
from compiler.schema import InputSchema
from lazy.shapes import is_batched, static_size

FLOAT32 = compiler.CompileOptions(warmup=False)  # JAX, float32: the production path


@pytest.fixture(scope="module")
def pca_svc() -> tuple[Any, np.ndarray]:
    """PCA + SVC(rbf, probability=True) on noisy 3-class data with features in the thousands:
    ~1300 support vectors, most at ±C, so each decision sums terms ~100× its own size."""
    x, y = make_classification(
        3000, 20, n_informative=8, n_redundant=4, n_classes=3, flip_y=0.2, random_state=0
    )
    x = (x * 1e3).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # scikit-learn 1.9 deprecates probability
        svc = SVC(kernel="rbf", probability=True, random_state=0)
        est = make_pipeline(PCA(10, random_state=0), svc).fit(x[:2000], y[:2000])
    return est, x[2000:]


def test_pca_svc_probabilities_are_exact_to_float32_rounding(pca_svc: tuple[Any, np.ndarray]):
    est, x = pca_svc
    model = compiler.compile(est, options=FLOAT32)
    got, want = model.predict_proba(x), est.predict_proba(x)
    assert np.abs(got - want).max() <= 1e-5  # was 3e-5 with a plain float32 matmul
    np.testing.assert_array_equal(got.argmax(axis=1), want.argmax(axis=1))
    decision = model.decision_function(x)
    assert np.abs(decision - est.decision_function(x)).max() <= 1e-5  # was 2e-5
    np.testing.assert_array_equal(model.predict(x), est.predict(x))


def _cancelling(n: int, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Kernel-like values in (0, 1] and ±1 weights (a few free ones) summing to ~0 per row."""
    k = rng.uniform(0.2, 1.0, (rows, n))
    w = rng.choice([-1.0, 1.0], (n, 2))
    w[: n // 10] = rng.uniform(-1.0, 1.0, (n // 10, 2))  # free dual coefficients
    return k.astype(np.float32), w


def _bounded_graph(n: int, w: np.ndarray) -> lz.Graph:
    b = lz.Builder()
    ctx = Context(b, compiler.CompileOptions(), InputSchema((), named=False))
    out = bounded_matmul(b.input("k", (n,), "float32"), w, ctx, "w")
    return b.graph({"out": out})


def _run_float32(n: int, w: np.ndarray, k: np.ndarray) -> np.ndarray:
    compiled = lz.compile(_bounded_graph(n, w), lz.Options(max_batch=256), warmup=False)
    return compiled({"k": k})["out"]


def test_bounded_matmul_keeps_every_per_row_value_as_narrow_as_k() -> None:
    # A (B, 2n) [k1 | k2] concatenation fed one matmul instead of two: XLA wrote it as an extra
    # copy, and pipeline j's predict_proba ran 2-4x slower than with a plain matmul.
    n = 300
    _, w = _cancelling(n, 1, np.random.default_rng(1))
    widths = [
        static_size(node.shape) for node in _bounded_graph(n, w).order if is_batched(node.shape)
    ]
    assert len(widths) > 4 and max(widths) == n  # k, its split, and the narrow products


def test_bounded_matmul_rounds_relative_to_its_terms_far_below_a_float32_matmul() -> None:
    n = 2000
    k, w = _cancelling(n, 256, np.random.default_rng(0))
    exact = k.astype(np.float64) @ w  # the float32 k is the input: only the sum is at stake
    terms = np.abs(k.astype(np.float64)) @ np.abs(w)  # Σ|k w| ~1000, the sums ~1% of it
    plain = k @ w.astype(np.float32)
    assert (np.abs(plain - exact) / terms).max() > 1e-8  # a float32 matmul: ~0.2-0.5 ulp
    got = _run_float32(n, w, k)
    # only the small inexact part rounds: ~1/16 of that here (the 10% free weights dominate it)
    assert (np.abs(got - exact) / terms).max() < 5e-9


@pytest.mark.parametrize("kernel", ["rbf", "sigmoid", "linear"])  # poly: unbounded, summed plainly
def test_regressors_and_one_class_share_the_accurate_dual_sum(kernel: str) -> None:
    x, y = make_classification(600, 6, random_state=2)
    x = x.astype(np.float32)
    params: dict[str, Any] = {"gamma": 0.01} if kernel == "sigmoid" else {}
    for est in (SVR(kernel=kernel, **params).fit(x, y), OneClassSVM(kernel=kernel, **params)):
        est = est.fit(x) if isinstance(est, OneClassSVM) else est
        model = compiler.compile(est, options=FLOAT32)
        method = "predict" if isinstance(est, SVR) else "decision_function"
        want = getattr(est, method)(x)
        scale = np.abs(want).max() + 1.0
        np.testing.assert_allclose(getattr(model, method)(x), want, rtol=0, atol=2e-6 * scale)
