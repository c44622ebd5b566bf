"""Float32-comparing splits (scikit-learn's trees, XGBoost) on scaled and imputed features read
the host's float32 replay of the steps (compiler/replayed_columns.py) where encoding pays (each
value compared often: the ensembles here are large enough): the graph compares float32 only,
and every answer is the source's, on float64 and on float32 tables, on rows exactly on the
thresholds and one float64 step either side."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, OneHotEncoder, StandardScaler
from xgboost import XGBClassifier

import compiler
import lazy as lz
from lazy import native
from tests.compiler.test_split_codes import _probes

MODELS = {
    "forest": lambda: RandomForestClassifier(20, max_depth=8, random_state=0),
    "gbc": lambda: GradientBoostingClassifier(n_estimators=120, random_state=0),
    # Its replayed features hold an imputed mean as exactly 0.0, where it splits ``x < 0.0``.
    "xgboost": lambda: XGBClassifier(n_estimators=80, max_depth=4, random_state=0),
}


def _frame(n: int, seed: int) -> pd.DataFrame:
    """Integer counts, a binary flag, prices to the cent, a continuous column, NaN in three of
    them, and a category."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "count": rng.integers(0, 7, n).astype(float),
            "flag": (rng.random(n) < 0.3).astype(float),
            "price": np.round(rng.gamma(2.0, 20.0, n), 2),
            "v": rng.normal(0.0, 3.0, n),
            "plan": rng.choice(["free", "pro", "team"], n),
        }
    )
    for column in ("count", "price", "v"):
        df.loc[rng.random(n) < 0.05, column] = np.nan
    return df


def _fit(model: str, scaler: object) -> tuple[object, pd.DataFrame]:
    df = _frame(4000, 0)
    v = df["v"].fillna(0.0)
    y = ((df["count"].fillna(3) > 2) ^ (df["plan"] == "pro") ^ (np.sin(v) > 0)).to_numpy(int)
    numeric = ["count", "flag", "price", "v"]
    ct = ColumnTransformer(
        [
            ("num", make_pipeline(SimpleImputer(), scaler), numeric),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["plan"]),
        ]
    )
    return make_pipeline(ct, MODELS[model]()).fit(df, y), df


def _compares(program: lz.Program) -> set[str]:
    """The dtypes the graph's comparisons and tree walks read."""
    walks = {lz.Op.LT, lz.Op.LE, lz.Op.GT, lz.Op.GE, lz.Op.FOREST_SUM}
    return {
        node.inputs[0].dtype for graph in program.graphs for node in graph.order if node.op in walks
    }


@pytest.mark.parametrize("host_rows", [0, None], ids=["device", "measured"])
@pytest.mark.parametrize("scaler", [StandardScaler, MinMaxScaler])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_replayed_features_decide_as_the_source(
    model: str, scaler: type, host_rows: int | None
) -> None:
    pipe, df = _fit(model, scaler())
    placement = {} if host_rows is None else {"host_rows": host_rows}
    compiled = compiler.compile(pipe, options=compiler.CompileOptions(max_batch=256, **placement))
    assert "the host replays in float32" in compiled.report.steps[-1].detail
    program = compiled.traced.program
    # One (B, 4) input for the four replayed features: one argument per device call.
    replayed = [n for n in program.graphs[0].inputs if n.attr("name").startswith("replay:")]
    assert [n.shape[1:] for n in replayed] == [(4,)]
    assert _compares(program) <= {"float32"}  # no float64 comparison anywhere
    probe = _probes(df)
    np.testing.assert_array_equal(compiled.predict(probe), pipe.predict(probe))
    np.testing.assert_allclose(compiled.predict_proba(probe), pipe.predict_proba(probe), atol=1e-6)
    # A float32 table: scikit-learn scales it in float32 arithmetic, and so does the replay.
    as32 = probe.astype({c: np.float32 for c in ("count", "flag", "price", "v")})
    np.testing.assert_array_equal(compiled.predict(as32), pipe.predict(as32))


