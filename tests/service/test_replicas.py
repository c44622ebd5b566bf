"""Real ``kestrel serve`` processes: replicas sharing one S3 store (moto), graceful drain on
SIGTERM, and registering, deleting and predicting one model at once."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import skops.io as sio
from sklearn.linear_model import LinearRegression

from tests.service.conftest import S3_KEY, S3_REGION, S3_SECRET
from tests.service.live import LiveServer

OPTIONS = '{"max_batch": 8}'
X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)


def _linear(coef: list[float], intercept: float) -> LinearRegression:
    return LinearRegression().fit(X, X @ np.asarray(coef, np.float32) + intercept)


# Two models whose answers can not be mistaken for each other.
MODELS = {"a": _linear([1, 2, 3], 0.0), "b": _linear([-3, 0.5, 1], 10.0)}
BLOBS = {kind: sio.dumps(model) for kind, model in MODELS.items()}


def expected(kind: str, rows: np.ndarray) -> np.ndarray:
    return MODELS[kind].predict(rows)


def answer(doc: dict[str, Any]) -> np.ndarray:
    (out,) = doc["outputs"].values()
    return np.ravel(np.asarray(out, dtype=np.float64))


def eventually(check: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """Retry ``check`` until it neither raises an AssertionError nor returns False."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result is not False:
                return result
            problem: object = f"returned {result!r}"
        except (AssertionError, httpx.TransportError) as exc:
            problem = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}: {problem}")
        time.sleep(0.2)


def started(servers: list[LiveServer]) -> list[LiveServer]:
    """Start the processes side by side (each start waits for /readyz)."""
    with ThreadPoolExecutor(len(servers)) as pool:
        return list(pool.map(lambda s: s.start(), servers))


@pytest.fixture
def s3_env(s3_endpoint: str, s3_bucket: str) -> dict[str, str]:
    options = {
        "key": S3_KEY,
        "secret": S3_SECRET,
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": S3_REGION},
    }
    return {
        "KESTREL_STORE_URL": f"s3://{s3_bucket}/kestrel",
        "KESTREL_STORE_OPTIONS": json.dumps(options),
    }


@pytest.fixture
def replicas(tmp_path: Path, s3_env: dict[str, str]) -> Iterator[list[LiveServer]]:
    """Three replicas on one S3 store, each with its own compile cache, polling every 0.5 s."""
    servers = [
        LiveServer(tmp_path / name, KESTREL_POLL_INTERVAL_S="0.5", **s3_env) for name in "abc"
    ]
    for server in servers:
        server.workdir.mkdir()
    try:
        yield started(servers)
    finally:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.stop(), servers))


def serving(server: LiveServer, version: str, kind: str) -> None:
    """``server`` serves model "m" at ``version`` (READY, current) with model ``kind``."""
    doc = server.client.get("/models/m", headers=server.admin).json()
    assert doc.get("current") == version, (server.url, doc)
    states = {v["version"]: v["state"] for v in doc["versions"]}
    assert states[version] == "READY", (server.url, states)
    r = server.client.post("/models/m/predict", json=X[:6].tolist())
    assert r.status_code == 200, r.text
    assert r.json()["version"] == version
    np.testing.assert_allclose(answer(r.json()), expected(kind, X[:6]), rtol=1e-4, atol=1e-4)


def test_replicas_on_one_s3_store_follow_registrations_and_deletions(
    replicas: list[LiveServer],
) -> None:
    a, b, c = replicas
    assert a.register("m", BLOBS["a"], options=OPTIONS).status_code == 201
    for server in replicas:
        eventually(lambda s=server: serving(s, "1", "a"), what=f"{server.url} serves 1")
    answers = {
        s.url: s.client.post("/models/m/predict", json=X.tolist()).json()["outputs"]
        for s in replicas
    }
    assert len({json.dumps(v, sort_keys=True) for v in answers.values()}) == 1, answers

    r = b.register("m", BLOBS["b"], options=OPTIONS)  # a new version through another replica
    assert r.status_code == 201 and r.json()["version"] == "2", r.text
    for server in replicas:
        eventually(lambda s=server: serving(s, "2", "b"), what=f"{server.url} swaps to 2")
    for server in replicas:  # the old one is stored but no longer loaded anywhere
        eventually(lambda s=server: _state(s, "1") == "RETIRED", what="version 1 retired")

    assert c.client.delete("/models/m/versions/2", headers=c.admin).status_code == 204
    for server in replicas:
        eventually(lambda s=server: serving(s, "1", "a"), what=f"{server.url} falls back to 1")
        eventually(lambda s=server: _status(s, "/models/m/versions/2") == 404, what="2 gone")

    assert c.client.delete("/models/m", headers=c.admin).status_code == 204
    for server in replicas:
        eventually(lambda s=server: _status(s, "/models/m") == 404, what=f"{server.url} drops m")
        r = server.client.post("/models/m/predict", json=X[:2].tolist())
        assert r.status_code == 404, r.text
    for server in replicas:
        assert server.alive()
        assert "Traceback" not in server.logs(), server.logs()


