"""Scalers, normalizers, imputers, encoders and feature selectors."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.preprocessing import FunctionTransformer, StandardScaler

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..registry import register


@register(StandardScaler, methods=("transform",), limits="dense input")
def standard_scaler(est: Any, features: Features, ctx: Context) -> Heads:
    x = features.values
    if est.with_mean:
        x = x - ctx.param(est.mean_, "mean_")
    if est.with_std:
        x = x / ctx.param(est.scale_, "scale_")
    return Heads({"transform": x})


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
