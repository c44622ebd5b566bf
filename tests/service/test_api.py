"""The HTTP API against a real server process: every route, every error class, bad inputs."""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import skops.io as sio
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from tests.service.live import ADMIN_TOKEN, LiveServer

OPTIONS = '{"max_batch": 16}'


@pytest.fixture(scope="module")
def shop() -> tuple[object, pd.DataFrame]:
    """A DataFrame pipeline: scaled numbers + one-hot strings → string labels."""
    rng = np.random.default_rng(0)
    n = 300
    frame = pd.DataFrame(
        {
            "price": rng.uniform(1, 100, n),
            "weight": rng.normal(5, 2, n),
            "colour": rng.choice(["red", "green", "blue"], n),
        }
    )
    label = np.where(frame.price + 20 * (frame.colour == "red") > 60, "buy", "skip")
    pre = ColumnTransformer(
        [
            ("num", StandardScaler(), ["price", "weight"]),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["colour"]),
        ]
    )
    model = make_pipeline(pre, LogisticRegression()).fit(frame, label)
    return model, frame


@pytest.fixture(scope="module")
def forest() -> tuple[object, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    return RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0).fit(x, y), x


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, shop, forest) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("api")).start()
    model, frame = shop
    sample = frame.head(8).to_json(orient="records")
    r = live.register("shop", sio.dumps(model), sample=sample, options=OPTIONS)
    assert r.status_code == 201, r.text
    r = live.register("forest", sio.dumps(forest[0]), options=OPTIONS)
    assert r.status_code == 201, r.text
    yield live
    live.stop()


def test_native_tree_kernels_are_cached_beside_the_executables(server: LiveServer) -> None:
    # The forest's host walk (lazy/forest.py, numba) compiled at warm-up; its machine code is
    # kept under KESTREL_CACHE_DIR, the one writable place a locked-down pod has.
    assert list((server.workdir / "cache" / "numba").rglob("*.nbi")), "no numba cache index"


def rows_of(frame: pd.DataFrame) -> list[dict[str, object]]:
    return orjson.loads(frame.to_json(orient="records"))


# -- happy paths --------------------------------------------------------------------------------
def test_health_and_server_metadata(server: LiveServer) -> None:
    c = server.client
    assert c.get("/healthz").json() == {"status": "ok"}
    assert c.get("/readyz").json() == {"status": "ready"}
    assert c.get("/v2/health/live").status_code == 200
    assert c.get("/v2/health/ready").json() == {"ready": True}
    assert "binary_tensor_data" in c.get("/v2").json()["extensions"]
    paths = c.get("/openapi.json").json()["paths"]
    assert {"/models", "/models/{name}/predict", "/v2/models/{name}/infer"} <= set(paths)


def test_describe_shows_schema_report_parity(server: LiveServer) -> None:
    doc = server.client.get("/models/shop", headers=server.admin).json()
    assert doc["current"] == "1"
    (v,) = doc["versions"]
    assert v["state"] == "READY"
    assert [c["name"] for c in v["schema"]["columns"]] == ["price", "weight", "colour"]
    assert v["schema"]["columns"][2]["categories"] == ["blue", "green", "red"]
    assert v["parity"]["ok"] and v["parity"]["source"] == "sample"
    assert v["classes"] == ["buy", "skip"]
    # Which buckets run on the host is timed at warm-up; timing stops at the first the device
    # wins, so they are always the smallest: 1, 2, 4, … (or none).
    hosts = v["host_buckets"]
    assert hosts == [2**k for k in range(len(hosts))]
    assert "scikit-learn" in v["framework"] or "sklearn" in str(v["framework"])
    listing = server.client.get("/models", headers=server.admin).json()["models"]
    assert {m["name"] for m in listing} == {"shop", "forest"}


