"""Registering, deleting and scoring one model at the same time, on a real server; and deadlines
that pass while a request is queued.

Churn: for ``CHURN_S`` seconds, scoring threads send multi-chunk requests while one thread
registers new versions and another deletes the current version or the whole model. Versions are
told apart by their output (version tag × 1000 added to the same linear function), so every
200 must carry, for every row, exactly the prediction of the version it names — never a mix
within one response, never a version that was not registered. Expected statuses:

- scoring: 200; 404 while the model is deleted and no new version is registered yet; 503 while
  that new version compiles (LOADING), or when the version picked was retired between lookup
  and compute three times running ("being replaced; retry");
- registration (``?wait=true``): 201; 422 when the model was deleted while the version compiled;
- deletion: 204; 404 when there was nothing left to delete.

Anything else, a 5xx above all, fails the test (``REFUSALS_OK`` pins the reasons too).

Deadlines: requests queued behind a big one, with a deadline shorter than the queue takes to
drain, are answered 504 when the batcher reaches them, counted in
``kestrel_rejections_total{reason="deadline"}``, and their rows never reach the device.
"""

from __future__ import annotations

import io
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
import skops.io as sio
from sklearn.linear_model import LinearRegression

from tests.service.live import LiveServer

CHURN_S = 10.0
SCORERS = 3
MODEL = "churn"
MAX_BATCH = 8  # requests of up to 20 rows are split over several batches
OPTIONS = f'{{"max_batch": {MAX_BATCH}}}'
WEIGHTS = np.array([0.5, -2.0, 3.0])
PREDICT_OK = {200, 404, 503}
# Why scoring may be refused during churn (digits normalised to N); any other reason is a bug.
REFUSALS_OK = {
    "404 no model named 'churn'",  # deleted, and the next version is not READY yet
    "503 model 'churn' version N is LOADING",  # ...and the next one is compiling
    "503 model 'churn' is being replaced; retry",  # retired between lookup and compute, 3 times
}
REGISTER_OK = {201, 422}
DELETE_OK = {204, 404}


def versioned_model(tag: int) -> LinearRegression:
    """``x @ WEIGHTS + 1000 * tag``: every version's outputs lie in their own band."""
    x = np.random.default_rng(tag).normal(size=(64, len(WEIGHTS)))
    return LinearRegression().fit(x, x @ WEIGHTS + 1000.0 * tag)


