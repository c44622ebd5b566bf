"""Float32 input is decided as the source decides it on float32 input.

scikit-learn's scalers and imputers keep float32 in float32, rounding after each operation, so a
split behind them can flip one float32 step away from where it flips on float64 input. Every
probe here sits on or beside a recorded threshold of either kind; each model is checked to have
thresholds where the two kinds of input differ (else the test would prove nothing) and to be
exact on float32 input and on float64 input alike."""

from __future__ import annotations

import lightgbm
import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import (
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
    RandomForestRegressor,
)
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import (
    KBinsDiscretizer,
    MaxAbsScaler,
    MinMaxScaler,
    OneHotEncoder,
    RobustScaler,
    StandardScaler,
)
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

import compiler
import lazy as lz
from compiler import float32_inputs
from compiler.errors import SchemaError
from compiler.float32_inputs import ColumnShift, Float32Inputs, arrives_float32

WIDTH = 4


def real_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """float32 columns as real tables hold them: a large offset with a few decimals (so the
    scalers' float32 rounding matters), small integers, a binary flag, and NaN in one."""
    rng = np.random.default_rng(seed)
    n = 3000
    x = np.empty((n, WIDTH), np.float32)
    x[:, 0] = np.round(1000 + rng.normal(scale=3, size=n), 3)
    x[:, 1] = rng.integers(0, 7, n)
    x[:, 2] = np.round(rng.normal(scale=50, size=n), 2)
    x[:, 3] = rng.integers(0, 2, n)
    y = ((x[:, 0] - 1000) * 0.4 + x[:, 1] * 0.3 + x[:, 2] * 0.01 + x[:, 3] > 1.5).astype(int)
    x[rng.random(n) < 0.05, 2] = np.nan
    return x, y


def probes(model: compiler.CompiledModel, base: np.ndarray, steps: int = 3) -> np.ndarray:
    """float32 rows: each base row with one column set to every float32 value within ``steps``
    of each recorded threshold, for float64 and for float32 input."""
    rows = []
    for points in model.decisions:
        t = points.values if points.cuts is None else points.cuts.ravel()
        t = t[np.isfinite(t)]
        with np.errstate(over="ignore"):
            near = [t.astype(np.float32)]
        for direction in (np.inf, -np.inf):
            v = near[0]
            for _ in range(steps):
                v = np.nextafter(v, np.float32(direction))
                near.append(v)
        values = np.unique(np.concatenate(near))
        values = values[np.isfinite(values)]
        block = np.repeat(base, len(values), axis=0)
        block[:, points.column] = np.tile(values, len(base))
        rows.append(block)
    return np.concatenate(rows)


def _differs_by_input_dtype(source, x32: np.ndarray, method: str) -> int:
    """Rows on which the source answers float32 input otherwise than the same values in float64:
    the cases this file is about."""
    a = getattr(source, method)(x32)
    b = getattr(source, method)(x32.astype(np.float64))
    return int((~np.isclose(a, b, rtol=0, atol=1e-12)).reshape(len(x32), -1).any(axis=1).sum())


PIPELINES = {
    "standard-tree": lambda: make_pipeline(
        SimpleImputer(strategy="median"), StandardScaler(), DecisionTreeClassifier(random_state=0)
    ),
    "minmax-clip-hgb": lambda: make_pipeline(
        MinMaxScaler(feature_range=(-1, 3), clip=True),
        HistGradientBoostingClassifier(max_iter=30, random_state=0),
    ),
    "robust-forest": lambda: make_pipeline(
        SimpleImputer(strategy="mean"),
        RobustScaler(),
        RandomForestRegressor(n_estimators=5, max_depth=8, random_state=0),
    ),
    "maxabs-hgb": lambda: make_pipeline(
        SimpleImputer(strategy="median"),
        MaxAbsScaler(),
        HistGradientBoostingRegressor(max_iter=20, random_state=0),
    ),
}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_trees_behind_scalers_decide_float32_input_as_the_source(name: str) -> None:
    x, y = real_data()
    pipeline = PIPELINES[name]().fit(x, y)
    model = compiler.compile(pipeline, sample=x[:64])
    method = "predict_proba" if hasattr(pipeline, "predict_proba") else "predict"
    rows = probes(model, x[:3])
    assert _differs_by_input_dtype(pipeline, rows, method) > 0, "no probe tells the dtypes apart"
    # The host moves float32 values that folded splits read, and replays the features of
    # float32-comparing trees in float32 (compiler.replayed_columns), which needs no move.
    assert model._float32 is not None or model._omitted
    for batch in (rows, rows.astype(np.float64)):
        np.testing.assert_allclose(
            getattr(model, method)(batch), getattr(pipeline, method)(batch), rtol=0, atol=1e-6
        )


