"""What fitted steps record of their training data, mapped back onto the raw input columns."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import (
    KBinsDiscretizer,
    MinMaxScaler,
    QuantileTransformer,
    RobustScaler,
    StandardScaler,
)

import compiler
from compiler.statistics import quantile_bins

ROWS = 1200


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A continuous column with NaN, a repeated count, a binary flag."""
    rng = np.random.default_rng(seed)
    x = np.c_[
        rng.normal(50.0, 12.0, ROWS).round(1),
        rng.poisson(2.0, ROWS),
        rng.integers(0, 2, ROWS),
    ].astype(np.float64)
    x[rng.random(ROWS) < 0.1, 0] = np.nan
    return x, np.nan_to_num(x[:, 0], nan=50.0) / 10 + x[:, 1]


def _statistics(*steps: Any) -> dict[int, Any]:
    x, y = _data()
    pipe = make_pipeline(*steps, HistGradientBoostingRegressor(max_iter=5)).fit(x, y)
    options = compiler.CompileOptions(warmup=False, backend="interpreter")
    return {s.column: s for s in compiler.trace(pipe, options=options).statistics}


def test_a_min_max_scaler_behind_other_steps_gives_the_raw_range() -> None:
    x, _ = _data()
    stats = _statistics(SimpleImputer(), StandardScaler(), MinMaxScaler())
    for j in range(3):
        low, high = np.nanmin(x[:, j]), np.nanmax(x[:, j])
        # The smallest raw value the scaler maps onto its minimum: the minimum, or a few ulp
        # below where the scaler's rounding cannot tell them apart.
        assert stats[j].low <= low and stats[j].low == pytest.approx(low, rel=1e-12, abs=1e-12)
        assert stats[j].high >= high and stats[j].high == pytest.approx(high, rel=1e-12)
        assert stats[j].edges is None  # a range, no distribution
    assert stats[1].steps == ("model/minmaxscaler (MinMaxScaler)",)


def test_scalers_and_imputers_record_nothing_and_computed_columns_are_left_out() -> None:
    assert _statistics(SimpleImputer(), StandardScaler()) == {}
    assert _statistics(SimpleImputer(), RobustScaler()) == {}
    # A projection's output is no map of one raw column: its range says nothing of them.
    assert _statistics(SimpleImputer(), PCA(2), MinMaxScaler()) == {}


def test_bin_edges_give_a_range_but_not_for_a_constant_column() -> None:
    x, y = _data()
    x[:, 2] = 1.0
    pipe = make_pipeline(
        SimpleImputer(), KBinsDiscretizer(4, encode="ordinal"), HistGradientBoostingRegressor()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Feature 2 is constant"
        pipe.fit(x, y)
    options = compiler.CompileOptions(warmup=False, backend="interpreter")
    stats = {s.column: s for s in compiler.trace(pipe, options=options).statistics}
    assert sorted(stats) == [0, 1]  # the constant column's edges are ±inf
    assert (stats[1].low, stats[1].high) == (x[:, 1].min(), x[:, 1].max())


def test_quantiles_give_a_histogram_on_the_values_a_count_takes() -> None:
    x, _ = _data()
    stats = _statistics(SimpleImputer(), QuantileTransformer(n_quantiles=300))
    count = stats[1]
    assert set(count.edges) <= set(x[:, 1])  # quantiles of repeated values are those values
    assert count.resolution == 299
    # The share below each edge is the data's, to the quantiles' resolution.
    below = np.concatenate([[0.0], np.cumsum(count.shares)[:-1]])
    for edge, share in zip(count.edges, below[1:], strict=False):
        assert share == pytest.approx((x[:, 1] < edge).mean(), abs=2 / 299)
    assert count.shares.sum() == pytest.approx(1.0)
    flag = stats[2]
    assert flag.edges.tolist() == [0.0, 1.0] and flag.shares[0] == 0.0
    assert flag.shares[2] == pytest.approx(x[:, 2].mean(), abs=2 / 299)
    # Behind an imputer the quantiles see a missing value as its fill (the mean): rows compared
    # with them count it in the fill's bin, as the step does.
    fills = SimpleImputer().fit(x).statistics_  # as the pipeline's imputer computed them
    for j, fill in enumerate(fills):
        assert stats[j].missing_bin == np.searchsorted(stats[j].edges, fill, side="right")
    assert _statistics(QuantileTransformer(n_quantiles=300))[0].missing_bin is None


def test_steps_reading_one_column_join_their_ranges() -> None:
    stats = _statistics(SimpleImputer(), MinMaxScaler(), QuantileTransformer(n_quantiles=100))
    both = stats[0]
    assert [s.split(" ")[-1] for s in both.steps] == ["(MinMaxScaler)", "(QuantileTransformer)"]
    assert both.edges is not None and both.resolution == 99


def test_quantile_bins_of_a_binary_column() -> None:
    references = np.linspace(0.0, 1.0, 11)
    quantiles = np.array([0, 0, 0, 0, 0, 0, 0.4, 1, 1, 1, 1], np.float64)
    edges, shares = quantile_bins(quantiles, references)
    assert edges.tolist() == [0.0, 0.4, 1.0]
    assert shares.tolist() == pytest.approx([0.0, 0.6, 0.1, 0.3])