def _state(server: LiveServer, version: str) -> str:
    doc = server.client.get(f"/models/m/versions/{version}", headers=server.admin).json()
    return doc["state"]


def _status(server: LiveServer, path: str) -> int:
    return server.client.get(path, headers=server.admin).status_code


def test_sigterm_drains_every_accepted_request_and_exits_0(tmp_path: Path) -> None:
    # A partial batch waits up to 3 s for more rows: every request below is accepted and queued
    # in the batcher (not yet computed) when SIGTERM arrives.
    live = LiveServer(tmp_path, KESTREL_BATCH_WAIT_MS="3000").start()
    n = 16
    try:
        r = live.register("m", BLOBS["a"], options='{"max_batch": 64}')
        assert r.status_code == 201, r.text
        results: list[tuple[int, int, Any]] = []

        def one(i: int) -> None:
            with httpx.Client(base_url=live.url, timeout=60) as client:  # its own connection
                r = client.post("/models/m/predict", json=X[i : i + 1].tolist())
                results.append((i, r.status_code, r.json() if r.status_code == 200 else r.text))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        eventually(
            lambda: live.metric("kestrel_queue_rows", model="m") == n,
            timeout=2.5,
            what=f"{n} requests queued",
        )
        assert live.proc is not None
        t0 = time.monotonic()
        live.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        code = live.proc.wait(30)
        elapsed = time.monotonic() - t0
    finally:
        live.stop()
    assert sorted(status for _, status, _ in results) == [200] * n, results
    for i, _, doc in results:
        np.testing.assert_allclose(answer(doc), expected("a", X[i : i + 1]), rtol=1e-4, atol=1e-4)
    assert code == 0, live.logs()
    assert elapsed < 30, elapsed  # uvicorn's grace period
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{live.url}/healthz", timeout=2)


def test_register_delete_and_predict_at_once_never_500_nor_mix_versions(tmp_path: Path) -> None:
    # Polling on too: replica syncs run between the registrations and deletions below.
    live = LiveServer(tmp_path, KESTREL_POLL_INTERVAL_S="0.2").start()
    stop = threading.Event()
    statuses: dict[str, list[int]] = {"register": [], "delete": [], "predict": [], "read": []}
    wrong: list[str] = []
    refusals: list[str] = []
    served: set[str] = set()

    def registrar() -> None:
        with httpx.Client(base_url=live.url, timeout=120, headers=live.admin) as client:
            for i in range(8):
                kind = "ab"[i % 2]
                r = client.post(
                    "/models",
                    params={"wait": "true"},
                    data={"name": "m", "version": f"{kind}{i}", "options": OPTIONS},
                    files={"file": ("m.skops", BLOBS[kind])},
                )
                statuses["register"].append(r.status_code)
                if r.status_code in (409, 422):
                    refusals.append(r.json()["error"]["message"])

    def deleter() -> None:
        with httpx.Client(base_url=live.url, timeout=120, headers=live.admin) as client:
            i = 0
            while not stop.is_set():
                time.sleep(0.7)
                i += 1
                doc = client.get("/models/m").json()
                versions = [v["version"] for v in doc.get("versions", [])]
                if i % 3 == 0 or not versions:
                    r = client.delete("/models/m")
                else:
                    r = client.delete(f"/models/m/versions/{versions[-1]}")
                statuses["delete"].append(r.status_code)

    def predictor(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with httpx.Client(base_url=live.url, timeout=60, headers=live.admin) as client:
            while not stop.is_set():
                rows = X[rng.integers(0, len(X), 4)]
                r = client.post("/models/m/predict", json=rows.tolist())
                statuses["predict"].append(r.status_code)
                if r.status_code == 200:
                    version = r.json()["version"]
                    served.add(version)
                    kind = version[0]
                    got, want = answer(r.json()), expected(kind, rows)
                    if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                        wrong.append(f"version {version} answered {got}, model {kind}: {want}")
                for path in ("/models", "/metrics", "/models/m"):
                    statuses["read"].append(client.get(path).status_code)

    workers = [threading.Thread(target=predictor, args=(s,)) for s in range(3)]
    workers.append(threading.Thread(target=deleter))
    register_thread = threading.Thread(target=registrar)
    try:
        for t in [*workers, register_thread]:
            t.start()
        register_thread.join(300)
    finally:
        stop.set()
        for t in workers:
            t.join(60)
        live.stop()
    assert not wrong, wrong
    seen = {k: sorted(set(v)) for k, v in statuses.items()}
    # 404: the model or version is gone; 409/422: a registration lost to a delete or a version
    # conflict; 503: the version is not READY (yet, or any more). Never 500.
    assert set(statuses["register"]) <= {201, 202, 409, 422}, seen
    assert set(statuses["delete"]) <= {204, 404}, seen
    assert set(statuses["predict"]) <= {200, 404, 503}, seen
    assert set(statuses["read"]) <= {200, 404}, seen
    assert 201 in statuses["register"] and 204 in statuses["delete"], seen
    assert all("deleted while loading" in m or "already has" in m for m in refusals), refusals
    assert served, "no prediction succeeded: the test exercised nothing"
    assert "Traceback" not in live.logs(), live.logs()
