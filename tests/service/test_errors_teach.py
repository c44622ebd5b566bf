"""Errors that teach, against a real server: a misspelled column names its fix, columns the
model does not read are reported (or refused under ``strict_columns``), a FAILED version answers
409 with its reason instead of a 503 that invites retries, the unknown-model 404 lists only
models that can serve, and every registration error names the form field it comes from. A
sample of real rows may hold NaN: it registers, and reads back from the store the same way."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pandas as pd
import pytest
import skops.io as sio
from sklearn.datasets import load_iris
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from tests.service.live import LiveServer

OPTIONS = '{"max_batch": 8}'
COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
IGNORED = "kestrel-ignored-columns"
# Its sample must have the model's 4 columns: the registration compiles, then FAILS on it.
WRONG_WIDTH_SAMPLE = "[[1.0, 2.0]]"


@pytest.fixture(scope="module")
def flowers() -> tuple[object, pd.DataFrame]:
    """Iris with missing petal widths, imputed: real rows with NaN are its natural sample."""
    data = load_iris(as_frame=True)
    frame = data.data.set_axis(COLUMNS, axis=1)
    frame.loc[::7, "petal_width"] = np.nan
    labels = data.target_names[data.target]
    model = make_pipeline(SimpleImputer(), StandardScaler(), LogisticRegression(max_iter=500))
    return model.fit(frame, labels), frame


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, flowers) -> Iterator[LiveServer]:
    model, frame = flowers
    live = LiveServer(tmp_path_factory.mktemp("teach")).start()
    r = live.register("flowers", sio.dumps(model), sample=nan_sample(frame), options=OPTIONS)
    assert r.status_code == 201, r.text
    yield live
    live.stop()


def nan_sample(frame: pd.DataFrame) -> str:
    """Rows as Python's json writes them: a missing value is the literal ``NaN``."""
    text = json.dumps(frame.iloc[:15].to_dict(orient="records"))
    assert "NaN" in text
    return text


def row(frame: pd.DataFrame, i: int) -> dict[str, float | None]:
    return {k: None if pd.isna(v) else v for k, v in frame.iloc[i].items()}


def error_of(r) -> dict[str, str]:
    """The native error document, checked for its shape."""
    doc = r.json()
    assert set(doc) == {"error"} and {"code", "message", "request_id"} <= set(doc["error"]), doc
    return doc["error"]


def register_failing(live: LiveServer, name: str) -> str:
    """Register a version that FAILS (its sample has 2 columns of 4); its failure reason."""
    model = make_pipeline(StandardScaler(), LinearRegression()).fit(np.eye(4), np.arange(4.0))
    r = live.register(name, sio.dumps(model), sample=WRONG_WIDTH_SAMPLE, options=OPTIONS)
    assert r.status_code == 422, r.text
    described = live.client.get(f"/models/{name}", headers=live.admin).json()
    (version,) = described["versions"]
    assert version["state"] == "FAILED"
    return version["error"]


# -- samples with missing values -----------------------------------------------------------------
def test_a_sample_with_nan_registers_and_reads_back_after_a_restart(server, flowers) -> None:
    model, frame = flowers
    version = server.client.get("/models/flowers/versions/1", headers=server.admin).json()
    assert version["state"] == "READY" and version["parity"]["source"] == "sample"
    missing = row(frame, 0)  # row 0 is one whose petal width is missing
    assert missing["petal_width"] is None
    r = server.client.post("/models/flowers/predict", json=[missing])
    assert r.status_code == 200, r.text
    assert r.json()["outputs"]["predict"] == model.predict(frame.iloc[:1]).tolist()
    # The store keeps the sample's NaN: the reload checks parity on the same rows again.
    server.stop()
    server.start()
    version = server.client.get("/models/flowers/versions/1", headers=server.admin).json()
    assert version["state"] == "READY" and version["parity"]["source"] == "sample", version
    again = server.client.post("/models/flowers/predict", json=[missing]).json()["outputs"]
    # Labels equal; probabilities to float32 rounding: warm-up timing may place a bucket on
    # another lowering after a restart (one plan per version is issue 22's).
    assert again["predict"] == r.json()["outputs"]["predict"]
    np.testing.assert_allclose(
        again["predict_proba"], r.json()["outputs"]["predict_proba"], rtol=1e-6
    )