def test_one_rounding_before_a_float32_comparing_tree_needs_no_shift() -> None:
    """MaxAbsScaler divides once: float32 input rounds the quotient once, as the tree's own
    float32 cast of the float64 quotient does, so the host moves nothing."""
    x, y = real_data()
    pipeline = make_pipeline(
        MaxAbsScaler(), DecisionTreeRegressor(max_depth=10, random_state=0)
    ).fit(np.nan_to_num(x), y)
    model = compiler.compile(pipeline, sample=x[:64])
    assert model._float32 is None
    rows = probes(model, np.nan_to_num(x[:3]))
    np.testing.assert_allclose(model.predict(rows), pipeline.predict(rows), rtol=0, atol=1e-6)


def test_bin_edges_behind_a_scaler_decide_float32_input_as_the_source() -> None:
    x, y = real_data()
    x = np.nan_to_num(x, nan=0.0)
    pipeline = make_pipeline(
        StandardScaler(),
        KBinsDiscretizer(n_bins=12, encode="ordinal", strategy="uniform", subsample=None),
    ).fit(x, y)
    model = compiler.compile(pipeline, sample=x[:64])
    rows = probes(model, x[:2])
    assert _differs_by_input_dtype(pipeline, rows, "transform") > 0
    for batch in (rows, rows.astype(np.float64)):
        np.testing.assert_array_equal(model.transform(batch), pipeline.transform(batch))


def test_a_float32_frame_with_strings_decides_as_the_source() -> None:
    """The shape that showed the bug: imputer + scaler on float32 columns beside one-hot strings,
    a forest after them."""
    x, y = real_data()
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({f"n{j}": x[:, j] for j in range(WIDTH)})
    frame["s"] = np.array(["a", "b", "c"], dtype=object)[rng.integers(0, 3, len(frame))]
    numeric = [f"n{j}" for j in range(WIDTH)]
    features = ColumnTransformer(
        [
            ("num", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), numeric),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["s"]),
        ]
    )
    pipeline = make_pipeline(features, DecisionTreeClassifier(random_state=0)).fit(frame, y)
    model = compiler.compile(pipeline, sample=frame.iloc[:64])
    values = probes(model, x[:2])
    rows = pd.DataFrame({f"n{j}": values[:, j] for j in range(WIDTH)})
    rows["s"] = "b"
    as64 = rows.astype({c: np.float64 for c in numeric})
    assert arrives_float32(rows, numeric) and not arrives_float32(as64, numeric)
    differ = pipeline.predict_proba(rows) != pipeline.predict_proba(as64)
    assert differ.any(), "no probe tells the dtypes apart"
    np.testing.assert_array_equal(model.predict_proba(rows), pipeline.predict_proba(rows))
    np.testing.assert_array_equal(model.predict_proba(as64), pipeline.predict_proba(as64))


#: Sources that compare float64: a float32 table reaches them widened exactly, so the compiled
#: model reads it as it is and decides on it in float32 (lazy.narrowing), with no host work.
FLOAT64_COMPARING = {
    "hgb": lambda: HistGradientBoostingClassifier(max_iter=30, random_state=0),
    "lightgbm": lambda: lightgbm.LGBMClassifier(
        n_estimators=20, num_leaves=15, min_child_samples=5, random_state=0, verbose=-1
    ),
    "hgb-regressor": lambda: HistGradientBoostingRegressor(max_iter=20, random_state=0),
}