@pytest.mark.parametrize("split_codes", [True, False])
def test_a_forced_split_codes_option_folds_onto_the_raw_columns(split_codes: bool) -> None:
    pipe, df = _fit("forest", StandardScaler())
    options = compiler.CompileOptions(max_batch=256, split_codes=split_codes)
    compiled = compiler.compile(pipe, options=options)
    assert "folded into thresholds" in compiled.report.steps[-1].detail
    assert not any(n.startswith("replay:") for n in compiled.traced.program.input_names)
    probe = _probes(df)
    np.testing.assert_array_equal(compiled.predict(probe), pipe.predict(probe))


def test_a_small_boosting_ensemble_folds_where_replaying_would_not_pay() -> None:
    """5 trees of depth 2 compare each of 4 columns a few times per row: fewer than the
    replay's cost per value buys back (compiler/trees/cost.py), so the splits are folded; 20
    trees of depth 3 compare each a few dozen times, and replay."""
    df = _frame(2000, 0)
    y = (df["price"].fillna(0.0) > 40).to_numpy(int)
    scaled = make_pipeline(SimpleImputer(), StandardScaler())
    for trees, depth, how in ((5, 2, "folded into thresholds"), (20, 3, "the host replays")):
        model = GradientBoostingClassifier(n_estimators=trees, max_depth=depth, random_state=0)
        pipe = make_pipeline(scaled, model).fit(df[["count", "flag", "price", "v"]], y)
        compiled = compiler.compile(pipe)
        assert how in compiled.report.steps[-1].detail


def test_contributions_of_replayed_features_are_the_folded_ones() -> None:
    """TreeSHAP walks the same splits either way: the replayed model's contributions equal the
    folded model's (forced split codes), row for row."""
    pipe, df = _fit("gbc", StandardScaler())
    rows = _probes(df).iloc[:300]
    replayed = compiler.compile(pipe, options=compiler.CompileOptions(explain=True))
    folded = compiler.compile(pipe, options=compiler.CompileOptions(explain=True, split_codes=True))
    np.testing.assert_allclose(
        replayed.contributions(rows), folded.contributions(rows), rtol=0, atol=1e-9
    )


@pytest.mark.parametrize("numba", [True, False], ids=["kernel", "numpy"])
def test_columns_only_the_replay_reads_reach_it_apart_from_the_table(
    numba: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table that arrives column by column hands the replay its raw columns as contiguous
    rows; where nothing else reads one (no graph: its plan column is coded), the input table
    ``x`` holds 0 there rather than a second, strided copy. Answers are the source's whatever
    the form of the rows, with the native kernel or numpy's replay, and a value the source
    cannot read is still refused by name."""
    monkeypatch.setattr(native, "AVAILABLE", numba and native.AVAILABLE)
    pipe, df = _fit("forest", StandardScaler())
    compiled = compiler.compile(pipe, options=compiler.CompileOptions(max_batch=256))
    sources = sorted(compiled.traced.replayed_inputs.sources)
    assert sources
    probe = _probes(df).iloc[:600].reset_index(drop=True)
    feed, _ = compiled.encode(probe)
    assert not feed["x"][:, sources].any()
    records = probe.astype(object).where(probe.notna(), None).to_dict("records")
    as_ints = probe.assign(flag=probe["flag"].fillna(0).astype(np.int64))
    for rows, source_rows in (
        (probe, probe),
        (records, probe),
        ({c: probe[c].tolist() for c in probe.columns}, probe),
        (as_ints, as_ints),
    ):
        np.testing.assert_allclose(
            compiled.predict_proba(rows), pipe.predict_proba(source_rows), rtol=0, atol=1e-6
        )
    np.testing.assert_array_equal(compiled.predict(probe.to_numpy()), pipe.predict(probe))
    name = df.columns[sources[0]]
    bad = probe.astype({name: object})
    bad.loc[3, name] = "n/a"
    with pytest.raises(compiler.SchemaError, match=f"{name}"):
        compiled.predict(bad)