# -- column names ----------------------------------------------------------------------------------
def test_a_misspelled_column_names_the_key_and_the_column_it_misspells(server, flowers) -> None:
    _, frame = flowers
    typo = {("petal_widht" if k == "petal_width" else k): v for k, v in row(frame, 1).items()}
    expected = "unknown column 'petal_widht' (did you mean 'petal_width'?); missing column "
    expected += "'petal_width'"
    rows = server.client.post("/models/flowers/predict", json=[row(frame, 2), typo])
    assert rows.status_code == 422
    assert error_of(rows)["message"] == f"row 1: {expected}"
    assert error_of(rows)["code"] == "invalid_input"
    columns = {k: [v] for k, v in typo.items()}
    by_column = server.client.post("/models/flowers/predict", json={"columns": columns})
    assert by_column.status_code == 422 and error_of(by_column)["message"] == expected
    # v2: one tensor per column, named after it.
    inputs = [{"name": k, "shape": [1], "datatype": "FP64", "data": [v]} for k, v in typo.items()]
    v2 = server.client.post("/v2/models/flowers/infer", json={"inputs": inputs})
    assert v2.status_code == 422 and v2.json()["error"].endswith(expected), v2.text


def test_columns_the_model_does_not_read_are_scored_and_reported(server, flowers) -> None:
    _, frame = flowers
    clean = [row(frame, i) for i in range(1, 4)]
    extra = [{**r, "colour": "blue", "notes, free text": "é"} for r in clean]
    plain = server.client.post("/models/flowers/predict", json=clean)
    assert (
        plain.status_code == 200 and IGNORED not in plain.headers and "warnings" not in plain.json()
    )
    r = server.client.post("/models/flowers/predict", json=extra)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == plain.json()["outputs"]
    assert [unquote(n) for n in r.headers[IGNORED].split(",")] == ["colour", "notes, free text"]
    (warning,) = r.json()["warnings"]
    assert "ignored 2 columns the model does not read: ['colour', 'notes, free text']" in warning
    # Columnar bodies and v2 tensors too.
    columns = {k: [r[k] for r in extra] for k in extra[0]}
    r = server.client.post("/models/flowers/predict", json={"columns": columns})
    assert r.status_code == 200 and r.headers[IGNORED] == "colour,notes%2C%20free%20text"
    inputs = [
        {"name": k, "shape": [3], "datatype": "FP64", "data": v}
        for k, v in columns.items()
        if k in COLUMNS
    ] + [{"name": "colour", "shape": [3], "datatype": "BYTES", "data": ["blue"] * 3}]
    v2 = server.client.post("/v2/models/flowers/infer", json={"inputs": inputs})
    assert v2.status_code == 200 and v2.headers[IGNORED] == "colour", v2.text


def test_strict_columns_refuses_extra_columns_naming_them(server, flowers) -> None:
    _, frame = flowers
    clean = [row(frame, i) for i in range(1, 4)]
    # Only the last row has an extra key: a strict request reads every row's keys.
    extra = [*clean[:2], {**clean[2], "colour": "blue"}]
    strict = {"strict_columns": "true"}
    r = server.client.post("/models/flowers/predict", params=strict, json=extra)
    assert r.status_code == 422, r.text
    assert error_of(r)["message"] == (
        f"strict_columns: the model does not read column ['colour']; it reads {COLUMNS}"
    )
    ok = server.client.post("/models/flowers/predict", params=strict, json=clean)
    assert ok.status_code == 200 and IGNORED not in ok.headers
    inputs = [
        {"name": k, "shape": [1], "datatype": "FP64", "data": [v]} for k, v in clean[0].items()
    ] + [{"name": "colour", "shape": [1], "datatype": "BYTES", "data": ["blue"]}]
    v2 = server.client.post("/v2/models/flowers/infer", params=strict, json={"inputs": inputs})
    assert v2.status_code == 422 and "'colour'" in v2.json()["error"], v2.text
    bad = server.client.post(
        "/models/flowers/predict", params={"strict_columns": "maybe"}, json=clean
    )
    assert bad.status_code == 400
    assert error_of(bad)["message"] == (
        "query parameter 'strict_columns' must be true or false, got 'maybe'"
    )


