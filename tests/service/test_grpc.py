"""The Open Inference Protocol v2 over gRPC, through Triton's unmodified ``tritonclient.grpc``,
against a real server process: the same answers, tokens, errors and metrics as over HTTP."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pytest
import skops.io as sio
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from prometheus_client.parser import text_string_to_metric_families
from sklearn.compose import make_column_transformer
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.service.live import ADMIN_TOKEN, LiveServer

READ_TOKEN = "test-read-token"
READ = {"authorization": f"Bearer {READ_TOKEN}"}
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
OPTIONS = '{"max_batch": 16}'
MAX_BODY = 1 << 20


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    labels = np.where(x[:, 0] + x[:, 1] > 0, "up", "down")
    frame = pd.DataFrame(
        {"size": rng.uniform(0, 10, 200), "city": rng.choice(["oslo", "rome", "lima"], 200)}
    )
    city_labels = np.where(frame["size"] + 3 * (frame["city"] == "rome") > 6, "big", "small")
    pre = make_column_transformer((StandardScaler(), ["size"]), (OneHotEncoder(), ["city"]))
    return {
        "x": x,
        "frame": frame,
        "clf": LogisticRegression().fit(x, labels),
        "reg": GradientBoostingRegressor(n_estimators=10, max_depth=2, random_state=0).fit(
            x, x[:, 0] * 2 - x[:, 2]
        ),
        "city": make_pipeline(pre, LogisticRegression()).fit(frame, city_labels),
        # Two versions of one model: aliases and traffic splits.
        "twin": [LogisticRegression(C=c).fit(x, labels) for c in (1.0, 0.01)],
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, models) -> Iterator[LiveServer]:
    live = LiveServer(
        tmp_path_factory.mktemp("grpc"),
        grpc=True,
        KESTREL_SCORING_TOKEN=READ_TOKEN,
        KESTREL_MAX_BODY_BYTES=str(MAX_BODY),
    ).start()
    for name in ("clf", "reg"):
        assert live.register(name, sio.dumps(models[name]), options=OPTIONS).status_code == 201
    sample = models["frame"].head(5).to_json(orient="records")
    r = live.register("city", sio.dumps(models["city"]), sample=sample, options=OPTIONS)
    assert r.status_code == 201, r.text
    for model in models["twin"]:
        assert live.register("twin", sio.dumps(model), options=OPTIONS).status_code == 201
    r = live.client.put("/models/twin/aliases/stable", json={"version": "1"}, headers=live.admin)
    assert r.status_code == 200, r.text
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[tgrpc.InferenceServerClient]:
    assert server.grpc_address is not None
    with tgrpc.InferenceServerClient(server.grpc_address) as c:
        yield c


@pytest.fixture(scope="module")
def http(server: LiveServer) -> thttp.InferenceServerClient:
    return thttp.InferenceServerClient(server.url.removeprefix("http://"))


def _inputs(module: Any, name: str, models) -> list[Any]:
    """The input tensors of a few rows for model ``name``, built with ``module`` (tritonclient's
    grpc or http): one [rows, 3] FP64 matrix, or one tensor per column (BYTES for strings)."""
    if name == "city":
        frame = models["frame"].head(7)
        size = module.InferInput("size", [7], "FP64")
        size.set_data_from_numpy(frame["size"].to_numpy())
        city = module.InferInput("city", [7, 1], "BYTES")
        city.set_data_from_numpy(frame["city"].to_numpy(dtype=object).reshape(7, 1))
        return [size, city]
    x = models["x"][:7]
    tensor = module.InferInput("input", list(x.shape), "FP64")
    tensor.set_data_from_numpy(x)
    return [tensor]


def _rows(name: str, models) -> Any:
    return models["frame"].head(7) if name == "city" else models["x"][:7]


OUTPUTS = {
    "clf": ["predict", "predict_proba", "decision_function"],
    "reg": ["predict"],
    "city": ["predict", "predict_proba"],
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_infer_answers_as_http_v2_and_the_source(
    client: tgrpc.InferenceServerClient, http: thttp.InferenceServerClient, models, name: str
) -> None:
    outputs = OUTPUTS[name]
    result = client.infer(
        name,
        _inputs(tgrpc, name, models),
        outputs=[tgrpc.InferRequestedOutput(o) for o in outputs],
        request_id="r-1",
        headers=READ,
    )
    answer = http.infer(
        name,
        _inputs(thttp, name, models),
        outputs=[thttp.InferRequestedOutput(o, binary_data=True) for o in outputs],
        headers=dict(READ),  # a copy: tritonclient.http adds its own headers to the dict
    )
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (name, "1", "r-1")
    assert [o.name for o in response.outputs] == outputs  # the outputs asked for, only
    assert len(response.raw_output_contents) == len(outputs)  # raw, as the inputs came
    source, rows = models[name], _rows(name, models)
    for output in outputs:
        got = result.as_numpy(output)
        np.testing.assert_array_equal(got, answer.as_numpy(output), err_msg=output)
        want = getattr(source, output)(rows)
        if got.dtype == object:
            assert [v.decode() for v in got.ravel()] == want.tolist()
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=output)


def _stub(server: LiveServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_address) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def stub(server: LiveServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    yield from _stub(server)


def test_typed_contents_answer_in_typed_contents(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, client: tgrpc.InferenceServerClient, models
) -> None:
    """Inputs in ``contents`` (not raw): the answer comes in typed contents, equal to raw's."""
    frame = models["frame"].head(7)
    request = service_pb2.ModelInferRequest(model_name="city")
    size = request.inputs.add(name="size", datatype="FP64", shape=[7])
    size.contents.fp64_contents.extend(frame["size"].tolist())
    city = request.inputs.add(name="city", datatype="BYTES", shape=[7])
    city.contents.bytes_contents.extend(c.encode() for c in frame["city"])
    request.outputs.add(name="predict")
    request.outputs.add(name="predict_proba")
    response = stub.ModelInfer(request, metadata=tuple(READ.items()))
    assert not response.raw_output_contents
    labels, proba = response.outputs
    assert (labels.datatype, list(labels.shape)) == ("BYTES", [7])
    assert (proba.datatype, list(proba.shape)) == ("FP32", [7, 2])
    raw = client.infer("city", _inputs(tgrpc, "city", models), headers=READ)
    assert list(labels.contents.bytes_contents) == raw.as_numpy("predict").tolist()
    np.testing.assert_array_equal(
        np.array(proba.contents.fp32_contents, np.float32).reshape(7, 2),
        raw.as_numpy("predict_proba"),
    )