def test_predict_rows_columns_arrow_npy_agree_with_source(server: LiveServer, shop, forest) -> None:
    model, frame = shop
    batch = frame.iloc[:37]
    want_labels = model.predict(batch).tolist()
    want_proba = model.predict_proba(batch)
    c = server.client
    as_rows = c.post("/models/shop/predict", json=rows_of(batch))
    assert as_rows.status_code == 200, as_rows.text
    out = as_rows.json()
    assert out["rows"] == 37 and out["version"] == "1"
    assert out["outputs"]["predict"] == want_labels
    np.testing.assert_allclose(out["outputs"]["predict_proba"], want_proba, rtol=1e-5, atol=1e-6)

    columns = {"columns": {c: batch[c].tolist() for c in batch}, "outputs": ["predict"]}
    as_columns = c.post("/predict", params={"model": "shop"}, json=columns).json()
    assert as_columns["outputs"] == {"predict": want_labels}

    sink = io.BytesIO()
    table = pa.Table.from_pandas(batch, preserve_index=False)
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    as_arrow = c.post(
        "/models/shop/versions/1/predict?outputs=predict",
        content=sink.getvalue(),
        headers={"content-type": "application/vnd.apache.arrow.stream"},
    )
    assert as_arrow.json()["outputs"]["predict"] == want_labels

    rf, x = forest
    buffer = io.BytesIO()
    np.save(buffer, x[:50])
    as_npy = c.post(
        "/models/forest/predict",
        content=buffer.getvalue(),
        headers={"content-type": "application/x-npy"},
    ).json()
    assert as_npy["outputs"]["predict"] == rf.predict(x[:50]).tolist()
    np.testing.assert_allclose(
        as_npy["outputs"]["predict_proba"], rf.predict_proba(x[:50]), atol=1e-6
    )
    arrays = c.post("/models/forest/predict", json={"instances": x[:3].tolist()}).json()
    assert arrays["outputs"]["predict"] == rf.predict(x[:3]).tolist()


def test_large_request_is_chunked_not_compiled(server: LiveServer, forest) -> None:
    rf, x = forest
    before = server.metric("kestrel_compiles_total", cause="after_ready")
    big = np.tile(x, (3, 1))  # 600 rows over a top bucket of 16
    out = server.client.post("/models/forest/predict", json=big.tolist()).json()
    assert out["outputs"]["predict"] == rf.predict(big).tolist()
    assert server.metric("kestrel_compiles_total", cause="after_ready") == before


# -- bad inputs ---------------------------------------------------------------------------------
BAD_PREDICT = [
    ("malformed JSON", b'[{"price": 1,', "application/json", 400, "malformed JSON"),
    ("empty body", b"", "application/json", 400, "empty"),
    ("empty batch", b"[]", "application/json", 400, "empty batch"),
    ("not rows", b'"hello"', "application/json", 400, "expected a JSON list"),
    ("missing column", b'[{"price": 1, "weight": 2}]', "application/json", 422, "colour"),
    (
        "wrong type",
        b'[{"price": "cheap", "weight": 2, "colour": "red"}]',
        "application/json",
        422,
        "price",
    ),
    (
        "NaN literal",
        b'[{"price": NaN, "weight": 2, "colour": "red"}]',
        "application/json",
        400,
        "malformed",
    ),
    ("nested value", b'[[1, [2], "red"]]', "application/json", 400, "[0][1]"),
    ("ragged rows", b'[[1, 2, "red"], [1, 2]]', "application/json", 400, "[1]"),
    ("two keys", b'{"rows": [], "columns": {}}', "application/json", 400, "exactly one"),
    (
        "unknown output",
        b'{"rows": [{"price": 1, "weight": 2, "colour": "red"}], "outputs": ["nope"]}',
        "application/json",
        400,
        "nope",
    ),
    ("bad media type", b"price=1", "text/csv", 415, "Content-Type"),
    ("garbage arrow", b"not arrow", "application/vnd.apache.arrow.stream", 400, "Arrow"),
    ("garbage npy", b"not npy", "application/x-npy", 400, ".npy"),
]


@pytest.mark.parametrize(
    ("body", "ctype", "status", "needle"),
    [c[1:] for c in BAD_PREDICT],
    ids=[c[0] for c in BAD_PREDICT],
)
def test_bad_predict_inputs_get_4xx_naming_the_problem(
    server: LiveServer, body: bytes, ctype: str, status: int, needle: str
) -> None:
    r = server.client.post("/models/shop/predict", content=body, headers={"content-type": ctype})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert needle in error["message"], error
    assert error["request_id"] == r.headers["x-request-id"]
    assert server.alive()


