"""PowerTransformer: Yeo-Johnson / Box-Cox with the fitted lambdas, then the fitted scaler.

scipy computes ``expm1(lmbda * log1p(x)) / lmbda`` (and ``log1p(x)`` when ``|lmbda| < eps``); the
IR has no expm1, and ``exp(z) - 1`` loses every digit of a small ``z`` in float32. :func:`expm1`
uses Kahan's correction instead, accurate to a few ulp for every ``z``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.preprocessing import PowerTransformer

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..registry import register, unsupported_param

#: scipy's branch points: yeojohnson's ``finfo(float64).eps``, boxcox's 1e-19.
_YEO_JOHNSON_EPS = float(np.spacing(1.0))
_BOX_COX_EPS = 1e-19


def expm1(z: lz.LazyTensor) -> lz.LazyTensor:
    """``exp(z) - 1`` without cancellation: ``(u - 1) * z / log(u)`` with ``u = exp(z)`` (the
    rounding error of ``u`` cancels between numerator and denominator; Kahan), exact at the ends
    where ``u`` is 1, 0 or inf."""
    u = lz.exp(z)
    special = (u == 1.0) | (u == 0.0) | (u == float("inf"))
    safe = lz.where(special, 2.0, u)  # also keeps log(exp(z)) from being simplified to z
    corrected = (safe - 1.0) * (z / lz.log(safe))
    return lz.where(u == 1.0, z, lz.where(special, u - 1.0, corrected))


def _power(
    log_base: lz.LazyTensor, lmbda: np.ndarray, eps: float, name: str, ctx: Context
) -> lz.LazyTensor:
    """Per column: ``expm1(lmbda * log_base) / lmbda``, or ``log_base`` where ``|lmbda| < eps``."""
    small = np.abs(lmbda) < eps
    safe = np.where(small, 1.0, lmbda)
    powered = expm1(log_base * ctx.param(safe, name)) / ctx.param(safe, f"{name}_divisor")
    if not small.any():
        return powered
    return lz.where(ctx.param(small, f"{name}_is_zero", dtype="bool"), log_base, powered)


def _yeo_johnson(x: lz.LazyTensor, lmbda: np.ndarray, ctx: Context) -> lz.LazyTensor:
    """``scipy.stats._morestats._yeojohnson_transform``: x >= 0 and x < 0 (and NaN) branches."""
    positive = _power(lz.log1p(x), lmbda, _YEO_JOHNSON_EPS, "lambdas_", ctx)
    negative = -_power(lz.log1p(-x), 2.0 - lmbda, _YEO_JOHNSON_EPS, "two_minus_lambdas_", ctx)
    return lz.where(x >= 0.0, positive, negative)


def _box_cox(x: lz.LazyTensor, lmbda: np.ndarray, ctx: Context) -> lz.LazyTensor:
    """``scipy.special.boxcox``."""
    return _power(lz.log(x), lmbda, _BOX_COX_EPS, "lambdas_", ctx)


@register(
    PowerTransformer,
    methods=("transform",),
    limits="yeo-johnson and box-cox, with or without standardize; box-cox of a non-positive "
    "value gives NaN where scikit-learn raises",
)
def power_transformer(est: Any, features: Features, ctx: Context) -> Heads:
    transforms = {"yeo-johnson": _yeo_johnson, "box-cox": _box_cox}
    if est.method not in transforms:
        raise unsupported_param(est, "method", est.method, "'yeo-johnson', 'box-cox'")
    lmbda = np.asarray(est.lambdas_, np.float64)
    x = transforms[est.method](features.values, lmbda, ctx)
    if est.standardize:
        scaler = est._scaler
        if scaler.with_mean:
            x = x - ctx.param(scaler.mean_, "mean_")
        if scaler.with_std:
            x = x / ctx.param(scaler.scale_, "scale_")
    return Heads({"transform": x})
