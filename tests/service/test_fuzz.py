"""Schemathesis against a real server, driven by the server's own ``/openapi.json``.

Every operation of the document gets generated requests, conforming to it (positive) and
violating it (negative), sent over HTTP with the admin token so management routes are exercised
past auth. Each response must be below 500 and honour the document: a documented status code,
the documented content type, headers and body schema; and a request that violates the document
must be refused. Operations on a random name mostly stop at "no such model", so part of the
cases are pinned to the demo model (``iris``), some with valid-shaped rows of fuzzed values, to
reach the batcher and the output encoders too.

The server is dedicated to this module: destructive operations (deletes, unload) run last, after
everything that needs the demo model.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.demo_model import COLUMNS, DEMO_NAME
from service.v2 import HEADER_LENGTH
from tests.service.live import LiveServer

# A thousand requests over every operation, a live server per run: make test-slow (CI).
pytestmark = pytest.mark.slow

# 24 operations: parameterless ones are exhausted after one example, the 16 others reach this.
MAX_EXAMPLES = 70
MIN_REQUESTS = 1000
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# 503 (model not ready) and 504 (the client's own deadline passed) are outcomes the document
# promises, not server faults; any other 5xx is.
CONFIG = schemathesis.Config.from_dict(
    {"checks": {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "503", "504"]}}}
)

# Row values: finite float32 (extremes included) in "clean" bodies; any JSON scalar in the rest.
FLOAT32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
SCALARS = st.one_of(FLOAT32, st.integers(), st.booleans(), st.none(), st.text(max_size=6))
# Any JSON value: what a hostile client puts where an object, a list or a number belongs.
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
OUTPUT_NAMES = st.sampled_from(["predict", "predict_proba", "decision_function", "nope"])
V2_DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


@dataclass(frozen=True)
class Body:
    """A request body aimed at the demo model, as schemathesis' ``as_strategy`` takes it."""

    content: Any
    media_type: str = "application/json"
    headers: dict[str, str] | None = None


@st.composite
def native_bodies(draw: st.DrawFn) -> Body:
    """Rows for the demo model as objects, arrays or columns; values and ``outputs`` fuzzed."""
    cells = FLOAT32 if draw(st.booleans()) else SCALARS
    rows = [{c: draw(cells) for c in COLUMNS} for _ in range(draw(st.integers(1, 40)))]
    layout = draw(st.sampled_from(["objects", "arrays", "columns"]))
    if layout == "objects":
        data: Any = rows
    elif layout == "arrays":
        data = [[row[c] for c in COLUMNS] for row in rows]
    else:
        data = {c: [row[c] for row in rows] for c in COLUMNS}
    if layout != "columns" and draw(st.booleans()):
        return Body(data)
    doc = {"columns" if layout == "columns" else "rows": data}
    if draw(st.booleans()):
        doc["outputs"] = draw(st.lists(OUTPUT_NAMES, max_size=3) | JSON_VALUES)
    return Body(doc)


