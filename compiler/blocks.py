"""Building blocks converters share: affine maps and classifier output heads."""

from __future__ import annotations

from typing import Any

import numpy as np

import lazy as lz

from .context import Context
from .features import Heads


def affine(x: lz.LazyTensor, coef: Any, intercept: Any, ctx: Context) -> lz.LazyTensor:
    """``x @ coef.T + intercept`` for sklearn-shaped ``coef`` ((k, F) or (F,)); (B, k) or (B,)."""
    coef = np.asarray(coef)
    vector = coef.ndim == 1
    w = ctx.param(np.atleast_2d(coef).T, "coef_")
    out = x @ w
    intercept = np.asarray(intercept, dtype=np.float64)
    if intercept.ndim == 0:
        intercept = np.full(w.shape[1], float(intercept))
    if np.any(intercept != 0):
        out = out + ctx.param(intercept, "intercept_")
    return lz.reshape(out, (lz.B,)) if vector else out


def decision_heads(decision: lz.LazyTensor, classes: np.ndarray, **extra: lz.LazyTensor) -> Heads:
    """``decision_function`` and ``predict`` as scikit-learn's linear classifiers define them:
    binary → index ``decision > 0``; multiclass → first argmax."""
    if decision.ndim == 2 and decision.shape[1] == 1:
        decision = lz.reshape(decision, (lz.B,))
    index = lz.cast(decision > 0, "int32") if decision.ndim == 1 else lz.argmax(decision, axis=1)
    return Heads({"decision_function": decision, "predict": index, **extra}, classes=classes)


def binary_proba(positive: lz.LazyTensor) -> lz.LazyTensor:
    """(B,) probability of the positive class → (B, 2) ``[1 - p, p]``."""
    p = lz.reshape(positive, (lz.B, 1))
    return lz.concat([1.0 - p, p], axis=1)