def test_nan_rejected_where_the_source_rejects_it(server: LiveServer) -> None:
    r = server.client.post(
        "/models/shop/predict", json=[{"price": None, "weight": 1, "colour": "red"}]
    )
    assert r.status_code == 422 and "price" in r.json()["error"]["message"]


def test_float32_overflow_is_a_422_not_a_wrong_label(server: LiveServer) -> None:
    """Values near float32's limit overflow a scaled softmax (inf - inf = NaN) where scikit-learn
    computes in float64: the service names the rows instead of answering NaN scores and the
    label argmax picks from them. Normal rows of the same request are not the problem."""
    x, y = load_iris(return_X_y=True)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    assert server.register("multi", sio.dumps(model), options=OPTIONS).status_code == 201
    rows = [[0.1, 0.2, 0.3, 0.4], [3e38] * 4, [0.0] * 4, [-3e38] * 4]
    assert np.isfinite(model.predict_proba(np.array(rows))).all()  # the source copes
    r = server.client.post("/models/multi/predict", json=rows)
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("row(s) 1, 3: the model's float32 arithmetic overflowed")
    assert '"dtype": "float64"' in message
    ok = server.client.post("/models/multi/predict", json=[rows[0], rows[2]])
    assert ok.status_code == 200
    assert ok.json()["outputs"]["predict"] == model.predict(np.array([rows[0], rows[2]])).tolist()


def test_overflow_is_a_422_when_the_model_leaves_a_column_unread(server: LiveServer) -> None:
    """The same overflow, in rows sent as JSON objects to a model whose ColumnTransformer drops
    a column: that column's place in the encoded table must not read as a missing value, or
    every row would pass as one with NaN inputs and the NaN scores would be answered."""
    x, y = load_iris(return_X_y=True, as_frame=True)
    frame = x.assign(note="seen")
    columns = ColumnTransformer([("numbers", StandardScaler(), list(x.columns))])
    model = make_pipeline(columns, LogisticRegression(max_iter=500)).fit(frame, y)
    assert server.register("dropping", sio.dumps(model), options=OPTIONS).status_code == 201
    rows = [
        {**dict(zip(x.columns, values, strict=True)), "note": "any text"}
        for values in ([0.1, 0.2, 0.3, 0.4], [3e38] * 4, [0.0] * 4, [-3e38] * 4)
    ]
    assert np.isfinite(model.predict_proba(pd.DataFrame(rows))).all()  # the source copes
    r = server.client.post("/models/dropping/predict", json=rows)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"].startswith("row(s) 1, 3: the model's float32 arithmetic")


