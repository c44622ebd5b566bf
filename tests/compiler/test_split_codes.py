"""Tree splits reading raw columns as float32 split codes decide exactly as the source."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

import compiler
import lazy as lz
from compiler import float32_splits


def _frame(n: int, seed: int) -> pd.DataFrame:
    """Integer, binary, decimal and timestamp-like columns with NaN, and a string column."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "count": rng.integers(0, 7, n).astype(float),
            "flag": rng.integers(0, 2, n).astype(float),
            "amount": np.round(rng.lognormal(2.0, 1.0, n), 2),
            "v": np.round(rng.normal(size=n), 4),
            "plan": rng.choice(["free", "pro", "team"], n),
        }
    )
    for column in ("count", "amount", "v"):
        df.loc[rng.random(n) < 0.1, column] = np.nan
    return df


def _fit(model: object, with_time: bool = False) -> tuple[object, pd.DataFrame]:
    df = _frame(4000, 0)
    if with_time:  # one-second steps at 1.6e9: thresholds far closer than one float32 step
        df["at"] = 1.6e9 + np.random.default_rng(3).integers(0, 400, len(df)).astype(float)
    numeric = [c for c in df.columns if c != "plan"]
    ct = ColumnTransformer(
        [
            ("num", make_pipeline(SimpleImputer(), StandardScaler()), numeric),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["plan"]),
        ]
    )
    v = df["v"].fillna(0.0)
    y = ((df["count"].fillna(3) > 2) ^ (df["plan"] == "pro") ^ (np.sin(v * 3) > 0)).to_numpy(int)
    if with_time:
        y ^= (df["at"] % 7 > 3).to_numpy(int)
    pipe = make_pipeline(ct, model).fit(df, y)
    return pipe, df


