"""Admission on default settings: concurrent clients the server can serve by batching are all
served; a queue that stands above the delay target sheds (service/queue_delay.py).

Each load runs in its own process (tests/service/loadgen.py: raw keep-alive sockets). Closed
loop: every connection sends its next request as soon as the previous one is answered, so all
of them start at once (a burst) and stay in flight together. Latency percentiles are printed
(docs/reliability.md), not asserted: they are speed figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import skops.io as sio
from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from tests.service.live import LiveServer
from tests.service.loadgen import run_process

ROW = json.dumps([[5.1, 3.5, 1.4, 0.2]])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    server = LiveServer(tmp_path_factory.mktemp("bursts"), KESTREL_LOG_LEVEL="warning").start()
    x, y = load_iris(return_X_y=True)
    small = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    assert server.register("iris", sio.dumps(small)).status_code == 201
    yield server
    server.stop()


@pytest.mark.parametrize("clients", [200, 1000])
def test_concurrent_single_row_clients_are_all_served(live: LiveServer, clients: int) -> None:
    before = live.metric("kestrel_rejections_total", reason="overloaded")
    summary = run_process(
        live.url, "/models/iris/predict", ROW, "--closed", "--connections", str(clients),
        "--duration", "3",
    )  # fmt: skip
    ok = summary["by_status"].get("200", {})
    print(f"\n{clients} closed-loop clients, default settings: {json.dumps(summary)}")
    assert summary["errors"] == 0, summary["error_examples"]
    assert set(summary["by_status"]) == {"200"}, summary["by_status"]
    assert ok["count"] >= clients  # every client was answered at least once
    assert live.metric("kestrel_rejections_total", reason="overloaded") == before
    assert live.alive()
    assert "Unable to initialize backend" not in live.logs()  # JAX's platform probing is quiet


def test_a_standing_queue_is_shed_and_what_is_admitted_is_answered(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 16)).astype(np.float32)
    forest = RandomForestClassifier(n_estimators=100, max_depth=8, random_state=0)
    forest.fit(x, x[:, 0] + x[:, 1] * x[:, 2] > 0)
    body = json.dumps(rng.normal(size=(128, 16)).round(3).tolist())
    live = LiveServer(tmp_path, KESTREL_LOG_LEVEL="warning").start()
    try:
        r = live.register("forest", sio.dumps(forest), options='{"max_batch": 256}')
        assert r.status_code == 201, r.text
        # 64 clients keep 32 batches of work queued: the queue stands far above the target.
        summary = run_process(
            live.url, "/models/forest/predict", body, "--closed", "--connections", "64",
            "--duration", "3",
        )  # fmt: skip
        print(f"\nstanding queue, default settings: {json.dumps(summary)}")
        assert summary["errors"] == 0, summary["error_examples"]
        assert set(summary["by_status"]) == {"200", "429"}, summary["by_status"]
        assert summary["by_status"]["200"]["count"] > 64
        shed = live.metric("kestrel_rejections_total", model="forest", reason="overloaded")
        assert shed == summary["by_status"]["429"]["count"]
        # Once the load is gone the model admits again at once.
        assert live.client.post("/models/forest/predict", content=body).status_code == 200
        assert live.alive() and "Traceback" not in live.logs()
    finally:
        live.stop()
