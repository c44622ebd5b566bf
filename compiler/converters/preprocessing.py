"""Scalers, normalizers, polynomial expansion and other transforms of numeric features."""

from __future__ import annotations

from dataclasses import replace
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
from ..features import Arithmetic, Clip, Features, Heads, Step
from ..registry import register, unsupported_param
from .discretization import ExactTests, above

#: A per-column non-decreasing map: replayed for the decisions that read it.
FOLDED = (
    "folded into the tree splits, bin edges and knots that read it (exact for float64 and "
    "float32 inputs)"
)


@register(StandardScaler, methods=("transform",), limits="dense input", exactness=FOLDED)
def standard_scaler(est: Any, features: Features, ctx: Context) -> Heads:
    center = est.mean_ if est.with_mean else None
    scale = est.scale_ if est.with_std else None
    heads = _center_and_scale(features, center, scale, ctx, params_in_input_dtype=True)
    # Centred on its training mean: the training rows' output has mean 0.
    return replace(heads, means=(0.0,) * features.width) if est.with_mean else heads


def _center_and_scale(
    features: Features,
    center: Any,
    scale: Any,
    ctx: Context,
    *,
    params_in_input_dtype: bool = False,
) -> Heads:
    """``(x - center) / scale`` as scikit-learn computes it (either may be None: skipped).

    On float32 input the source subtracts and divides in place, rounding to float32 after each:
    StandardScaler with its parameters first cast to float32 (``params_in_input_dtype``), the
    others with the float64 parameters."""
    x = features.values
    if center is not None:
        x = x - ctx.param(center, "center")
    if scale is not None:
        x = x / ctx.param(scale, "scale_")
    c = None if center is None else np.asarray(center, np.float64)
    s = None if scale is None else np.asarray(scale, np.float64)

    def replay(j: int) -> tuple[Step, ...]:  # non-decreasing: scale_ > 0 (zero variances: 1)
        steps = [] if c is None else [Arithmetic(np.subtract, c[j], params_in_input_dtype)]
        steps += [] if s is None else [Arithmetic(np.divide, s[j], params_in_input_dtype)]
        return tuple(steps)

    return Heads.transformed(features.mapped(x, replay))


@register(MinMaxScaler, methods=("transform",), limits="`clip`", exactness=FOLDED)
def min_max_scaler(est: Any, features: Features, ctx: Context) -> Heads:
    x = features.values * ctx.param(est.scale_, "scale_") + ctx.param(est.min_, "min_")
    low, high = (float(v) for v in est.feature_range)
    if est.clip:  # np.clip: NaN stays NaN, as with maximum/minimum
        x = lz.minimum(lz.maximum(x, low), high)
    scale, shift = np.asarray(est.scale_, np.float64), np.asarray(est.min_, np.float64)

    def replay(j: int) -> tuple[Step, ...] | None:
        if not scale[j] > 0:  # a reversed or degenerate range is not non-decreasing
            return None
        steps = (Arithmetic(np.multiply, scale[j]), Arithmetic(np.add, shift[j]))
        return (*steps, Clip(low, high)) if est.clip else steps

    return Heads.transformed(features.mapped(x, replay))


@register(MaxAbsScaler, methods=("transform",), limits="dense input; `clip`", exactness=FOLDED)
def max_abs_scaler(est: Any, features: Features, ctx: Context) -> Heads:
    heads = _center_and_scale(features, None, est.scale_, ctx)
    if not getattr(est, "clip", False):
        return heads
    x = lz.minimum(lz.maximum(heads.outputs["transform"], -1.0), 1.0)  # NaN stays NaN
    clipped = Features(x, heads.features().sources, heads.maps)
    return Heads.transformed(clipped.mapped(x, lambda j: Clip(-1.0, 1.0)))


@register(
    RobustScaler,
    methods=("transform",),
    limits="`with_centering`, `with_scaling`",
    exactness=FOLDED,
)
def robust_scaler(est: Any, features: Features, ctx: Context) -> Heads:
    center = est.center_ if est.with_centering else None
    scale = est.scale_ if est.with_scaling else None
    return _center_and_scale(features, center, scale, ctx)


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


@register(
    Binarizer,
    methods=("transform",),
    limits="dense input",
    exactness="``x > threshold`` decided on the raw float64 columns (through scalers before it)",
)
def binarizer(est: Any, features: Features, ctx: Context) -> Heads:
    tests = ExactTests(features, ctx)
    passed = tests.holds(np.full(features.width, float(est.threshold)), above, "threshold")
    return Heads({"transform": lz.cast(passed, ctx.dtype)}, exact=(True,) * features.width)


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
    except Exception as exc:  # arbitrary Python on lazy values: whatever it raises
        raise UnsupportedError(
            f"FunctionTransformer(func={getattr(est.func, '__name__', est.func)!r}) is not made "
            f"of recognisable numpy ufuncs ({exc.__class__.__name__}); allow host steps to run it "
            "on the host"
        ) from None
    if not isinstance(out, lz.LazyTensor) or out.shape != features.values.shape:
        raise UnsupportedError("FunctionTransformer must return one value per input value")
    return Heads({"transform": out})
