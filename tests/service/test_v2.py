"""Open Inference Protocol v2 through an unmodified ``tritonclient.http`` client."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
import skops.io as sio
import tritonclient.http as triton
from sklearn.compose import make_column_transformer
from sklearn.ensemble import GradientBoostingRegressor, HistGradientBoostingClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, PolynomialFeatures, StandardScaler
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from tests.service.live import ADMIN_TOKEN, LiveServer

OPTIONS = '{"max_batch": 16}'
SMALL = '{"max_batch": 4}'


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


def _more_models(x: np.ndarray) -> dict[str, tuple[Any, str]]:
    """More kinds of model, by name: (fitted estimator, registration options)."""
    three = np.digitize(x[:, 0], [-0.5, 0.5])
    return {
        "binary": (LogisticRegression().fit(x, x[:, 1] > 0), SMALL),
        # NaN is a legitimate input: the pipeline imputes it.
        "imputed": (make_pipeline(SimpleImputer(), LogisticRegression()).fit(x, three), SMALL),
        # NaN and ±inf are legitimate inputs: the trees route them.
        "hgb": (HistGradientBoostingClassifier(max_iter=5).fit(x, three), SMALL),
        # A NaN input is a NaN in the answer.
        "scaler": (StandardScaler().fit(x), SMALL),
        # 1e200 squared is inf, in the source too.
        "poly": (PolynomialFeatures(2).fit(x), '{"max_batch": 4, "dtype": "float64"}'),
    }


@pytest.fixture(scope="module")
def more_models(models) -> dict[str, tuple[Any, str]]:
    return _more_models(models[1].astype(np.float64))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, models, more_models) -> Iterator[LiveServer]:
    reg, _x, clf, frame = models
    live = LiveServer(tmp_path_factory.mktemp("v2")).start()
    assert live.register("reg", sio.dumps(reg), options=OPTIONS).status_code == 201
    sample = frame.head(5).to_json(orient="records")
    assert live.register("city", sio.dumps(clf), sample=sample, options=OPTIONS).status_code == 201
    for name, (est, options) in more_models.items():
        r = live.register(name, sio.dumps(est), options=options)
        assert r.status_code == 201, r.text
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
    assert meta["outputs"] == [{"name": "predict", "datatype": "FP32", "shape": [-1]}]
    city = client.get_model_metadata("city", model_version="1")
    assert city["inputs"] == [
        {"name": "size", "datatype": "FP32", "shape": [-1]},
        {"name": "city", "datatype": "BYTES", "shape": [-1]},
    ]
    assert city["outputs"] == [
        {"name": "predict", "datatype": "BYTES", "shape": [-1]},
        {"name": "predict_proba", "datatype": "FP32", "shape": [-1, 2]},
        {"name": "decision_function", "datatype": "FP32", "shape": [-1]},
    ]


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


# -- model metadata states what infer takes and answers ------------------------------------------
ROWS = 3


def _rows(name: str, models) -> Any:
    """Rows to score with model ``name``: a frame for the model fitted on one, else a matrix."""
    return models[3].head(ROWS) if name == "city" else models[1][:ROWS].astype(np.float64)


def _native(server: LiveServer, name: str, rows: Any) -> dict[str, np.ndarray]:
    """The native route's answer: rows as JSON records, a matrix as .npy (NaN and ±inf kept)."""
    if isinstance(rows, pd.DataFrame):
        r = server.client.post(f"/models/{name}/predict", content=rows.to_json(orient="records"))
    else:
        buffer = io.BytesIO()
        np.save(buffer, rows)
        headers = {"content-type": "application/x-npy"}
        r = server.client.post(
            f"/models/{name}/predict", content=buffer.getvalue(), headers=headers
        )
    assert r.status_code == 200, r.text
    return {k: np.asarray(v) for k, v in r.json()["outputs"].items()}


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("name", ["reg", "city", "binary", "imputed", "hgb", "scaler", "poly"])
def test_metadata_is_what_infer_takes_and_answers(
    client: triton.InferenceServerClient, server: LiveServer, models, name: str, binary: bool
) -> None:
    """Tensors built from the metadata alone are accepted, and every output has the stated
    datatype and shape (-1: the batch), with the native route's values."""
    meta = client.get_model_metadata(name)
    rows = _rows(name, models)
    inputs = []
    for spec in meta["inputs"]:
        shape = [ROWS if d == -1 else d for d in spec["shape"]]
        values = np.asarray(rows) if len(shape) == 2 else rows[spec["name"]].to_numpy()
        tensor = triton.InferInput(spec["name"], shape, spec["datatype"])
        tensor.set_data_from_numpy(
            values.astype(triton_to_np_dtype(spec["datatype"])), binary_data=binary
        )
        inputs.append(tensor)
    outputs = [triton.InferRequestedOutput(o["name"], binary_data=binary) for o in meta["outputs"]]
    result = client.infer(name, inputs, outputs=outputs)
    native = _native(server, name, rows)
    assert [o["name"] for o in meta["outputs"]] == list(native)
    for spec in meta["outputs"]:
        answer = result.get_output(spec["name"])
        shape = [ROWS if d == -1 else d for d in spec["shape"]]
        assert (answer["datatype"], answer["shape"]) == (spec["datatype"], shape), spec["name"]
        got = result.as_numpy(spec["name"])
        assert list(got.shape) == shape
        if spec["datatype"] == "BYTES":
            labels = [v.decode() if isinstance(v, bytes) else v for v in got.ravel()]
            assert labels == native[spec["name"]].ravel().tolist()
        else:
            np.testing.assert_allclose(got, native[spec["name"]], rtol=1e-6, err_msg=spec["name"])


