"""QuantileTransformer and KBinsDiscretizer on float64 rows exactly on their knots and edges.

Real columns repeat values (binary flags, counts, prices to the cent), and every repeated value is
a quantile or a bin edge with rows exactly on it, where the source's answer jumps: scikit-learn
averages the ascending and the descending interpolation over tied quantiles, maps the fitted
minimum to 0 and the maximum to 1, and bins a value on an edge into the upper bin. Values such as
0.1 are not float32 numbers, so a float32 graph that compared the host's float32 rounding of the
row would put every such row on the wrong side. The rows here are the knots and edges themselves,
their float64 neighbours (``np.nextafter``), their float32 neighbours, midpoints, values outside
the fitted range and NaN, on integer, binary and repeated-decimal columns, also behind a scaler
and an imputer (features computed by an earlier step).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.decomposition import PCA
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import KBinsDiscretizer, QuantileTransformer, StandardScaler

import compiler

FLOAT32 = compiler.CompileOptions(backend="jax", max_batch=1024, warmup=False)
FLOAT64 = compiler.CompileOptions(backend="jax", dtype="float64", max_batch=1024, warmup=False)
REFERENCE = compiler.CompileOptions(backend="interpreter", dtype="float64")


def _columns(n: int = 400, seed: int = 0) -> np.ndarray:
    """Binary, small integers, a 0/1 flag mostly 0, decimals to 0.1 with ties at both ends and
    in the middle (clipped), prices to the cent, and a continuous column."""
    rng = np.random.default_rng(seed)
    return np.column_stack(
        [
            rng.integers(0, 2, n),
            rng.integers(0, 6, n),
            rng.random(n) < 0.1,
            np.clip(np.round(rng.normal(0.0, 0.6, n), 1), -0.7, 0.9),
            np.round(rng.lognormal(2.0, 0.5, n), 2),
            rng.normal(size=n),
        ]
    ).astype(np.float64)


def _probes(values: np.ndarray) -> np.ndarray:
    """``values``, their float64 and float32 neighbours, the midpoints between distinct ones, and
    values outside their range."""
    v = np.unique(values[~np.isnan(values)])
    up, down = np.nextafter(v, np.inf), np.nextafter(v, -np.inf)
    v32 = v.astype(np.float32)
    up32 = np.nextafter(v32, np.float32(np.inf)).astype(np.float64)
    down32 = np.nextafter(v32, np.float32(-np.inf)).astype(np.float64)
    middle = (v[1:] + v[:-1]) / 2
    outside = [v[0] - 1.0, v[-1] + 1.0, v[0] - 1e-9, v[-1] + 1e-9]
    probes = np.concatenate([v, up, down, v32.astype(np.float64), up32, down32, middle, outside])
    # not the neighbours of 0: XLA flushes subnormal numbers (float32's too) to zero
    return probes[(probes == 0) | (np.abs(probes) >= np.finfo(np.float32).tiny)]


def _rows(knots: list[np.ndarray], n_rows: int, seed: int = 1) -> np.ndarray:
    """Rows whose every column is a probe of that column's knots, each probe at least once."""
    rng = np.random.default_rng(seed)
    probes = [_probes(k) for k in knots]
    n_rows = max(n_rows, *(len(p) for p in probes))
    return np.column_stack([np.concatenate([p, rng.choice(p, n_rows - len(p))]) for p in probes])


def _quantile_rows(est: QuantileTransformer, x: np.ndarray) -> np.ndarray:
    knots = [np.concatenate([est.quantiles_[:, j], x[:, j]]) for j in range(x.shape[1])]
    rows = _rows(knots, 600)
    # the normal output's bounds: 1e-7 inside the fitted range, and their float64 neighbours
    bounds = np.vstack([est.quantiles_[0] + 1e-7, est.quantiles_[-1] - 1e-7])
    bounds = np.vstack([bounds, np.nextafter(bounds, np.inf), np.nextafter(bounds, -np.inf)])
    nan = np.where(np.eye(x.shape[1], dtype=bool), np.nan, x[: x.shape[1]])
    return np.vstack([rows, bounds, nan])


def _assert_close(got: np.ndarray, expected: np.ndarray, atol: float, rtol: float = 0.0) -> None:
    assert got.shape == expected.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("distribution", ["uniform", "normal"])
@pytest.mark.parametrize("n_quantiles", [1000, 37])
def test_quantiles_on_knots_ties_and_bounds(distribution: str, n_quantiles: int) -> None:
    x = _columns()
    x[::17, 3] = np.nan  # NaN is ignored by fit and passed through by transform
    est = QuantileTransformer(
        n_quantiles=min(n_quantiles, len(x)), output_distribution=distribution
    ).fit(x)
    rows = _quantile_rows(est, x)
    expected = est.transform(rows)
    # the ties matter: binary rows on 0 and 1 map to the bounds, a tied middle value between
    assert set(np.unique(expected[rows[:, 0] == 0.0, 0])) == {expected[rows[:, 0] == 0.0, 0][0]}
    for options in (REFERENCE, FLOAT64):
        got = compiler.compile(est, options=options).transform(rows)
        _assert_close(got, expected, atol=1e-12)
    got = compiler.compile(est, options=FLOAT32).transform(rows)
    # float32 rounding of the interpolation (the normal output's tails are ~5 in size)
    _assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_uniform_ties_take_the_middle_of_their_references() -> None:
    """A binary-like column with three values, one not a float32 number: rows on it are in the
    middle of its run of references, rows 1 ulp away at either end of it."""
    x = np.repeat([0.1, 0.2, 0.7], [30, 50, 20])[:, None]
    est = QuantileTransformer(n_quantiles=100).fit(x)
    rows = np.array([0.1, 0.2, 0.7, np.nextafter(0.2, 1.0), np.nextafter(0.2, 0.0), 0.45, -1.0])
    expected = est.transform(rows[:, None])[:, 0]
    np.testing.assert_allclose(expected[[0, 2, 6]], [0.0, 1.0, 0.0])
    assert 0.4 < expected[1] < 0.6 and expected[3] > 0.75 and expected[4] < 0.35
    got = compiler.compile(est, options=FLOAT32).transform(rows[:, None])[:, 0]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("distribution", ["uniform", "normal"])
