"""SplineTransformer: every B-spline basis value, by the Cox-de Boor recursion unrolled.

Per row and feature, the knot interval ``i`` (``t[i] <= x < t[i+1]``, clipped to the base
interval as scipy's ``BSpline`` does when it extrapolates) is an exact count
(:mod:`._sorted`); scipy's ``_deBoor_D`` recursion then gives the ``degree + 1`` non-zero basis
values, which are scattered to their columns. The recursion's ``1 / (t[a] - t[b])`` factors are
fitted tables indexed by ``i`` (0 where knots coincide, as scipy skips them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.preprocessing import SplineTransformer

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..monotone import raw_in_column_order
from ..registry import register, unsupported_param
from ._sorted import count_at_most, per_column, rounded
from .discretization import ExactTests, above, at_least

_EXTRAPOLATIONS = ("error", "constant", "linear", "continue", "periodic")


def _inverse_widths(t: np.ndarray, offset_b: int, offset_a: int) -> np.ndarray:
    """(F, m): ``1 / (t[i + offset_b] - t[i + offset_a])`` per interval i, 0 where they coincide
    (or out of range: those intervals are never used)."""
    f, m = t.shape
    out = np.zeros((f, m))
    for i in range(m):
        b, a = i + offset_b, i + offset_a
        if 0 <= a < m and 0 <= b < m:
            width = t[:, b] - t[:, a]
            out[:, i] = np.where(width != 0, 1.0 / np.where(width != 0, width, 1.0), 0.0)
    return out


def _basis(
    x: lz.LazyTensor, t: np.ndarray, k: int, ctx: Context, count: lz.LazyTensor
) -> tuple[lz.LazyTensor, list]:
    """The interval (B, F) and the ``k + 1`` basis values h[m] (B, F) of functions ``i - k + m``,
    given ``count`` (B, F), how many knots are at most ``x``."""
    n = t.shape[1] - k - 1
    interval = lz.minimum(lz.maximum(count - 1, k), n - 1)
    knot = {d: per_column(interval + d, t, ctx, f"knot_{d}") for d in range(1 - k, k + 1)}
    h: list[Any] = [None]  # h[0] = 1, kept symbolic to skip multiplying by it
    for j in range(1, k + 1):
        hh, h = h, [0.0] * (j + 1)
        for nn in range(1, j + 1):
            inverse = per_column(interval, _inverse_widths(t, nn, nn - j), ctx, f"inv_{j}_{nn}")
            w = inverse if hh[nn - 1] is None else hh[nn - 1] * inverse
            h[nn - 1] = h[nn - 1] + w * (knot[nn] - x)
            h[nn] = w * (x - knot[nn - j])
    ones = x * 0.0 + 1.0
    return interval, [ones if v is None else v for v in h]


def _scatter(
    interval: lz.LazyTensor, h: list, k: int, n_splines: int, ctx: Context
) -> lz.LazyTensor:
    """(B, F, n_splines): h[m] in column ``(interval - k + m) mod n_splines`` (periodic splines
    reuse the first ``degree`` coefficients after the last)."""
    columns = ctx.const(np.arange(n_splines, dtype=np.int32), "int32")
    out = None
    for m, value in enumerate(h):
        row = interval + (m - k)
        row = row - lz.cast(row >= n_splines, "int32") * n_splines
        hit = lz.cast(lz.expand_dims(row, 2) == columns, ctx.dtype) * lz.expand_dims(value, 2)
        out = hit if out is None else out + hit
    return out


def _boundary_degrees(est: Any) -> list[tuple[int, int]]:
    """Per feature, the degree scikit-learn's transform uses for the fitted range and for the
    number of bases continued beyond it. Its loop bumps one ``degree`` variable for linear
    extrapolation of degree <= 1 and keeps it for later features; this repeats that."""
    degree, out = est.degree, []
    for _ in est.bsplines_:
        boundary = degree
        if est.extrapolation == "linear" and degree <= 1:
            degree += 1
        out.append((boundary, degree))
    return out


def _boundary_rows(est: Any, side: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per feature: the range's edge on ``side`` ('min'/'max') (F,), and the (F, n_splines)
    values and slopes that replace the basis beyond it."""
    n_splines = est.bsplines_[0].c.shape[1]
    edges, values, slopes = [], [], []
    for spl, (boundary, reach) in zip(est.bsplines_, _boundary_degrees(est), strict=True):
        at = spl.t[boundary] if side == "min" else spl.t[-boundary - 1]
        value, slope = np.asarray(spl(at), np.float64), np.asarray(spl(at, nu=1), np.float64)
        if est.extrapolation == "constant":
            slope = np.zeros_like(slope)
        keep = np.zeros(n_splines, bool)
        keep[slice(None, reach) if side == "min" else slice(n_splines - reach, None)] = True
        edges.append(at)
        values.append(np.where(keep, value, 0.0))
        slopes.append(np.where(keep, slope, 0.0))
    return np.asarray(edges, np.float64), np.asarray(values), np.asarray(slopes)


