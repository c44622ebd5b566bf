"""Data-quality and drift metrics: the registration reference, and the counts and PSI of sampled
production rows against it."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import skops.io as sio
from prometheus_client import CollectorRegistry
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, OneHotEncoder, QuantileTransformer, StandardScaler

import compiler
import lazy as lz
from service.drift import OTHER_COLUMNS
from service.drift_reference import Histogram, build_reference, present_values, psi, smoothed
from service.metrics import Metrics
from service.models import ModelManager
from service.settings import Settings
from service.store import ModelStore
from service.versions import ModelOptions, State, Upload

RNG = np.random.default_rng(7)
N = 600


def _frame(n: int, rng: np.random.Generator, shift: float = 0.0) -> pd.DataFrame:
    """Real data shapes: a continuous column with NaN, a repeated integer count, a binary flag and
    a string category."""
    income = rng.lognormal(3.0, 0.5, n) + shift
    income[rng.random(n) < 0.1] = np.nan
    return pd.DataFrame(
        {
            "income": income,
            "visits": rng.poisson(3, n).astype(np.int64),
            "member": rng.integers(0, 2, n).astype(np.int64),
            "city": rng.choice(["oslo", "lima", "pune"], n, p=[0.5, 0.3, 0.2]).astype(object),
        }
    )


def _pipeline() -> object:
    frame = _frame(N, RNG)
    y = ((np.nan_to_num(frame["income"], nan=20.0) > 20) ^ (frame["city"] == "lima")).astype(int)
    numeric = make_pipeline(SimpleImputer(), StandardScaler())
    features = ColumnTransformer(
        [
            ("num", numeric, ["income", "visits", "member"]),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["city"]),
        ]
    )
    return make_pipeline(features, HistGradientBoostingClassifier(max_iter=20)).fit(frame, y)


def _fitted_pipeline(train: pd.DataFrame) -> object:
    """A model whose steps record their training data: a QuantileTransformer behind an imputer
    and a scaler on ``income`` (its range and distribution), a MinMaxScaler on the count and the
    flag (their ranges), a one-hot city (its categories)."""
    y = ((train["visits"] > 3) ^ (train["city"] == "lima")).astype(int)
    income = make_pipeline(SimpleImputer(), StandardScaler(), QuantileTransformer(n_quantiles=500))
    features = ColumnTransformer(
        [
            ("income", income, ["income"]),
            ("counts", MinMaxScaler(), ["visits", "member"]),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["city"]),
        ]
    )
    return make_pipeline(features, HistGradientBoostingClassifier(max_iter=20)).fit(train, y)


def _binned_psi(histogram: Histogram, schema: compiler.InputSchema, rows: object, j: int) -> float:
    """Column ``j`` of ``rows`` binned as the drift worker bins it, and its PSI."""
    x, indices = schema.observed(rows)
    present, missing = present_values(x, indices, j)
    bins = histogram.bin_of(present)
    if histogram.missing_bin is not None:
        bins = np.concatenate([bins, np.full(int(missing.sum()), histogram.missing_bin)])
    return psi(np.bincount(bins, minlength=histogram.bins), histogram.expected)


def test_a_numeric_histogram_bins_repeated_values_and_edges_alike() -> None:
    binary = np.array([0, 0, 0, 1, 1, 0, 1, 0, 0, 0], np.float64)
    h = Histogram.numeric(binary)
    assert h is not None and h.edges is not None
    assert h.edges.tolist() == [0.0, 1.0]  # values the sample holds, not interpolated ones
    # A value exactly on an edge goes to the bin above, in the reference and live alike.
    assert h.bin_of(np.array([-1.0, 0.0, 0.5, 1.0, 2.0])).tolist() == [0, 1, 1, 2, 2]
    counts = np.bincount(h.bin_of(binary), minlength=h.bins)
    assert psi(counts, h.expected) == pytest.approx(0.0, abs=1e-12)
    assert psi(np.array([0, 0, 10]), h.expected) > 1.0  # every row now 1
    counts = np.bincount(h.bin_of(RNG.poisson(3, 1000).astype(float)), minlength=h.bins)
    assert math.isfinite(psi(counts, h.expected))  # half a count per bin: no log(0)
    assert Histogram.numeric(np.zeros(0)) is None
    assert smoothed(np.array([0, 1])).tolist() == pytest.approx([0.25, 0.75])


def test_the_reference_records_ranges_missing_ratios_and_categories() -> None:
    pipe = _pipeline()
    sample = _frame(400, np.random.default_rng(1))
    model = compiler.compile(pipe, sample=sample)
    schema = model.schema
    ref = build_reference(schema, sample, model.outputs(sample), model.classes_)
    by_name = {c.name: c for c in ref.columns}
    income = sample["income"]
    assert by_name["income"].low == income.min() and by_name["income"].high == income.max()
    assert by_name["income"].missing_ratio == pytest.approx(income.isna().mean())
    assert by_name["member"].histogram.edges.tolist() == [0.0, 1.0]
    city = by_name["city"]
    assert city.categorical and city.low is None and city.histogram.categories == 3
    assert sorted(ref.outputs) == sorted(model.methods)
    assert ref.outputs["predict"].classes == {0: 0, 1: 1}
    assert ref.describe()["sample_rows"] == 400
    # Without a sample only the schema is known: categories, no ranges or histograms.
    bare = build_reference(schema, None, None, None)
    assert bare.rows == 0 and not bare.outputs
    assert all(c.histogram is None and c.low is None for c in bare.columns)
    assert [c.categorical for c in bare.columns] == [False, False, False, True]


def test_without_a_sample_the_fitted_statistics_give_ranges_and_a_histogram() -> None:
    train = _frame(3000, np.random.default_rng(11))
    pipe = _fitted_pipeline(train)
    model = compiler.compile(pipe, options=compiler.CompileOptions(warmup=False))
    schema = model.schema
    ref = build_reference(schema, None, None, None, model.statistics)
    income, visits, member, city = ref.columns
    # The MinMaxScaler's data_min_ / data_max_: the count's and the flag's training range.
    assert (visits.low, visits.high) == (train["visits"].min(), train["visits"].max())
    assert (member.low, member.high) == (0.0, 1.0)
    assert visits.histogram is None and member.histogram is None  # a range gives no mass
    assert visits.fitted == ("model/columntransformer/counts (MinMaxScaler)",)
    # The quantiles, moved back through the scaler onto the raw line: every training income is
    # in range, and the ends are the training extremes up to the scaler's rounding.
    seen = train["income"].dropna()
    assert income.low <= seen.min() and income.high >= seen.max()
    assert income.low == pytest.approx(seen.min(), rel=1e-12)
    assert income.high == pytest.approx(seen.max(), rel=1e-12)
    histogram = income.histogram
    assert histogram is not None and histogram.bins == 10
    # The QuantileTransformer saw missing incomes as the imputer's mean: they count in its bin.
    fill = pipe[0].named_transformers_["income"][0].statistics_[0]
    assert fill == histogram.edges[5]  # a tenth of the rows sit on it: one of its deciles
    assert histogram.missing_bin == int(np.searchsorted(histogram.edges, fill, side="right"))
    # The training rows binned live reproduce the fitted shares.
    assert _binned_psi(histogram, schema, train, 0) < 0.01
    assert _binned_psi(histogram, schema, _frame(2000, np.random.default_rng(12)), 0) < 0.05
    shifted = _frame(2000, np.random.default_rng(13), shift=10.0)
    assert _binned_psi(histogram, schema, shifted, 0) > 0.25
    more_missing = _frame(2000, np.random.default_rng(14))
    more_missing.loc[: len(more_missing) // 2, "income"] = np.nan
    assert _binned_psi(histogram, schema, more_missing, 0) > 0.25
    # Categories are the schema's; nothing fitted gives a missing-value ratio.
    assert city.categorical and city.low is None and city.histogram is None
    assert all(c.missing_ratio is None for c in ref.columns)
    assert ref.describe() == {
        "sample_rows": 0,
        "columns_with_histograms": 1,
        "columns_with_ranges": 3,
        "columns_from_fitted_statistics": 3,
        "outputs": [],
    }
    # With a sample, its histograms stand and its ranges widen to the training range.
    sample = _frame(200, np.random.default_rng(15))
    sample.loc[0, "visits"] = train["visits"].max() + 5
    both = build_reference(schema, sample, model.outputs(sample), model.classes_, model.statistics)
    income2, visits2 = both.columns[:2]
    assert visits2.low == 0 and visits2.high == train["visits"].max() + 5
    assert income2.low == min(income.low, sample["income"].min())
    assert income2.high == max(income.high, sample["income"].max())
    assert income2.histogram.missing_bin is None  # the sample's: missing values left out
    assert income2.missing_ratio == pytest.approx(sample["income"].isna().mean())
    # A model whose steps record nothing (scalers, imputers) gets no ranges from them.
    bare = compiler.compile(_pipeline(), options=compiler.CompileOptions(warmup=False))
    assert bare.statistics == ()


def test_observed_reads_what_a_model_would_refuse() -> None:
    schema = compiler.compile(_pipeline()).schema
    rows = [
        {"income": None, "visits": 2, "member": 1, "city": "oslo"},
        {"income": 30.5, "visits": 1, "member": 0, "city": "rome"},
        {"income": float("nan"), "visits": 0, "member": 0, "city": None},
    ]
    x, indices = schema.observed(rows)
    assert np.isnan(x[[0, 2], 0]).all() and x[1, 0] == 30.5
    (city,) = indices.values()
    oslo = list(schema.vocabularies[3].categories).index("oslo")
    assert city.tolist() == [oslo, -1, -2]


def _manager(root: Path, **overrides: object) -> ModelManager:
    settings = Settings(
        store_url=str(root / "store"),
        cache_dir=root / "cache",
        poll_interval_s=0,
        live_parity_share=0,
        drift_share=1.0,
        drift_cpu=1.0,
        drift_min_rows=100,
        **overrides,
    )
    cache = lz.ExecutableCache(disk_dir=settings.cache_dir)
    metrics = Metrics(CollectorRegistry())
    return ModelManager(settings, ModelStore(settings.store_url), metrics, cache)


def _value(manager: ModelManager, name: str, **labels: str) -> float | None:
    return manager.metrics.registry.get_sample_value(name, {"model": "m", "version": "1", **labels})


async def _send(manager: ModelManager, requests: int, *, seed: int, shift: float = 0.0) -> int:
    """Score ``requests`` requests of 100 fresh rows (seeds ``seed``, ``seed + 1``, ...): the
    rows sent."""
    for i in range(requests):
        rows = _frame(100, np.random.default_rng(seed + i), shift=shift)
        await manager.predict("m", None, rows, outputs=None, deadline=None)
    return 100 * requests


async def _observed(manager: ModelManager, rows: float) -> None:
    deadline = time.monotonic() + 30
    while (_value(manager, "kestrel_input_rows_total") or 0) < rows:
        assert time.monotonic() < deadline, "the drift worker did not read the samples"
        await asyncio.sleep(0.02)


def test_quality_counts_and_psi_move_when_the_inputs_shift(tmp_path: Path) -> None:
    manager = _manager(tmp_path, drift_columns=3, drift_window_s=3600)
    pipe = _pipeline()
    sample = _frame(500, np.random.default_rng(2))
    records = sample.astype(object).where(sample.notna(), None).to_dict(orient="records")

    async def scenario() -> None:
        try:
            mv = await manager.register(
                Upload(
                    "m",
                    sio.dumps(pipe),
                    filename="m.skops",
                    sample=records,
                    options=ModelOptions(max_batch=64),
                )
            )
            assert await manager.wait(mv, 180) and mv.state is State.READY, mv.error
            assert mv.describe()["drift_reference"]["sample_rows"] == 500
            seen = 0
            # The registration distribution: every PSI stays small.
            seen += await _send(manager, 6, seed=100)
            await _observed(manager, seen)
            assert _value(manager, "kestrel_input_psi_max") < 0.1
            assert _value(manager, "kestrel_prediction_psi", output="predict") < 0.1
            # Rows on the sample's range ends count as in range; beyond it, out of range.
            income = mv.reference.columns[0]
            edge = [
                {"income": income.low, "visits": 3, "member": 1, "city": "oslo"},
                {"income": income.high, "visits": 3, "member": 0, "city": "rome"},
                {"income": income.high * 2, "visits": 3, "member": 0, "city": None},
                {"income": None, "visits": 3, "member": 0, "city": "lima"},
            ]
            counted = [
                ("out_of_range_values", "income"),
                ("missing_values", "income"),
                ("unknown_categories", OTHER_COLUMNS),
                ("missing_values", OTHER_COLUMNS),
            ]

            def counts() -> list[float]:
                return [
                    _value(manager, f"kestrel_input_{k}_total", column=c) or 0 for k, c in counted
                ]

            before = counts()
            await manager.predict("m", None, edge, outputs=None, deadline=None)
            seen += 4
            await _observed(manager, seen)
            # city is the fourth column: past drift_columns=3, counted as (other) with the
            # others there (none).
            assert [a - b for a, b in zip(counts(), before, strict=True)] == [1, 1, 1, 1]
            # Incomes shift up: the column's PSI and the predictions' move, the others do not.
            seen += await _send(manager, 12, seed=200, shift=25.0)
            await _observed(manager, seen)
            assert _value(manager, "kestrel_input_psi", column="income") > 0.25
            assert _value(manager, "kestrel_input_psi", column="visits") < 0.1
            assert _value(manager, "kestrel_input_psi_max") > 0.25
            assert _value(manager, "kestrel_prediction_psi", output="predict_proba") > 0.1
            assert _value(manager, "kestrel_input_psi", column="city") is None  # not labelled
            assert _value(manager, "kestrel_drift_samples_total", result="observed") == 19
        finally:
            await manager.close()

    asyncio.run(scenario())


def test_a_model_registered_without_a_sample_is_monitored_by_its_fitted_statistics(
    tmp_path: Path,
) -> None:
    manager = _manager(tmp_path, drift_columns=4, drift_window_s=3600)
    train = _frame(3000, np.random.default_rng(11))
    pipe = _fitted_pipeline(train)

    async def scenario() -> None:
        try:
            upload = Upload("m", sio.dumps(pipe), filename="m.skops", options=ModelOptions())
            mv = await manager.register(upload)
            assert await manager.wait(mv, 180) and mv.state is State.READY, mv.error
            described = mv.describe()["drift_reference"]
            assert described["sample_rows"] == 0
            assert described["columns_from_fitted_statistics"] == 3
            seen = 0
            # Rows from the training distribution: the quantile column's PSI stays small; the
            # range-only columns have none.
            seen += await _send(manager, 6, seed=300)
            await _observed(manager, seen)
            assert _value(manager, "kestrel_input_psi", column="income") < 0.1
            assert _value(manager, "kestrel_input_psi", column="visits") is None
            assert _value(manager, "kestrel_input_reference_missing_ratio", column="income") is None

            def out_of_range() -> list[float]:
                return [
                    _value(manager, "kestrel_input_out_of_range_values_total", column=c) or 0
                    for c in ("income", "visits", "member", "city")
                ]

            before = out_of_range()
            income, visits = mv.reference.columns[:2]
            edge = [  # the training range's ends are in range; beyond them, out of range
                {"income": income.low, "visits": visits.high, "member": 1, "city": "oslo"},
                {"income": income.high, "visits": 0, "member": 0, "city": "lima"},
                {"income": income.high * 2, "visits": visits.high + 1, "member": 2, "city": "x"},
                {"income": income.low / 2, "visits": 3, "member": 0, "city": "pune"},
                {"income": None, "visits": -1, "member": 1, "city": "oslo"},
            ]
            await manager.predict("m", None, edge, outputs=None, deadline=None)
            seen += len(edge)
            await _observed(manager, seen)
            moved = [a - b for a, b in zip(out_of_range(), before, strict=True)]
            assert moved == [2, 2, 1, 0]
            # Incomes shift up: their PSI moves against the fitted quantiles.
            seen += await _send(manager, 12, seed=400, shift=25.0)
            await _observed(manager, seen)
            assert _value(manager, "kestrel_input_psi", column="income") > 0.25
            assert _value(manager, "kestrel_input_psi_max") > 0.25
        finally:
            await manager.close()

    asyncio.run(scenario())