def test_health_and_metadata_as_http(
    client: tgrpc.InferenceServerClient, server: LiveServer
) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "kestrel" and "model_repository" in meta["extensions"]
    for name in ("clf", "city", "twin@stable"):
        grpc_meta = client.get_model_metadata(name, headers=READ, as_json=True)
        http_meta = server.client.get(f"/v2/models/{name}", headers=READ).json()
        # protobuf's JSON writes int64 as strings and leaves empty lists out.
        for tensor in grpc_meta["inputs"] + grpc_meta["outputs"]:
            tensor["shape"] = [int(d) for d in tensor["shape"]]
        assert grpc_meta == http_meta, name
    assert client.get_model_metadata("twin", "stable", headers=READ).versions == ["1", "2"]
    assert client.is_model_ready("clf", headers=READ)
    assert client.is_model_ready("twin", "1", headers=READ)
    assert client.is_model_ready("twin@stable", headers=READ)
    assert not client.is_model_ready("nope", headers=READ)
    assert not client.is_model_ready("clf", "9", headers=READ)


def test_alias_as_a_version_and_in_the_name(client: tgrpc.InferenceServerClient, models) -> None:
    inputs = _inputs(tgrpc, "twin", models)
    answers = {
        "current": client.infer("twin", inputs, headers=READ),
        "by alias": client.infer("twin", inputs, model_version="stable", headers=READ),
        "name@alias": client.infer("twin@stable", inputs, headers=READ),
        "by number": client.infer("twin", inputs, model_version="1", headers=READ),
    }
    versions = {k: r.get_response().model_version for k, r in answers.items()}
    assert versions == {"current": "2", "by alias": "1", "name@alias": "1", "by number": "1"}
    x = models["x"][:7]
    for key, source in (("by alias", models["twin"][0]), ("current", models["twin"][1])):
        proba = answers[key].as_numpy("predict_proba")
        np.testing.assert_allclose(proba, source.predict_proba(x), atol=1e-6, err_msg=key)


