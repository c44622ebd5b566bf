"""``kestrel serve --workers 2``: real worker processes behind one port, as one pod.

Which worker answers is learnt from ``/healthz`` (it names its pid in a pod) on the same
keep-alive connection as the request it follows: a connection stays with the worker that
accepted it, and a new connection may go to either.
"""

from __future__ import annotations

import contextlib
import os
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
from prometheus_client.parser import text_string_to_metric_families
from sklearn.linear_model import LinearRegression

from service.pod_metrics import PUBLISH_S
from service.versions import Phase
from tests.deploy.prometheus_server import PrometheusServer
from tests.service.live import LiveServer

# Two pods of two worker processes each: about two minutes, so make test-slow runs it.
pytestmark = pytest.mark.slow

X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
MODELS = {
    kind: LinearRegression().fit(X, X @ np.asarray(coef, np.float32) + bias)
    for kind, coef, bias in (("a", [1, 2, 3], 0.0), ("b", [-3, 0.5, 1], 10.0))
}
OPTIONS = '{"max_batch": 8}'
PREDICT_ROUTE = "/models/{name}/predict"


def start_pod(workdir: Path, *, grpc: bool = False, **env: str) -> LiveServer:
    """Two workers, both ready (LiveServer.start returns once one of them is)."""
    server = LiveServer(workdir, grpc=grpc, KESTREL_WORKERS="2", **env).start(timeout=180)
    deadline = time.monotonic() + 180
    while True:
        answered = on_new_connections(server, lambda c: c.get("/readyz").status_code, 16)
        if len({pid for status, pid in answered if status == 200}) == 2:
            return server
        assert time.monotonic() < deadline, server.logs()
        time.sleep(0.5)


def worker_of(client: httpx.Client) -> int:
    """The pid of the worker holding ``client``'s connection."""
    return int(client.get("/healthz").json()["worker"])


def score(client: httpx.Client, name: str, rows: np.ndarray) -> httpx.Response:
    return client.post(f"/models/{name}/predict", json={"rows": rows.tolist()})


def scores_as(kind: str, response: httpx.Response, rows: np.ndarray) -> None:
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"].values()
    np.testing.assert_allclose(np.ravel(out), MODELS[kind].predict(rows), rtol=1e-4, atol=1e-4)


def on_new_connections(server: LiveServer, call: Callable[[httpx.Client], Any], n: int) -> list:
    """``call`` on ``n`` new connections, 8 at a time (so both workers are busy accepting);
    each result with the pid of the worker that answered it."""

    def one(_: int) -> tuple[Any, int]:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            result = call(client)
            return result, worker_of(client)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


@contextlib.contextmanager
def each_worker(server: LiveServer, n: int = 1) -> Iterator[list[tuple[int, httpx.Client]]]:
    """``n`` open connections to each of the two workers, with the worker's pid (the kernel
    picks the worker of a new connection: new ones are opened until each has ``n``)."""
    by_worker: dict[int, list[httpx.Client]] = {}
    try:
        for _ in range(200):
            client = httpx.Client(base_url=server.url, timeout=120)
            mine = by_worker.setdefault(worker_of(client), [])
            (mine.append if len(mine) < n else lambda c: c.close())(client)
            if len(by_worker) == 2 and all(len(c) == n for c in by_worker.values()):
                break
        else:
            raise AssertionError(f"not {n} connections to each of 2 workers in 200: {by_worker}")
        yield [(pid, c) for pid, clients in by_worker.items() for c in clients]
    finally:
        for clients in by_worker.values():
            for c in clients:
                c.close()


