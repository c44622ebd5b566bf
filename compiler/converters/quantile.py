"""QuantileTransformer (uniform output): ``_transform_col``'s two-way interpolation.

scikit-learn averages ``np.interp`` ascending and descending (so repeated quantiles map to the
middle of their references), then pins the fitted minimum to 0 and maximum to 1. Ascending,
``np.interp`` uses the segment after the *last* quantile <= x; descending, the segment before the
*first* quantile >= x. Both are found by exact per-column counts (:mod:`._sorted`), so only the
within-segment arithmetic is rounded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.preprocessing import QuantileTransformer

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..registry import register, unsupported_param
from ._sorted import count_at_most, count_below, per_column, rounded

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _segments(q: np.ndarray, r: np.ndarray, ascending: bool) -> tuple[np.ndarray, ...]:
    """For a count c in [0, n] per column (F, n + 1) tables of: the anchor (quantile, reference)
    the interpolation starts from, 1 / the segment's width, and the reference change over it."""
    f, n = q.shape
    anchor_q, anchor_r = np.zeros((f, n + 1)), np.zeros((f, n + 1))
    inverse_width, rise = np.zeros((f, n + 1)), np.zeros((f, n + 1))
    anchor_r[:, 0], anchor_r[:, n] = r[0], r[-1]  # left of / right of every quantile
    width = np.diff(q, axis=1)  # (F, n - 1)
    with np.errstate(divide="ignore"):
        inverse = np.where(width > 0, 1.0 / np.where(width > 0, width, 1.0), 0.0)
    inverse = np.minimum(inverse, _FLOAT32_MAX)  # never inf: 0 * inf would be NaN
    if ascending:  # c = #{q <= x} in 1..n-1: segment [c-1, c], from its left end
        anchor_q[:, 1:n], anchor_r[:, 1:n] = q[:, :-1], r[:-1]
    else:  # c = #{q < x} in 1..n-1: segment [c-1, c], from its right end
        anchor_q[:, 1:n], anchor_r[:, 1:n] = q[:, 1:], r[1:]
    inverse_width[:, 1:n] = inverse
    rise[:, 1:n] = np.diff(r)
    return anchor_q, anchor_r, inverse_width, rise


def _interp(
    x: lz.LazyTensor, q: np.ndarray, r: np.ndarray, ascending: bool, ctx: Context
) -> lz.LazyTensor:
    if ascending:
        count = count_at_most(x, q, ctx, "quantiles_le")
    else:
        count = count_below(x, q, ctx, "quantiles_lt")
    side = "asc" if ascending else "desc"
    anchor_q, anchor_r, inverse_width, rise = _segments(q, r, ascending)
    # the anchor as float32 hi + lo: x - hi is exact near the anchor (Sterbenz), so a float32 x
    # a few ulp from a quantile still gets the right fraction of a very narrow segment
    hi = anchor_q.astype(ctx.dtype).astype(np.float64)
    start = per_column(count, hi, ctx, f"{side}_quantile")
    distance = (x - start) if ascending else (start - x)
    if np.any(anchor_q != hi):
        lo = per_column(count, anchor_q - hi, ctx, f"{side}_quantile_lo")
        distance = distance - lo if ascending else distance + lo
    # the fraction of the segment covered; clipped since the rounded anchor may sit past x
    fraction = lz.minimum(
        lz.maximum(distance * per_column(count, inverse_width, ctx, f"{side}_inverse_width"), 0.0),
        1.0,
    )
    change = fraction * per_column(count, rise, ctx, f"{side}_rise")
    base = per_column(count, anchor_r, ctx, f"{side}_reference")
    return base + change if ascending else base - change


def _equals(x: lz.LazyTensor, value: np.ndarray, ctx: Context) -> lz.LazyTensor:
    """``x == value`` (float64 values): never true for an unrepresentable value."""
    up = ctx.param(rounded(value, ctx, "up"), "equals_up", dtype=ctx.dtype)
    down = ctx.param(rounded(value, ctx, "down"), "equals_down", dtype=ctx.dtype)
    return (x >= up) & (x <= down)


@register(
    QuantileTransformer,
    methods=("transform",),
    limits="output_distribution 'uniform' (the IR has no inverse erf, so 'normal' is refused); "
    "dense input",
)
def quantile_transformer(est: Any, features: Features, ctx: Context) -> Heads:
    if est.output_distribution != "uniform":
        raise unsupported_param(
            est,
            "output_distribution",
            est.output_distribution,
            "'uniform' ('normal' needs the normal quantile function, which cannot be computed "
            "exactly with the IR's ops)",
        )
    x = features.values
    q = np.asarray(est.quantiles_, np.float64).T  # (F, n)
    r = np.asarray(est.references_, np.float64)
    y = 0.5 * (_interp(x, q, r, True, ctx) + _interp(x, q, r, False, ctx))
    lower, upper = _equals(x, q[:, 0], ctx), _equals(x, q[:, -1], ctx)
    y = lz.where(lower, 0.0, lz.where(upper, 1.0, y))  # the lower bound is assigned last
    return Heads({"transform": lz.where(lz.isnan(x), x, y)})