def test_route_key_picks_the_version_http_picks(
    client: tgrpc.InferenceServerClient, server: LiveServer, models
) -> None:
    r = server.client.put(
        "/models/twin/traffic", json={"weights": {"1": 50, "2": 50}}, headers=server.admin
    )
    assert r.status_code == 200, r.text
    try:
        body = {
            "inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP64", "data": [0, 0, 0]}]
        }
        seen = set()
        for key in (f"user-{i}" for i in range(12)):
            headers = {**READ, "x-kestrel-route-key": key}
            via_grpc = {
                client.infer("twin", _inputs(tgrpc, "twin", models), headers=headers)
                .get_response()
                .model_version
                for _ in range(2)
            }
            via_http = server.client.post("/v2/models/twin/infer", json=body, headers=headers)
            assert via_grpc == {via_http.json()["model_version"]}, key
            seen |= via_grpc
        assert seen == {"1", "2"}  # twelve keys cannot all hash to one half
    finally:
        r = server.client.put("/models/twin/traffic", json={"weights": {}}, headers=server.admin)
        assert r.status_code == 200, r.text


def test_repository_index_load_and_unload(client: tgrpc.InferenceServerClient) -> None:
    index = client.get_model_repository_index(headers=ADMIN, as_json=True)["models"]
    assert {(m["name"], m["version"], m["state"]) for m in index} >= {
        ("clf", "1", "READY"),
        ("twin", "2", "READY"),
    }
    client.unload_model("reg", headers=ADMIN)
    try:
        assert not client.is_model_ready("reg", headers=READ)
        ready = client.get_model_repository_index(headers=ADMIN, as_json=True)["models"]
        assert "reg" not in {m["name"] for m in ready if m["state"] == "READY"}
    finally:
        client.load_model("reg", headers=ADMIN)
    assert client.is_model_ready("reg", headers=READ)


def _code(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status(), caught.value.message()


def test_tokens_as_over_http(client: tgrpc.InferenceServerClient, models) -> None:
    inputs = _inputs(tgrpc, "clf", models)
    status, message = _code(lambda: client.infer("clf", inputs))
    assert status == "StatusCode.UNAUTHENTICATED" and "Bearer" in message
    status, _ = _code(lambda: client.infer("clf", inputs, headers={"authorization": "Bearer x"}))
    assert status == "StatusCode.PERMISSION_DENIED"
    status, message = _code(lambda: client.load_model("clf", headers=READ))
    assert status == "StatusCode.PERMISSION_DENIED" and "model management" in message
    status, _ = _code(lambda: client.get_model_repository_index(headers=READ))
    assert status == "StatusCode.PERMISSION_DENIED"
    status, _ = _code(lambda: client.get_model_metadata("clf"))
    assert status == "StatusCode.UNAUTHENTICATED"
    assert client.is_server_live()  # public, as /v2/health/live
    assert client.infer("clf", inputs, headers=ADMIN).get_response().model_version == "1"


def _matrix(datatype: str, shape: list[int], data: np.ndarray) -> tgrpc.InferInput:
    tensor = tgrpc.InferInput("input", shape, datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def test_bad_requests_name_what_is_wrong(
    client: tgrpc.InferenceServerClient, stub: service_pb2_grpc.GRPCInferenceServiceStub, models
) -> None:
    x = models["x"][:2]
    cases = {
        "short bytes": (
            lambda: [_with_raw(_matrix("FP64", [2, 3], x), x.tobytes()[:-8])],
            "StatusCode.INVALID_ARGUMENT",
            "input 'input': 40 bytes of binary data, expected 48 for shape [2, 3] FP64",
        ),
        "wrong datatype": (
            lambda: [_matrix("BYTES", [2, 3], np.full((2, 3), "tall", dtype=object))],
            "StatusCode.INVALID_ARGUMENT",
            "column 'x0', row 0: 'tall' is not a number",
        ),
        "wrong shape": (
            lambda: [_with_raw(_matrix("FP64", [2, 3], x), x.tobytes(), shape=[3, 3])],
            "StatusCode.INVALID_ARGUMENT",
            "expected 72 for shape [3, 3] FP64",
        ),
        "unknown datatype": (
            lambda: [_with_raw(_matrix("FP64", [2, 3], x), x.tobytes(), datatype="FLOAT")],
            "StatusCode.INVALID_ARGUMENT",
            "input 'input': unknown datatype 'FLOAT'",
        ),
    }
    for case, (inputs, status, message) in cases.items():
        tensors = inputs()
        got_status, got = _code(lambda t=tensors: client.infer("clf", t, headers=READ))
        assert (got_status, message in got) == (status, True), (case, got)

    ok = [_matrix("FP64", [2, 3], x)]
    status, message = _code(lambda: client.infer("nope", ok, headers=READ))
    assert status == "StatusCode.NOT_FOUND" and "no model named 'nope'" in message
    status, message = _code(lambda: client.infer("clf", ok, model_version="7", headers=READ))
    assert status == "StatusCode.NOT_FOUND" and "no version '7'" in message
    wanted = [tgrpc.InferRequestedOutput("predict_log_odds")]
    status, message = _code(lambda: client.infer("clf", ok, outputs=wanted, headers=READ))
    assert status == "StatusCode.INVALID_ARGUMENT" and "predict_log_odds" in message

    # Typed contents in another datatype's field.
    request = service_pb2.ModelInferRequest(model_name="clf")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 3])
    tensor.contents.fp64_contents.extend([0.0, 1.0, 2.0])
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, metadata=tuple(READ.items()))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'input': datatype FP32 takes fp32_contents, got fp64_contents" in (
        caught.value.details()
    )