# -- NaN and ±inf in tritonclient's JSON ---------------------------------------------------------
def _infer_json(client: triton.InferenceServerClient, name: str, x: np.ndarray, outputs: list[str]):
    datatype = "FP32" if x.dtype == np.float32 else "FP64"
    tensor = triton.InferInput("input", list(x.shape), datatype)
    tensor.set_data_from_numpy(x, binary_data=False)  # NaN and ±inf as bare JSON tokens
    requested = [triton.InferRequestedOutput(o, binary_data=False) for o in outputs]
    return client.infer(name, [tensor], outputs=requested)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_in_a_json_tensor_is_a_missing_value_the_pipeline_imputes(
    client: triton.InferenceServerClient, server: LiveServer, models, more_models, dtype
) -> None:
    x = models[1][:4].astype(dtype)
    x[0, 1] = x[2, 0] = x[2, 2] = np.nan
    result = _infer_json(client, "imputed", x, ["predict", "predict_proba"])
    native = _native(server, "imputed", x)
    np.testing.assert_array_equal(result.as_numpy("predict"), native["predict"])
    np.testing.assert_allclose(result.as_numpy("predict_proba"), native["predict_proba"], rtol=1e-6)
    source = more_models["imputed"][0]
    np.testing.assert_array_equal(native["predict"], source.predict(x))


def test_infinities_in_a_json_tensor_reach_a_model_that_takes_them(
    client: triton.InferenceServerClient, server: LiveServer, models, more_models
) -> None:
    x = models[1][:4].astype(np.float64)
    x[0, 0], x[1, 1], x[2, 2], x[3, 0] = np.inf, -np.inf, np.nan, -np.inf
    result = _infer_json(client, "hgb", x, ["predict", "predict_proba"])
    native = _native(server, "hgb", x)
    np.testing.assert_array_equal(result.as_numpy("predict"), native["predict"])
    np.testing.assert_allclose(result.as_numpy("predict_proba"), native["predict_proba"], rtol=1e-6)
    source = more_models["hgb"][0]
    np.testing.assert_array_equal(native["predict"], source.predict(x))
    np.testing.assert_allclose(native["predict_proba"], source.predict_proba(x), atol=1e-6)


def test_nan_and_infinities_in_json_answers_reach_tritonclient(
    client: triton.InferenceServerClient, models, more_models
) -> None:
    """As Triton writes them, NaN, Infinity and -Infinity: null would read back as NaN."""
    x = models[1][:3].astype(np.float64)
    x[1, 2] = np.nan
    got = _infer_json(client, "scaler", x, ["transform"]).as_numpy("transform")
    want = more_models["scaler"][0].transform(x)
    assert np.isnan(got[1, 2]) and np.isnan(want[1, 2])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    big = np.array([[1e200, -1e200, 1.0], [1.0, 2.0, 3.0]])
    got = _infer_json(client, "poly", big, ["transform"]).as_numpy("transform")
    with np.errstate(over="ignore"):
        want = more_models["poly"][0].transform(big)
    assert np.isposinf(want).any() and np.isneginf(want).any()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"inputs": [NaN', "malformed JSON"),
        (b'{"inputs": [1, 2,], "x": NaN}', "malformed JSON"),
        (b'{"id": "\\ud800", "inputs": [NaN]}', "malformed JSON"),  # a lone surrogate
        (
            b'{"inputs": [{"name": "input", "shape": [1, 3], "datatype": "INT64", '
            b'"data": [1, NaN, 2]}]}',
            "'data' is not all INT64",
        ),
    ],
)
def test_json_with_nan_tokens_is_checked_like_any_other(
    server: LiveServer, body: bytes, message: str
) -> None:
    r = server.client.post(
        "/v2/models/imputed/infer", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and message in r.json()["error"], r.text


def test_repository_extension(server: LiveServer) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    index = client.get_model_repository_index(headers=admin)
    assert {(m["name"], m["state"]) for m in index} >= {("reg", "READY"), ("city", "READY")}
    client.unload_model("reg", headers=admin)
    assert not client.is_model_ready("reg")
    client.load_model("reg", headers=admin)
    assert client.is_model_ready("reg")
