"""What every gRPC call goes through, as an HTTP request goes through the middleware: its
request id, the same admission (tokens, overload), the same error classes as gRPC status codes,
and the same request metrics.

A call is decided as the HTTP request it stands for (:class:`Call`: ``ModelInfer`` of ``iris``
is ``POST /v2/models/iris/infer``), so :class:`service.admission.Admission` and
:mod:`service.access` take their decisions on it unchanged: the same token for the same kind of
route, the same 429 ``overloaded``, the same in-flight counts. Metrics count it with the route
label ``grpc:`` followed by that route's template (``grpc:/v2/models/{name}/infer``: existing
panels and rules that select ``…/infer`` include it) and the status label the HTTP status the
same answer has over HTTP (so the 4xx / 5xx panels and alerts count gRPC errors too), and a
scoring call the version label of the version that answered it, as over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from service.admission import Admission
from service.errors import ServiceError, http_error_for
from service.metrics import ServedVersion, served_version
from service.middleware import CLIENT_CLOSED_REQUEST, access_log, log_access, request_id_var

T = TypeVar("T")

ROUTE_PREFIX = "grpc:"
REQUEST_ID = "x-request-id"

log = logging.getLogger(__name__)

# By the HTTP status of the error: gRPC itself answers RESOURCE_EXHAUSTED for a message over the
# size limit, so a request too large for the batcher (413) answers it too.
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(err: ServiceError) -> grpc.StatusCode:
    """The gRPC status of a service error (INTERNAL for a 500 or any status not listed)."""
    return _CODES.get(err.status, grpc.StatusCode.INTERNAL)


@dataclass(frozen=True, slots=True)
class Call:
    """A gRPC call as the HTTP request it stands for."""

    method: str  # the HTTP method of the equivalent route
    template: str  # its route template, e.g. /v2/models/{name}/infer
    name: str | None = None  # the model the call names, as sent
    version: str | None = None

    @property
    def path(self) -> str:
        """The equivalent path, each value percent-encoded: a name cannot add a segment."""
        path = self.template
        for key, value in (("{name}", self.name), ("{version}", self.version)):
            if value is not None:
                path = path.replace(key, urllib.parse.quote(value, safe="@"))
        return path


def model_call(method: str, template: str, name: str, version: str) -> Call:
    """The call for a model (and version: empty is the current one, as in the protocol)."""
    if version:
        head, tail = template.split("{name}", 1)
        return Call(method, f"{head}{{name}}/versions/{{version}}{tail}", name, version)
    return Call(method, template, name)


class Calls:
    """Runs gRPC handlers under the application's admission, error mapping and metrics."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    async def run(
        self, call: Call, context: grpc.aio.ServicerContext, handler: Callable[[], Awaitable[T]]
    ) -> T:
        """``handler()``'s answer; an error aborts the call with its status and message, and the
        request id (with ``Retry-After`` and the like) in the trailing metadata."""
        start = time.perf_counter()
        admission, metrics = self.admission, self.admission.metrics
        path = call.path
        headers = [(_bytes(k), _bytes(v)) for k, v in context.invocation_metadata() or ()]
        verdict = admission.decide(path, call.method, headers)
        token = request_id_var.set(verdict.request_id)
        trailing: list[tuple[str, str]] = [(REQUEST_ID, verdict.request_id)]
        try:
            if verdict.refused is not None:
                admission.count_refusal(path, b"", verdict.refused)
                await _abort(context, verdict.refused, trailing)
            kind, load = verdict.kind, admission.scoring
            in_flight = metrics.in_flight_count(kind)
            in_flight.n += 1
            served = None  # the version a scoring call reached, for its metrics
            if kind == "scoring":
                load.enter(verdict.model)
                served = ServedVersion()
                served_token = served_version.set(served)
            status, error = 500, None
            try:
                answer = await handler()
                status = 200
            except asyncio.CancelledError:  # the client left, or its deadline passed
                status = CLIENT_CLOSED_REQUEST
                raise
            except Exception as exc:
                error = self._service_error(exc, call)
                status = error.status
            finally:
                in_flight.n -= 1
                if served is not None:
                    load.leave(verdict.model)
                    served_version.reset(served_token)
                self._count(call, served, status, time.perf_counter() - start)
            if error is not None:
                await _abort(context, error, trailing)
            context.set_trailing_metadata(tuple(trailing))
            return answer
        finally:
            request_id_var.reset(token)

    def _service_error(self, exc: Exception, call: Call) -> ServiceError:
        """``exc`` as the error HTTP would answer, counted as a rejection where it is one."""
        mapped = http_error_for(exc)
        if mapped is None:
            log.exception("unhandled error on gRPC %s", call.template)
            return ServiceError(f"internal error ({type(exc).__name__}); see the log")
        if mapped.reason is not None:
            metrics = self.admission.metrics
            model = self.admission.model_label(call.name)
            metrics.child(metrics.rejections, model, mapped.reason).inc()
        return mapped

    def _count(self, call: Call, served: ServedVersion | None, status: int, elapsed: float) -> None:
        if served is not None and served.version:
            model, version = served.model, served.version
        else:
            model, version = self.admission.model_label(call.name), ""
        route = ROUTE_PREFIX + call.template
        self.admission.metrics.observe_request(model, version, route, status, elapsed)
        if access_log.isEnabledFor(logging.INFO):
            log_access("GRPC", call.path, status, route, model, elapsed)


async def _abort(
    context: grpc.aio.ServicerContext, err: ServiceError, trailing: list[tuple[str, str]]
) -> None:
    # The error's HTTP headers that mean something to a client (Retry-After, WWW-Authenticate);
    # not Connection, which concerns HTTP/1.1 only.
    headers = [(k.lower(), v) for k, v in err.headers.items() if k.lower() != "connection"]
    await context.abort(status_code(err), err.message, tuple(trailing + headers))


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("latin-1", "replace")


def metadata_value(context: grpc.aio.ServicerContext, key: str) -> str | None:
    """The first value of the call's metadata ``key`` (lower case), as HTTP reads a header."""
    return _first(context.invocation_metadata() or (), key)


def _first(metadata: Iterable[tuple[str, Any]], key: str) -> str | None:
    for k, v in metadata:
        if k == key:
            return v if isinstance(v, str) else v.decode("latin-1")
    return None
