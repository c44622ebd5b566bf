"""compiler.compile: inputs in every format, schema errors, host steps, the report."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from cases_core import Doubler
from sklearn.datasets import make_classification
from sklearn.decomposition import PCA
from sklearn.ensemble import RandomForestRegressor
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.multioutput import MultiOutputClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

import compiler


@pytest.fixture(scope="module")
def data() -> tuple[pd.DataFrame, np.ndarray]:
    x, y = make_classification(120, 4, n_informative=3, n_redundant=0, random_state=0)
    return pd.DataFrame(x, columns=["a", "b", "c", "d"]), np.array(["no", "yes"])[y]


@pytest.fixture(scope="module")
def fitted(data):
    frame, y = data
    return make_pipeline(StandardScaler(), LogisticRegression()).fit(frame, y)


@pytest.fixture(scope="module")
def model(fitted, data) -> compiler.CompiledModel:
    return compiler.compile(fitted, options=compiler.CompileOptions(max_batch=32))


def test_every_input_format_gives_the_same_answer(model, fitted, data) -> None:
    frame, _ = data
    expected = fitted.predict_proba(frame)
    rows = frame.to_dict(orient="records")
    columns = {c: frame[c].tolist() for c in frame.columns}
    shuffled = frame[["d", "c", "b", "a"]]  # by name, whatever the order
    for form in (frame, rows, columns, shuffled, frame.to_numpy()):
        np.testing.assert_allclose(model.predict_proba(form), expected, rtol=1e-5, atol=1e-6)
    assert model.predict(rows).tolist() == fitted.predict(frame).tolist()


def test_schema_names_columns_and_kinds(model) -> None:
    assert model.schema.as_dict() == {
        "columns": [{"name": n, "kind": "numeric"} for n in ("a", "b", "c", "d")]
    }


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([{"a": 1, "b": 2, "c": 3}], "row 0: missing column 'd'"),
        ({"a": [1], "b": [2], "c": [3]}, "missing column 'd'"),
        (
            [{"a": 1, "b": 2, "c": 3, "d": 4}, {"a": 1, "b": 2, "c": 3, "dd": 4}],
            r"row 1: unknown column 'dd' \(did you mean 'd'\?\); missing column 'd'",
        ),
        ([{"a": 1, "b": "two", "c": 3, "d": 4}], "column 'b', row 0: 'two' is not a number"),
        (np.zeros((2, 3)), r"expected 4 columns"),
        (np.zeros(4), "expected a 2-D table"),
        ([{"a": 1, "b": None, "c": 3, "d": 4}], "column 'b', row 0: missing value"),
    ],
)
def test_bad_rows_name_the_problem(model, bad, message) -> None:
    with pytest.raises(compiler.SchemaError, match=message):
        model.predict(bad)


def test_extra_columns_are_the_keys_that_name_no_column(model, data) -> None:
    frame, _ = data
    schema = model.schema
    rows = frame.iloc[:3].to_dict(orient="records")
    assert schema.extra_columns(rows) == () and schema.extra_columns(frame.to_numpy()) == ()
    later = [*rows[:2], {**rows[2], "e": 1}]  # only the last row holds an extra key
    assert schema.extra_columns(later) == ()  # by default, the first row's keys only
    assert schema.extra_columns(later, every_row=True) == ("e",)
    assert schema.extra_columns([{"z": 0, **rows[0]}]) == ("z",)
    assert schema.extra_columns({**frame.to_dict(orient="list"), "z": [0] * len(frame)}) == ("z",)
    assert schema.extra_columns(frame.assign(z=0)) == ("z",)
    assert schema.column_mismatch(["a", "b", "cc", "d", "x"]) == (
        "unknown columns 'cc' (did you mean 'c'?), 'x'; missing column 'c'"
    )


def test_report_lists_steps_and_sizes(model) -> None:
    report = model.report.as_dict()
    assert [(s["path"], s["estimator"], s["where"]) for s in report["steps"]] == [
        ("model", "Pipeline", "device"),
        ("model/standardscaler", "StandardScaler", "device"),
        ("model/logisticregression", "LogisticRegression", "device"),
    ]
    assert report["host_steps"] == []
    assert report["graph_nodes"] > 0 and report["graph_stages"] == 1
    assert report["methods"] == ("predict", "predict_proba", "decision_function")


def test_unsupported_step_names_the_class_and_lists_what_is_supported(data) -> None:
    frame, y = data
    pipe = make_pipeline(Doubler(), LogisticRegression()).fit(frame.to_numpy(), y)
    with pytest.raises(compiler.UnsupportedError, match=r"Doubler is not supported\. Supported: "):
        compiler.compile(pipe)


@pytest.mark.parametrize("backend", ["jax", "interpreter"])
def test_host_steps_run_between_compiled_segments_when_allowed(data, backend) -> None:
    frame, y = data
    x = frame.to_numpy()
    pipe = make_pipeline(StandardScaler(), Doubler(), LogisticRegression()).fit(x, y)
    options = compiler.CompileOptions(allow_host_steps=True, max_batch=16, backend=backend)
    model = compiler.compile(pipe, options=options)
    assert model.report.host_steps == ["model/doubler"]
    assert model.report.graph_stages == 2
    np.testing.assert_allclose(model.predict_proba(x), pipe.predict_proba(x), rtol=1e-5, atol=1e-6)


def test_methods_option_limits_the_heads(fitted) -> None:
    options = compiler.CompileOptions(methods=("predict_proba",), max_batch=8)
    model = compiler.compile(fitted, options=options)
    assert model.methods == ("predict_proba",)
    with pytest.raises(AttributeError, match="compiled without 'predict'"):
        model.predict(np.zeros((1, 4)))
    with pytest.raises(compiler.UnsupportedError, match="transform"):
        compiler.compile(fitted, options=compiler.CompileOptions(methods=("transform",)))


def test_labels_of_any_type_come_back_exactly(data) -> None:
    frame, y = data
    x = frame.to_numpy()
    for labels in (y == "yes", np.where(y == "yes", 7, -3), np.where(y == "yes", "b", "a")):
        est = LogisticRegression().fit(x, labels)
        got = compiler.compile(est, options=compiler.CompileOptions(max_batch=8)).predict(x)
        assert got.dtype == est.predict(x).dtype
        np.testing.assert_array_equal(got, est.predict(x))


def test_a_list_valued_head_is_one_device_output_split_on_the_host(data) -> None:
    """MultiOutputClassifier.predict_proba is a list of per-target arrays: the device computes
    them side by side, ``decode`` (and every public method) splits them as scikit-learn does."""
    frame, y = data
    targets = np.column_stack(
        [y, np.where(frame["a"] > 0, "up", np.where(frame["b"] > 0, "flat", "down"))]
    )
    est = MultiOutputClassifier(LogisticRegression()).fit(frame, targets)
    model = compiler.compile(est, options=compiler.CompileOptions(max_batch=32))
    assert model.traced.splits == {"predict_proba": (2, 3)}
    raw = model.run(frame)["predict_proba"]
    assert raw.shape == (len(frame), 5)
    expected = est.predict_proba(frame)
    for got in (model.predict_proba(frame), model.decode({"predict_proba": raw})["predict_proba"]):
        assert isinstance(got, list) and [p.shape for p in got] == [(120, 2), (120, 3)]
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(model.predict(frame), est.predict(frame))


KINDS = ("binary", "multiclass", "regressor", "two targets", "transformer", "multi-output")


def _fit(kind: str, x: np.ndarray) -> object:
    three = np.digitize(x[:, 0], [-0.5, 0.5])
    if kind == "binary":
        return LogisticRegression().fit(x, x[:, 1] > 0)
    if kind == "multiclass":
        return LogisticRegression().fit(x, three)
    if kind == "regressor":
        return LinearRegression().fit(x, x[:, 0])
    if kind == "two targets":
        return RandomForestRegressor(3, max_depth=3, random_state=0).fit(x, x[:, :2])
    if kind == "transformer":
        return make_pipeline(StandardScaler(), PCA(2)).fit(x)
    labels = np.column_stack([x[:, 1] > 0, np.array(["a", "b", "c"])[three]])
    return MultiOutputClassifier(LogisticRegression()).fit(x, labels)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", KINDS)
def test_output_specs_are_the_shapes_and_dtypes_of_the_answers(data, kind, dtype) -> None:
    x = data[0].to_numpy()
    est = _fit(kind, x)
    model = compiler.compile(est, options=compiler.CompileOptions(max_batch=8, dtype=dtype))
    assert set(model.output_specs) == set(model.methods)
    for method, got in model.outputs(x[:5]).items():
        spec = model.output_specs[method]
        if spec.parts:  # a list of per-target arrays, side by side in ``shape``
            assert [g.shape for g in got] == [(5, w) for w in spec.parts]
            got = np.concatenate(got, axis=1)
        assert got.shape == (5, *spec.shape) and got.dtype == spec.dtype, method
    if "predict_proba" in model.methods:  # a classifier's labels
        assert model.output_specs["predict"].dtype == est.predict(x[:5]).dtype


# -- a float matrix: the per-request fast path of encoding -------------------------------------
def test_a_float32_matrix_is_encoded_without_a_copy(model, data) -> None:
    x = np.ascontiguousarray(data[0].to_numpy(np.float32)[:3])
    feed, rows = model.encode(x)
    assert rows == 3 and feed["x"] is x
    float64 = model.encode(x.astype(np.float64))[0]["x"]
    assert float64.dtype == np.float32 and np.array_equal(float64, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_nan_in_a_float_matrix_is_refused_by_column_and_row(model, data, dtype) -> None:
    x = data[0].to_numpy(dtype)[:5].copy()
    x[3, 2] = np.nan
    with pytest.raises(compiler.SchemaError, match="column 'c', row 3: missing value"):
        model.predict_proba(x)


def test_infinities_in_a_float_matrix_are_not_missing_values(model, data) -> None:
    x = data[0].to_numpy(np.float32)[:2].copy()
    x[0, 0], x[0, 1] = np.inf, -np.inf  # their sum is NaN, yet no value is missing
    np.testing.assert_array_equal(model.predict_proba(x), model.predict_proba(x.tolist()))


# -- host steps for steps a converter refuses ---------------------------------------------------
def _ranks_beside(x):
    """Arbitrary Python (np.asarray of a lazy value cannot be traced): width 4 → 8, int ranks."""
    x = np.asarray(x)
    return np.column_stack([x, np.argsort(np.argsort(x, axis=1), axis=1)])


def _int_ranks(x):
    return np.argsort(np.argsort(np.asarray(x), axis=1), axis=1)  # int64, as many columns


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_refused_function_transformer_runs_on_the_host_when_allowed(data, dtype) -> None:
    frame, y = data
    x = np.round(frame.to_numpy(), 1)  # repeated values: ties in the ranks
    pipe = make_pipeline(
        StandardScaler(), FunctionTransformer(_ranks_beside), LogisticRegression()
    ).fit(x, y)
    with pytest.raises(compiler.UnsupportedError, match="allow host steps"):
        compiler.compile(pipe)
    options = compiler.CompileOptions(allow_host_steps=True, max_batch=16, dtype=dtype)
    model = compiler.compile(pipe, options=options)
    report = model.report
    assert report.host_steps == ["model/functiontransformer"]
    (step,) = [s for s in report.steps if s.where == "host"]
    assert "not made of recognisable numpy ufuncs" in step.detail  # why it is a host step
    assert [s.where for s in report.steps] == ["device", "device", "host", "device"]
    assert report.graph_stages == 2  # compiled on either side
    np.testing.assert_array_equal(model.predict(x), pipe.predict(x))
    np.testing.assert_allclose(model.predict_proba(x), pipe.predict_proba(x), rtol=1e-5, atol=1e-6)


def test_a_host_step_output_has_the_source_width_and_the_graph_dtype(data) -> None:
    frame, _ = data
    x = frame.to_numpy()
    step = FunctionTransformer(_int_ranks).fit(x)
    options = compiler.CompileOptions(allow_host_steps=True, backend="interpreter")
    got = compiler.compile(step, options=options).transform(x)
    assert got.shape == (len(x), 4) and got.dtype == np.float32
    np.testing.assert_array_equal(got, step.transform(x))


def test_a_host_step_fitted_on_a_frame_sees_the_frame_columns(data) -> None:
    frame, y = data

    def by_name(df):
        return np.column_stack([df["a"] * df["d"], df[["b", "c"]]])

    pipe = make_pipeline(FunctionTransformer(by_name), LogisticRegression()).fit(frame, y)
    options = compiler.CompileOptions(allow_host_steps=True, backend="interpreter", dtype="float64")
    model = compiler.compile(pipe, options=options)
    np.testing.assert_allclose(model.predict_proba(frame), pipe.predict_proba(frame), rtol=1e-12)


def test_a_step_that_cannot_even_run_on_a_probe_row_names_itself(data) -> None:
    frame, y = data

    def picky(x):
        raise ValueError("never on the host")

    pipe = make_pipeline(FunctionTransformer(picky, check_inverse=False), LogisticRegression())
    pipe.steps[0][1].fit(frame.to_numpy())
    pipe.steps[1][1].fit(frame.to_numpy(), y)
    with pytest.raises(compiler.UnsupportedError, match="cannot run as a host step: never"):
        compiler.compile(pipe, options=compiler.CompileOptions(allow_host_steps=True))


# -- samples -------------------------------------------------------------------------------------
@pytest.mark.parametrize("empty", [[], np.empty((0, 4))], ids=["list", "array"])
def test_an_empty_sample_is_no_sample(fitted, data, empty) -> None:
    frame, _ = data
    model = compiler.compile(fitted, sample=empty, options=compiler.CompileOptions(max_batch=8))
    np.testing.assert_allclose(
        model.predict_proba(frame), fitted.predict_proba(frame), rtol=1e-5, atol=1e-6
    )


def test_a_sample_that_is_not_a_table_is_named_as_such(data) -> None:
    frame, y = data
    est = LogisticRegression().fit(frame.to_numpy(), y)
    with pytest.raises(compiler.SchemaError, match=r"table of rows × 4 columns, got .* \(4,\)"):
        compiler.compile(est, sample=frame.to_numpy()[0])


def test_a_stateless_step_without_a_width_asks_for_a_fit_or_a_sample(data) -> None:
    from sklearn.preprocessing import Binarizer

    x = data[0].to_numpy()
    with pytest.raises(compiler.SchemaError, match=r"never fitted\); fit it, or pass a sample"):
        compiler.compile(Binarizer())
    with pytest.raises(compiler.SchemaError, match=r"sample \(shape \(0,\)\) is not a table"):
        compiler.compile(Binarizer(), sample=[])
    options = compiler.CompileOptions(backend="interpreter")
    for est, sample in ((Binarizer(threshold=0.5), x[:3]), (Binarizer().fit(x), None)):
        got = compiler.compile(est, sample=sample, options=options).transform(x)
        np.testing.assert_array_equal(got, est.transform(x))


@pytest.mark.parametrize("with_sample", [False, True])
def test_a_column_the_pipeline_drops_is_required_but_never_parsed(with_sample: bool) -> None:
    """A ColumnTransformer dropping an id or free-text column: rows carry it, as for the
    source, and its values (not numbers) are not parsed."""
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "name": [f"customer {i}" for i in range(300)],
            "age": rng.integers(18, 80, 300).astype(float),
            "plan": rng.choice(["basic", "pro"], 300),
            "spend": np.round(rng.lognormal(3, 1, 300), 2),
        }
    )
    y = (frame.age > 40).astype(int)
    columns = ColumnTransformer(
        [("numbers", StandardScaler(), ["age", "spend"]), ("plan", OneHotEncoder(), ["plan"])]
    )
    model = make_pipeline(columns, LogisticRegression()).fit(frame, y)
    compiled = compiler.compile(model, sample=frame.head(20) if with_sample else None)
    assert compiled.traced.schema.unread == frozenset({0})
    np.testing.assert_allclose(compiled.predict_proba(frame), model.predict_proba(frame), atol=1e-6)
    row = {"name": "Ada Lovelace", "age": 36.0, "plan": "pro", "spend": 12.5}
    assert compiled.predict([row]).tolist() == model.predict(pd.DataFrame([row])).tolist()
    with pytest.raises(compiler.SchemaError, match="name"):
        compiled.predict([{k: v for k, v in row.items() if k != "name"}])
