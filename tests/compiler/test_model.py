"""compiler.compile: inputs in every format, schema errors, host steps, the report."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from cases_core import Doubler
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.multioutput import MultiOutputClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

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
        ([{"a": 1, "b": 2, "c": 3}], "row 0 has no column 'd'"),
        ({"a": [1], "b": [2], "c": [3]}, r"missing columns \['d'\]"),
        ([{"a": 1, "b": "two", "c": 3, "d": 4}], "column 'b', row 0: 'two' is not a number"),
        (np.zeros((2, 3)), r"expected 4 columns"),
        (np.zeros(4), "expected a 2-D table"),
        ([{"a": 1, "b": None, "c": 3, "d": 4}], "column 'b', row 0: missing value"),
    ],
)
def test_bad_rows_name_the_problem(model, bad, message) -> None:
    with pytest.raises(compiler.SchemaError, match=message):
        model.predict(bad)


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
