"""Scalers, normalizers, polynomial expansion and other transforms of numeric features."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.preprocessing import (
    Binarizer,
    FunctionTransformer,
    MaxAbsScaler,
    MinMaxScaler,
    Normalizer,
    PolynomialFeatures,
    RobustScaler,
    StandardScaler,
)

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..registry import register, unsupported_param


@register(StandardScaler, methods=("transform",), limits="dense input")
def standard_scaler(est: Any, features: Features, ctx: Context) -> Heads:
    x = features.values
    if est.with_mean:
        x = x - ctx.param(est.mean_, "mean_")
    if est.with_std:
        x = x / ctx.param(est.scale_, "scale_")
    return Heads({"transform": x})


@register(MinMaxScaler, methods=("transform",), limits="`clip`")
def min_max_scaler(est: Any, features: Features, ctx: Context) -> Heads:
    x = features.values * ctx.param(est.scale_, "scale_") + ctx.param(est.min_, "min_")
    if est.clip:  # np.clip: NaN stays NaN, as with maximum/minimum
        low, high = (float(v) for v in est.feature_range)
        x = lz.minimum(lz.maximum(x, low), high)
    return Heads({"transform": x})


@register(MaxAbsScaler, methods=("transform",), limits="dense input")
def max_abs_scaler(est: Any, features: Features, ctx: Context) -> Heads:
    return Heads({"transform": features.values / ctx.param(est.scale_, "scale_")})


@register(RobustScaler, methods=("transform",), limits="`with_centering`, `with_scaling`")
def robust_scaler(est: Any, features: Features, ctx: Context) -> Heads:
    x = features.values
    if est.with_centering:
        x = x - ctx.param(est.center_, "center_")
    if est.with_scaling:
        x = x / ctx.param(est.scale_, "scale_")
    return Heads({"transform": x})


#: ``_handle_zeros_in_scale``: a row norm below this (10 float64 eps) divides by 1 instead.
_TINY_NORM = 10 * np.finfo(np.float64).eps


@register(Normalizer, methods=("transform",), limits="`norm` l1, l2, max")
def normalizer(est: Any, features: Features, ctx: Context) -> Heads:
    x = features.values
    if est.norm == "l1":
        norms = lz.sum(abs(x), axis=1, keepdims=True)
    elif est.norm == "l2":
        norms = lz.sqrt(lz.sum(x * x, axis=1, keepdims=True))
    elif est.norm == "max":
        norms = lz.max(abs(x), axis=1, keepdims=True)
    else:
        raise unsupported_param(est, "norm", est.norm, "'l1', 'l2', 'max'")
    norms = lz.where(norms < _TINY_NORM, 1.0, norms)
    return Heads({"transform": x / norms})


@register(Binarizer, methods=("transform",), limits="dense input")
def binarizer(est: Any, features: Features, ctx: Context) -> Heads:
    x = features.values
    return Heads({"transform": lz.cast(x > float(est.threshold), x.dtype)})


@register(PolynomialFeatures, methods=("transform",), limits="dense input; any degree")
def polynomial_features(est: Any, features: Features, ctx: Context) -> Heads:
    powers = np.asarray(est.powers_)
    degree = int(powers.sum(axis=1).max(initial=0))
    # each output column multiplies `degree` factors gathered from [x, 1]: feature j repeated
    # powers[o, j] times, padded with the constant 1
    factors = np.full((len(powers), max(degree, 1)), features.width, np.int32)
    for o, row in enumerate(powers):
        picked = np.repeat(np.arange(features.width), row)
        factors[o, : len(picked)] = picked
    x = features.values
    padded = lz.concat([x, lz.broadcast_to(ctx.const(1.0).reshape(1, 1), (lz.B, 1))], axis=1)
    index = ctx.param(factors.reshape(-1), "factors", dtype="int32")
    gathered = lz.reshape(lz.take(padded, index, axis=1), (lz.B, *factors.shape))
    out = gathered[:, :, 0]
    for k in range(1, factors.shape[1]):
        out = out * gathered[:, :, k]
    return Heads({"transform": out})


@register(
    FunctionTransformer,
    methods=("transform",),
    limits="identity, or a function built from numpy ufuncs (e.g. np.log1p); anything else is "
    "a host step when allowed",
)
def function_transformer(est: Any, features: Features, ctx: Context) -> Heads:
    if est.func is None:
        return Heads.transformed(features)
    try:
        with np.errstate(all="ignore"):
            out = est.func(features.values, **(est.kw_args or {}))
    except (lz.ConcretizationError, TypeError, lz.ShapeError) as exc:
        raise UnsupportedError(
            f"FunctionTransformer(func={getattr(est.func, '__name__', est.func)!r}) is not made "
            f"of recognisable numpy ufuncs ({exc.__class__.__name__}); allow host steps to run it "
            "on the host"
        ) from None
    if not isinstance(out, lz.LazyTensor) or out.shape != features.values.shape:
        raise UnsupportedError("FunctionTransformer must return one value per input value")
    return Heads({"transform": out})
