"""The ``contributions`` output (a version registered with ``{"explain": true}``) against a real
server: native JSON rows and v2 tensors, single- and multi-output models, and the refusals."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
import skops.io as sio
import tritonclient.grpc as tgrpc
from sklearn.base import clone
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_iris
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.naive_bayes import GaussianNB
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

import compiler
from tests.service.live import LiveServer

EXPLAIN = '{"explain": true, "max_batch": 16}'
NUMERIC = ["age", "active", "amount", "visits"]
COLUMNS = [*NUMERIC, "plan", "bias"]


@pytest.fixture(scope="module")
def churn() -> tuple[Pipeline, pd.DataFrame]:
    """Integer, binary and decimal columns with missing values, and a string column."""
    rng = np.random.default_rng(0)
    n = 300
    frame = pd.DataFrame(
        {
            "age": rng.integers(18, 80, n).astype(np.float64),
            "active": rng.integers(0, 2, n).astype(np.float64),
            "amount": rng.normal(50, 20, n).round(2),
            "visits": rng.integers(0, 30, n).astype(np.float64),
            "plan": rng.choice(["basic", "pro", "team"], n),
        }
    )
    frame.loc[rng.random(n) < 0.1, "amount"] = np.nan
    frame.loc[rng.random(n) < 0.05, "visits"] = np.nan
    label = (frame.amount.fillna(50) + 15 * (frame.plan == "pro") - frame.age / 4 > 40).astype(int)
    pre = ColumnTransformer(
        [
            ("num", make_pipeline(SimpleImputer(), StandardScaler()), NUMERIC),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["plan"]),
        ]
    )
    pipe = Pipeline(
        [("pre", pre), ("gb", GradientBoostingClassifier(n_estimators=20, random_state=0))]
    )
    return pipe.fit(frame, label), frame


@pytest.fixture(scope="module")
def iris() -> tuple[RandomForestClassifier, pd.DataFrame]:
    data = load_iris(as_frame=True)
    frame = data.frame.drop(columns="target")
    model = RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0)
    return model.fit(frame, data.target), frame


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, churn, iris) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("contributions"), grpc=True).start()
    pipe, frame = churn
    sample = frame.head(8).to_json(orient="records")
    r = live.register("churn", sio.dumps(pipe), sample=sample, options=EXPLAIN)
    assert r.status_code == 201, r.text
    forest, flowers = iris
    r = live.register("iris", sio.dumps(forest), options=EXPLAIN)
    assert r.status_code == 201, r.text
    # Registered without explain.
    r = live.register("plain", sio.dumps(linear(flowers)), options='{"max_batch": 4}')
    assert r.status_code == 201, r.text
    # A linear model explains against its sample's rows.
    background = frame.head(BACKGROUND_ROWS).to_json(orient="records")
    r = live.register(
        "churn_linear", sio.dumps(churn_linear(churn)), sample=background, options=EXPLAIN
    )
    assert r.status_code == 201, r.text
    yield live
    live.stop()


def linear(frame: pd.DataFrame) -> LogisticRegression:
    return LogisticRegression(max_iter=500).fit(frame, np.arange(len(frame)) % 3)


#: The rows of the churn frame the linear model is registered with: its background.
BACKGROUND_ROWS = 50


def churn_linear(churn: tuple[Pipeline, pd.DataFrame]) -> Pipeline:
    """The churn pipeline's featurization before a logistic regression."""
    pipe, frame = churn
    model = Pipeline([("pre", clone(pipe[0])), ("lr", LogisticRegression(max_iter=1000))])
    return model.fit(frame, pipe.predict(frame))


