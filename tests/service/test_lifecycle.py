"""Restart recovery (kill -9, on a real S3 protocol) and hot swap under load."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import skops.io as sio
from sklearn.ensemble import HistGradientBoostingRegressor, RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from tests.service.conftest import S3_KEY, S3_REGION, S3_SECRET
from tests.service.live import LiveServer

OPTIONS = '{"max_batch": 8}'


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 4)).astype(np.float32)
    return x, (x[:, 0] - x[:, 2] > 0).astype(int)


@pytest.mark.slow  # three models on S3, killed and restarted: make test-slow (CI)
def test_kill_9_then_restart_recovers_every_model_without_compiling(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, data
) -> None:
    x, y = data
    models = {
        "lr": make_pipeline(StandardScaler(), LogisticRegression()).fit(x, y),
        "rf": RandomForestClassifier(n_estimators=4, max_depth=3, random_state=0).fit(x, y),
        "hgb": HistGradientBoostingRegressor(max_iter=5, random_state=0).fit(x, x[:, 1]),
    }
    options = {
        "key": S3_KEY,
        "secret": S3_SECRET,
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": S3_REGION},
    }
    env = {
        "KESTREL_STORE_URL": f"s3://{s3_bucket}/kestrel",
        "KESTREL_STORE_OPTIONS": json.dumps(options),
    }
    live = LiveServer(tmp_path, **env).start()
    before = {}
    try:
        for name, model in models.items():
            r = live.register(name, sio.dumps(model), options=OPTIONS)
            assert r.status_code == 201, r.text
            before[name] = live.client.post(f"/models/{name}/predict", json=x[:20].tolist()).json()
    finally:
        live.kill()

    again = LiveServer(tmp_path, port=live.port, **env).start()  # same address, fresh process
    try:
        listing = again.client.get("/models", headers=again.admin).json()["models"]
        assert {(m["name"], m["current"]) for m in listing} == {(n, "1") for n in models}
        executables = 0
        for name in models:
            (version,) = again.client.get(f"/models/{name}", headers=again.admin).json()["versions"]
            assert version["state"] == "READY"
            # The stored plan places each bucket: those on the device need an executable, and
            # the parity gate checks the device lowering in the largest bucket as well.
            for graph in version["plan"]:
                device = [p["runs_on"] == "device" for p in graph]
                largest = max(range(len(graph)), key=lambda i: graph[i]["bucket"])
                executables += sum(device) + (not device[largest])
            after = again.client.post(f"/models/{name}/predict", json=x[:20].tolist()).json()
            assert after == before[name]
        assert again.metric("kestrel_compiles_total") == 0  # nothing compiled: all from disk
        disk_hits = again.metric("kestrel_executable_cache_lookups_total", result="disk_hits")
        assert disk_hits == executables
    finally:
        again.stop()


def test_hot_swap_under_load_loses_no_request(tmp_path: Path, data) -> None:
    x, y = data
    first = LogisticRegression().fit(x, y)
    second = RandomForestClassifier(n_estimators=3, max_depth=3, random_state=0).fit(x, y)
    live = LiveServer(tmp_path).start()
    try:
        assert live.register("m", sio.dumps(first), options=OPTIONS).status_code == 201
        stop = threading.Event()
        statuses: list[int] = []
        versions: set[str] = set()

        def load() -> None:
            import httpx

            with httpx.Client(base_url=live.url, timeout=60) as c:
                while not stop.is_set():
                    r = c.post("/models/m/predict", json=x[:3].tolist())
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        versions.add(r.json()["version"])

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            r = live.register("m", sio.dumps(second), options=OPTIONS)
            assert r.status_code == 201, r.text
            r = live.register("m", sio.dumps(first), options=OPTIONS)
            assert r.status_code == 201, r.text
            # Keep the load on until version 3 has answered: READY means it serves from now on.
            deadline = time.monotonic() + 60
            while "3" not in versions and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert statuses and set(statuses) == {200}, sorted(set(statuses))
        assert versions == {"1", "2", "3"}
    finally:
        live.stop()