@dataclass
class Log:
    """What every thread saw; checked once all threads stopped (a version may serve before its
    registration's response arrives)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    predictions: list[tuple[np.ndarray, dict[str, Any]]] = field(default_factory=list)
    predict_status: Counter[int] = field(default_factory=Counter)
    registered: dict[str, int] = field(default_factory=dict)  # version → tag
    register_status: Counter[int] = field(default_factory=Counter)
    delete_status: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)  # scoring errors by message
    unexpected: list[str] = field(default_factory=list)

    def note(self, what: str, r: httpx.Response, allowed: set[int]) -> None:
        if r.status_code not in allowed:
            with self.lock:
                self.unexpected.append(f"{what}: {r.status_code} {r.text[:300]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # Requests queued behind a 60 000-row one must reach the batcher and expire there; shedding
    # by queueing delay (tests/service/test_bursts.py) would refuse them on their headers.
    no_shedding = {"KESTREL_QUEUE_DELAY_TARGET_MS": "600000"}
    live = LiveServer(tmp_path_factory.mktemp("churn"), **no_shedding).start()
    yield live
    live.stop()


def register(live: LiveServer, client: httpx.Client, tag: int, log: Log) -> None:
    r = client.post(
        "/models",
        params={"wait": "true"},
        data={"name": MODEL, "options": OPTIONS},
        files={"file": ("m.skops", sio.dumps(versioned_model(tag)))},
        headers=live.admin,
    )
    log.note(f"register tag {tag}", r, REGISTER_OK)
    with log.lock:
        log.register_status[r.status_code] += 1
        if r.status_code == 201:
            log.registered[r.json()["version"]] = tag
    if r.status_code == 422:
        assert "deleted while loading" in r.json()["error"]["message"], r.text


def registrar(live: LiveServer, stop: threading.Event, log: Log) -> None:
    with httpx.Client(base_url=live.url, timeout=120) as client:
        tag = 1
        while not stop.is_set():
            register(live, client, tag, log)
            tag += 1


def deleter(live: LiveServer, stop: threading.Event, log: Log) -> None:
    """Every ~0.7 s: delete the current version (twice), then the whole model (once)."""
    with httpx.Client(base_url=live.url, timeout=120) as client:
        round_ = 0
        while not stop.wait(0.7):
            round_ += 1
            if round_ % 3:
                current = client.get(f"/models/{MODEL}", headers=live.admin)
                if current.status_code != 200 or current.json()["current"] is None:
                    continue
                path = f"/models/{MODEL}/versions/{current.json()['current']}"
                kind = "version"
            else:
                path, kind = f"/models/{MODEL}", "model"
            r = client.delete(path, headers=live.admin)
            log.note(f"DELETE {path}", r, DELETE_OK)
            with log.lock:
                log.delete_status[f"{kind} {r.status_code}"] += 1


def scorer(live: LiveServer, stop: threading.Event, log: Log, seed: int) -> None:
    rng = np.random.default_rng(seed)
    with httpx.Client(base_url=live.url, timeout=120) as client:
        while not stop.is_set():
            x = rng.normal(size=(int(rng.integers(1, 21)), len(WEIGHTS))).astype(np.float32)
            try:
                r = client.post(f"/models/{MODEL}/predict", json=x.tolist())
            except httpx.TransportError as exc:  # e.g. the server dropped the connection
                with log.lock:
                    log.unexpected.append(f"predict: {exc!r}")
                continue
            log.note("predict", r, PREDICT_OK)
            with log.lock:
                log.predict_status[r.status_code] += 1
                if r.status_code == 200:
                    log.predictions.append((x, r.json()))
                else:
                    message = r.json()["error"]["message"].split("; ready:")[0]
                    message = re.sub(r"\d+", "N", message)
                    log.refusals[f"{r.status_code} {message}"] += 1


def check_prediction(x: np.ndarray, doc: dict[str, Any], registered: dict[str, int]) -> None:
    version = doc["version"]
    assert version in registered, f"version {version} answered but was never registered"
    got = np.asarray(doc["outputs"]["predict"], dtype=np.float64)
    assert got.shape == (len(x),) and doc["rows"] == len(x), doc
    tags = np.rint((got - x.astype(np.float64) @ WEIGHTS) / 1000.0)
    assert set(tags.tolist()) == {registered[version]}, (version, registered, tags)  # no mix
    want = versioned_model(registered[version]).predict(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


def test_register_delete_and_predict_one_model_at_once(server: LiveServer) -> None:
    log = Log()
    with httpx.Client(base_url=server.url, timeout=120) as client:
        register(server, client, 0, log)  # something to score from the first request on
    stop = threading.Event()
    threads = [
        threading.Thread(target=registrar, args=(server, stop, log)),
        threading.Thread(target=deleter, args=(server, stop, log)),
        *(threading.Thread(target=scorer, args=(server, stop, log, s)) for s in range(SCORERS)),
    ]
    for t in threads:
        t.start()
    time.sleep(CHURN_S)
    stop.set()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads)

    print(
        f"\nchurn: predict {dict(log.predict_status)}, register {dict(log.register_status)}, "
        f"delete {dict(log.delete_status)}, refusals {dict(log.refusals)}"
    )
    assert not log.unexpected, "\n".join(log.unexpected)
    assert set(log.refusals) <= REFUSALS_OK, log.refusals
    assert len(log.registered) >= 3, log.register_status
    assert log.predict_status[200] >= 20, log.predict_status
    assert any(k.endswith(" 204") for k in log.delete_status), log.delete_status
    for x, doc in log.predictions:
        check_prediction(x, doc, log.registered)
    # The server is still whole: a fresh version registers and serves its own predictions.
    with httpx.Client(base_url=server.url, timeout=120) as client:
        register(server, client, 999, log)
        x = np.ones((3, len(WEIGHTS)), dtype=np.float32)
        r = client.post(f"/models/{MODEL}/predict", json=x.tolist())
    assert r.status_code == 200, r.text
    check_prediction(x, r.json(), log.registered)
    assert r.json()["version"] == max(log.registered, key=int)
    assert server.metric("kestrel_compiles_total", cause="after_ready") == 0


# -- deadlines that pass in the queue --------------------------------------------------------------
DEADLINE_MODEL = "waits"
# In batches of one row: a queue that takes seconds to drain, so that a request behind it expires
# there and not on its way in (its deadline must outlast the arrival path on a loaded machine: a
# 50 ms one sometimes expired before reaching the batcher). Since small buckets run on the host,
# 48 000 rows in batches of 8 sometimes drained within the 300 ms; the queue holds at most 65 536
# rows (KESTREL_MAX_QUEUE_ROWS), so the batches shrink instead.
DEADLINE_OPTIONS = '{"max_batch": 1}'
BIG_ROWS = 60_000
LATE_MS = 300


def computed_rows(live: LiveServer) -> float:
    return live.metric("kestrel_batch_rows_processed_total", model=DEADLINE_MODEL)


def test_deadline_passing_in_the_queue_is_never_computed(server: LiveServer) -> None:
    """Requests queued behind a big one expire there: 504, counted, their rows never computed."""
    r = server.register(DEADLINE_MODEL, sio.dumps(versioned_model(1)), options=DEADLINE_OPTIONS)
    assert r.status_code == 201, r.text
    rejected = server.metric("kestrel_rejections_total", model=DEADLINE_MODEL, reason="deadline")
    rows_before = computed_rows(server)
    big = io.BytesIO()
    np.save(big, np.ones((BIG_ROWS, len(WEIGHTS)), dtype=np.float32))
    x = np.ones((2, len(WEIGHTS)), dtype=np.float32)
    tensor = {"name": "input", "datatype": "FP32", "shape": [2, 3], "data": x.ravel().tolist()}

    def post(path: str, **kwargs: Any) -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            return client.post(path, **kwargs)

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(
            post,
            f"/models/{DEADLINE_MODEL}/predict",
            content=big.getvalue(),
            headers={"content-type": "application/x-npy"},
        )
        deadline = time.monotonic() + 60
        while server.metric("kestrel_queue_rows", model=DEADLINE_MODEL) == 0:
            assert time.monotonic() < deadline and not first.done(), "the big request never queued"
            time.sleep(0.005)
        native = pool.submit(
            post,
            f"/models/{DEADLINE_MODEL}/predict",
            json=x.tolist(),
            headers={"x-kestrel-timeout-ms": str(LATE_MS)},
        )
        v2 = pool.submit(  # the v2 timeout is in µs, as tritonclient sends it
            post,
            f"/v2/models/{DEADLINE_MODEL}/infer",
            json={"inputs": [tensor], "parameters": {"timeout": LATE_MS * 1000}},
        )
        assert first.result().status_code == 200, first.result().text
        assert native.result().status_code == 504, native.result().text
        error = native.result().json()["error"]
        assert error["code"] == "deadline_exceeded" and "queued" in error["message"], error
        assert v2.result().status_code == 504 and "queued" in v2.result().json()["error"]

    after = server.metric("kestrel_rejections_total", model=DEADLINE_MODEL, reason="deadline")
    assert after - rejected == 2
    assert computed_rows(server) - rows_before == BIG_ROWS, "an expired request was computed"
