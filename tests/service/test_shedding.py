"""Load shedding: over ``KESTREL_MAX_IN_FLIGHT`` scoring requests in progress, a new one is
answered 429 at once (before its body is read), on a connection that stays open."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import skops.io as sio
from sklearn.linear_model import LogisticRegression

from tests.service.live import LiveServer

X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
V2_BODY = {
    "inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": X[0].tolist()}]
}


def test_scoring_over_the_in_flight_limit_is_shed_at_once_and_management_is_not(
    tmp_path: Path,
) -> None:
    # One request may be in progress; a partial batch waits 3 s for company, so the first
    # request holds the only slot while the others arrive.
    live = LiveServer(tmp_path, KESTREL_MAX_IN_FLIGHT="1", KESTREL_BATCH_WAIT_MS="3000").start()
    try:
        model = LogisticRegression().fit(X, X[:, 0] > 0)
        assert live.register("m", sio.dumps(model), options='{"max_batch": 8}').status_code == 201
        held: list[httpx.Response] = []
        holder = threading.Thread(
            target=lambda: held.append(live.client.post("/models/m/predict", json=X[:1].tolist()))
        )
        holder.start()
        deadline = time.monotonic() + 2.5
        while live.metric("kestrel_queue_rows", model="m") < 1:  # the slot is taken
            assert time.monotonic() < deadline, "the first request never reached the batcher"
            time.sleep(0.02)

        with httpx.Client(base_url=live.url, timeout=10) as client:
            t0 = time.perf_counter()
            shed = [client.post(path, json=X[:1].tolist()) for path in _scoring_paths()]
            v2 = client.post("/v2/models/m/infer", json=V2_BODY)
            elapsed = time.perf_counter() - t0
            for r in shed:
                assert r.status_code == 429, r.text
                assert r.headers["retry-after"] == "1"
                error = r.json()["error"]
                assert error["code"] == "overloaded" and "limit of 1" in error["message"]
                assert error["request_id"] == r.headers["x-request-id"]
            # The v2 protocol's own error shape, as its clients (tritonclient) parse it.
            assert v2.status_code == 429 and v2.headers["retry-after"] == "1"
            assert v2.json() == {"error": shed[0].json()["error"]["message"]}
            assert elapsed < 2.0, f"shedding waited for the batch: {elapsed:.2f} s"
            # Keep-alive: every answer above came over the one connection, and so does this.
            assert client.get("/models", headers=live.admin).status_code == 200
        holder.join(30)
        assert [r.status_code for r in held] == [200]
        assert live.metric("kestrel_rejections_total", model="m", reason="overloaded") == 3
        assert live.metric("kestrel_rejections_total", model="_none", reason="overloaded") == 1
        assert live.metric("kestrel_requests_total", route="_refused", status="429") == 4
        # The slot is free again: the next request is admitted.
        assert live.client.post("/models/m/predict", json=X[:1].tolist()).status_code == 200
    finally:
        live.stop()


def _scoring_paths() -> list[str]:
    """The same model through two scoring routes, and an unknown model (a bounded label)."""
    return ["/models/m/predict", "/predict?model=m", "/models/nope/predict"]
