"""Load shedding: over ``KESTREL_MAX_IN_FLIGHT`` scoring requests in progress, a new one is
answered 429 at once (before its body is read), on a connection that stays open.

The first test runs a real ``kestrel serve``; the others drive the HTTP protocol of
service/shedding.py in a real uvicorn server on a socket, in front of a small ASGI app that
records what reaches it, with raw HTTP/1.1 bytes (keep-alive, pipelining, ``Expect``, chunked
bodies are what the protocol must get right)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx
import numpy as np
import pytest
import skops.io as sio
import uvicorn
from prometheus_client import CollectorRegistry
from sklearn.linear_model import LogisticRegression

from service.access import Auth
from service.admission import Admission, ScoringLoad
from service.metrics import Metrics
from service.shedding import protocol_for
from tests.service.live import LiveServer

X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
V2_BODY = {
    "inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": X[0].tolist()}]
}


def test_scoring_over_the_in_flight_limit_is_shed_at_once_and_management_is_not(
    tmp_path: Path,
) -> None:
    # One request may be in progress; a partial batch waits ten minutes for company, so the first
    # request holds the only slot until the test releases it: registering a new version retires
    # the old one, whose batcher then computes what it holds at once.
    live = LiveServer(tmp_path, KESTREL_MAX_IN_FLIGHT="1", KESTREL_BATCH_WAIT_MS="600000").start()
    try:
        model = LogisticRegression().fit(X, X[:, 0] > 0)
        assert live.register("m", sio.dumps(model), options='{"max_batch": 8}').status_code == 201
        held: list[httpx.Response] = []
        holder = threading.Thread(
            target=lambda: held.append(live.client.post("/models/m/predict", json=X[:1].tolist()))
        )
        holder.start()
        deadline = time.monotonic() + 60  # only a safety net
        while live.metric("kestrel_queue_rows", model="m") < 1:  # the slot is taken
            assert time.monotonic() < deadline, "the first request never reached the batcher"
            time.sleep(0.02)

        with httpx.Client(base_url=live.url, timeout=10) as client:
            shed = [client.post(path, json=X[:1].tolist()) for path in _scoring_paths()]
            v2 = client.post("/v2/models/m/infer", json=V2_BODY)
            # Answered while the batch still holds the slot: shedding did not wait for it (it
            # would have waited the ten minutes, past the client's timeout).
            assert held == [] and holder.is_alive()
            for r in shed:
                assert r.status_code == 429, r.text
                assert r.headers["retry-after"] == "1"
                error = r.json()["error"]
                assert error["code"] == "overloaded" and "limit of 1" in error["message"]
                assert error["request_id"] == r.headers["x-request-id"]
            # The v2 protocol's own error shape, as its clients (tritonclient) parse it.
            assert v2.status_code == 429 and v2.headers["retry-after"] == "1"
            assert v2.json() == {"error": shed[0].json()["error"]["message"]}
            # Keep-alive: every answer above came over the one connection, and so does this.
            assert client.get("/models", headers=live.admin).status_code == 200
        # Management is not shed either way: the new version registers with the slot taken.
        assert live.register("m", sio.dumps(model), options='{"max_batch": 8}').status_code == 201
        holder.join(30)
        assert [r.status_code for r in held] == [200]
        assert live.metric("kestrel_rejections_total", model="m", reason="overloaded") == 3
        assert live.metric("kestrel_rejections_total", model="_none", reason="overloaded") == 1
        assert live.metric("kestrel_requests_total", route="_refused", status="429") == 4
        # The slot is free again: the next request is admitted (a full batch: no waiting).
        assert live.client.post("/models/m/predict", json=X[:8].tolist()).status_code == 200
    finally:
        live.stop()


def _scoring_paths() -> list[str]:
    """The same model through two scoring routes, and an unknown model (a bounded label)."""
    return ["/models/m/predict", "/predict?model=m", "/models/nope/predict"]


# --- the protocol, in front of a recording ASGI app -------------------------------------------

LIMIT = 64 * 1024  # the body limit of every route below
BODY = json.dumps(np.zeros((128, 40)).tolist()).encode()  # ~40 KB, like a batch-scoring request


class Recorder:
    """An ASGI app answering 200 with ``<path> <body length>``; ``/slow`` answers after 0.3 s."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.seen.append(scope["path"])
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        if scope["path"] == "/slow":
            await asyncio.sleep(0.3)
        body = f"{scope['path']} {size}".encode()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class Served:
    """A uvicorn server with the shedding protocol on a free port, in a thread."""

    def __init__(self, scoring_token: str | None = None) -> None:
        self.app = Recorder()
        self.metrics = Metrics(CollectorRegistry())
        self.load = ScoringLoad(1)
        self.admission = Admission(
            metrics=self.metrics,
            limit_for=lambda path, method: LIMIT,
            model_label=lambda name: name or "_none",
            scoring=self.load,
            refusal=Auth(admin="admin", scoring=scoring_token).refusal,
        )
        config = uvicorn.Config(
            self.app,
            http=protocol_for(self.admission),
            loop="asyncio",
            lifespan="off",
            log_config=None,
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def count(self, name: str, **labels: str) -> float:
        return sum(
            s.value
            for family in self.metrics.registry.collect()
            for s in family.samples
            if s.name == name and labels.items() <= s.labels.items()
        )


@pytest.fixture
def served() -> Iterator[Served]:
    with Served() as s:
        yield s


def post(path: str, body: bytes = BODY, *extra: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "host: k", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def read_response(stream: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One response from a connection's buffered reader: status, headers, body."""
    status_line = stream.readline()
    assert status_line, "the connection closed without an answer"
    headers = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = stream.read(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


def test_saturated_scoring_is_refused_on_headers_and_the_connection_kept(served: Served) -> None:
    served.load.in_flight = 1  # the one slot is taken
    with served.connect() as conn, conn.makefile("rb") as stream:
        # One at a time, then two in one write (none is ahead of another's answer: both are
        # refused at once, in order).
        conn.sendall(post("/models/m/predict", BODY, "x-request-id: rid-1"))
        answers = [read_response(stream)]
        conn.sendall(post("/predict?model=m") + post("/v2/models/m/infer"))
        answers += [read_response(stream), read_response(stream)]
        assert served.app.seen == []  # no request reached the application
        for status, headers, _ in answers:
            assert status == 429 and headers["retry-after"] == "1"
            assert headers["content-type"] == "application/json"
            assert "connection" not in headers and "date" in headers
        native = json.loads(answers[0][2])["error"]
        assert native["code"] == "overloaded" and "limit of 1" in native["message"]
        assert native["request_id"] == answers[0][1]["x-request-id"] == "rid-1"
        assert json.loads(answers[2][2]) == {"error": native["message"]}  # the v2 shape
        # The slot frees: the same connection's next request is admitted, its body whole (the
        # bodies skipped above did not leak into it).
        served.load.in_flight = 0
        conn.sendall(post("/models/m/predict"))
        assert read_response(stream)[::2] == (200, f"/models/m/predict {len(BODY)}".encode())
    assert served.count("kestrel_rejections_total", model="m", reason="overloaded") == 3
    assert served.count("kestrel_requests_total", route="_refused", status="429") == 3


def test_only_scoring_posts_are_refused_on_headers(served: Served) -> None:
    served.load.in_flight = 1
    with served.connect() as conn, conn.makefile("rb") as stream:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nhost: k\r\n\r\n")
        assert read_response(stream)[0] == 200
        conn.sendall(post("/models", b"{}", "authorization: Bearer admin"))
        assert read_response(stream)[0] == 200
    assert served.app.seen == ["/healthz", "/models"]


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (post("/models/m/predict", BODY, "expect: 100-continue"), 429),  # the body may not come
        (post("/models/m/predict", BODY, "connection: close"), 429),
        (post("/models/m/predict", BODY, version="1.0"), 429),
        (post("/models/m/predict", b"x" * (LIMIT + 1)), 413),  # the body is not read
    ],
    ids=["expect-100-continue", "connection-close", "http-1.0", "too-large"],
)
def test_a_refusal_closes_the_connection_when_it_cannot_be_reused(
    served: Served, request_bytes: bytes, status: int
) -> None:
    served.load.in_flight = 1
    with served.connect() as conn, conn.makefile("rb") as stream:
        conn.sendall(request_bytes)
        answer_status, headers, _ = read_response(stream)
        assert (answer_status, headers["connection"]) == (status, "close")
        assert stream.read() == b""  # closed by the server
    assert served.app.seen == []


def test_a_refused_chunked_body_past_the_limit_closes_the_connection(served: Served) -> None:
    served.load.in_flight = 1
    head = b"POST /models/m/predict HTTP/1.1\r\nhost: k\r\ntransfer-encoding: chunked\r\n\r\n"
    chunk = b"%x\r\n%s\r\n" % (LIMIT, b"x" * LIMIT)
    with served.connect() as conn, conn.makefile("rb") as stream:
        conn.sendall(head + chunk)
        assert read_response(stream)[0] == 429  # answered on the headers
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for _ in range(64):  # more than the route accepts: the server stops reading
                conn.sendall(chunk)
                time.sleep(0.005)
        assert stream.read() == b""


def test_a_pipelined_request_waits_for_the_answer_ahead_of_it(served: Served) -> None:
    """A request behind one in progress on its connection is left to uvicorn's queue (the
    application's middleware refuses it in its turn): answers never overtake each other."""
    served.load.in_flight = 1
    with served.connect() as conn, conn.makefile("rb") as stream:
        conn.sendall(post("/slow", b"{}") + post("/models/m/predict"))
        first, second = read_response(stream), read_response(stream)
    assert first[::2] == (200, b"/slow 2")
    assert second[::2] == (200, f"/models/m/predict {len(BODY)}".encode())


def test_tokens_are_checked_before_load_is_reported() -> None:
    """A caller without the scoring token learns nothing about the load: 401, not 429."""
    with Served(scoring_token="s") as served:
        served.load.in_flight = 1
        with served.connect() as conn, conn.makefile("rb") as stream:
            conn.sendall(post("/models/m/predict"))
            status, headers, _ = read_response(stream)
            assert (status, headers["connection"]) == (401, "close")
        with served.connect() as conn, conn.makefile("rb") as stream:
            conn.sendall(post("/models/m/predict", BODY, "authorization: Bearer s"))
            assert read_response(stream)[0] == 429
        assert served.app.seen == []
