"""One pure-ASGI middleware for what every request needs: an id, a body limit, and metrics.

Pure ASGI (not Starlette's BaseHTTPMiddleware) because it sits on the hot path of single-row
requests, where each extra task and copy is visible in the latency.
"""

from __future__ import annotations

import contextvars
import logging
import time
import uuid
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
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        limit_for: Callable[[str, str], int],
        model_label: Callable[[str | None], str],
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.limit_for = limit_for
        self.model_label = model_label

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        rid = _header(scope, b"x-request-id")
        rid = rid[:128] if rid else uuid.uuid4().hex
        token = request_id_var.set(rid)
        limit = self.limit_for(scope["path"], scope["method"])
        declared = _header(scope, b"content-length")
        status = 500
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _reject_too_large(send, rid, limit, declared)
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
        in_flight = self.metrics.in_flight.labels(route_kind(scope["path"], scope["method"]))
        in_flight.inc()
        try:
            await self.app(scope, limited_receive, send_with_id)
        finally:
            in_flight.dec()
            route = _route(scope)
            model = self.model_label(scope.get("path_params", {}).get("name"))
            elapsed = time.perf_counter() - start
            self.metrics.requests.labels(model, route, str(status)).inc()
            self.metrics.request_seconds.labels(model, route).observe(elapsed)
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


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


async def _reject_too_large(send: Send, rid: str, limit: int, declared: str | None) -> None:
    what = f"{declared} bytes" if declared and declared.isdigit() else "the body"
    body = orjson.dumps(
        {
            "error": {
                "code": "payload_too_large",
                "message": f"{what} exceeds this route's limit of {limit} bytes",
                "request_id": rid,
            }
        }
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                (b"x-request-id", rid.encode("latin-1")),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
