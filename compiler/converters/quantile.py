"""QuantileTransformer: ``_transform_col``'s two-way interpolation, then the output distribution.

scikit-learn averages ``np.interp`` ascending and descending (so repeated quantiles map to the
middle of their references). Ascending, ``np.interp`` uses the segment after the *last* quantile
<= x; descending, the segment before the *first* quantile >= x. Both are per-column counts, and
every comparison with a quantile or bound is decided exactly as scikit-learn decides it for float64
rows (:class:`.discretization.ExactTests`: on the raw float64 column, through preceding scalers
and imputers). That matters: quantiles of repeated values (binary, integer, rounded columns) are
those values, rows sit exactly on them, and the answer jumps there — from one end of the tied
references to their middle to the other end — while e.g. 0.1 rounded to float32 lies above 0.1.
Only the within-segment arithmetic is rounded: the distance to the segment's end in float64
where the row is read raw, and on a quantile the fraction is set exactly (0 or 1).

- ``uniform``: rows equal to the fitted minimum map to 0 and to the maximum to 1.
- ``normal``: rows within ``BOUNDS_THRESHOLD`` of the fitted minimum (``x - 1e-7 < q[0]``, in
  float64) map to 0, of the maximum (``x + 1e-7 > q[-1]``) to 1; then ``norm.ppf`` (the IR's NDTRI), clipped to the ppf of
  ``1e-7 - eps`` and ``1 - (1e-7 - eps)`` (so 0 and 1 land on the clip values). ppf is steep in
  both tails, so float32 needs the uniform value with its *relative* precision there: the lower
  half reads ``ppf(y)`` with y computed from each segment's lower reference, the upper half
  ``-ppf(1 - y)`` with ``1 - y`` interpolated directly from the references ``1 - r`` (linear
  interpolation commutes with that map) and computed from each segment's upper end. Neither
  cancels, and the result stays within a few float32 ulp in both tails.

Limits: a column no map describes (a projection's output) is compared as the graph computed it;
subnormal inputs are flushed to zero by XLA.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats
from sklearn.preprocessing import QuantileTransformer
from sklearn.preprocessing._data import BOUNDS_THRESHOLD

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..registry import register, unsupported_param
from ._sorted import per_column
from .discretization import ExactTests, above, at_least

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
    """``np.interp`` of every column of ``v`` over its quantiles onto reference vectors.

    ``ascending`` picks ``np.interp``'s segment: after the last quantile <= v, or (descending,
    as scikit-learn's mirrored call) before the first quantile >= v; both are counts decided
    exactly as scikit-learn does for float64 rows (:class:`.discretization.ExactTests`).
    ``from_left`` picks the end the value is computed from, ``r[c-1] + f · rise`` or
    ``r[c] - f · rise``: the same number, but only the end whose reference is nearer 0 keeps
    its relative precision near 0. Counts and fractions are shared by every reference vector.
    """

    def __init__(self, features: Features, q: np.ndarray, ctx: Context) -> None:
        self.q, self.ctx = q, ctx
        self.tests = ExactTests(features, ctx)
        # the value the fractions are computed from: the raw float64 row where it is v itself
        self.x = self.tests.source_values(features.values)
        self._counts: dict[bool, lz.LazyTensor] = {}
        self._fractions: dict[tuple[bool, bool], lz.LazyTensor] = {}

    def _count(self, ascending: bool) -> lz.LazyTensor:
        if ascending not in self._counts:
            test, name = (at_least, "quantiles_le") if ascending else (above, "quantiles_lt")
            self._counts[ascending] = self.tests.count(self.q, test, name)
        return self._counts[ascending]

    def _fraction(self, ascending: bool, from_left: bool) -> lz.LazyTensor:
        """The fraction of the segment between its anchor end and v, in [0, 1]."""
        key = (ascending, from_left)
        if key not in self._fractions:
            x, ctx, count = self.x, self.ctx, self._count(ascending)
            anchor_q, inverse_width = _quantile_tables(self.q, from_left)
            name = f"{'asc' if ascending else 'desc'}_{'left' if from_left else 'right'}"
            if x.dtype == "float64":
                # float64 rows: the distance to the anchor in float64, then the graph's dtype
                start = _gather(count, anchor_q, ctx, f"{name}_quantile", "float64")
                distance = (x - start) if from_left else (start - x)
                if ctx.dtype != "float64":
                    distance = lz.cast(distance, ctx.dtype)
            else:
                # the anchor as float32 hi + lo: x - hi is exact near the anchor (Sterbenz), so
                # a float32 x a few ulp from a quantile gets the right fraction of a narrow
                # segment
                hi = anchor_q.astype(x.dtype).astype(np.float64)
                start = _gather(count, hi, ctx, f"{name}_quantile", x.dtype)
                distance = (x - start) if from_left else (start - x)
                if np.any(anchor_q != hi):
                    lo = _gather(count, anchor_q - hi, ctx, f"{name}_quantile_lo", x.dtype)
                    distance = distance - lo if from_left else distance + lo
            scale = per_column(count, inverse_width, ctx, f"{name}_inverse_width")
            # clipped: the rounded anchor may sit past x
            fraction = lz.minimum(lz.maximum(distance * scale, 0.0), 1.0)
            # On a quantile (decided exactly), v is the segment's lower end ascending, its upper
            # end descending: the fraction is exact there whatever rounding v had (a scaler's
            # output in float32 is a few ulp off, and segments between ties can be narrower).
            on_end = 0.0 if ascending == from_left else 1.0
            self._fractions[key] = lz.where(self._on_quantile(), on_end, fraction)
        return self._fractions[key]

    def _on_quantile(self) -> lz.LazyTensor:
        """(B, F) bool: whether v equals one of its column's quantiles."""
        return self._count(True) > self._count(False)

    def __call__(
        self, r: np.ndarray, name: str, *, ascending: bool, from_left: bool
    ) -> lz.LazyTensor:
        count, fraction = self._count(ascending), self._fraction(ascending, from_left)
        anchor_r, rise = _reference_tables(r, self.q.shape[0], from_left)
        side = f"{'asc' if ascending else 'desc'}_{'left' if from_left else 'right'}_{name}"
        base = per_column(count, anchor_r, self.ctx, side)
        change = fraction * per_column(count, rise, self.ctx, f"{side}_rise")
        return base + change if from_left else base - change


