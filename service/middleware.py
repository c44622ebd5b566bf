"""One pure-ASGI middleware for what every request needs: an id, a body limit, tokens, load
shedding, metrics, and a JSON answer whatever happens inside.

Pure ASGI (not Starlette's BaseHTTPMiddleware) because it sits on the hot path of single-row
requests, where each extra task and copy is visible in the latency.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.routing import Mount

from service.admission import Admission, error_response
from service.errors import PayloadTooLarge, ServiceError
from service.metrics import ServedVersion, served_version

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
    """Request ids (``X-Request-ID`` in and out), body size limits, in-flight and duration metrics
    (a scoring request's with the version that answered it: :class:`service.metrics.ServedVersion`).

    What is decided before routing (:class:`service.admission.Admission`: the request id, the
    route's body limit, 413 by ``Content-Length``, 401 / 403 by token, 429 when scoring is
    overloaded) is answered here, before the body is read, in the route's error shape and counted
    with the route label ``_refused``; a chunked body is counted against the limit as it streams,
    and answered 413 on a closed connection as soon as it crosses it. An exception no handler
    mapped becomes a JSON 500 with the request id (and the traceback in the log).

    Load shedding is what keeps admitted requests fast under overload: a rejection must cost far
    less than a prediction, or rejecting alone saturates the event loop and every request waits
    behind the backlog (see docs/reliability.md). The HTTP protocol of ``kestrel serve``
    (service/shedding.py) refuses most of them even earlier, on their headers; this catches the
    rest (other servers, pipelined requests).
    """

    def __init__(self, app: ASGIApp, *, admission: Admission) -> None:
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        path = scope["path"]
        admission = self.admission
        verdict = admission.decide(
            path, scope["method"], scope["headers"], scope.get("query_string", b"")
        )
        rid, limit = verdict.request_id, verdict.limit
        token = request_id_var.set(rid)
        status = 500
        if verdict.refused is not None:
            await _send_error(send, rid, path, verdict.refused)
            admission.count_refusal(path, scope.get("query_string", b""), verdict.refused)
            request_id_var.reset(token)
            return
        kind = verdict.kind
        scoring = kind == "scoring"
        load = admission.scoring

        received = 0
        started = False
        cut_off = False  # a streamed body crossed the limit: answered 413 here

        async def limited_receive() -> Message:
            nonlocal received, status, started, cut_off
            if cut_off:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # A body without Content-Length (chunked) past the limit: answered now,
                    # with the connection closed so that the server stops reading it, whatever
                    # the app does with a half-read body (a multipart parser would answer 400).
                    # To the app, the client has left.
                    cut_off = True
                    if not started:
                        err = PayloadTooLarge(
                            f"request body exceeds this route's limit of {limit} bytes"
                        )
                        err.headers = {"connection": "close"}
                        await _send_error(send, rid, path, err)
                        status, started = err.status, True
                    return {"type": "http.disconnect"}
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if cut_off:  # the app's answer to a request already answered
                return
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode("latin-1")))
                message["headers"] = headers
            await send(message)

        # The route template is known only after routing: count in flight by kind of route.
        metrics = admission.metrics
        in_flight = metrics.in_flight_count(kind)
        in_flight.n += 1
        served = None  # the version a scoring request reached, for its metrics
        if scoring:
            load.enter(verdict.model)
            served = ServedVersion()
            served_token = served_version.set(served)
        try:
            await self.app(scope, limited_receive, send_with_id)
        except ClientDisconnect:
            # The client left before sending its whole body: there is nobody to answer, and it
            # is not the server's error. Counted as 499, nginx's "client closed request".
            if not cut_off:  # else the 413 above stands: the app saw the disconnect it was given
                status = CLIENT_CLOSED_REQUEST
        except Exception as exc:
            # Starlette would answer a plain-text 500 without the request id; the handlers map
            # every known error, so this is a bug: log it whole and say where to look.
            log.exception("unhandled error on %s %s", scope["method"], path)
            if not started:  # else the response is cut short: the client sees a broken body
                internal = ServiceError(f"internal error ({type(exc).__name__}); see the log")
                await _send_error(send, rid, path, internal)
        finally:
            in_flight.n -= 1
            end = time.perf_counter()
            if served is not None:
                load.leave(verdict.model)
                served_version.reset(served_token)
            route = _route(scope)
            if served is not None and served.version:
                model, version = served.model, served.version
            else:
                model = admission.model_label(scope.get("path_params", {}).get("name"))
                version = ""
            if cut_off:
                metrics.child(metrics.rejections, model, PayloadTooLarge.reason).inc()
            elapsed = end - start
            metrics.observe_request(model, version, route, status, elapsed)
            if access_log.isEnabledFor(logging.INFO):
                log_access(scope["method"], scope["path"], status, route, model, elapsed)
            request_id_var.reset(token)


CLIENT_CLOSED_REQUEST = 499


def log_access(method: str, path: str, status: int, route: str, model: str, elapsed: float) -> None:
    """One answered request's access-log line (the caller checks the level: a hot path)."""
    access_log.info(
        "%s %s %d %.2f ms",
        method,
        path,
        status,
        elapsed * 1e3,
        extra={"status": status, "route": route, "model": model, "ms": elapsed * 1e3},
    )


def _route(scope: Scope) -> str:
    """The template of the route that answered, or ``unmatched`` if none did.

    FastAPI records its own routes in the scope. Of the Starlette routes it also dispatches
    (FastAPI's ``/openapi.json``, the mount of the docs' assets) only the endpoint is left, so the
    route is found again among the router's: few requests take that way, none of them scoring.
    """
    route = scope.get("route")
    if route is not None:
        return getattr(route, "path", None) or "unmatched"
    endpoint = scope.get("endpoint")
    if endpoint is not None:
        for candidate in getattr(scope.get("router"), "routes", ()):
            if isinstance(candidate, Mount):
                answered = candidate.app
            else:
                answered = getattr(candidate, "endpoint", None)
            if answered is endpoint:
                return candidate.path_format
    return "unmatched"


async def _send_error(send: Send, rid: str, path: str, err: ServiceError) -> None:
    """Answer ``err`` in the route's error shape, with its headers and the request id."""
    body, headers = error_response(rid, path, err)
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