def test_oversize_body_refused_before_reading(tmp_path: Path) -> None:
    live = LiveServer(tmp_path, KESTREL_MAX_BODY_BYTES="1000").start()
    try:
        r = live.client.post("/models/x/predict", content=b"[" + b"1," * 2000 + b"1]")
        assert r.status_code == 413 and "1000" in r.json()["error"]["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
            for _ in range(50):
                yield b" " * 100

        r = live.client.post("/models/x/predict", content=chunks())
        assert r.status_code == 413
        assert live.alive()
    finally:
        live.stop()


def test_unknown_model_and_version(server: LiveServer) -> None:
    r = server.client.post("/models/nope/predict", json=[[1, 2, 3, 4]])
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
    r = server.client.post("/models/forest/versions/9/predict", json=[[1, 2, 3, 4]])
    assert r.status_code == 404 and "9" in r.json()["error"]["message"]


def test_deadline_already_passed_gives_504_without_computing(server: LiveServer, forest) -> None:
    before = server.metric("kestrel_batch_rows_processed_total", model="forest")
    r = server.client.post(
        "/models/forest/predict",
        json=forest[1][:2].tolist(),
        headers={"x-kestrel-timeout-ms": "0.0001"},
    )
    assert r.status_code == 504, r.text
    assert server.metric("kestrel_rejections_total", model="forest", reason="deadline") >= 1
    assert server.metric("kestrel_batch_rows_processed_total", model="forest") == before
    bad = server.client.post(
        "/models/forest/predict", json=[[1, 2, 3, 4]], headers={"x-kestrel-timeout-ms": "soon"}
    )
    assert bad.status_code == 400


# -- uploads ------------------------------------------------------------------------------------
class _Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # what a hostile pickle does: run code at load
        return (open, (self.path, "w"))


def test_bad_uploads_get_4xx_and_store_unchanged(server: LiveServer, tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    before = server.client.get("/models", headers=server.admin).json()
    cases = [
        (pickle.dumps(_Exploit(str(sentinel))), "model.pkl", 403, "pickle"),
        (b"garbage bytes", "model.bin", 422, "format"),
        (sio.dumps(make_pipeline(StandardScaler()).fit([[1.0], [2.0]]))[:100], "m.skops", 422, ""),
        (b"tree\nversion=v4\nnum_class=1\n", "m.txt", 422, ""),
        (b'{"learner": {', "m.json", 422, ""),
    ]
    for data, filename, status, needle in cases:
        r = server.register("hostile", data, filename=filename)
        assert r.status_code == status, (filename, r.text)
        assert needle in r.json()["error"]["message"].lower()
    assert not sentinel.exists()
    assert server.client.get("/models", headers=server.admin).json() == before


def test_unsupported_estimator_named(server: LiveServer) -> None:
    from sklearn.cluster import DBSCAN

    data = sio.dumps(DBSCAN().fit(np.random.default_rng(0).normal(size=(20, 2))))
    r = server.register("dbscan", data)
    assert r.status_code in (403, 422)
    assert "DBSCAN" in r.json()["error"]["message"]


def test_bad_registration_fields(server: LiveServer, forest) -> None:
    data = sio.dumps(forest[0])
    assert server.register("bad name!", data).status_code == 400
    assert server.register("x", data, options='{"max_batch": -1}').status_code == 422
    assert server.register("x", data, options='{"nope": 1}').status_code == 422
    assert server.register("x", data, sample="[1, ").status_code == 400
    r = server.register("forest", data, version="1")
    assert r.status_code == 409


def test_management_needs_the_admin_token(server: LiveServer) -> None:
    c = server.client
    routes = [
        ("GET", "/models"),
        ("GET", "/models/forest"),
        ("GET", "/models/forest/versions/1"),
        ("DELETE", "/models/forest"),
        ("DELETE", "/models/forest/versions/1"),
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/forest/unload"),
    ]
    for method, path in routes:
        assert c.request(method, path).status_code == 401, path
        wrong = c.request(method, path, headers={"Authorization": "Bearer wrong"})
        assert wrong.status_code == 403, path
    r = server.register("forest2", b"x", headers={})
    assert r.status_code == 401
    assert server.client.get("/models/forest", headers=server.admin).json()["current"] == "1"


def test_new_version_swaps_and_delete(server: LiveServer, forest) -> None:
    rf, x = forest
    r = server.register("forest", sio.dumps(rf), options=OPTIONS)
    assert r.status_code == 201, r.text
    assert r.json()["version"] == "2" and r.headers["location"] == "/models/forest/versions/2"
    assert (
        server.client.post("/models/forest/predict", json=x[:2].tolist()).json()["version"] == "2"
    )
    assert (
        server.client.delete("/models/forest/versions/2", headers=server.admin).status_code == 204
    )
    assert (
        server.client.post("/models/forest/predict", json=x[:2].tolist()).json()["version"] == "1"
    )
    assert server.client.get("/models/forest/versions/2", headers=server.admin).status_code == 404


def test_async_registration_202_then_ready(server: LiveServer, forest) -> None:
    r = server.register("later", sio.dumps(forest[0]), options=OPTIONS, wait=False)
    assert r.status_code in (201, 202), r.text
    url = r.headers["location"]
    for _ in range(600):
        state = server.client.get(url, headers=server.admin).json()["state"]
        if state != "LOADING":
            break
        import time

        time.sleep(0.1)
    assert state == "READY"
    assert server.client.delete("/models/later", headers=server.admin).status_code == 204
    assert server.client.post("/models/later/predict", json=[[0, 0, 0, 0]]).status_code == 404


def test_each_scoring_request_records_one_decode_and_one_encode(server: LiveServer, forest) -> None:
    def count(phase: str) -> float:
        return server.metric("kestrel_codec_duration_seconds_count", model="forest", phase=phase)

    before = {phase: count(phase) for phase in ("decode", "encode")}
    assert server.client.post("/models/forest/predict", json=forest[1][:3].tolist()).is_success
    rows = forest[1][:2].astype("float32")
    infer = {
        "inputs": [
            {
                "name": "x",
                "shape": list(rows.shape),
                "datatype": "FP32",
                "data": rows.ravel().tolist(),
            }
        ]
    }
    r = server.client.post("/v2/models/forest/infer", json=infer)
    assert r.is_success, r.text
    assert {phase: count(phase) - before[phase] for phase in before} == {"decode": 2, "encode": 2}


def test_metrics_after_traffic(server: LiveServer, forest) -> None:
    server.client.post("/models/forest/predict", json=forest[1][:3].tolist())
    text = server.client.get("/metrics").text
    for name in (
        "kestrel_requests_total",
        "kestrel_request_duration_seconds_bucket",
        "kestrel_queue_duration_seconds_bucket",
        "kestrel_compute_duration_seconds_bucket",
        "kestrel_codec_duration_seconds_bucket",
        "kestrel_batch_rows_bucket",
        "kestrel_batch_padded_rows_total",
        "kestrel_queue_rows",
        "kestrel_in_flight_requests",
        "kestrel_rejections_total",
        "kestrel_compiles_total",
        "kestrel_model_load_duration_seconds_bucket",
        "kestrel_model_load_phase_duration_seconds_bucket",
        "kestrel_model_info",
        "kestrel_models",
    ):
        assert name in text, name
    assert (
        server.metric(
            "kestrel_requests_total", model="forest", route="/models/{name}/predict", status="200"
        )
        >= 1
    )
    assert server.metric("kestrel_compiles_total", cause="after_ready") == 0
    # Bounded labels: an unknown model name is not a label value.
    server.client.post("/models/random-name-123/predict", json=[[1]])
    assert "random-name-123" not in server.client.get("/metrics").text


def test_admin_token_is_required_for_pickle_even_when_allowed(tmp_path: Path, forest) -> None:
    live = LiveServer(tmp_path, KESTREL_ALLOW_PICKLE="true").start()
    try:
        data = pickle.dumps(forest[0])
        assert (
            live.register(
                "p", data, filename="m.pkl", headers={"Authorization": "Bearer nope"}
            ).status_code
            == 403
        )
        r = live.register("p", data, filename="m.pkl", options=OPTIONS)
        assert r.status_code == 201, r.text
        assert live.metric("kestrel_pickle_loads_total") == 1
    finally:
        live.stop()


def test_serve_refuses_public_management_without_token(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {k: v for k, v in LiveServer(tmp_path).env.items() if k != "KESTREL_ADMIN_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "KESTREL_ADMIN_TOKEN" in done.stderr


assert ADMIN_TOKEN


def test_queue_full_answers_429_with_retry_after(tmp_path: Path, forest) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    rf, x = forest
    # The queue's own bound, not shedding by queueing delay (tests/service/test_bursts.py),
    # which a standing queue of 2-row batches would reach first.
    no_shedding = {"KESTREL_QUEUE_DELAY_TARGET_MS": "600000"}
    live = LiveServer(tmp_path, KESTREL_MAX_QUEUE_ROWS="6", **no_shedding).start()
    try:
        assert live.register("f", sio.dumps(rf), options='{"max_batch": 2}').status_code == 201
        too_big = live.client.post("/models/f/predict", json=x[:7].tolist())
        assert too_big.status_code == 413 and "6" in too_big.json()["error"]["message"]

        def call(_: int) -> httpx.Response:
            with httpx.Client(base_url=live.url, timeout=60) as c:
                return c.post("/models/f/predict", json=x[:3].tolist())

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(call, range(96)))
        codes = {r.status_code for r in answers}
        assert codes <= {200, 429}, codes
        assert 429 in codes, "32 concurrent 3-row requests must overflow a 6-row queue"
        for r in answers:
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == "queue_full"
        assert live.metric("kestrel_rejections_total", model="f", reason="queue_full") >= 1
        assert live.client.post("/models/f/predict", json=x[:3].tolist()).status_code == 200
    finally:
        live.stop()