def pod_metric(text: str, name: str, **labels: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # gRPC on: every worker binds its port too (a worker that cannot would stop the pod).
    server = start_pod(tmp_path_factory.mktemp("pod"), grpc=True)
    try:
        yield server
    finally:
        server.stop()


def test_both_workers_answer_on_one_port(pod: LiveServer) -> None:
    with each_worker(pod) as workers:
        assert [c.get("/readyz").status_code for _, c in workers] == [200, 200]
        assert pod.proc is not None and pod.proc.pid not in {pid for pid, _ in workers}


def test_a_registered_model_scores_through_every_worker(pod: LiveServer) -> None:
    rows = X[:5]
    with each_worker(pod) as workers:
        # wait=true: answered once every worker serves it, so the other one is not asked too soon.
        created = pod.register("m", sio.dumps(MODELS["a"]), options=OPTIONS)
        assert created.status_code == 201, created.text
        for _, client in workers:
            scores_as("a", score(client, "m", rows), rows)

    # Registered without waiting and followed on the upload's connection (as `kestrel register`
    # does): READY is reported once the other worker serves the new version too.
    with (
        each_worker(pod) as workers,
        httpx.Client(base_url=pod.url, timeout=60, headers=pod.admin) as client,
    ):
        accepted = client.post(
            "/models",
            params={"wait": "false"},
            data={"name": "m", "options": OPTIONS},
            files={"file": ("m.skops", sio.dumps(MODELS["b"]))},
        )
        assert accepted.status_code == 202, accepted.text
        location = accepted.headers["Location"]
        seen = []
        while (doc := client.get(location).json())["state"] == "LOADING":
            seen.append(doc["progress"]["phase"])
            time.sleep(0.02)
        assert doc["state"] == "READY", doc
        # "replicating" (this worker serves it, the other loads it) comes last, if caught.
        order = [p.value for p in Phase]
        assert [order.index(p) for p in seen] == sorted(order.index(p) for p in seen)
        for _, other in workers:
            scores_as("b", score(other, "m", rows), rows)


def test_grpc_scores_through_the_pod(pod: LiveServer) -> None:
    import tritonclient.grpc as tgrpc

    assert pod.register("g", sio.dumps(MODELS["a"]), options=OPTIONS).status_code == 201
    assert pod.grpc_address is not None
    for _ in range(8):  # new channels: the kernel spreads them over the workers' sockets
        with tgrpc.InferenceServerClient(pod.grpc_address) as client:
            rows = tgrpc.InferInput("input", list(X[:4].shape), "FP32")
            rows.set_data_from_numpy(X[:4])
            answer = client.infer("g", [rows]).as_numpy("predict")
            np.testing.assert_allclose(
                np.ravel(answer), MODELS["a"].predict(X[:4]), rtol=1e-4, atol=1e-4
            )


def test_registrations_through_both_workers_at_once_keep_every_version(pod: LiveServer) -> None:
    # Six uploads at once, three through each worker, each name through both: the workers
    # write the store under the pod's lock, so none loses another's version or manifest entry.
    def upload(job: tuple[httpx.Client, str]) -> int:
        client, name = job
        response = client.post(
            "/models",
            params={"wait": "true"},
            data={"name": name, "options": OPTIONS},
            files={"file": ("m.skops", sio.dumps(MODELS["a"]))},
            headers=pod.admin,
        )
        return response.status_code

    with each_worker(pod, 3) as workers, ThreadPoolExecutor(6) as pool:
        uploads = zip([client for _, client in workers], "cdcdcd", strict=True)
        assert list(pool.map(upload, uploads)) == [201] * 6
    for name in ("c", "d"):
        described = pod.client.get(f"/models/{name}", headers=pod.admin).json()
        assert {v["version"] for v in described["versions"]} == {"1", "2", "3"}, described
    for response, _ in on_new_connections(pod, lambda c: score(c, "d", X[:2]), 8):
        scores_as("a", response, X[:2])


def test_a_scrape_reports_the_pod_totals(pod: LiveServer, tmp_path: Path) -> None:
    if not pod.client.get("/models/m", headers=pod.admin).is_success:
        assert pod.register("m", sio.dumps(MODELS["a"]), options=OPTIONS).status_code == 201
    labels = {"model": "m", "route": PREDICT_ROUTE, "status": "200"}
    # Earlier tests' requests reach a scrape once their worker has published its snapshot.
    time.sleep(2 * PUBLISH_S)
    before = pod_metric(pod.client.get("/metrics").text, "kestrel_requests_total", **labels)
    sent = 40
    with each_worker(pod, 2) as workers:  # 10 requests on each of 4 connections, 2 per worker
        for _, client in workers:
            assert [score(client, "m", X[:2]).status_code for _ in range(10)] == [200] * 10

    prometheus = PrometheusServer(
        tmp_path,
        {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {"job_name": "kestrel", "static_configs": [{"targets": [f"127.0.0.1:{pod.port}"]}]}
            ],
        },
    ).start()
    try:
        query = "sum(kestrel_requests_total{{{}}})".format(
            ",".join(f'{k}="{v}"' for k, v in labels.items())
        )

        def counted() -> bool:
            result = prometheus.query(query)
            return bool(result) and float(result[0]["value"][1]) == before + sent

        prometheus.wait(counted, 30, f"{query} == {before + sent}")
        # Series that count the pod once, not once per worker.
        assert float(prometheus.query("kestrel_workers")[0]["value"][1]) == 2
        models = pod.client.get("/models", headers=pod.admin).json()["models"]
        ready = prometheus.query('kestrel_models{state="READY"}')
        assert float(ready[0]["value"][1]) == len(models)  # each model's current version
        limit = prometheus.query("kestrel_scoring_in_flight_limit")
        assert float(limit[0]["value"][1]) == 2048
    finally:
        prometheus.stop()
    text = pod.client.get("/metrics").text
    rows = pod_metric(text, "kestrel_batch_rows_processed_total", model="m")
    assert rows >= 2 * sent  # every row sent, counted in whichever worker batched it
    assert pod_metric(text, "kestrel_worker_starts_total") == 2