def test_quantiles_behind_a_scaler_and_an_imputer(distribution: str) -> None:
    """The knots are decided on the raw float64 column through the steps before (exact), not on
    the float32 scaled value the graph computes."""
    x = _columns(seed=2)
    x[::13, 1] = np.nan
    x[::11, 3] = np.nan
    pipeline = make_pipeline(
        SimpleImputer(strategy="median"),
        StandardScaler(),
        QuantileTransformer(n_quantiles=200, output_distribution=distribution),
    ).fit(x)
    rows = np.vstack([_rows([x[:, j] for j in range(x.shape[1])], 500, seed=3), x[:40]])
    expected = pipeline.transform(rows)
    for options in (REFERENCE, FLOAT64):
        _assert_close(compiler.compile(pipeline, options=options).transform(rows), expected, 1e-12)
    got = compiler.compile(pipeline, options=FLOAT32).transform(rows)
    _assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_quantiles_of_raw_scaled_and_projected_columns_together() -> None:
    """Columns of every kind in one step: raw, scaled (mapped), and projected (no map: compared
    as the graph computes them, so only float32-close there)."""
    x = _columns(seed=4)
    pipeline = make_pipeline(
        ColumnTransformer(
            [
                ("scaled", StandardScaler(), [1, 3]),
                ("projected", PCA(n_components=1), [4, 5]),
                ("raw", "passthrough", [0, 2, 3]),
            ]
        ),
        QuantileTransformer(n_quantiles=100),
    ).fit(x)
    rows = np.vstack([_rows([x[:, j] for j in range(x.shape[1])], 400, seed=5), x[:40]])
    expected = pipeline.transform(rows)
    got = compiler.compile(pipeline, options=FLOAT32).transform(rows)
    exact = [0, 1, 3, 4, 5]  # every column but the projection
    _assert_close(got[:, exact], expected[:, exact], atol=1e-6)
    _assert_close(got[:, [2]], expected[:, [2]], atol=1e-4)


# -- KBinsDiscretizer ---------------------------------------------------------------------------

ENCODES = ["ordinal", "onehot", "onehot-dense"]
STRATEGIES = ["uniform", "quantile", "kmeans"]


def _dense(x: object) -> np.ndarray:
    return np.asarray(x.toarray() if hasattr(x, "toarray") else x)


def _edge_rows(est: KBinsDiscretizer, x: np.ndarray, n_rows: int = 600) -> np.ndarray:
    knots = [np.concatenate([est.bin_edges_[j], x[:, j]]) for j in range(x.shape[1])]
    return _rows(knots, n_rows)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("encode", ENCODES)
def test_bins_on_every_edge_and_its_neighbours(encode: str, strategy: str) -> None:
    x = _columns(seed=6)
    est = KBinsDiscretizer(n_bins=5, encode=encode, strategy=strategy).fit(x)
    rows = _edge_rows(est, x)
    expected = _dense(est.transform(rows))
    ordinal = KBinsDiscretizer(n_bins=5, encode="ordinal", strategy=strategy).fit(x)
    on_edge = np.column_stack(
        [np.isin(rows[:, j], ordinal.bin_edges_[j][1:-1]) for j in range(x.shape[1])]
    )
    assert on_edge.sum() > 50  # the rows do sit on edges
    for options in (FLOAT32, FLOAT64):
        got = compiler.compile(est, options=options).transform(rows)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("encode", ENCODES)
def test_bins_behind_a_scaler_and_an_imputer(encode: str) -> None:
    x = _columns(seed=7)
    x[::9, 4] = np.nan
    pipeline = make_pipeline(
        SimpleImputer(strategy="median"),
        StandardScaler(),
        KBinsDiscretizer(n_bins=4, encode=encode, strategy="uniform"),
    ).fit(x)
    rows = np.vstack([_rows([x[:, j] for j in range(x.shape[1])], 500, seed=8), x[:50]])
    expected = _dense(pipeline.transform(rows))
    for options in (FLOAT32, FLOAT64):
        got = compiler.compile(pipeline, options=options).transform(rows)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bins_of_a_float32_discretizer() -> None:
    """``dtype=np.float32``: scikit-learn bins ``float32(x)``; the host's own rounding is it."""
    x = _columns(seed=9)
    est = KBinsDiscretizer(n_bins=6, encode="ordinal", strategy="quantile", dtype=np.float32)
    est.fit(x)
    rows = _edge_rows(est, x)
    expected = est.transform(rows)
    for options in (FLOAT32, FLOAT64):
        np.testing.assert_array_equal(
            compiler.compile(est, options=options).transform(rows), expected
        )
