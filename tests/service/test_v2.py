"""Open Inference Protocol v2 through an unmodified ``tritonclient.http`` client."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest
import skops.io as sio
import tritonclient.http as triton
from sklearn.compose import make_column_transformer
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from tritonclient.utils import InferenceServerException

from tests.service.live import ADMIN_TOKEN, LiveServer

OPTIONS = '{"max_batch": 16}'


@pytest.fixture(scope="module")
def models():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    reg = GradientBoostingRegressor(n_estimators=10, max_depth=2, random_state=0).fit(
        x, x[:, 0] * 2
    )
    frame = pd.DataFrame(
        {"size": rng.uniform(0, 10, 200), "city": rng.choice(["oslo", "rome"], 200)}
    )
    labels = np.where(frame["size"] > 5, "big", "small")
    pre = make_column_transformer((StandardScaler(), ["size"]), (OneHotEncoder(), ["city"]))
    clf = make_pipeline(pre, LogisticRegression()).fit(frame, labels)
    return reg, x, clf, frame


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, models) -> Iterator[LiveServer]:
    reg, _x, clf, frame = models
    live = LiveServer(tmp_path_factory.mktemp("v2")).start()
    assert live.register("reg", sio.dumps(reg), options=OPTIONS).status_code == 201
    sample = frame.head(5).to_json(orient="records")
    assert live.register("city", sio.dumps(clf), sample=sample, options=OPTIONS).status_code == 201
    yield live
    live.stop()


@pytest.fixture
def client(server: LiveServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.url.removeprefix("http://"))


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("reg") and not client.is_model_ready("nope")
    meta = client.get_model_metadata("reg")
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3]}]
    assert [o["name"] for o in meta["outputs"]] == ["predict"]
    city = client.get_model_metadata("city", model_version="1")
    assert [(i["name"], i["datatype"]) for i in city["inputs"]] == [
        ("size", "FP32"),
        ("city", "BYTES"),
    ]
    assert city["outputs"][0]["datatype"] == "BYTES"


@pytest.mark.parametrize("binary", [True, False])
def test_infer_matrix(client: triton.InferenceServerClient, models, binary: bool) -> None:
    reg, x, _, _ = models
    tensor = triton.InferInput("input", list(x[:20].shape), "FP32")
    tensor.set_data_from_numpy(x[:20], binary_data=binary)
    out = triton.InferRequestedOutput("predict", binary_data=binary)
    result = client.infer("reg", [tensor], outputs=[out], request_id="r1")
    np.testing.assert_allclose(result.as_numpy("predict"), reg.predict(x[:20]), rtol=1e-5)
    assert result.get_response()["id"] == "r1"


def test_infer_columns_with_strings(client: triton.InferenceServerClient, models) -> None:
    _, _, clf, frame = models
    batch = frame.head(9)
    size = triton.InferInput("size", [9], "FP64")
    size.set_data_from_numpy(batch["size"].to_numpy())
    city = triton.InferInput("city", [9, 1], "BYTES")
    city.set_data_from_numpy(batch["city"].to_numpy(dtype=object).reshape(9, 1))
    outputs = [triton.InferRequestedOutput("predict"), triton.InferRequestedOutput("predict_proba")]
    result = client.infer("city", [size, city], outputs=outputs, model_version="1")
    labels = [v.decode() for v in result.as_numpy("predict")]
    assert labels == clf.predict(batch).tolist()
    np.testing.assert_allclose(
        result.as_numpy("predict_proba"), clf.predict_proba(batch), atol=1e-6
    )


def test_infer_errors_are_exceptions_with_reasons(client: triton.InferenceServerClient) -> None:
    wrong = triton.InferInput("input", [2, 5], "FP32")
    wrong.set_data_from_numpy(np.zeros((2, 5), np.float32))
    with pytest.raises(InferenceServerException, match="missing columns"):
        client.infer("reg", [wrong])
    with pytest.raises(InferenceServerException, match="nope"):
        client.infer("nope", [wrong])


def test_timeout_parameter_is_a_deadline(server: LiveServer) -> None:
    body = {
        "inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [0, 0, 0]}],
        "parameters": {"timeout": 0.001},
    }
    r = server.client.post("/v2/models/reg/infer", json=body)
    assert r.status_code == 504, r.text


def test_malformed_binary_requests(server: LiveServer) -> None:
    head = b'{"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}]}'
    r = server.client.post(
        "/v2/models/reg/infer",
        content=head + b"\x00" * 8,  # 4 bytes short
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    assert r.status_code == 400 and "binary_data_size" in r.json()["error"]
    r = server.client.post(
        "/v2/models/reg/infer", content=head, headers={"Inference-Header-Content-Length": "9999"}
    )
    assert r.status_code == 400


def test_repository_extension(server: LiveServer) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    index = client.get_model_repository_index(headers=admin)
    assert {(m["name"], m["state"]) for m in index} >= {("reg", "READY"), ("city", "READY")}
    client.unload_model("reg", headers=admin)
    assert not client.is_model_ready("reg")
    client.load_model("reg", headers=admin)
    assert client.is_model_ready("reg")
