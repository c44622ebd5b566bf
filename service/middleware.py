"""One pure-ASGI middleware for what every request needs: an id, a body limit, tokens, load
shedding, metrics, and a JSON answer whatever happens inside.

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

from service.errors import PayloadTooLarge, ServiceError, TooManyRequests
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
log = logging.getLogger(__name__)


class ServiceMiddleware:
    """Request ids (``X-Request-ID`` in and out), body size limits, in-flight and duration metrics.

    ``limit_for(path, method)`` gives the largest body a route accepts: a ``Content-Length`` above
    it is refused with 413 before reading a byte; a chunked body is counted as it streams.
    ``model_label(name)`` bounds the model label to known models. ``refusal(path, headers)``
    says why a request is not allowed (401 / 403, :mod:`service.access`), checked before routing
    and before the body is read.

    Everything refused before routing (413 by ``Content-Length``, tokens, shedding) is answered
    here in the route's error shape and counted with the route label ``_refused``. An exception
    no handler mapped becomes a JSON 500 with the request id (and the traceback in the log).

    Load shedding: with ``max_scoring_in_flight`` (or a shared :class:`ScoringLoad` with a cap), a
    scoring request arriving while that many are in progress is answered 429 at once, before its
    body is read or the request routed. Under overload this is what keeps admitted requests fast:
    a rejection must cost far less than a prediction, or rejecting alone saturates the event loop
    and every request waits behind the backlog (see docs/reliability.md).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        limit_for: Callable[[str, str], int],
        model_label: Callable[[str | None], str],
        max_scoring_in_flight: int | None = None,
        scoring: ScoringLoad | None = None,
        refusal: Callable[[str, Any], ServiceError | None] | None = None,
    ) -> None:
        if scoring is not None and max_scoring_in_flight is not None:
            raise ValueError("pass max_scoring_in_flight or a ScoringLoad with its cap, not both")
        self.app = app
        self.metrics = metrics
        self.limit_for = limit_for
        self.model_label = model_label
        self.scoring = scoring if scoring is not None else ScoringLoad(max_scoring_in_flight)
        self.refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        rid, declared = _id_and_length(scope)
        # 32 random hex digits like uuid4().hex, without building a UUID object (2 µs a request).
        rid = rid[:128] if rid else os.urandom(16).hex()
        token = request_id_var.set(rid)
        path = scope["path"]
        limit = self.limit_for(path, scope["method"])
        status = 500
        refused: ServiceError | None = None
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            what = f"{declared} bytes" if declared.isdigit() else "the body"
            refused = PayloadTooLarge(f"{what} exceeds this route's limit of {limit} bytes")
            refused.headers = {"connection": "close"}  # the body is not read
        elif self.refusal is not None:
            refused = self.refusal(path, scope["headers"])
            if refused is not None and scope["method"] in _WITH_BODY:
                refused.headers = {**refused.headers, "connection": "close"}
        kind = route_kind(path, scope["method"])
        scoring = kind == "scoring"
        load = self.scoring
        cap = load.cap
        if refused is None and scoring and cap is not None and load.in_flight >= cap:
            # Keep-alive: the body (small, under the scoring limit) is read by the server's HTTP
            # parser anyway, and a client retrying after 429 should not pay for a new connection.
            refused = TooManyRequests(
                f"the server is at its limit of {cap} scoring requests in progress; retry shortly",
                retry_after_s=1,
            )
            refused.code = refused.reason = "overloaded"
        if refused is not None:
            await self._refuse(scope, send, rid, refused)
            request_id_var.reset(token)
            return

        received = 0
        started = False

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
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode("latin-1")))
                message["headers"] = headers
            await send(message)

        # The route template is known only after routing: count in flight by kind of route.
        metrics = self.metrics
        in_flight = metrics.in_flight_count(kind)
        in_flight.n += 1
        if scoring:
            load.in_flight += 1
        try:
            await self.app(scope, limited_receive, send_with_id)
        except Exception as exc:
            # Starlette would answer a plain-text 500 without the request id; the handlers map
            # every known error, so this is a bug: log it whole and say where to look.
            log.exception("unhandled error on %s %s", scope["method"], path)
            if not started:  # else the response is cut short: the client sees a broken body
                internal = ServiceError(f"internal error ({type(exc).__name__}); see the log")
                await _send_error(send, rid, path, internal)
        finally:
            in_flight.n -= 1
            if scoring:
                load.in_flight -= 1
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

    async def _refuse(self, scope: Scope, send: Send, rid: str, err: ServiceError) -> None:
        """Answer ``err`` before routing and count it: no route ran, no body was read."""
        await _send_error(send, rid, scope["path"], err)
        metrics = self.metrics
        model = self.model_label(_model_in_path(scope["path"], scope.get("query_string", b"")))
        if err.reason is not None:
            metrics.child(metrics.rejections, model, err.reason).inc()
        metrics.child(metrics.requests, model, REFUSED_ROUTE, str(err.status)).inc()


class ScoringLoad:
    """Scoring requests in progress, and the cap above which more are shed (None: no cap).

    One per application, shared by every :class:`ServiceMiddleware` instance in it: the scoring
    fast path (service/fastpath.py) runs its own instance, and shedding must count both."""

    __slots__ = ("cap", "in_flight")

    def __init__(self, cap: int | None = None) -> None:
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"the scoring in-flight cap must be a positive integer, got {cap!r}")
        self.cap = cap
        self.in_flight = 0


# The route label of requests refused before routing (the route template is not known yet).
REFUSED_ROUTE = "_refused"
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


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


async def _send_error(send: Send, rid: str, path: str, err: ServiceError) -> None:
    """Answer ``err`` in the route's error shape, with its headers and the request id."""
    body = orjson.dumps(err.document(path, rid))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", rid.encode("latin-1")),
    ]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