def _with_raw(
    tensor: tgrpc.InferInput, raw: bytes, *, shape: list[int] | None = None, datatype: str = ""
) -> tgrpc.InferInput:
    """``tensor`` with other raw bytes, shape or datatype than its data: what a client that
    builds the message itself may send (tritonclient checks its own)."""
    tensor._raw_content = raw
    if shape is not None:
        tensor.set_shape(shape)
    if datatype:
        tensor._input.datatype = datatype
    return tensor


def test_deadlines_and_sizes(client: tgrpc.InferenceServerClient, models) -> None:
    ok = _inputs(tgrpc, "clf", models)
    status, _ = _code(lambda: client.infer("clf", ok, timeout=1, headers=READ))  # 1 µs
    assert status == "StatusCode.DEADLINE_EXCEEDED"
    big = np.zeros((MAX_BODY // 24 + 1, 3))
    status, _ = _code(lambda: client.infer("clf", [_matrix("FP64", list(big.shape), big)]))
    assert status == "StatusCode.RESOURCE_EXHAUSTED"  # over KESTREL_MAX_BODY_BYTES


def test_strict_columns_and_ignored_columns(client: tgrpc.InferenceServerClient, models) -> None:
    inputs = _inputs(tgrpc, "city", models)
    extra = tgrpc.InferInput("colour", [7], "BYTES")
    extra.set_data_from_numpy(np.array(["red"] * 7, dtype=object))
    result = client.infer("city", [*inputs, extra], headers=READ)
    assert result.get_response().parameters["kestrel_ignored_columns"].string_param == "colour"
    status, message = _code(
        lambda: client.infer(
            "city", [*inputs, extra], parameters={"strict_columns": True}, headers=READ
        )
    )
    assert status == "StatusCode.INVALID_ARGUMENT" and "'colour'" in message


def test_grpc_calls_are_in_the_request_metrics(
    client: tgrpc.InferenceServerClient, server: LiveServer, models
) -> None:
    route = "grpc:/v2/models/{name}/infer"
    # Counted under the version that answered, the 422 of its schema too; refusals under none.
    answered = {"model": "reg", "version": "1", "route": route}
    before = server.metric("kestrel_requests_total", **answered, status="200")
    for _ in range(3):
        client.infer("reg", _inputs(tgrpc, "reg", models), headers=READ)
    _code(lambda: client.infer("reg", [_matrix("FP64", [1, 2], np.zeros((1, 2)))], headers=READ))
    after = server.metric("kestrel_requests_total", **answered, status="200")
    assert after - before == 3
    assert server.metric("kestrel_requests_total", **answered, status="422") >= 1
    assert server.metric("kestrel_request_duration_seconds_count", **answered) >= 4
    assert server.metric("kestrel_rejections_total", model="reg", reason="bad_input") >= 1
    refused = {"route": "_refused", "status": "401", "version": ""}
    before = server.metric("kestrel_requests_total", **refused)
    _code(lambda: client.infer("reg", _inputs(tgrpc, "reg", models)))
    assert server.metric("kestrel_requests_total", **refused) == before + 1


def _request_counts(server: LiveServer) -> Counter[tuple[str, str, str, str]]:
    """``kestrel_requests_total`` by (model, version, route, status), in one /metrics scrape."""
    counts: Counter[tuple[str, str, str, str]] = Counter()
    for family in text_string_to_metric_families(server.client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "kestrel_requests_total":
                labels = sample.labels
                key = (labels["model"], labels["version"], labels["route"], labels["status"])
                counts[key] += int(sample.value)
    return counts


def test_request_metrics_count_each_request_under_the_version_that_answered(
    client: tgrpc.InferenceServerClient, server: LiveServer, models
) -> None:
    """A 50 / 50 canary split of twin: over native HTTP, v2 HTTP and gRPC, each request is
    counted under the version its answer names; an alias and a pinned version under the
    version they resolve to, the error of a version after routing under it too; requests that
    reached no version (unknown model, a body refused before routing, no token) under ""."""
    native, v2 = "/models/{name}/predict", "/v2/models/{name}/infer"
    rpc = "grpc:" + v2
    row = models["x"][:1]
    body = {
        "inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP64", "data": row[0].tolist()}]
    }
    r = server.client.put(
        "/models/twin/traffic", json={"weights": {"1": 50, "2": 50}}, headers=server.admin
    )
    assert r.status_code == 200, r.text
    try:
        before = _request_counts(server)
        expected: Counter[tuple[str, str, str, str]] = Counter()
        for key in (f"user-{i}" for i in range(16)):
            headers = {**READ, "x-kestrel-route-key": key}
            r = server.client.post("/models/twin/predict", json=row.tolist(), headers=headers)
            assert r.status_code == 200, r.text
            expected["twin", r.json()["version"], native, "200"] += 1
            r = server.client.post("/v2/models/twin/infer", json=body, headers=headers)
            assert r.status_code == 200, r.text
            expected["twin", r.json()["model_version"], v2, "200"] += 1
            result = client.infer("twin", _inputs(tgrpc, "twin", models), headers=headers)
            expected["twin", result.get_response().model_version, rpc, "200"] += 1
        assert {version for _, version, _, _ in expected} == {"1", "2"}  # both answered
        # An alias, named as name@alias: its version, under the model's own name.
        r = server.client.post("/models/twin@stable/predict", json=row.tolist(), headers=READ)
        assert r.status_code == 200 and r.json()["version"] == "1", r.text
        expected["twin", "1", native, "200"] += 1
        # Routed to version 2, then refused by its schema (two columns, not three).
        pinned = "/models/{name}/versions/{version}/predict"
        r = server.client.post("/models/twin/versions/2/predict", json=[[1, 2]], headers=READ)
        assert r.status_code == 422, r.text
        expected["twin", "2", pinned, "422"] += 1
        # Reaching no version: a body that is not JSON, an unknown model, no token.
        r = server.client.post(
            "/models/twin/predict",
            content=b"{",
            headers={**READ, "content-type": "application/json"},
        )
        assert r.status_code == 400, r.text
        expected["twin", "", native, "400"] += 1
        r = server.client.post("/models/nope/predict", json=row.tolist(), headers=READ)
        assert r.status_code == 404, r.text
        expected["_none", "", native, "404"] += 1
        status, _ = _code(
            lambda: client.infer("nope", _inputs(tgrpc, "twin", models), headers=READ)
        )
        assert status == "StatusCode.NOT_FOUND"
        expected["_none", "", rpc, "404"] += 1
        r = server.client.post("/models/twin/predict", json=row.tolist())
        assert r.status_code == 401, r.text
        expected["twin", "", "_refused", "401"] += 1

        counted = _request_counts(server) - before
        del counted["_none", "", "/metrics", "200"]  # the scrape before
        assert counted == expected
    finally:
        r = server.client.put("/models/twin/traffic", json={"weights": {}}, headers=server.admin)
        assert r.status_code == 200, r.text