def rows_of(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON rows: NaN as null."""
    return orjson.loads(frame.to_json(orient="records"))


def probe_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows with missing values and an unknown category among ordinary ones."""
    rows = frame.iloc[:12].copy()
    rows.loc[rows.index[0], "amount"] = np.nan
    rows.loc[rows.index[1], ["amount", "visits"]] = np.nan
    rows.loc[rows.index[2], "plan"] = "enterprise"  # never seen: the encoder ignores it
    return rows


def as_matrix(contributions: list[dict[str, Any]], columns: list[str]) -> np.ndarray:
    return np.array([[row[c] for c in columns] for row in contributions], dtype=np.float64)


# -- native route -------------------------------------------------------------------------------
def test_contributions_beside_predictions_sum_to_the_decision_function(
    server: LiveServer, churn
) -> None:
    pipe, frame = churn
    rows = probe_rows(frame)
    r = server.client.post(
        "/models/churn/predict",
        json={"rows": rows_of(rows), "outputs": ["predict", "contributions"]},
    )
    assert r.status_code == 200, r.text
    doc = r.json()
    assert list(doc["outputs"]) == ["predict", "contributions"]
    assert doc["outputs"]["predict"] == pipe.predict(rows).tolist()
    assert "contribution_outputs" not in doc  # one raw output: the log-odds
    contributions = doc["outputs"]["contributions"]
    assert len(contributions) == len(rows)
    assert all(list(row) == COLUMNS for row in contributions)
    matrix = as_matrix(contributions, COLUMNS)
    np.testing.assert_allclose(matrix.sum(axis=1), pipe.decision_function(rows), rtol=0, atol=1e-9)
    # The compiler's own answer in this process (the float64 reference interpreter).
    options = compiler.CompileOptions(explain=True, backend="interpreter")
    local = compiler.compile(pipe, options=options).contributions(rows)
    np.testing.assert_allclose(matrix, local, rtol=0, atol=1e-9)


def test_contributions_alone_by_query_on_every_scoring_route(server: LiveServer, churn) -> None:
    pipe, frame = churn
    rows = frame.iloc[20:23]
    expected = pipe.decision_function(rows)
    c = server.client
    for path, params in [
        ("/models/churn/predict", {}),
        ("/models/churn/versions/1/predict", {}),
        ("/predict", {"model": "churn"}),
    ]:
        r = c.post(path, params={**params, "outputs": "contributions"}, json=rows_of(rows))
        assert r.status_code == 200, (path, r.text)
        outputs = r.json()["outputs"]
        assert list(outputs) == ["contributions"]
        sums = as_matrix(outputs["contributions"], COLUMNS).sum(axis=1)
        np.testing.assert_allclose(sums, expected, rtol=0, atol=1e-9)
    # Outputs not asked for contributions by default.
    assert list(c.post("/models/churn/predict", json=rows_of(rows)).json()["outputs"]) == [
        "predict",
        "predict_proba",
        "decision_function",
    ]


def test_top_k_keeps_the_largest_columns_and_the_sum_of_the_others(
    server: LiveServer, churn
) -> None:
    pipe, frame = churn
    rows = frame.iloc[30:40]
    c = server.client
    full = c.post("/models/churn/predict?outputs=contributions", json=rows_of(rows)).json()
    r = c.post("/models/churn/predict?outputs=contributions&top_k=2", json=rows_of(rows))
    assert r.status_code == 200, r.text
    for short, whole, raw in zip(
        r.json()["outputs"]["contributions"],
        full["outputs"]["contributions"],
        pipe.decision_function(rows),
        strict=True,
    ):
        kept = list(short)[:2]
        assert list(short)[2:] == ["others", "bias"]
        largest = sorted([*NUMERIC, "plan"], key=lambda col: -abs(whole[col]))[:2]
        assert {abs(short[col]) for col in kept} == {abs(whole[col]) for col in largest}
        assert math.isclose(sum(short.values()), raw, abs_tol=1e-9)
    for bad in ("0", "two"):
        r = c.post(f"/models/churn/predict?outputs=contributions&top_k={bad}", json=rows_of(rows))
        assert r.status_code == 400 and "top_k" in r.json()["error"]["message"]
    r = c.post("/models/churn/predict?top_k=2", json=rows_of(rows))
    assert r.status_code == 400 and "contributions" in r.json()["error"]["message"]


def test_concurrent_requests_batch_and_each_gets_its_own_rows(server: LiveServer, churn) -> None:
    pipe, frame = churn
    expected = pipe.decision_function(frame)
    before = server.metric("kestrel_compiles_total", cause="on_demand")
    batches_before = server.metric("kestrel_explain_batch_rows_count", model="churn")

    def ask(start: int) -> tuple[int, int, dict[str, Any]]:
        size = 1 + start % 23  # 1..23 rows: every explanation bucket, and past the top one
        body = {"rows": rows_of(frame.iloc[start : start + size]), "outputs": ["contributions"]}
        r = server.client.post("/models/churn/predict", json=body)
        assert r.status_code == 200, r.text
        return start, size, r.json()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(0, 240, 10)))
    for start, size, doc in answers:
        sums = as_matrix(doc["outputs"]["contributions"], COLUMNS).sum(axis=1)
        np.testing.assert_allclose(sums, expected[start : start + size], rtol=0, atol=1e-9)
    # Warmed at load: no bucket of the explanation compiles for a request.
    assert server.metric("kestrel_compiles_total", cause="on_demand") == before
    assert server.metric("kestrel_compiles_total", cause="after_ready") == 0
    assert server.metric("kestrel_explain_batch_rows_count", model="churn") > batches_before


