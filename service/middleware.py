"""One pure-ASGI middleware for what every request needs: an id, a body limit, and metrics.

Pure ASGI (not Starlette's BaseHTTPMiddleware) because it sits on the hot path of single-row
requests, where each extra task and copy is visible in the latency.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from service.errors import PayloadTooLarge
from service.metrics import Metrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "kestrel_request_id", default=None
)
access_log = logging.getLogger("kestrel.access")


class ServiceMiddleware:
    """Request ids (``X-Request-ID`` in and out), body size limits, in-flight and duration metrics.

    ``limit_for(path, method)`` gives the largest body a route accepts: a ``Content-Length`` above
    it is refused with 413 before reading a byte; a chunked body is counted as it streams.
    ``model_label(name)`` bounds the model label to known models.

    Load shedding: with ``max_scoring_in_flight``, a scoring request arriving while that many are
    in progress is answered 429 at once, before its body is read or the request routed. Under
    overload this is what keeps admitted requests fast: a rejection must cost far less than a
    prediction, or rejecting alone saturates the event loop and every request waits behind the
    backlog (see docs/reliability.md).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        limit_for: Callable[[str, str], int],
        model_label: Callable[[str | None], str],
        max_scoring_in_flight: int | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.limit_for = limit_for
        self.model_label = model_label
        self.max_scoring_in_flight = max_scoring_in_flight
        self.scoring_in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        rid, declared = _id_and_length(scope)
        # 32 random hex digits like uuid4().hex, without building a UUID object (2 µs a request).
        rid = rid[:128] if rid else os.urandom(16).hex()
        token = request_id_var.set(rid)
        limit = self.limit_for(scope["path"], scope["method"])
        status = 500
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _reject_too_large(send, rid, limit, declared)
            request_id_var.reset(token)
            return
        kind = route_kind(scope["path"], scope["method"])
        scoring = kind == "scoring"
        cap = self.max_scoring_in_flight
        if scoring and cap is not None and self.scoring_in_flight >= cap:
            await self._shed(scope, send, rid)
            request_id_var.reset(token)
            return

        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the app, so its handler answers 413 like any service error.
                    raise PayloadTooLarge(
                        f"request body exceeds this route's limit of {limit} bytes"
                    )
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode("latin-1")))
                message["headers"] = headers
            await send(message)

        # The route template is known only after routing: count in flight by kind of route.
        metrics = self.metrics
        in_flight = metrics.child(metrics.in_flight, kind)
        in_flight.inc()
        if scoring:
            self.scoring_in_flight += 1
        try:
            await self.app(scope, limited_receive, send_with_id)
        finally:
            in_flight.dec()
            if scoring:
                self.scoring_in_flight -= 1
            route = _route(scope)
            model = self.model_label(scope.get("path_params", {}).get("name"))
            elapsed = time.perf_counter() - start
            requests, seconds = metrics.request_children(model, route, status)
            requests.inc()
            seconds.observe(elapsed)
            if access_log.isEnabledFor(logging.INFO):
                access_log.info(
                    "%s %s %d %.2f ms",
                    scope["method"],
                    scope["path"],
                    status,
                    elapsed * 1e3,
                    extra={"status": status, "route": route, "model": model, "ms": elapsed * 1e3},
                )
            request_id_var.reset(token)

    async def _shed(self, scope: Scope, send: Send, rid: str) -> None:
        """429 for a scoring request over the in-flight limit: no routing, no body read."""
        await _reject_overloaded(send, rid, self.max_scoring_in_flight or 0)
        metrics = self.metrics
        model = self.model_label(_model_in_path(scope["path"], scope.get("query_string", b"")))
        metrics.child(metrics.rejections, model, "overloaded").inc()
        metrics.child(metrics.requests, model, SHED_ROUTE, "429").inc()


# The route label of requests shed before routing (the route template is not known yet).
SHED_ROUTE = "_shed"


def route_kind(path: str, method: str) -> str:
    """A bounded label for a raw path: scoring, management, health or other."""
    if path.endswith(("/predict", "/infer")):
        return "scoring"
    if path.startswith(("/models", "/v2/repository")):
        return "management"
    if path in ("/healthz", "/readyz", "/metrics") or path.startswith("/v2"):
        return "health"
    return "other"


def _route(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


def _id_and_length(scope: Scope) -> tuple[str | None, str | None]:
    """The first ``X-Request-ID`` and ``Content-Length`` values, in one pass over the headers."""
    rid = length = None
    for key, value in scope.get("headers", ()):
        if key == b"x-request-id":
            if rid is None:
                rid = value.decode("latin-1")
        elif key == b"content-length" and length is None:
            length = value.decode("latin-1")
    return rid, length


def _model_in_path(path: str, query: bytes) -> str | None:
    """The model a scoring path names, without routing: /models/{name}/..., /v2/models/{name}/...
    or /predict?model={name} (None if it names none)."""
    parts = path.split("/", 4)
    if len(parts) > 2 and parts[1] == "models":
        return parts[2]
    if len(parts) > 3 and parts[1] == "v2" and parts[2] == "models":
        return parts[3]
    for pair in query.split(b"&"):
        if pair.startswith(b"model="):
            return pair[6:].decode("latin-1")
    return None


async def _reject_overloaded(send: Send, rid: str, limit: int) -> None:
    message = f"the server is at its limit of {limit} scoring requests in progress; retry shortly"
    # Keep-alive, unlike 413: the body (small, under the scoring limit) is read by the server's
    # HTTP parser anyway, and a client retrying after 429 should not pay for a new connection.
    await _send_error(send, rid, 429, "overloaded", message, (b"retry-after", b"1"))


async def _reject_too_large(send: Send, rid: str, limit: int, declared: str | None) -> None:
    what = f"{declared} bytes" if declared and declared.isdigit() else "the body"
    message = f"{what} exceeds this route's limit of {limit} bytes"
    await _send_error(send, rid, 413, "payload_too_large", message, (b"connection", b"close"))


async def _send_error(
    send: Send, rid: str, status: int, code: str, message: str, header: tuple[bytes, bytes]
) -> None:
    """Answer with the service's error body before any route ran (``header``: one extra)."""
    body = orjson.dumps({"error": {"code": code, "message": message, "request_id": rid}})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                header,
                (b"x-request-id", rid.encode("latin-1")),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