def test_the_strict_columns_setting_is_each_request_s_default(tmp_path: Path) -> None:
    live = LiveServer(tmp_path, KESTREL_STRICT_COLUMNS="true").start()
    try:
        frame = pd.DataFrame({"a": [0.0, 1.0, 2.0, 3.0], "b": [1.0, 0.0, 1.0, 0.0]})
        model = LinearRegression().fit(frame, [0.0, 1.0, 2.0, 3.0])
        assert live.register("lin", sio.dumps(model), options=OPTIONS).status_code == 201
        body = [{"a": 1.0, "b": 2.0, "c": 3.0}]
        refused = live.client.post("/models/lin/predict", json=body)
        assert refused.status_code == 422 and "['c']" in error_of(refused)["message"]
        allowed = live.client.post("/models/lin/predict?strict_columns=false", json=body)
        assert allowed.status_code == 200 and allowed.headers[IGNORED] == "c"
    finally:
        live.stop()


# -- versions that failed --------------------------------------------------------------------------
def test_scoring_a_failed_version_is_a_409_with_the_reason(server) -> None:
    reason = register_failing(server, "broken")
    assert "sample row 0 has 2 values; the model reads 4 columns" in reason
    c = server.client
    for path in ("/models/broken/predict", "/models/broken/versions/1/predict"):
        r = c.post(path, json=[[1.0, 2.0, 3.0, 4.0]])
        assert r.status_code == 409, r.text
        assert "retry-after" not in r.headers
        error = error_of(r)
        assert error["code"] == "version_failed"
        assert error["message"] == f"model 'broken' version 1 FAILED and cannot serve: {reason}"
    # v2: infer and metadata answer the same; ready says not ready, with the same status.
    inputs = [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    infer = c.post("/v2/models/broken/infer", json={"inputs": inputs})
    assert infer.status_code == 409 and reason in infer.json()["error"], infer.text
    meta = c.get("/v2/models/broken")
    assert meta.status_code == 409 and reason in meta.json()["error"], meta.text
    ready = c.get("/v2/models/broken/versions/1/ready")
    assert ready.status_code == 409 and ready.json() == {"name": "broken", "ready": False}


def test_scoring_a_replaced_version_by_number_is_a_409_naming_the_current_one(server) -> None:
    model = make_pipeline(StandardScaler(), LinearRegression()).fit(np.eye(4), np.arange(4.0))
    for _ in range(2):
        assert server.register("swapped", sio.dumps(model), options=OPTIONS).status_code == 201
    row = [[1.0, 2.0, 3.0, 4.0]]
    r = server.client.post("/models/swapped/versions/1/predict", json=row)
    assert r.status_code == 409 and "retry-after" not in r.headers, r.text
    assert error_of(r) | {"request_id": None} == {
        "code": "version_retired",
        "message": "model 'swapped' version 1 is RETIRED: stored, not loaded (version 2 serves)",
        "request_id": None,
    }
    assert server.client.post("/models/swapped/predict", json=row).status_code == 200


def test_a_failed_new_version_leaves_the_current_one_serving(server, flowers) -> None:
    model, frame = flowers
    r = server.register("flowers", sio.dumps(model), sample=WRONG_WIDTH_SAMPLE, options=OPTIONS)
    assert r.status_code == 422, r.text
    versions = server.client.get("/models/flowers", headers=server.admin).json()["versions"]
    (failed,) = [v["version"] for v in versions if v["state"] == "FAILED"]
    current = server.client.post("/models/flowers/predict", json=[row(frame, 1)])
    assert current.status_code == 200 and current.json()["version"] == "1"
    r = server.client.post(f"/models/flowers/versions/{failed}/predict", json=[row(frame, 1)])
    assert r.status_code == 409 and "FAILED" in error_of(r)["message"], r.text


def test_the_unknown_model_404_lists_only_models_that_can_serve(server) -> None:
    register_failing(server, "broken-too")
    r = server.client.post("/models/flowrs/predict", json=[[1.0, 2.0, 3.0, 4.0]])
    assert r.status_code == 404
    message = error_of(r)["message"]
    assert message.startswith("no model named 'flowrs' (did you mean 'flowers'?); ready: [")
    ready, failed = message.split("; failed, none ready: ")
    assert "'flowers'" in ready and "broken" not in ready
    assert "'broken-too'" in failed
    inputs = [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    v2 = server.client.post("/v2/models/flowrs/infer", json={"inputs": inputs})
    assert v2.status_code == 404 and v2.json() == {"error": message}


# -- registration fields -------------------------------------------------------------------------
FIELD_ERRORS = [
    ("name", {"name": "no spaces!"}, 400, "field 'name': invalid model name 'no spaces!'"),
    ("version", {"version": "../up"}, 400, "field 'version': invalid version '../up'"),
    (
        "options NaN",
        {"options": '{"max_batch": NaN}'},
        400,
        "field 'options': not valid JSON: NaN is not allowed at line 1 column 15",
    ),
    ("options list", {"options": "[8]"}, 400, "field 'options' must be a JSON object, got list"),
    (
        "options values",
        {"options": '{"max_batch": 0, "speed": 1}'},
        422,
        "field 'options': max_batch: Input should be greater than or equal to 1; speed: Extra "
        "inputs are not permitted",
    ),
    ("sample JSON", {"sample": '[{"a": 1,'}, 400, "field 'sample': not valid JSON: "),
    ("sample shape", {"sample": '"rows"'}, 400, "field 'sample' must be JSON rows"),
    ("sample surrogate", {"sample": '[["\\ud800"]]'}, 400, "field 'sample': not valid JSON: "),
    ("format", {"format": "onnx"}, 422, "field 'format': unknown model format 'onnx'"),
]


@pytest.mark.parametrize(
    ("form", "status", "message"),
    [c[1:] for c in FIELD_ERRORS],
    ids=[c[0] for c in FIELD_ERRORS],
)
def test_registration_errors_name_their_form_field(
    server, flowers, form: dict[str, str], status: int, message: str
) -> None:
    fields = {"name": "fields", **form}
    r = server.client.post(
        "/models",
        params={"wait": "true"},
        data=fields,
        files={"file": ("m.skops", io.BytesIO(sio.dumps(flowers[0])))},
        headers=server.admin,
    )
    assert r.status_code == status, r.text
    assert error_of(r)["message"].startswith(message), r.text


def test_an_empty_file_and_a_taken_version_name_their_field(server, flowers) -> None:
    r = server.register("fields", b"")
    assert r.status_code == 400
    assert error_of(r)["message"] == "field 'file': the uploaded file is empty"
    r = server.register("flowers", sio.dumps(flowers[0]), version="1", options=OPTIONS)
    assert r.status_code == 409, r.text
    assert error_of(r)["message"] == (
        "model 'flowers' already has version '1' (leave 'version' out to number the upload "
        "automatically)"
    )


def test_a_nan_in_a_scoring_body_says_so_and_where(server) -> None:
    body = b'[{"sepal_length": 5.1, "sepal_width": NaN, "petal_length": 1.4, "petal_width": 0.2}]'
    column = body.index(b"NaN") + 1
    r = server.client.post(
        "/models/flowers/predict", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert error_of(r)["message"] == (
        f"malformed JSON: NaN is not allowed at line 1 column {column} (JSON has no NaN or "
        "Infinity; null is a missing value)"
    )


# -- the document ----------------------------------------------------------------------------------
def test_the_openapi_document_describes_the_new_answers(server) -> None:
    doc = server.client.get("/openapi.json").json()
    paths = doc["paths"]
    for path in ("/models/{name}/predict", "/predict", "/v2/models/{name}/infer"):
        operation = paths[path]["post"]
        assert "409" in operation["responses"], path
        assert "Kestrel-Ignored-Columns" in operation["responses"]["200"]["headers"], path
        params = {p["name"]: p for p in operation["parameters"]}
        assert params["strict_columns"]["schema"] == {"type": "boolean"}, path
    assert "409" in paths["/v2/models/{name}/ready"]["get"]["responses"]
    assert "409" in paths["/v2/models/{name}"]["get"]["responses"]
    assert "warnings" in doc["components"]["schemas"]["Prediction"]["properties"]
