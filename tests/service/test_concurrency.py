"""Registering, deleting and scoring one model at the same time, on a real server; and deadlines
that pass while a request is queued.

Churn: for ``CHURN_S`` seconds, and then until enough of every kind of event happened (however
fast the machine), scoring threads send multi-chunk requests while one thread registers new
versions and another deletes the current version or the whole model. Versions are told apart by
their output (version tag × 1000 added to the same linear function), so every 200 must carry,
for every row, exactly the prediction of the version it names — never a mix within one
response, never a version that was not registered. Expected statuses:

- scoring: 200; 404 while the model is deleted and no new version is registered yet; 503 while
  that new version compiles (LOADING), or when the version picked was retired between lookup
  and compute three times running ("being replaced; retry");
- registration (``?wait=true``): 201; 422 when the model was deleted while the version compiled;
- deletion: 204; 404 when there was nothing left to delete.

Anything else, a 5xx above all, fails the test (``REFUSALS_OK`` pins the reasons too).

Deadlines: requests queued behind a batch that the test holds (a host step of this module waits
while a file exists) until their deadline has passed are answered 504 when the batcher reaches
them, counted in ``kestrel_rejections_total{reason="deadline"}``, and their rows never reach the
device.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import skops.io as sio
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer

from tests.service.live import LiveServer

CHURN_S = 10.0  # the least time the churn lasts
CHURN_MAX_S = 300.0  # the most, waiting for enough events: only a safety net
MIN_REGISTERED = 3
MIN_SCORED = 20
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


# -- holding a batch of the live server ----------------------------------------------------------
HOLD_ENV = "KESTREL_TEST_HOLD_FILE"  # set for the server only


def held(x: Any) -> np.ndarray:
    """A host step (this module is a trusted one for the server below) that passes its input
    through, but only once the file named by ``$KESTREL_TEST_HOLD_FILE`` is gone: while the test
    keeps it, the batch computing stays in ``run`` and everything behind it stays queued. It
    marks the hold with a ``.held`` file beside it. ``np.asarray`` keeps it out of the compiled
    graph, so it runs for every batch."""
    x = np.asarray(x, dtype=np.float64)
    hold = os.environ.get(HOLD_ENV)
    if hold and os.path.exists(hold):
        Path(hold + ".held").touch()
        give_up = time.monotonic() + 120  # never keep the server's thread if the test died
        while os.path.exists(hold) and time.monotonic() < give_up:
            time.sleep(0.005)
    return x


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    workdir = tmp_path_factory.mktemp("churn")
    # Requests queued behind the held batch must reach the batcher and expire there; shedding
    # by queueing delay (tests/service/test_bursts.py) would refuse them on their headers.
    no_shedding = {"KESTREL_QUEUE_DELAY_TARGET_MS": "600000"}
    # The server imports this module (as pytest named it) to run held() as a host step.
    here = str(Path(__file__).resolve().parent)
    python_path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    live = LiveServer(
        workdir,
        KESTREL_HOST_STEP_MODULES=held.__module__,
        PYTHONPATH=python_path,
        **{HOLD_ENV: str(workdir / "hold")},
        **no_shedding,
    ).start()
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


def churned_enough(log: Log) -> bool:
    with log.lock:
        return (
            len(log.registered) >= MIN_REGISTERED
            and log.predict_status[200] >= MIN_SCORED
            and any(k.endswith(" 204") for k in log.delete_status)
        )


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
    start = time.monotonic()
    for t in threads:
        t.start()
    try:
        # Until every kind of event below happened, not for a fixed time: a slow machine churns
        # longer instead of failing the counts.
        while time.monotonic() - start < CHURN_S or not churned_enough(log):
            if time.monotonic() - start > CHURN_MAX_S:
                break  # the counts below say what never happened
            time.sleep(0.1)
    finally:
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
    assert len(log.registered) >= MIN_REGISTERED, log.register_status
    assert log.predict_status[200] >= MIN_SCORED, log.predict_status
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
DEADLINE_OPTIONS = '{"max_batch": 8}'
HELD_ROWS = 5
# A real time, as the server sets deadlines on its own clock: the late requests' deadline must
# outlast their way from the client into the batcher's queue on a loaded machine (else they
# expire on arrival instead), so it is generous for that way. Its length costs test time only:
# the test waits it out after seeing them queued, with the batch ahead of them held meanwhile.
LATE_MS = 2000


def computed_rows(live: LiveServer) -> float:
    return live.metric("kestrel_batch_rows_processed_total", model=DEADLINE_MODEL)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll ``condition()``; the timeout is only a safety net."""
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, what
        time.sleep(0.005)


def test_deadline_passing_in_the_queue_is_never_computed(server: LiveServer) -> None:
    """Requests queued behind a batch until their deadline passed: 504, counted, never computed."""
    x_fit = np.random.default_rng(1).normal(size=(64, len(WEIGHTS)))
    model = make_pipeline(FunctionTransformer(held), LinearRegression()).fit(x_fit, x_fit @ WEIGHTS)
    r = server.register(DEADLINE_MODEL, sio.dumps(model), options=DEADLINE_OPTIONS)
    assert r.status_code == 201, r.text
    rejected = server.metric("kestrel_rejections_total", model=DEADLINE_MODEL, reason="deadline")
    rows_before = computed_rows(server)
    hold = Path(server.env[HOLD_ENV])
    x = np.ones((2, len(WEIGHTS)), dtype=np.float32)
    tensor = {"name": "input", "datatype": "FP32", "shape": [2, 3], "data": x.ravel().tolist()}

    def post(path: str, **kwargs: Any) -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            return client.post(path, **kwargs)

    def late_queued() -> bool:
        return server.metric("kestrel_queue_rows", model=DEADLINE_MODEL) == len(x) * 2

    hold.touch()
    try:
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(
                post,
                f"/models/{DEADLINE_MODEL}/predict",
                json=np.ones((HELD_ROWS, len(WEIGHTS))).tolist(),
            )
            wait_for(lambda: Path(f"{hold}.held").exists() or first.done(), "never held")
            assert not first.done(), first.result().text
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
            wait_for(lambda: late_queued() or native.done() or v2.done(), "late ones not queued")
            # Both deadlines were set on arrival, before they were seen queued: after this they
            # have passed, with both still queued behind the held batch.
            time.sleep(LATE_MS / 1e3)
            assert not (native.done() or v2.done()) and late_queued()
            hold.unlink()
            assert first.result().status_code == 200, first.result().text
            assert native.result().status_code == 504, native.result().text
            error = native.result().json()["error"]
            assert error["code"] == "deadline_exceeded" and "queued" in error["message"], error
            assert v2.result().status_code == 504 and "queued" in v2.result().json()["error"]
    finally:
        hold.unlink(missing_ok=True)

    after = server.metric("kestrel_rejections_total", model=DEADLINE_MODEL, reason="deadline")
    assert after - rejected == 2
    assert computed_rows(server) - rows_before == HELD_ROWS, "an expired request was computed"