@pytest.mark.parametrize("name", sorted(FLOAT64_COMPARING))
def test_float32_tables_are_decided_as_they_are_by_float64_comparing_trees(name: str) -> None:
    x, y = real_data()
    source = FLOAT64_COMPARING[name]().fit(x, y)
    # Split codes (chosen for few columns compared often) would encode the table instead.
    options = compiler.CompileOptions(split_codes=False)
    model = compiler.compile(source, sample=x[:64], options=options)
    assert model.compiled.narrows == "x"
    rows = probes(model, x[:3])
    rows[::7, 2] = np.nan
    feed, _ = model.encode(rows)
    assert feed["x"] is rows  # no copy, no widening on the host
    method = "predict_proba" if hasattr(source, "predict_proba") else "predict"
    narrow = model.compiled.graphs[-1]
    with model.pinned(lz.HOST):  # where warm-up's timing placed the buckets is noise here
        calls = narrow.stats.calls
        getattr(model, method)(rows)
        assert narrow.stats.calls > calls  # the narrowed program answered
    # On every formulation, the same answers as the float64 table of the same values, and as
    # the source's (the device widens the table itself).
    expected = getattr(source, method)(rows)
    for formulation in model.formulations:
        with model.pinned(formulation):
            got = getattr(model, method)(rows)
            np.testing.assert_array_equal(got, getattr(model, method)(rows.astype(np.float64)))
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
            if method == "predict_proba":
                np.testing.assert_array_equal(model.predict(rows), source.predict(rows))


def test_subnormal_float32_tables_and_thresholds_decide_as_the_source_everywhere() -> None:
    """Thresholds between subnormal float32 values round down to subnormals, which a device
    that flushes them reads as zero (lazy.subnormals moves them and reruns such rows on the
    host): the narrowed program still decides every row as the source on each formulation."""
    rng = np.random.default_rng(0)
    tiny = np.finfo(np.float32).tiny
    values = np.array([-1, -tiny / 2, -tiny / 8, 0, tiny / 8, tiny / 4, tiny / 2, tiny, 1])
    x = rng.choice(values.astype(np.float32), (4000, 3))
    y = ((x[:, 0] > tiny / 5) ^ (x[:, 1] < -tiny / 6)).astype(int)
    source = HistGradientBoostingClassifier(max_iter=10, random_state=0).fit(x, y)
    options = compiler.CompileOptions(split_codes=False, max_batch=256)
    model = compiler.compile(source, options=options)
    assert model.compiled.narrows == "x"
    subnormal = np.concatenate([d.values for d in model.decisions])
    assert ((subnormal != 0) & (np.abs(subnormal) < tiny)).any()
    rows = rng.choice(values.astype(np.float32), (2000, 3))
    for formulation in model.formulations:
        with model.pinned(formulation):
            np.testing.assert_array_equal(model.predict(rows), source.predict(rows))
            np.testing.assert_allclose(
                model.predict_proba(rows), source.predict_proba(rows), rtol=0, atol=1e-6
            )


def test_a_float32_table_the_host_moves_is_not_narrowed() -> None:
    """Behind a scaler, float32 input is decided at other thresholds: the host moves the values
    (float64), so the program stays the float64 one."""
    x, y = real_data()
    pipeline = PIPELINES["minmax-clip-hgb"]().fit(x, y)
    model = compiler.compile(pipeline, sample=x[:64])
    assert model._float32 is not None and model.compiled.narrows is None
    rows = probes(model, x[:3])
    assert model.encode(rows)[0]["x"].dtype == np.float64


