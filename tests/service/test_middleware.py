"""The service middleware around small ASGI apps: what it answers when the app cannot."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from service.access import Auth
from service.admission import REFUSED_ROUTE, Admission, ScoringLoad
from service.metrics import Metrics
from service.middleware import ServiceMiddleware


async def failing_app(scope: Any, receive: Any, send: Any) -> None:
    raise RuntimeError("a bug nobody mapped")


async def echo_app(scope: Any, receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def wrap(app: Any, metrics: Metrics, **kw: Any) -> ServiceMiddleware:
    admission = Admission(
        metrics=metrics,
        limit_for=lambda path, method: 16,
        model_label=lambda name: name or "_none",
        **kw,
    )
    return ServiceMiddleware(app, admission=admission)


def request(app: Any, method: str, path: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://kestrel") as client:
            return await client.request(method, path, **kw)

    return asyncio.run(go())


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


@pytest.mark.parametrize("path", ["/models/m/predict", "/v2/models/m/infer"])
def test_an_unmapped_exception_is_a_json_500_with_the_request_id(
    metrics: Metrics, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    r = request(wrap(failing_app, metrics), "POST", path, headers={"X-Request-ID": "req-7"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "req-7"
    message = "internal error (RuntimeError); see the log"
    if path.startswith("/v2"):
        assert r.json() == {"error": message}
    else:
        assert r.json() == {
            "error": {"code": "internal", "message": message, "request_id": "req-7"}
        }
    assert "a bug nobody mapped" in caplog.text  # the traceback is in the log
    assert sample(metrics, "kestrel_requests_total", model="_none", route="unmatched") == 1


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/models/m/predict", "native"), ("/v2/models/m/infer", "v2")],
)
def test_refusals_before_routing_answer_in_the_routes_error_shape(
    metrics: Metrics, path: str, shape: str
) -> None:
    app = wrap(echo_app, metrics, refusal=Auth(admin="a", scoring="s").refusal)
    too_large = request(app, "POST", path, content=b"x" * 17, headers={"Authorization": "Bearer s"})
    anonymous = request(app, "POST", path, content=b"{}")
    assert too_large.status_code == 413 and too_large.headers["connection"] == "close"
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    for r, what in ((too_large, "17 bytes exceeds this route's limit of 16"), (anonymous, "token")):
        error = r.json()["error"]
        if shape == "v2":
            assert isinstance(error, str) and what in error
        else:
            assert what in error["message"] and error["request_id"] == r.headers["x-request-id"]
    assert sample(metrics, "kestrel_requests_total", model="m", route=REFUSED_ROUTE) == 2
    assert sample(metrics, "kestrel_rejections_total", model="m", reason="unauthorized") == 1
    assert sample(metrics, "kestrel_rejections_total", model="m", reason="too_large") == 1
    admitted = request(app, "POST", path, content=b"{}", headers={"X-Kestrel-Token": "s"})
    assert admitted.status_code == 200 and admitted.content == b"{}"


def test_instances_sharing_a_scoring_load_shed_together() -> None:
    """The scoring fast path runs its own middleware instance: both must count one limit."""
    metrics = Metrics(CollectorRegistry())
    load = ScoringLoad(1)
    gate = asyncio.Event()

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:
        await gate.wait()
        await echo_app(scope, receive, send)

    first = wrap(slow_app, metrics, scoring=load)
    second = wrap(echo_app, metrics, scoring=load)

    async def go() -> tuple[int, int, int]:
        transport = httpx.ASGITransport(app=first, raise_app_exceptions=False)
        other = httpx.ASGITransport(app=second, raise_app_exceptions=False)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://k") as a,
            httpx.AsyncClient(transport=other, base_url="http://k") as b,
        ):
            held = asyncio.create_task(a.post("/models/m/predict", content=b"1"))
            while load.in_flight == 0:
                await asyncio.sleep(0)
            shed = await b.post("/models/m/predict", content=b"1")
            gate.set()
            done = await held
            after = await b.post("/models/m/predict", content=b"1")
            return shed.status_code, done.status_code, after.status_code

    assert asyncio.run(go()) == (429, 200, 200)
    assert load.in_flight == 0
    with pytest.raises(ValueError, match="positive integer"):
        ScoringLoad(0)


def test_a_client_leaving_mid_body_is_counted_not_logged_as_a_server_error(
    metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    async def reads_body(scope: Any, receive: Any, send: Any) -> None:
        from starlette.requests import Request

        await Request(scope, receive).body()

    async def disconnects() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    sent: list[Any] = []

    async def record(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/models/m/predict", "headers": []}
    asyncio.run(wrap(reads_body, metrics)(scope, disconnects, record))
    assert sent == []  # nobody to answer
    assert "unhandled" not in caplog.text and "Traceback" not in caplog.text
    assert sample(metrics, "kestrel_requests_total", model="_none", status="499") == 1


def test_a_streamed_body_past_the_limit_is_answered_413_once_and_the_app_sees_a_disconnect(
    metrics: Metrics,
) -> None:
    seen: list[str] = []

    async def answers_a_cut_body_400(scope: Any, receive: Any, send: Any) -> None:
        while True:  # as a multipart parser reads, and answers a body that stops short
            message = await receive()
            seen.append(message["type"])
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": b"There was an error parsing the body"})

    chunks = iter([{"type": "http.request", "body": b"x" * 10, "more_body": True}] * 3)

    async def receive() -> dict[str, Any]:
        return next(chunks)

    sent: list[Any] = []

    async def record(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/models", "headers": []}
    asyncio.run(wrap(answers_a_cut_body_400, metrics)(scope, receive, record))
    assert seen == ["http.request", "http.disconnect"]  # 10 bytes, then 20 of at most 16
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]
    assert b"limit of 16 bytes" in sent[1]["body"]
    assert sample(metrics, "kestrel_requests_total", status="413") == 1
    assert sample(metrics, "kestrel_rejections_total", reason="too_large") == 1