def _measured_from(features: Features, origin: np.ndarray, ctx: Context) -> lz.LazyTensor:
    """(B, F) in the graph's dtype: each value minus its feature's ``origin``, subtracted in
    float64 from the raw input column where the feature is one (its rounding to the graph's
    dtype then scales with the distance from the origin, not with the value), and in the
    computed columns' own dtype otherwise (their rounding is already made)."""
    maps = features.column_maps()
    raw = [m is not None and not m.steps and m.fill is None for m in maps]
    v = raw_in_column_order(features, ctx, raw) if any(raw) else features.values
    shifted = v - ctx.param(origin, "origin", dtype=v.dtype)
    return shifted if shifted.dtype == ctx.dtype else lz.cast(shifted, ctx.dtype)


def _period(t: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per feature: where the period starts, its length, and whether it is degenerate (one
    distinct value in fit: scikit-learn's ``% 0`` gives NaN, and every row maps to 0)."""
    n = t.shape[1] - k - 1
    low, period = t[:, k], t[:, n] - t[:, k]
    degenerate = period <= 0
    return low, np.where(degenerate, 1.0, period), degenerate


def _wrapped(x: lz.LazyTensor, t: np.ndarray, k: int, ctx: Context) -> lz.LazyTensor:
    """scikit-learn's ``t[k] + (x - t[k]) % (t[n] - t[k])`` on float64 ``x``."""
    low, period, degenerate = _period(t, k)
    start = ctx.param(low, "period_start", dtype="float64")
    wrapped = start + lz.remainder(x - start, ctx.param(period, "period", dtype="float64"))
    if degenerate.any():
        wrapped = lz.where(ctx.param(degenerate, "degenerate", dtype="bool"), 0.0, wrapped)
    return wrapped


def _periodic_values(features: Features, t: np.ndarray, k: int, ctx: Context) -> lz.LazyTensor:
    """(B, F) float64: each row's value wrapped into the period as scikit-learn wraps it.

    The wrap keeps its input's absolute error, so a float32 value many periods out (a
    timestamp wrapped into a day) would lose its place within the period: the wrap reads the
    source's own values in float64 (the raw column where the feature is one; steps before it
    compute in float64), with numpy's exact ``%``. At degree 0 a step sits at every knot, and
    the wrap moves each knot to ``knot + m * period`` on the raw line for every integer ``m``,
    which no threshold folds: the knots are compared with the wrapped float64 value, as
    scikit-learn compares them."""
    tests = ExactTests(features, ctx)
    if any(m is not None for m in tests.maps):
        ctx.promote(
            "a periodic spline wraps computed columns, keeping their absolute error: they "
            "compute in float64, as the source does",
            inputs=True,
        )
    v = tests.source_values(features.values)
    v = v if v.dtype == "float64" else lz.cast(v, "float64")
    if k == 0:
        for j, source in enumerate(tests.sources):
            if source is not None and tests.maps[j] is None:  # the raw column itself
                ctx.decides_at(source, _periodic_flips(t[j]), "periodic knot test")
    return _wrapped(v, t, k, ctx)


def _periodic_flips(t: np.ndarray, periods: int = 2) -> np.ndarray:
    """The raw values ``x`` at which a degree-0 periodic spline's knot count changes between
    ``x`` and the next float64, within ``periods`` periods of the fitted one: each knot moved by
    whole periods, then searched a few ulps each way with scikit-learn's own arithmetic."""
    low, period, degenerate = (np.asarray(a).item() for a in _period(t[None, :], 0))
    if degenerate:
        return np.empty(0)
    base = t[~np.isnan(t)]
    near = np.concatenate([base + m * period for m in range(-periods, periods + 1)])
    steps = [near]
    for _ in range(4):
        steps = [np.nextafter(steps[0], -np.inf), *steps, np.nextafter(steps[-1], np.inf)]
    x = np.stack(steps, axis=1)  # (candidates, 9), each row ascending

    def count(v: np.ndarray) -> np.ndarray:
        wrapped = low + (v - low) % period
        return np.searchsorted(base, wrapped, side="right")

    changes = count(x[:, :-1]) != count(x[:, 1:])
    flips = x[:, :-1][changes]
    return np.unique(np.concatenate([flips, near[~changes.any(axis=1)]]))


@register(
    SplineTransformer,
    methods=("transform",),
    limits="every extrapolation ('error': rows outside the knots give NaN where scikit-learn "
    "raises); handle_missing; include_bias; dense output",
    exactness="degree 0 (a step at every knot): knot and range tests on the raw float64 columns, "
    "through scalers before it; periodic: the wrap in float64 with numpy's exact %, on the raw "
    "column or on steps computed in float64, and degree 0 compares it with the knots in "
    "float64; higher degrees are continuous at the knots, so their knot tests are the graph's "
    "own, and their basis reads each value measured from the knots' start, subtracted in "
    "float64 from the raw column, so a float32 graph keeps a large value's place among the "
    "knots (a timestamp)",
)
def spline_transformer(est: Any, features: Features, ctx: Context) -> Heads:
    if est.extrapolation not in _EXTRAPOLATIONS:
        raise unsupported_param(est, "extrapolation", est.extrapolation, str(_EXTRAPOLATIONS))
    if est.sparse_output:
        raise unsupported_param(est, "sparse_output", True, "False")
    k = est.degree
    t = np.stack([np.asarray(s.t, np.float64) for s in est.bsplines_])  # (F, m)
    n_splines = est.bsplines_[0].c.shape[1]
    x = features.values
    # A degree-0 basis steps at every knot: a row the graph's rounding puts across a knot
    # gets another basis, so its knot and range tests are decided on the float64 input.
    # Higher degrees are continuous there (within rounding on either side).
    tests = None
    origin = np.zeros(len(t))  # what the basis's values are measured from, per feature
    if est.extrapolation == "periodic":
        wrapped = _periodic_values(features, t, k, ctx)
        if k == 0:  # the basis is 1 in the interval found, on the float64 value
            knots = ctx.param(t, "knots", dtype="float64")
            count = lz.sum(lz.cast(lz.expand_dims(wrapped, 2) >= knots, "int32"), axis=2)
            x_eval = x
        else:
            # The basis reads differences from knots only: measured from the period's start,
            # a float32 graph keeps the place within the period of a value far from 0.
            origin = _period(t, k)[0]
            x_eval = wrapped - ctx.param(origin, "period_origin", dtype="float64")
            x_eval = x_eval if ctx.dtype == "float64" else lz.cast(x_eval, ctx.dtype)
            t = t - origin[:, None]
            count = count_at_most(x_eval, t, ctx, "knots")
    elif k == 0:
        x_eval, tests = x, ExactTests(features, ctx)
        count = tests.count(t, at_least, "knots")
    else:
        count = count_at_most(x, t, ctx, "knots")
        # The basis reads differences from knots only: measured from the base interval's start
        # (in float64 where the raw column is there), a float32 graph keeps the place among
        # the knots of a value far from 0 (a timestamp), as the periodic wrap above does.
        origin = t[:, k]
        x_eval = _measured_from(features, origin, ctx)
        t = t - origin[:, None]
    interval, h = _basis(x_eval, t, k, ctx, count)
    out = _scatter(interval, h, k, n_splines, ctx)  # (B, F, n_splines)
    if est.extrapolation in ("error", "constant", "linear"):
        low_edge, low_values, low_slopes = _boundary_rows(est, "min")
        high_edge, high_values, high_slopes = _boundary_rows(est, "max")
        if tests is None:
            up = ctx.param(rounded(low_edge, ctx, "up"), "xmin", dtype=ctx.dtype)
            down = ctx.param(rounded(high_edge, ctx, "down"), "xmax", dtype=ctx.dtype)
            below, above_range = x < up, x > down
            inside = lz.expand_dims((x >= up) & (x <= down), 2)
        else:
            from_low = tests.holds(low_edge, at_least, "xmin")
            past_high = tests.holds(high_edge, above, "xmax")
            real = ~lz.isnan(x)  # a NaN is neither inside nor beyond
            below, above_range = real & ~from_low, real & past_high
            inside = lz.expand_dims(from_low & ~past_high, 2)
        if est.extrapolation == "error":
            outside: Any = float("nan")  # scipy's value outside the knots, where sklearn raises
        else:
            outside = lz.cast(inside, ctx.dtype) * 0.0  # zeros, (B, F, 1)
            for name, beyond, edge, values, slopes in (
                ("min", below, low_edge, low_values, low_slopes),
                ("max", above_range, high_edge, high_values, high_slopes),
            ):
                row = ctx.param(values, f"f_{name}") + lz.expand_dims(
                    x_eval - ctx.param(edge - origin, f"x{name}"), 2
                ) * ctx.param(slopes, f"fp_{name}")
                outside = lz.where(lz.expand_dims(beyond, 2), row, outside)
        out = lz.where(inside, out, outside)
    if est.handle_missing == "zeros":
        out = lz.where(lz.expand_dims(lz.isnan(x), 2), 0.0, out)
    if not est.include_bias:  # the last basis of every feature is dropped
        out = lz.slice_axis(out, 2, 0, n_splines - 1)
        n_splines -= 1
    return Heads({"transform": lz.reshape(out, (lz.B, features.width * n_splines))})
