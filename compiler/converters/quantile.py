"""QuantileTransformer: ``_transform_col``'s two-way interpolation, then the output distribution.

scikit-learn averages ``np.interp`` ascending and descending (so repeated quantiles map to the
middle of their references). Ascending, ``np.interp`` uses the segment after the *last* quantile
<= x; descending, the segment before the *first* quantile >= x. Both are found by exact per-column
counts (:mod:`._sorted`), so only the within-segment arithmetic is rounded.

- ``uniform``: rows equal to the fitted minimum map to 0 and to the maximum to 1.
- ``normal``: rows within ``BOUNDS_THRESHOLD`` of the fitted minimum (``x - 1e-7 < q[0]``) map
  to 0, of the maximum to 1; then ``norm.ppf`` (the IR's NDTRI), clipped to the ppf of
  ``1e-7 - eps`` and ``1 - (1e-7 - eps)`` (so 0 and 1 land on the clip values). ppf is steep in
  both tails, so float32 needs the uniform value with its *relative* precision there: the lower
  half reads ``ppf(y)`` with y computed from each segment's lower reference, the upper half
  ``-ppf(1 - y)`` with ``1 - y`` interpolated directly from the references ``1 - r`` (linear
  interpolation commutes with that map) and computed from each segment's upper end. Neither
  cancels, and the result stays within a few float32 ulp in both tails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats
from sklearn.preprocessing import QuantileTransformer
from sklearn.preprocessing._data import BOUNDS_THRESHOLD

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..registry import register, unsupported_param
from ._sorted import count_at_most, count_below, per_column, rounded

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _quantile_tables(q: np.ndarray, from_left: bool) -> tuple[np.ndarray, np.ndarray]:
    """For a count c in [0, n] per column, (F, n + 1) tables over segment [c - 1, c]: the
    quantile at its left or right end and 1 / its width (0 outside every quantile)."""
    f, n = q.shape
    anchor_q, inverse_width = np.zeros((f, n + 1)), np.zeros((f, n + 1))
    width = np.diff(q, axis=1)  # (F, n - 1)
    with np.errstate(divide="ignore"):
        inverse = np.where(width > 0, 1.0 / np.where(width > 0, width, 1.0), 0.0)
    inverse_width[:, 1:n] = np.minimum(inverse, _FLOAT32_MAX)  # never inf: 0 * inf is NaN
    anchor_q[:, 1:n] = q[:, :-1] if from_left else q[:, 1:]
    return anchor_q, inverse_width


def _reference_tables(r: np.ndarray, f: int, from_left: bool) -> tuple[np.ndarray, np.ndarray]:
    """The matching (F, n + 1) tables of the reference at the anchor end and the reference
    change over the segment; outside every quantile (c = 0, c = n) r[0] and r[-1]."""
    n = len(r)
    anchor_r, rise = np.zeros(n + 1), np.zeros(n + 1)
    anchor_r[0], anchor_r[n] = r[0], r[-1]
    anchor_r[1:n] = r[:-1] if from_left else r[1:]
    rise[1:n] = np.diff(r)
    return np.tile(anchor_r, (f, 1)), np.tile(rise, (f, 1))


class _Interpolation:
    """``np.interp`` of every column of ``x`` over its quantiles onto reference vectors.

    ``ascending`` picks ``np.interp``'s segment: after the last quantile <= x, or (descending,
    as scikit-learn's mirrored call) before the first quantile >= x; both are exact counts.
    ``from_left`` picks the end the value is computed from, ``r[c-1] + f · rise`` or
    ``r[c] - f · rise``: the same number, but only the end whose reference is nearer 0 keeps
    its relative precision near 0. Counts and fractions are shared by every reference vector.
    """

    def __init__(self, x: lz.LazyTensor, q: np.ndarray, ctx: Context) -> None:
        self.x, self.q, self.ctx = x, q, ctx
        self._counts: dict[bool, lz.LazyTensor] = {}
        self._fractions: dict[tuple[bool, bool], lz.LazyTensor] = {}

    def _count(self, ascending: bool) -> lz.LazyTensor:
        if ascending not in self._counts:
            count = count_at_most if ascending else count_below
            name = "quantiles_le" if ascending else "quantiles_lt"
            self._counts[ascending] = count(self.x, self.q, self.ctx, name)
        return self._counts[ascending]

    def _fraction(self, ascending: bool, from_left: bool) -> lz.LazyTensor:
        """The fraction of the segment between its anchor end and x, in [0, 1]."""
        key = (ascending, from_left)
        if key not in self._fractions:
            x, ctx, count = self.x, self.ctx, self._count(ascending)
            anchor_q, inverse_width = _quantile_tables(self.q, from_left)
            name = f"{'asc' if ascending else 'desc'}_{'left' if from_left else 'right'}"
            # the anchor as float32 hi + lo: x - hi is exact near the anchor (Sterbenz), so a
            # float32 x a few ulp from a quantile gets the right fraction of a narrow segment
            hi = anchor_q.astype(ctx.dtype).astype(np.float64)
            start = per_column(count, hi, ctx, f"{name}_quantile")
            distance = (x - start) if from_left else (start - x)
            if np.any(anchor_q != hi):
                lo = per_column(count, anchor_q - hi, ctx, f"{name}_quantile_lo")
                distance = distance - lo if from_left else distance + lo
            scale = per_column(count, inverse_width, ctx, f"{name}_inverse_width")
            # clipped: the rounded anchor may sit past x
            self._fractions[key] = lz.minimum(lz.maximum(distance * scale, 0.0), 1.0)
        return self._fractions[key]

    def __call__(
        self, r: np.ndarray, name: str, *, ascending: bool, from_left: bool
    ) -> lz.LazyTensor:
        count, fraction = self._count(ascending), self._fraction(ascending, from_left)
        anchor_r, rise = _reference_tables(r, self.q.shape[0], from_left)
        side = f"{'asc' if ascending else 'desc'}_{'left' if from_left else 'right'}_{name}"
        base = per_column(count, anchor_r, self.ctx, side)
        change = fraction * per_column(count, rise, self.ctx, f"{side}_rise")
        return base + change if from_left else base - change


def _equals(x: lz.LazyTensor, value: np.ndarray, ctx: Context) -> lz.LazyTensor:
    """``x == value`` (float64 values): never true for an unrepresentable value."""
    up = ctx.param(rounded(value, ctx, "up"), "equals_up", dtype=ctx.dtype)
    down = ctx.param(rounded(value, ctx, "down"), "equals_down", dtype=ctx.dtype)
    return (x >= up) & (x <= down)


def _first(holds: Callable[[np.ndarray], np.ndarray], guess: np.ndarray, dtype: str) -> np.ndarray:
    """Per column the smallest value of ``dtype`` where ``holds`` (false below some value, true
    from it on), searched from ``guess`` one value of ``dtype`` at a time."""
    v = np.asarray(guess, np.float64).astype(dtype)
    up, down = np.array(np.inf, dtype), np.array(-np.inf, dtype)
    while not (ok := holds(v.astype(np.float64))).all():
        v = np.where(ok, v, np.nextafter(v, up))
    while (earlier := holds((below := np.nextafter(v, down)).astype(np.float64))).any():
        v = np.where(earlier, below, v)
    return v


def _normal(x: lz.LazyTensor, q: np.ndarray, r: np.ndarray, ctx: Context) -> lz.LazyTensor:
    interp = _Interpolation(x, q, ctx)
    # y from the ends where r is smaller, 1 - y (interpolated from 1 - r) from where it is
    y = 0.5 * (
        interp(r, "reference", ascending=True, from_left=True)
        + interp(r, "reference", ascending=False, from_left=True)
    )
    complement = 0.5 * (
        interp(1.0 - r, "complement", ascending=True, from_left=False)
        + interp(1.0 - r, "complement", ascending=False, from_left=False)
    )
    z = lz.where(y <= 0.5, lz.ndtri(y), -lz.ndtri(complement))
    spacing = BOUNDS_THRESHOLD - np.spacing(1)
    clip_min, clip_max = (float(v) for v in stats.norm.ppf([spacing, 1 - spacing]))
    z = lz.minimum(lz.maximum(z, clip_min), clip_max)
    # scikit-learn's bounds, x - 1e-7 < q[0] and x + 1e-7 > q[-1] in float64, as comparisons
    # with the first value of the graph's dtype past each: exact for every input of that dtype
    low, high = q[:, 0], q[:, -1]
    below = _first(lambda v: v - BOUNDS_THRESHOLD >= low, low + BOUNDS_THRESHOLD, ctx.dtype)
    above = _first(lambda v: v + BOUNDS_THRESHOLD > high, high - BOUNDS_THRESHOLD, ctx.dtype)
    z = lz.where(x >= ctx.param(above, "upper_bound"), clip_max, z)
    return lz.where(x < ctx.param(below, "lower_bound"), clip_min, z)  # the lower one wins


@register(
    QuantileTransformer,
    methods=("transform",),
    limits="output_distribution 'uniform' and 'normal'; dense input",
)
def quantile_transformer(est: Any, features: Features, ctx: Context) -> Heads:
    if est.output_distribution not in ("uniform", "normal"):
        raise unsupported_param(
            est, "output_distribution", est.output_distribution, "'uniform', 'normal'"
        )
    x = features.values
    q = np.asarray(est.quantiles_, np.float64).T  # (F, n)
    r = np.asarray(est.references_, np.float64)
    if est.output_distribution == "normal":
        y = _normal(x, q, r, ctx)
    else:
        interp = _Interpolation(x, q, ctx)
        y = 0.5 * (
            interp(r, "reference", ascending=True, from_left=True)
            + interp(r, "reference", ascending=False, from_left=False)
        )
        lower, upper = _equals(x, q[:, 0], ctx), _equals(x, q[:, -1], ctx)
        y = lz.where(lower, 0.0, lz.where(upper, 1.0, y))  # the lower bound is assigned last
    return Heads({"transform": lz.where(lz.isnan(x), x, y)})
