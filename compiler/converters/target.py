"""TransformedTargetRegressor: the regressor's prediction mapped back through the target
transformer's inverse."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.compose import TransformedTargetRegressor
from sklearn.preprocessing import (
    FunctionTransformer,
    MaxAbsScaler,
    MinMaxScaler,
    RobustScaler,
    StandardScaler,
)

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..registry import register
from ._children import columns, head

Inverse = Callable[[Any, lz.LazyTensor, Context], lz.LazyTensor]


def _standard(t: Any, y: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    if t.with_std:
        y = y * ctx.param(t.scale_, "scale_")
    if t.with_mean:
        y = y + ctx.param(t.mean_, "mean_")
    return y


def _min_max(t: Any, y: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    return (y - ctx.param(t.min_, "min_")) / ctx.param(t.scale_, "scale_")


def _max_abs(t: Any, y: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    return y * ctx.param(t.scale_, "scale_")


def _robust(t: Any, y: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    if t.with_scaling:
        y = y * ctx.param(t.scale_, "scale_")
    if t.with_centering:
        y = y + ctx.param(t.center_, "center_")
    return y


def _function(t: Any, y: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    if t.inverse_func is None:
        return y
    name = getattr(t.inverse_func, "__name__", repr(t.inverse_func))
    try:
        with np.errstate(all="ignore"):
            out = t.inverse_func(y, **(t.inv_kw_args or {}))
    except (lz.ConcretizationError, TypeError, lz.ShapeError) as exc:
        raise UnsupportedError(
            f"{ctx.path}: inverse_func={name!r} is not made of recognisable numpy ufuncs "
            f"({exc.__class__.__name__})"
        ) from None
    if not isinstance(out, lz.LazyTensor) or out.shape != y.shape:
        raise UnsupportedError(f"{ctx.path}: inverse_func={name!r} must map values one to one")
    return out


#: Target transformers whose ``inverse_transform`` is converted (the same formulas as sklearn's).
INVERSES: dict[type, Inverse] = {
    StandardScaler: _standard,
    MinMaxScaler: _min_max,
    MaxAbsScaler: _max_abs,
    RobustScaler: _robust,
    FunctionTransformer: _function,
}


@register(
    TransformedTargetRegressor,
    methods=("predict",),
    limits="func / inverse_func made of numpy ufuncs; transformer StandardScaler, MinMaxScaler, "
    "MaxAbsScaler, RobustScaler or FunctionTransformer",
)
def transformed_target_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    transformer = est.transformer_
    inverse = INVERSES.get(type(transformer))
    if inverse is None:
        raise UnsupportedError(
            f"{ctx.path}: TransformedTargetRegressor(transformer={type(transformer).__name__}) "
            f"is not supported; supported: {', '.join(c.__name__ for c in INVERSES)}"
        )
    regressor = est.regressor_
    pred = head(ctx.convert(regressor, features, "regressor_"), "predict", regressor, ctx)
    out = inverse(transformer, columns(pred), ctx)
    if est._training_dim == 1 and out.shape[1] == 1:
        out = lz.reshape(out, (lz.B,))
    return Heads({"predict": out})