def test_several_raw_outputs_map_each_column_to_one_value_per_class(
    server: LiveServer, iris
) -> None:
    forest, frame = iris
    rows = frame.iloc[::15]
    body = {"rows": rows_of(rows), "outputs": ["predict_proba", "contributions"]}
    r = server.client.post("/models/iris/predict", json=body)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["contribution_outputs"] == [0, 1, 2]
    columns = [*frame.columns, "bias"]
    contributions = doc["outputs"]["contributions"]
    assert all(list(row) == columns for row in contributions)
    assert all(len(values) == 3 for row in contributions for values in row.values())
    cube = np.array([[row[c] for c in columns] for row in contributions])  # rows, columns, classes
    np.testing.assert_allclose(cube.sum(axis=1), forest.predict_proba(rows), rtol=0, atol=1e-9)


# -- refusals -----------------------------------------------------------------------------------
def test_a_model_that_cannot_explain_is_refused_at_registration(server: LiveServer, iris) -> None:
    _, frame = iris
    bayes = sio.dumps(GaussianNB().fit(frame, np.arange(len(frame)) % 3))
    r = server.register("plain", bayes, options='{"explain": true}')
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert "GaussianNB" in message and "contributions are not supported" in message
    # A linear model explains against background rows: without a sample it has none.
    r = server.register("plain", sio.dumps(linear(frame)), options='{"explain": true}')
    assert r.status_code == 422, r.text
    assert "background rows" in r.json()["error"]["message"]
    assert "sample" in r.json()["error"]["message"]
    # Refused before a version number was reserved: the next registration is version 2.
    r = server.register("plain", bayes, options='{"max_batch": 4}', promote=False)
    assert r.status_code == 201, r.text
    assert r.json()["version"] == "2"


def test_a_linear_model_is_explained_against_its_registration_sample(
    server: LiveServer, churn
) -> None:
    """Each column's part minus its mean over the sample's rows, as shap.LinearExplainer gives
    it with that background; summed by the column the client sent."""
    _, frame = churn
    model = churn_linear(churn)
    rows = probe_rows(frame)
    r = server.client.post("/models/churn_linear/predict?outputs=contributions", json=rows_of(rows))
    assert r.status_code == 200, r.text
    matrix = as_matrix(r.json()["outputs"]["contributions"], COLUMNS)
    np.testing.assert_allclose(matrix.sum(axis=1), model.decision_function(rows), atol=1e-12)
    options = compiler.CompileOptions(explain=True, backend="interpreter")
    background = frame.head(BACKGROUND_ROWS)
    local = compiler.compile(model, sample=background, options=options).contributions(rows)
    np.testing.assert_allclose(matrix, local, rtol=0, atol=1e-12)
    # The bias is the mean raw output over the background rows.
    np.testing.assert_allclose(
        matrix[:, -1], model.decision_function(background).mean(), rtol=0, atol=1e-12
    )


