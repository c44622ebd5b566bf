"""Edge cases of the discretizer, quantile and power transforms that training rows do not reach:
float32 rows next to every bin edge and quantile, and lambdas at and near the log branches."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import (
    KBinsDiscretizer,
    PowerTransformer,
    QuantileTransformer,
    SplineTransformer,
    StandardScaler,
)

import compiler

JAX = compiler.CompileOptions(backend="jax", max_batch=512, warmup=False)


def _neighbours(values: np.ndarray) -> np.ndarray:
    """Every value's float32 rounding and the float32 numbers one and two steps either side."""
    v32 = values.astype(np.float32)
    out = [v32]
    for direction in (np.float32(np.inf), np.float32(-np.inf)):
        step = v32
        for _ in range(2):
            step = np.nextafter(step, direction)
            out.append(step)
    return np.concatenate(out).astype(np.float64)


def _rows_near(edges: list[np.ndarray], n_rows: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.column_stack([rng.choice(_neighbours(e), n_rows) for e in edges])


def test_bins_are_exact_for_float32_rows_next_to_every_edge() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 3))
    est = KBinsDiscretizer(n_bins=7, encode="ordinal", strategy="uniform").fit(x)
    rows = _rows_near([e[1:-1] for e in est.bin_edges_], 400)
    model = compiler.compile(est, options=JAX)
    np.testing.assert_array_equal(model.transform(rows), est.transform(rows))


def test_quantiles_are_exact_for_float32_rows_next_to_every_quantile() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 2))
    x[:40, 1] = 0.5  # a repeated quantile
    est = QuantileTransformer(n_quantiles=60).fit(x)
    rows = _rows_near([est.quantiles_[:, j] for j in range(2)], 500)
    rows = np.vstack([rows, [[-9.0, 9.0], [9.0, -9.0]]])  # outside the fitted range
    model = compiler.compile(est, options=JAX)
    np.testing.assert_allclose(model.transform(rows), est.transform(rows), rtol=0, atol=1e-5)


def test_normal_output_is_exact_for_float32_rows_near_every_quantile_and_bound() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 2)) * 0.1  # |q| < 0.5: several float32 values per 1e-7
    x[40:80, 1] = 0.05  # a repeated quantile
    # Column 0: 12 rows 1e-7 apart below and above the rest make the outer segments so narrow
    # that rows just inside scikit-learn's bounds (q[0] + 1e-7, q[-1] - 1e-7) would otherwise map
    # deep into a tail instead of onto the clip values.
    x[:12, 0] = x[:, 0].min() - 1e-3 + np.arange(12) * 1e-7
    x[12:24, 0] = x[:, 0].max() + 1e-3 + np.arange(12) * 1e-7
    est = QuantileTransformer(n_quantiles=60, output_distribution="normal").fit(x)
    q = est.quantiles_
    bounds = [np.concatenate([q[:, 0], q[[0, -1], 0] + [1e-7, -1e-7]]), q[:, 1]]
    rows = [_rows_near(bounds, 600)]
    # Column 1: rows across the outer segments, down to 1e-5 of their width from the ends,
    # where the uniform value is within ~1e-7 of 0 or 1 and ppf is steepest.
    depth = 10.0 ** rng.uniform(-5.0, 0.0, 200)
    for end, inner in ((0, 1), (-1, -2)):
        column = q[end, 1] + (q[inner, 1] - q[end, 1]) * depth
        rows.append(np.column_stack([np.zeros(200), column]).astype(np.float32))
    rows.append(np.array([[-9.0, 9.0], [9.0, -9.0], [np.nan, 0.1]]))
    table = np.vstack(rows).astype(np.float64)
    model = compiler.compile(est, options=JAX)
    np.testing.assert_allclose(model.transform(table), est.transform(table), rtol=1e-6, atol=1e-6)


def _with_lambdas(method: str, column: np.ndarray, lambdas: list[float]) -> PowerTransformer:
    est = PowerTransformer(method=method, standardize=False).fit(np.tile(column, (1, 2)))
    est.lambdas_ = np.asarray(lambdas)  # our own estimator: set the branches we want to test
    est.n_features_in_ = len(lambdas)
    return est


