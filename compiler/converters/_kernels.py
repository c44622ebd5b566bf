"""Distances and kernels between the input rows and a fitted set of points.

Squared distances are summed over explicit differences, not expanded as ``x² - 2xy + y²``:
scikit-learn expands in float64, where the cancellation is harmless; in float32 it is not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError


def differences(x: lz.LazyTensor, points: lz.LazyTensor) -> lz.LazyTensor:
    """(B, F) rows and (n, F) points → (B, n, F) ``x - point``."""
    return lz.expand_dims(x, 1) - points


def squared_distances(x: lz.LazyTensor, points: lz.LazyTensor) -> lz.LazyTensor:
    """(B, n) squared Euclidean distances."""
    d = differences(x, points)
    return lz.sum(d * d, axis=2)


def _normalized(x: lz.LazyTensor) -> lz.LazyTensor:
    """``sklearn.preprocessing.normalize``: rows of norm zero stay zero."""
    norm = lz.sqrt(lz.sum(x * x, axis=1, keepdims=True))
    return x / lz.where(norm == 0.0, 1.0, norm)


def kernel_bound(name: str, points: np.ndarray, gamma: float, degree: float, coef0: float) -> float:
    """An upper bound of ``|pairwise_kernels(x, points, metric=name)|`` for rows ``x`` like the
    fitted ``points`` (bounded kernels: 1; the others from the points' largest norm)."""
    if name in ("rbf", "sigmoid", "cosine"):
        return 1.0
    top = float(np.max(np.sum(points * points, axis=1), initial=0.0))
    if name == "poly":
        return float((abs(gamma) * top + abs(coef0)) ** degree)
    return top  # linear


def kernel(
    name: str,
    x: lz.LazyTensor,
    points: Any,
    ctx: Context,
    gamma: float,
    degree: float,
    coef0: float,
) -> lz.LazyTensor:
    """``pairwise_kernels(x, points, metric=name)`` (B, n) for the named kernels."""
    y = ctx.param(points, "X_fit_")
    if name == "linear":
        return x @ lz.transpose(y)
    if name == "poly":
        return (x @ lz.transpose(y) * gamma + coef0) ** float(degree)
    if name == "sigmoid":
        return lz.tanh(x @ lz.transpose(y) * gamma + coef0)
    if name == "rbf":
        return lz.exp(squared_distances(x, y) * -gamma)
    if name == "cosine":
        return _normalized(x) @ lz.transpose(_normalized(y))
    raise UnsupportedError(
        f"{ctx.path}: kernel={name!r} is not supported; supported: linear, poly, sigmoid, rbf, cosine"
    )
