"""Small graphs shared by the lazy tests."""

from __future__ import annotations

import numpy as np
import pytest

import lazy as lz


def scaler_logreg(seed: int = 0, n_features: int = 6, n_classes: int = 3) -> lz.Graph:
    """StandardScaler + multinomial logistic regression, with predict and predict_proba heads."""
    rng = np.random.default_rng(seed)
    b = lz.Builder()
    x = b.input("x", (n_features,))
    mean = b.param(rng.standard_normal(n_features).astype(np.float32), "mean")
    scale = b.param((rng.random(n_features) + 0.5).astype(np.float32), "scale")
    coef = b.param(rng.standard_normal((n_features, n_classes)).astype(np.float32), "coef")
    bias = b.param(rng.standard_normal(n_classes).astype(np.float32), "intercept")
    logits = ((x - mean) / scale) @ coef + bias
    return b.graph({"proba": lz.softmax(logits), "label": lz.argmax(logits)})


@pytest.fixture
def graph() -> lz.Graph:
    return scaler_logreg()


@pytest.fixture
def cache() -> lz.ExecutableCache:
    return lz.ExecutableCache()