def test_contributions_of_a_version_without_explain_are_a_400(server: LiveServer, iris) -> None:
    _, frame = iris
    body = {"rows": rows_of(frame.iloc[:2]), "outputs": ["predict", "contributions"]}
    r = server.client.post("/models/plain/predict", json=body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message == (
        'this version has no contributions; register it with options {"explain": true}'
    )
    r = server.client.post("/models/plain/predict?outputs=contributions", json=body["rows"])
    assert r.status_code == 400 and "explain" in r.text
    # An unknown output keeps its message; on a version that explains it lists contributions.
    r = server.client.post("/models/churn/predict?outputs=nope", json=body["rows"])
    assert r.status_code == 400
    assert "unknown outputs ['nope']" in r.text and "contributions" in r.text


# -- Open Inference Protocol v2 ------------------------------------------------------------------
def test_v2_metadata_lists_contributions(server: LiveServer) -> None:
    outputs = server.client.get("/v2/models/churn").json()["outputs"]
    assert {"name": "contributions", "datatype": "FP64", "shape": [-1, 6]} in outputs
    outputs = server.client.get("/v2/models/iris").json()["outputs"]
    assert {"name": "contributions", "datatype": "FP64", "shape": [-1, 5, 3]} in outputs
    outputs = server.client.get("/v2/models/plain").json()["outputs"]
    assert "contributions" not in [o["name"] for o in outputs]


def _v2_inputs(rows: pd.DataFrame) -> list[dict[str, Any]]:
    inputs = []
    for name in rows.columns:
        values = rows[name].tolist()
        if name == "plan":
            inputs.append({"name": name, "datatype": "BYTES", "shape": [len(rows)], "data": values})
        else:
            inputs.append({"name": name, "datatype": "FP64", "shape": [len(rows)], "data": values})
    return inputs


def test_v2_contributions_tensor(server: LiveServer, churn, iris) -> None:
    pipe, frame = churn
    rows = probe_rows(frame).iloc[:5]
    request = {
        "inputs": _v2_inputs(rows),
        "outputs": [{"name": "predict"}, {"name": "contributions"}],
    }
    # NaN as the bare token, as tritonclient writes it.
    body = json.dumps(request, allow_nan=True)
    r = server.client.post(
        "/v2/models/churn/infer", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text
    tensors = {t["name"]: t for t in r.json()["outputs"]}
    tensor = tensors["contributions"]
    assert tensor["datatype"] == "FP64" and tensor["shape"] == [5, 6]
    assert tensor["parameters"] == {"columns": COLUMNS}
    values = np.array(tensor["data"], dtype=np.float64).reshape(5, 6)
    assert not any(math.isnan(v) for v in tensor["data"])
    np.testing.assert_allclose(values.sum(axis=1), pipe.decision_function(rows), atol=1e-9)
    native = server.client.post(
        "/models/churn/predict?outputs=contributions", json=rows_of(rows)
    ).json()["outputs"]["contributions"]
    np.testing.assert_array_equal(values, as_matrix(native, COLUMNS))

    forest, flowers = iris
    few = flowers.iloc[:3]
    request = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP64",
                "shape": [3, 4],
                "data": few.to_numpy().ravel().tolist(),
            }
        ],
        "outputs": [{"name": "contributions", "parameters": {"binary_data": False}}],
    }
    r = server.client.post("/v2/models/iris/infer", json=request)
    assert r.status_code == 200, r.text
    (tensor,) = r.json()["outputs"]
    assert tensor["shape"] == [3, 5, 3]
    assert tensor["parameters"] == {"columns": [*flowers.columns, "bias"], "outputs": [0, 1, 2]}
    cube = np.array(tensor["data"]).reshape(3, 5, 3)
    np.testing.assert_allclose(cube.sum(axis=1), forest.predict_proba(few), atol=1e-9)

    r = server.client.post(
        "/v2/models/plain/infer",
        json={
            "inputs": request["inputs"],
            "outputs": [{"name": "contributions"}],
        },
    )
    assert r.status_code == 400 and "explain" in r.json()["error"]


def test_grpc_contributions_tensor_names_its_axes(server: LiveServer, iris) -> None:
    forest, flowers = iris
    few = flowers.iloc[:4].to_numpy()
    tensor = tgrpc.InferInput("x", list(few.shape), "FP64")
    tensor.set_data_from_numpy(few)
    assert server.grpc_address is not None
    with tgrpc.InferenceServerClient(server.grpc_address) as client:
        result = client.infer(
            "iris", [tensor], outputs=[tgrpc.InferRequestedOutput("contributions")]
        )
    cube = result.as_numpy("contributions")
    assert cube.dtype == np.float64 and cube.shape == (4, 5, 3)
    want = forest.predict_proba(flowers.iloc[:4])
    np.testing.assert_allclose(cube.sum(axis=1), want, atol=1e-9)
    (output,) = result.get_response().outputs
    params = {k: json.loads(p.string_param) for k, p in output.parameters.items()}
    assert params == {"columns": [*flowers.columns, "bias"], "outputs": [0, 1, 2]}