def _gather(
    index: lz.LazyTensor, table: np.ndarray, ctx: Context, name: str, dtype: str
) -> lz.LazyTensor:
    """:func:`per_column` with the table in ``dtype``."""
    n = table.shape[1]
    offsets = ctx.const(np.arange(table.shape[0], dtype=np.int32) * n, "int32")
    return lz.take(ctx.param(table.reshape(-1), name, dtype=dtype), index + offsets, axis=0)


def _bound_low(v: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Not scikit-learn's ``v - BOUNDS_THRESHOLD < q[0]`` (an up-set of v)."""
    return v - BOUNDS_THRESHOLD >= e


def _bound_high(v: np.ndarray, e: np.ndarray) -> np.ndarray:
    """scikit-learn's ``v + BOUNDS_THRESHOLD > q[-1]``."""
    return v + BOUNDS_THRESHOLD > e


def _normal(features: Features, q: np.ndarray, r: np.ndarray, ctx: Context) -> lz.LazyTensor:
    interp = _Interpolation(features, q, ctx)
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
    # scikit-learn's bounds, x - 1e-7 < q[0] and x + 1e-7 > q[-1] in float64
    tests = interp.tests
    z = lz.where(tests.holds(q[:, -1], _bound_high, "upper_bound"), clip_max, z)
    inside = tests.holds(q[:, 0], _bound_low, "lower_bound")
    return lz.where(inside, z, clip_min)  # the lower bound wins


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
        y = _normal(features, q, r, ctx)
    else:
        interp = _Interpolation(features, q, ctx)
        y = 0.5 * (
            interp(r, "reference", ascending=True, from_left=True)
            + interp(r, "reference", ascending=False, from_left=False)
        )
        tests = interp.tests
        # v == q[0] and v == q[-1]: at least the quantile and not above it
        lower = tests.holds(q[:, 0], at_least, "lower_ge") & ~tests.holds(
            q[:, 0], above, "lower_gt"
        )
        upper = tests.holds(q[:, -1], at_least, "upper_ge") & ~tests.holds(
            q[:, -1], above, "upper_gt"
        )
        y = lz.where(lower, 0.0, lz.where(upper, 1.0, y))  # the lower bound is assigned last
    return Heads({"transform": lz.where(lz.isnan(x), x, y)})