def test_what_arrives_as_float32() -> None:
    numeric = ["a", "b"]
    assert arrives_float32(np.zeros((2, 2), np.float32), numeric)
    assert not arrives_float32(np.zeros((2, 2)), numeric)
    assert not arrives_float32([[0.0, 1.0]], numeric)
    frame = pd.DataFrame({"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)})
    assert arrives_float32(frame, numeric)
    # Mixed with float64 or integers, scikit-learn's steps see a float64 array.
    assert not arrives_float32(frame.astype({"b": np.float64}), numeric)
    assert not arrives_float32(frame.astype({"b": np.int64}), numeric)


def test_shifted_values_decide_every_test_as_their_float32_thresholds() -> None:
    rng = np.random.default_rng(0)
    t64 = np.sort(rng.normal(size=200))
    # float32 thresholds a float32 step or two off, in the same order (as a map's are).
    t32 = np.maximum.accumulate(
        np.nextafter(t64.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    )
    shift = ColumnShift.of(0, np.stack([t64, t32], axis=1))
    x = np.concatenate([t32, np.nextafter(t32.astype(np.float32), np.float32(-1)), [np.nan]])
    x = np.concatenate([x, rng.normal(size=1000).astype(np.float32)]).astype(np.float64)
    moved = shift.apply(x)
    assert moved is not None
    real = ~np.isnan(x)
    np.testing.assert_array_equal(moved[real, None] <= t64[None, :], x[real, None] <= t32[None, :])
    assert np.isnan(moved[~real]).all()
    # Values the thresholds agree on do not move.
    far = np.abs(x[:, None] - t64[None, :]).min(axis=1) > 1e-5
    np.testing.assert_array_equal(moved[far & real], x[far & real])


def test_a_float32_value_no_float64_value_decides_alike_is_refused() -> None:
    # Two tests that float64 input cannot tell apart (one threshold) but float32 input can.
    pairs = np.array([[1.0, 0.5], [1.0, 1.5]])
    inputs = Float32Inputs((ColumnShift.of(0, pairs),), frozenset())
    x = np.array([[0.25], [2.0]])
    inputs.apply(x, ["c"])  # below and above both: decidable
    with pytest.raises(SchemaError, match=r"column 'c'.*float64"):
        inputs.apply(np.array([[1.0]]), ["c"])


def test_a_missing_value_decided_otherwise_on_float32_input_is_refused() -> None:
    inputs = Float32Inputs((), frozenset({1}))
    inputs.apply(np.array([[np.nan, 1.0]]), ["a", "b"])
    with pytest.raises(SchemaError, match=r"column 'b'.*missing"):
        inputs.apply(np.array([[0.0, np.nan]]), ["a", "b"])


def test_the_native_and_the_numpy_look_ups_move_the_same_values(monkeypatch) -> None:
    x, y = real_data()
    pipeline = PIPELINES["standard-tree"]().fit(x, y)
    model = compiler.compile(pipeline, sample=x[:64])
    inputs = model._float32
    table = probes(model, x[:3]).astype(np.float64)
    native_moved = table.copy()
    inputs.apply(native_moved, model.schema.names)
    assert (native_moved[~np.isnan(table)] != table[~np.isnan(table)]).any()
    monkeypatch.setattr(float32_inputs.native, "AVAILABLE", False)
    numpy_moved = table.copy()
    inputs.apply(numpy_moved, model.schema.names)
    np.testing.assert_array_equal(numpy_moved, native_moved)


def test_the_built_look_up_serves_every_table_a_client_can_send() -> None:
    """``build`` (run as the server starts) leaves no look-up kernel for a request to compile:
    a float32 table read-only, Fortran-ordered or a strided view finds the same listed values
    on the kernel it built."""
    float32_inputs.build()
    kernel = float32_inputs._kernel()
    built = set(kernel.signatures)
    threshold = 0.1
    shift = float32_inputs.ColumnShift.of(1, np.array([[threshold, float(np.float32(threshold))]]))
    inputs = float32_inputs.Float32Inputs([shift], frozenset())
    table = np.tile(np.array([0.5, float(np.float32(threshold)), 2.0]), (40, 1))
    rows, which = inputs._hits(table)
    assert rows.size == 40
    read_only = table.copy()
    read_only.flags.writeable = False
    wide = np.repeat(table, 2, axis=1)[:, ::2]
    for variant in (read_only, np.asfortranarray(table), wide):
        got = inputs._hits(variant)
        np.testing.assert_array_equal(got[0], rows)
        np.testing.assert_array_equal(got[1], which)
    assert set(kernel.signatures) == built, "a table compiled a look-up build() does not"
