"""The registration gate probes the model's own decision values: a boundary moved by one float64
step, invisible to sampled and synthetic rows, is caught and named."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_breast_cancer
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import KBinsDiscretizer, OneHotEncoder, StandardScaler

import compiler
from compiler.probes import neighbourhood
from service import parity, parity_probes

warnings.filterwarnings("ignore", category=UserWarning)


def _mixed_frame(n: int = 600, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "visits": rng.integers(0, 6, n).astype(np.float64),  # repeated integers
            "score": np.round(rng.normal(50, 10, n), 1),
            "member": rng.integers(0, 2, n),  # binary, int64
            "plan": rng.choice(["basic", "plus", "pro"], n),
        }
    )
    frame.loc[::7, "visits"] = np.nan
    y = (frame["score"] + 5 * frame["visits"].fillna(2) > 60).to_numpy().astype(int)
    return frame, y


def _preprocess(handle_unknown: str = "ignore", impute: bool = True) -> ColumnTransformer:
    numeric = make_pipeline(SimpleImputer(), StandardScaler()) if impute else StandardScaler()
    return ColumnTransformer(
        [
            ("num", numeric, ["visits", "score", "member"]),
            ("cat", OneHotEncoder(handle_unknown=handle_unknown), ["plan"]),
        ]
    )


def _gate(est, model, sample=None) -> parity.ParityResult:
    return parity.gate(est, model, sample, synthetic_rows=64, probe_rows=4096, rtol=1e-4, atol=1e-5)


def _probes(est, model: compiler.CompiledModel, base: pd.DataFrame) -> parity_probes.ProbeRows:
    def accepts(rows: object) -> bool:
        return parity.source_accepts(est, ["predict"], rows)

    return parity_probes.build(model.schema, base, model.decisions, accepts, limit=4096)


def _compiled(est) -> compiler.CompiledModel:
    return compiler.compile(est, options=compiler.CompileOptions(max_batch=256))


@pytest.fixture(scope="module")
def scaled_hgb():
    x, y = load_breast_cancer(return_X_y=True)
    return make_pipeline(StandardScaler(), HistGradientBoostingClassifier(max_iter=15)).fit(x, y)


def test_the_gate_passes_exact_models_and_probes_their_decisions(scaled_hgb) -> None:
    x, _ = load_breast_cancer(return_X_y=True)
    model = _compiled(scaled_hgb)
    result = _gate(scaled_hgb, model, x[:50])
    assert result.ok, result.problem
    assert result.source == "sample" and result.rows == 50 + result.probes
    # Every split threshold of every raw column, with neighbours on both sides.
    thresholds = sum(d.values.size for d in model.decisions)
    assert result.probes > 2 * thresholds


def test_a_boundary_one_float64_step_off_is_caught_and_named(scaled_hgb) -> None:
    """The source's threshold moves by one float64 step after compiling: sampled rows agree, the
    probes on the compiled boundary do not."""
    import copy

    x, _ = load_breast_cancer(return_X_y=True)
    model = _compiled(scaled_hgb)
    moved = copy.deepcopy(scaled_hgb)
    nodes = moved[-1]._predictors[0][0].nodes
    root = int(np.flatnonzero(~nodes["is_leaf"])[0])
    column = int(nodes["feature_idx"][root])
    scaler = moved[0]
    # The largest raw value the root sends left, then a threshold that sends it right.
    raw = np.concatenate([d.values for d in model.decisions if d.column == column])
    scaled = (raw - scaler.mean_[column]) / scaler.scale_[column]
    left = scaled <= nodes["num_threshold"][root]
    edge = raw[left][np.argmax(scaled[left])]
    nodes["num_threshold"][root] = np.nextafter(scaled[left].max(), -np.inf)
    sample = x[x[:, column] != edge][:100]  # rows off the boundary, as most real rows are

    on_sample = parity.check_parity(moved, model, sample, source="sample", rtol=1e-4, atol=1e-5)
    assert on_sample.ok
    result = _gate(moved, model, sample)
    assert not result.ok
    assert f"column 'x{column}' near a split threshold of model/" in result.problem
    assert "HistGradientBoostingClassifier" in result.problem


def test_probes_cover_fills_categories_and_bin_edges_of_a_mixed_frame() -> None:
    frame, y = _mixed_frame()
    est = make_pipeline(_preprocess(), HistGradientBoostingClassifier(max_iter=20)).fit(frame, y)
    model = _compiled(est)
    result = _gate(est, model)
    assert result.ok, result.problem
    probes = _probes(est, model, frame.iloc[:20])
    labels = "\n".join(probes.labels)
    assert "column 'visits' = NaN" in labels  # the imputer's fill decides these
    assert "column 'plan': '<kestrel: unseen category>'" in labels
    assert "column 'plan', every category: 'pro'" in labels
    assert "column 'score' near a split threshold" in labels
    assert "column 'member' near a split threshold" in labels

    bins = make_pipeline(
        KBinsDiscretizer(4, encode="ordinal", quantile_method="averaged_inverted_cdf"),
        RandomForestClassifier(10, random_state=0),
    )
    bins.fit(frame[["visits", "score"]].fillna(0), y)
    model = _compiled(bins)
    kinds = {d.kind for d in model.decisions}
    assert kinds == {"bin_edges_ test"}  # the forest reads bin numbers, not raw columns
    assert _gate(bins, model).ok


def test_groups_the_source_refuses_are_left_out() -> None:
    frame, y = _mixed_frame()
    frame = frame.fillna(0.0)
    est = make_pipeline(_preprocess("error", impute=False), LogisticRegression()).fit(frame, y)
    model = _compiled(est)
    probes = _probes(est, model, frame.iloc[:10])
    # No NaN, no inf (LogisticRegression refuses both), no unseen category ('error').
    assert not any("NaN" in label or "inf" in label for label in probes.labels)
    assert not any("unseen" in label for label in probes.labels)
    assert _gate(est, model).ok


def test_neighbourhood_holds_both_sides_in_float64_and_float32() -> None:
    t = np.array([0.1, 2.5, -3.0])
    around = neighbourhood(t, steps=2)
    for v in t:
        assert v in around
        assert np.nextafter(v, np.inf) in around and np.nextafter(v, -np.inf) in around
        f = np.float32(v)
        up = float(np.nextafter(f, np.float32(np.inf)))
        mid = float(f) + (up - float(f)) / 2
        assert mid in around and np.nextafter(mid, np.inf) in around
    assert np.all(np.isfinite(around)) and np.all(np.diff(around) > 0)
    # Subnormals are outside the guarantee (XLA flushes them): never probed.
    assert not np.any((around != 0) & (np.abs(around) < np.finfo(np.float64).tiny))
    assert 0.0 in neighbourhood(np.array([0.0]))


def test_the_gate_checks_the_device_lowering_where_the_host_won_every_bucket(monkeypatch) -> None:
    """A plan made elsewhere may put any bucket on the device. With the device's subnormal
    thresholds left flushed (lazy.subnormals.for_flushing undone: the fault it fixes, XGBoost's
    ``x < 0.0`` read as ``x > -0.0``) and the host winning every bucket here, the gate still
    refuses, naming the device plan; the host plan passes, and so does the fixed model."""
    from xgboost import XGBClassifier

    import lazy as lz
    from lazy import executor, subnormals

    x = np.random.default_rng(0).integers(-2, 3, (3000, 3)).astype(float)
    est = XGBClassifier(n_estimators=20, max_depth=3).fit(x, (x[:, 0] >= 0) ^ (x[:, 1] > 0))

    def host_wins(self, index, dummy):
        return lz.Placement(self._buckets[index].rows, lz.HOST, "measured", 1.0, 2.0)

    monkeypatch.setattr(executor.CompiledGraph, "_measure", host_wins)
    if subnormals.flushes(lz.get_backend("jax"), lz.DTypePolicy.X32):
        with monkeypatch.context() as undone:
            undone.setattr(subnormals, "for_flushing", lambda graph, backend, policy: graph)
            model = _compiled(est)
        assert model.formulations == (lz.DEVICE, lz.HOST)
        assert {p.runs_on for p in model.compiled.graphs[0].placements.values()} == {lz.HOST}
        result = _gate(est, model, x[:50])
        assert not result.ok
        assert result.problem.startswith("on the device plan: predict: ")
        assert "on the host plan" not in result.problem
    result = _gate(est, _compiled(est), x[:50])
    assert result.ok, result.problem


def test_the_gate_checks_float32_tables_on_the_program_narrowed_for_them(monkeypatch) -> None:
    """A float64-comparing forest reads a float32 table as it is, through a program of its own
    (lazy.narrowing): the gate runs its probes as a float32 table too, and with that program's
    host-kernel thresholds rounded to nearest instead of down (FOREST_OF_WIDENED broken), refuses
    it by name while the float64 table passes."""
    from lazy.passes import rules

    x, y = load_breast_cancer(return_X_y=True)
    est = HistGradientBoostingClassifier(max_iter=15, random_state=0).fit(x, y)
    options = compiler.CompileOptions(max_batch=256, split_codes=False)
    model = compiler.compile(est, options=options)
    assert model.narrows_float32
    result = _gate(est, model, x[:50])
    assert result.ok, result.problem
    with monkeypatch.context() as broken:
        broken.setattr(rules, "round_down", lambda values, dtype: np.asarray(values).astype(dtype))
        model = compiler.compile(est, options=options)
    assert model.narrows_float32
    result = _gate(est, model, x[:50])
    assert not result.ok
    # Named as the float32 table's run ("on the host plan, float32 table: ..."); the float64
    # table's runs ("on the ... plan: ...") found nothing.
    assert "on the host plan, float32 table: " in result.problem
    assert "plan: " not in result.problem