@st.composite
def v2_bodies(draw: st.DrawFn) -> Body:
    """v2 tensors for the demo model (one [rows, 4] or one per column), JSON or binary; values,
    datatypes, parameters, ``id`` and ``outputs`` fuzzed, empty batches included."""
    clean = draw(st.booleans())
    datatype = "FP32" if clean else draw(st.sampled_from([*V2_DTYPES, "BYTES"]))
    cells = FLOAT32 if clean else SCALARS
    n = draw(st.integers(1 if clean else 0, 40))
    if draw(st.booleans()):
        specs = [("input", [n, len(COLUMNS)], [draw(cells) for _ in range(n * len(COLUMNS))])]
    else:
        specs = [(c, [n], [draw(cells) for _ in range(n)]) for c in COLUMNS]
    doc: dict[str, Any] = {
        "inputs": [{"name": k, "datatype": datatype, "shape": s, "data": d} for k, s, d in specs]
    }
    optional = {
        "id": st.text(max_size=8) | JSON_VALUES,
        "parameters": st.fixed_dictionaries(
            {}, optional={"timeout": st.integers(1, 10**9), "binary_data_output": st.booleans()}
        )
        | JSON_VALUES,
        "outputs": st.lists(
            st.fixed_dictionaries(
                {"name": OUTPUT_NAMES}, optional={"parameters": st.just({"binary_data": True})}
            ),
            max_size=3,
        )
        | JSON_VALUES,
    }
    if not clean:
        doc.update(draw(st.fixed_dictionaries({}, optional=optional)))
    if datatype == "BYTES" or not draw(st.booleans()):
        return Body(doc)
    # The binary extension: tensor bytes after the JSON header, sizes in the header.
    dtype = V2_DTYPES[datatype]
    blobs = []
    for tensor in doc["inputs"]:
        data = tensor.pop("data")
        try:
            blob = np.asarray(data, dtype=dtype).tobytes()
        except (TypeError, ValueError, OverflowError):
            blob = draw(st.binary(max_size=64))
        tensor["parameters"] = {"binary_data_size": draw(st.sampled_from([len(blob), 3]))}
        blobs.append(blob)
    header = json.dumps(doc).encode()
    length = draw(st.sampled_from([str(len(header)), str(len(header) + 1), "x"]))
    return Body(header + b"".join(blobs), "application/octet-stream", {HEADER_LENGTH: length})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("fuzz"), KESTREL_DEMO_MODEL="true").start()
    try:
        _wait_for_demo(live)
        yield live
    finally:
        live.stop()


def _wait_for_demo(live: LiveServer, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = live.client.get(f"/models/{DEMO_NAME}", headers=live.admin)
        if r.status_code == 200 and r.json()["current"] is not None:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the demo model never became READY:\n{live.logs()}")


def _destructive(op: APIOperation) -> bool:
    return op.method.upper() == "DELETE" or op.path.endswith("/unload")


def cases_for(op: APIOperation) -> SearchStrategy[Case]:
    """Positive and negative cases, plus positive ones aimed at the demo model."""
    strategies = [
        op.as_strategy(generation_mode=GenerationMode.POSITIVE),
        op.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    ]
    path_names = {p.name for p in op.path_parameters}
    pinned = {k: v for k, v in (("name", DEMO_NAME), ("version", "1")) if k in path_names}
    query = {"model": DEMO_NAME} if op.path == "/predict" else None
    if not (pinned or query):
        return st.one_of(strategies)
    target: dict[str, Any] = {"path_parameters": pinned or None, "query": query}
    strategies.append(op.as_strategy(generation_mode=GenerationMode.POSITIVE, **target))
    if op.path.endswith(("/predict", "/infer")):
        bodies = v2_bodies() if op.path.endswith("/infer") else native_bodies()
        strategies.append(
            bodies.flatmap(
                lambda body: op.as_strategy(
                    generation_mode=GenerationMode.POSITIVE,
                    body=body.content,
                    media_type=body.media_type,
                    headers=body.headers,
                    **target,
                )
            )
        )
    return st.one_of(strategies)


def test_every_operation_honours_its_documented_responses(server: LiveServer) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", config=CONFIG)
    operations = sorted((r.ok() for r in schema.get_all_operations()), key=_destructive)
    assert len(operations) >= 20, [op.label for op in operations]
    session = requests.Session()
    statuses: collections.Counter[int] = collections.Counter()
    per_operation: dict[str, int] = {}
    failures: dict[str, str] = {}

    for op in operations:
        sent = 0

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,  # the same requests on every run: a failure is reproducible
            phases=[Phase.explicit, Phase.generate],  # no shrinking against a live server
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
        )
        @given(case=cases_for(op))
        def exercise(case: Case) -> None:
            nonlocal sent
            response = case.call(session=session, headers=server.admin, timeout=60)
            sent += 1
            statuses[response.status_code] += 1
            case.validate_response(response, checks=CHECKS, headers=server.admin)

        try:
            exercise()
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis raises failure groups
            failures[op.label] = str(exc)[:2000]
        per_operation[op.label] = sent

    total = sum(per_operation.values())
    print(f"\nschemathesis: {total} requests, statuses {dict(sorted(statuses.items()))}")
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert not [s for s in statuses if s >= 500 and s not in (503, 504)], statuses
    assert all(per_operation.values()), per_operation
    assert total >= MIN_REQUESTS, per_operation
    assert server.alive()