def test_a_killed_worker_is_replaced_and_serves_what_the_pod_serves(pod: LiveServer) -> None:
    if not pod.client.get("/models/m", headers=pod.admin).is_success:
        assert pod.register("m", sio.dumps(MODELS["a"]), options=OPTIONS).status_code == 201
    with each_worker(pod) as workers:
        victim = workers[0][0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 90
    while True:
        try:
            with each_worker(pod) as workers:
                if victim not in {pid for pid, _ in workers}:
                    # The replacement took connections only once it served the model.
                    for _, client in workers:
                        assert score(client, "m", X[:3]).status_code == 200
                    break
        except AssertionError:  # one worker only, so far
            assert time.monotonic() < deadline, pod.logs()
        time.sleep(0.5)
    text = pod.client.get("/metrics").text
    assert pod_metric(text, "kestrel_worker_starts_total") == 3
    assert pod_metric(text, "kestrel_workers") == 2
    log = pod.log_path.read_text()
    assert f"Child process [{victim}] died" in log and "Traceback" not in log


@pytest.fixture(scope="module")
def slow_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A pod whose scoring requests stay in flight half a second (their batch waits to fill),
    with a pod-wide cap of 4 in flight and no delay-based shedding."""
    server = start_pod(
        tmp_path_factory.mktemp("slow-pod"),
        KESTREL_BATCH_WAIT_MS="500",
        KESTREL_MAX_IN_FLIGHT="4",
        KESTREL_QUEUE_DELAY_TARGET_MS="60000",
    )
    try:
        assert server.register("m", sio.dumps(MODELS["a"]), options=OPTIONS).status_code == 201
        yield server
    finally:
        server.stop()


def test_the_in_flight_cap_is_the_pods(slow_pod: LiveServer) -> None:
    # 8 at once, 4 through each worker: a cap per worker would admit them all; the pod's admits
    # 4 (one more per other worker, read at the same instant).
    together = threading.Barrier(8)

    def burst(client: httpx.Client) -> int:
        together.wait()
        return score(client, "m", X[:1]).status_code

    with each_worker(slow_pod, 4) as workers, ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(burst, [client for _, client in workers]))
    assert statuses.count(429) >= 3 and 4 <= statuses.count(200) <= 5, statuses
    # Counted in whichever worker refused them; a sibling's counts reach a scrape within 1 s.
    deadline = time.monotonic() + 10
    while (
        refused := pod_metric(
            slow_pod.client.get("/metrics").text, "kestrel_rejections_total", reason="overloaded"
        )
    ) < statuses.count(429) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert refused == statuses.count(429)


def test_sigterm_drains_every_worker_and_exits_0(slow_pod: LiveServer) -> None:
    assert slow_pod.proc is not None
    with each_worker(slow_pod, 2) as workers, ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(score, client, "m", X[:1]) for _, client in workers]
        time.sleep(0.2)  # sent, each waiting for its batch to fill
        slow_pod.proc.send_signal(signal.SIGTERM)
        for future in futures:
            scores_as("a", future.result(), X[:1])
        assert slow_pod.proc.wait(60) == 0
    for pid in {pid for pid, _ in workers}:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "Traceback" not in slow_pod.log_path.read_text()


@pytest.mark.slow
def test_a_preloaded_model_is_registered_once_and_served_by_every_worker(
    tmp_path: Path,
) -> None:
    # KServe's layout: the model file in a directory, its name from the environment.
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "model.skops").write_bytes(sio.dumps(MODELS["b"]))
    server = start_pod(
        tmp_path, KESTREL_PRELOAD=str(mnt), KESTREL_PRELOAD_NAME="pre", KESTREL_MAX_BATCH="8"
    )
    try:
        with each_worker(server) as workers:  # both ready (start_pod), and both score it
            for _, client in workers:
                scores_as("b", score(client, "pre", X[:3]), X[:3])
        versions = server.client.get("/models/pre", headers=server.admin).json()["versions"]
        assert [v["version"] for v in versions] == ["1"]  # the second worker found it stored
    finally:
        server.stop()