def _probes(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the training frame, and the same with every number one float64 step either way
    (where a split threshold sits on a data value)."""
    rows = df.sample(3000, random_state=1, replace=True).reset_index(drop=True)
    numeric = [c for c in rows.columns if rows[c].dtype.kind == "f"]
    up, down = rows.copy(), rows.copy()
    up[numeric] = np.nextafter(rows[numeric].to_numpy(), np.inf)
    down[numeric] = np.nextafter(rows[numeric].to_numpy(), -np.inf)
    return pd.concat([rows, up, down], ignore_index=True)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
@pytest.mark.parametrize(
    "model",
    [
        HistGradientBoostingClassifier(max_iter=30, random_state=0),
        RandomForestClassifier(20, max_depth=8, random_state=0),
    ],
    ids=["hgb", "forest"],
)
def test_split_codes_decide_as_the_source(model: object, backend: str) -> None:
    pipe, df = _fit(model)
    options = compiler.CompileOptions(split_codes=True, backend=backend, host_rows=0)
    compiled = compiler.compile(pipe, options=options)
    detail = compiled.report.steps[-1].detail
    assert "as float32 split codes" in detail, detail
    assert any(name.startswith("split:") for name in compiled.traced.program.input_names)
    probe = _probes(df)
    assert (compiled.predict(probe) == pipe.predict(probe)).all()
    np.testing.assert_allclose(compiled.predict_proba(probe), pipe.predict_proba(probe), atol=1e-6)
    # float32 input: moved as the source decides it, then encoded
    numeric = [c for c in probe.columns if c != "plan"]
    as32 = probe.astype({c: np.float32 for c in numeric})
    assert (compiled.predict(as32) == pipe.predict(as32)).all()


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_codes_of_imputed_columns_need_no_nan_aware_copy(backend: str) -> None:
    """The host encodes an imputed column's NaN as its fill, so the graph knows its codes hold
    no NaN and the forest reads them once, not beside a NaN-aware copy."""
    pipe, df = _fit(HistGradientBoostingClassifier(max_iter=30, random_state=0))
    options = compiler.CompileOptions(split_codes=True, backend=backend, host_rows=0)
    compiled = compiler.compile(pipe, options=options)
    nodes = [
        node
        for stage in compiled.traced.program.stages
        if getattr(stage, "graph", None) is not None
        for node in stage.graph.order
    ]
    codes = [n for n in nodes if n.op is lz.Op.INPUT and n.attr("name").startswith("split:")]
    assert len(codes) == 4  # the numeric columns, all imputed
    # The forest's matrix (the host kernel's features, the XLA loop's carried-in x): the four
    # codes and the three one-hot columns, with no NaN-aware second copy.
    forests = [n for n in nodes if n.op in (lz.Op.FOREST_SUM, lz.Op.LOOP)]
    assert forests
    for forest in forests:
        matrix = forest.inputs[0 if forest.op is lz.Op.FOREST_SUM else 1]
        assert matrix.shape[1] == 4 + 3
    probe = _probes(df)
    assert (compiled.predict(probe) == pipe.predict(probe)).all()


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_split_codes_compare_in_float32_inside_a_float64_step(backend: str) -> None:
    """LightGBM's step is float64 (its leaf sums are), but its splits read float32 codes: they
    compare in float32 against each threshold's float32 floor, which decides every float32 value
    as float64 does, with no cast of the codes back to float64."""
    df = _frame(4000, 0).drop(columns="plan")
    v = df["v"].fillna(0.0)
    y = ((df["count"].fillna(3) > 2) ^ (np.sin(v * 3) > 0)).to_numpy(int)
    model = lgb.LGBMClassifier(n_estimators=30, verbose=-1, random_state=0).fit(df, y)
    options = compiler.CompileOptions(split_codes=True, backend=backend, host_rows=0)
    compiled = compiler.compile(model, options=options)
    assert compiled.report.promoted  # the step computes in float64
    nodes = [
        node
        for stage in compiled.traced.program.stages
        if getattr(stage, "graph", None) is not None
        for node in stage.graph.order
    ]
    widened = [n for n in nodes if n.op is lz.Op.CAST and n.inputs[0].dtype == "float32"]
    assert not widened  # the codes reach the splits as they are
    for forest in (n for n in nodes if n.op is lz.Op.FOREST_SUM):  # the host's form
        features, _, thresholds, *_, values = (i.dtype for i in forest.inputs)
        assert (features, thresholds, values) == ("float32", "float32", "float64")
    probe = _probes(df)
    assert (compiled.predict(probe) == model.predict(probe)).all()
    np.testing.assert_allclose(
        compiled.predict_proba(probe), model.predict_proba(probe), atol=1e-12
    )


def test_a_column_whose_thresholds_share_a_float32_step_stays_float64() -> None:
    pipe, df = _fit(HistGradientBoostingClassifier(max_iter=30, random_state=0), with_time=True)
    compiled = compiler.compile(
        pipe, options=compiler.CompileOptions(split_codes=True, backend="numpy")
    )
    assert "in float64" in compiled.report.steps[-1].detail
    probe = _probes(df)
    assert (compiled.predict(probe) == pipe.predict(probe)).all()


def test_by_default_codes_are_read_where_the_forest_compares_each_value_often() -> None:
    """``split_codes=None``: a forest comparing each raw value hundreds of times per row reads
    codes (their encoding costs what about 80 float32 compares save); a small one float64."""
    large = HistGradientBoostingClassifier(max_iter=100, early_stopping=False, random_state=0)
    small = HistGradientBoostingClassifier(max_iter=4, random_state=0)
    for model, how in ((small, "in float64"), (large, "as float32 split codes")):
        pipe, df = _fit(model)
        compiled = compiler.compile(pipe, options=compiler.CompileOptions(backend="numpy"))
        assert f"splits exact {how}" in compiled.report.steps[-1].detail
        probe = _probes(df)
        assert (compiled.predict(probe) == pipe.predict(probe)).all()
        np.testing.assert_allclose(
            compiled.predict_proba(probe), pipe.predict_proba(probe), atol=1e-6
        )
    refused = compiler.CompileOptions(backend="numpy", split_codes=False)  # the large one
    assert "in float64" in compiler.compile(pipe, options=refused).report.steps[-1].detail


def test_the_built_encoder_serves_every_table_a_client_can_send() -> None:
    """``build`` (run as the server starts) leaves no encoder for a request to compile: a table
    that is read-only, Fortran-ordered or a strided view encodes on the kernel it built, to the
    same codes."""
    float32_splits.build()
    kernel = float32_splits._kernel()
    built = set(kernel.signatures)
    rng = np.random.default_rng(3)
    table = np.round(rng.normal(size=(300, 3)), 2)
    inputs = float32_splits.SplitInputs.of({(1, None): [np.array([-0.5, 0.0, 0.25])]})
    expected = inputs.encode(table)["split:0"]
    read_only = table.copy()
    read_only.flags.writeable = False
    wide = np.repeat(table, 2, axis=1)[:, ::2]
    for variant in (read_only, np.asfortranarray(table), wide):
        np.testing.assert_array_equal(inputs.encode(variant)["split:0"], expected)
    assert set(kernel.signatures) == built, "a table compiled an encoder build() does not"