def test_power_lambdas_at_and_near_the_log_branches() -> None:
    rng = np.random.default_rng(3)
    column = (rng.standard_normal((64, 1)) * 3.0).astype(np.float32).astype(np.float64)
    lambdas = [0.0, 1e-12, 1e-7, 1e-4, 0.5, 2.0, 2.0 - 1e-7, 2.0 + 1e-4, -1.5, 3.0]
    for method, rows in (("yeo-johnson", column), ("box-cox", np.abs(column) + 0.125)):
        est = _with_lambdas(method, rows, lambdas)
        table = np.tile(rows, (1, len(lambdas)))
        expected = est.transform(table)
        got = compiler.compile(est, options=JAX).transform(table)
        error = np.abs(got - expected) / np.maximum(np.abs(expected), 1.0)
        assert error.max() < 1e-6, (method, error.max(axis=0))


def test_splines_beyond_the_fitted_range() -> None:
    rng = np.random.default_rng(4)
    x = rng.uniform(-2.0, 3.0, (80, 2))
    rows = np.vstack([rng.uniform(-6.0, 8.0, (60, 2)), x[:5]]).astype(np.float32)
    rows = rows.astype(np.float64)
    inside = (rows >= x.min(axis=0)) & (rows <= x.max(axis=0))
    for extrapolation in ("constant", "linear", "continue", "periodic", "error"):
        # degree 0 with constant extrapolation fails in scikit-learn itself
        for degree in (1, 3) if extrapolation == "constant" else (0, 1, 3):
            est = SplineTransformer(n_knots=5, degree=degree, extrapolation=extrapolation)
            est.fit(x)
            table = rows[inside.all(axis=1)] if extrapolation == "error" else rows
            got = compiler.compile(est, options=JAX).transform(table)
            np.testing.assert_allclose(
                got, est.transform(table), rtol=1e-5, atol=1e-5, err_msg=f"{extrapolation}"
            )


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("extrapolation", ["linear", "continue", "error"])
def test_degree_0_splines_step_at_each_knot_as_the_source(extrapolation: str, scaled: bool) -> None:
    """A degree-0 basis changes at every knot, so a float64 row on a knot or one float64 step
    beside it must land where scikit-learn puts it (the fitted range's own ends included),
    also behind a scaler."""
    rng = np.random.default_rng(5)
    x = np.round(rng.normal(size=(300, 2)), 2)
    spline = SplineTransformer(n_knots=6, degree=0, extrapolation=extrapolation)
    est = (make_pipeline(StandardScaler(), spline) if scaled else spline).fit(x)
    knots = np.stack([b.t for b in spline.bsplines_], axis=1)  # (knots, 2) in spline space
    if scaled:
        knots = knots * est[0].scale_ + est[0].mean_
    near = np.concatenate([knots, np.nextafter(knots, np.inf), np.nextafter(knots, -np.inf)])
    rows = np.vstack([x, near])
    if extrapolation == "error":
        rows = rows[((rows >= x.min(axis=0)) & (rows <= x.max(axis=0))).all(axis=1)]
    got = compiler.compile(est, options=JAX).transform(rows)
    np.testing.assert_array_equal(got, est.transform(rows))


def _periodic_rows(spline: SplineTransformer, periods: int) -> np.ndarray:
    """Per feature (columns), in spline space: every knot moved by whole periods, each with its
    float64 neighbours two steps either side."""
    shifted = []
    for b in spline.bsplines_:
        k, t = b.k, b.t
        period = t[-k - 1] - t[k]
        moved = np.concatenate([t + m * period for m in range(-periods, periods + 1)])
        near = [moved]
        for direction in (np.inf, -np.inf):
            step = moved
            for _ in range(2):
                step = np.nextafter(step, direction)
                near.append(step)
        shifted.append(np.concatenate(near))
    return np.column_stack(shifted)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("degree", [0, 1, 3])
def test_periodic_splines_wrap_rows_as_the_source(degree: int, scaled: bool, dtype: str) -> None:
    """scikit-learn wraps with numpy's ``%`` (an exact fmod) in float64. A row on a knot moved
    by whole periods, or a float64 step beside it, must land in the interval scikit-learn
    finds: a degree-0 basis steps there, so its answer must be equal, not close."""
    rng = np.random.default_rng(11)
    x = np.column_stack([np.round(rng.uniform(0.0, 0.7, 300), 2), rng.integers(0, 24, 300)])
    spline = SplineTransformer(n_knots=7, degree=degree, extrapolation="periodic")
    est = (make_pipeline(StandardScaler(), spline) if scaled else spline).fit(x)
    rows = _periodic_rows(spline, periods=40)
    if scaled:
        rows = rows * est[0].scale_ + est[0].mean_
    rows = np.vstack([x, rows, rng.uniform(-100.0, 100.0, (200, 2))])
    options = compiler.CompileOptions(backend="jax", dtype=dtype, max_batch=1024, warmup=False)
    got = compiler.compile(est, options=options).transform(rows)
    if degree == 0 and not scaled:
        np.testing.assert_array_equal(got, est.transform(rows))
    else:  # a scaled row on a moved knot: the scaler's own rounding decides, as the source's
        np.testing.assert_allclose(got, est.transform(rows), rtol=0, atol=1e-6)


@pytest.mark.parametrize("degree", [0, 3])
def test_a_periodic_spline_of_timestamps_keeps_the_time_of_day(degree: int) -> None:
    """Seconds since the epoch wrapped into a day: float32 steps by 128 s at that magnitude, so
    the wrap must read the float64 column even in a float32 graph."""
    rng = np.random.default_rng(12)
    day = 86_400.0
    start = 1.7e9
    x = np.concatenate([[start, start + day], start + rng.integers(0, 86_400, 200)])[:, None]
    spline = SplineTransformer(n_knots=25, degree=degree, extrapolation="periodic").fit(x)
    rows = np.vstack(
        [x, start + rng.integers(-30, 30, (300, 1)) * day + rng.uniform(0, day, (300, 1))]
    )
    rows = np.vstack([rows, _periodic_rows(spline, periods=30)])
    got = compiler.compile(spline, options=JAX).transform(rows)
    if degree == 0:
        np.testing.assert_array_equal(got, spline.transform(rows))
    else:
        np.testing.assert_allclose(got, spline.transform(rows), rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", ["jax", "numpy"])
@pytest.mark.parametrize("extrapolation", ["linear", "constant", "continue"])
@pytest.mark.parametrize("degree", [1, 2, 3])
def test_a_spline_of_timestamps_keeps_each_row_among_the_knots(
    degree: int, extrapolation: str, backend: str
) -> None:
    """Seconds since the epoch over a month, with knots days apart: float32 steps by 128 s at
    that magnitude, so a float32 graph measures each value from the knots' start in float64
    (the basis then rounds with the distance from it) — within the float32 tolerance of the
    source's basis, on rows inside the range, on its knots and beyond it."""
    rng = np.random.default_rng(13)
    start, month = 1.7e9, 30 * 86_400.0
    x = start + np.concatenate([[0.0, month], rng.integers(0, 30 * 86_400, 300).astype(float)])
    spline = SplineTransformer(n_knots=12, degree=degree, extrapolation=extrapolation)
    spline.fit(x[:, None])
    knots = spline.bsplines_[0].t
    beyond = start + rng.uniform(-0.5, 1.5, 200) * month
    rows = np.concatenate([x, knots, np.nextafter(knots, np.inf), beyond])[:, None]
    options = compiler.CompileOptions(backend=backend, max_batch=512, warmup=False)
    got = compiler.compile(spline, options=options).transform(rows)
    expected = spline.transform(rows)
    scale = np.maximum(np.abs(expected), 1.0)
    assert (np.abs(got - expected) / scale).max() < 1e-5
