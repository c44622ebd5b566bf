"""What is decided about a request before it is routed: its id, its body limit, and whether it
is refused (413 by ``Content-Length``, 401 / 403 by token, 429 when scoring is overloaded).

One :class:`Admission` per application, shared by every layer that takes these decisions: the
ASGI middleware (service/middleware.py, instantiated twice: the ordinary stack and the scoring
fast path) and the HTTP protocol (service/shedding.py), which refuses an overloaded scoring
request on its headers, before uvicorn parses its body or starts a task for it. Both answer the
same refusal with the same body and count it the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from service.errors import PayloadTooLarge, ServiceError, TooManyRequests
from service.metrics import Metrics
from service.queue_delay import QueueDelay

Headers = Iterable[tuple[bytes, bytes]]

# The route label of requests refused before routing (the route template is not known yet).
REFUSED_ROUTE = "_refused"
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class ScoringLoad:
    """Scoring requests in progress, and the two reasons to refuse one more before reading it.

    - **Delay**: each serving model's :class:`~service.queue_delay.QueueDelay` says whether its
      queue stands above the delay target (``track``); a request for that model is then shed.
    - **Cap**: ``cap`` bounds the requests in progress whatever their model (None: no bound).
      It is a memory bound (each holds its body), not a latency budget, and is set well above
      the concurrency a process serves by batching.

    One per application: every layer that admits scoring requests counts against it.
    """

    __slots__ = ("_delays", "_per_model", "_shedding", "cap", "in_flight")

    def __init__(self, cap: int | None = None) -> None:
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"the scoring in-flight cap must be a positive integer, got {cap!r}")
        self.cap = cap
        self.in_flight = 0
        self._per_model: dict[str | None, int] = {}  # in progress, by the model the path names
        self._delays: dict[str, QueueDelay] = {}
        self._shedding = 0  # tracked models shedding now: the cheap test before parsing a path

    def track(self, model: str, **delay: Any) -> QueueDelay:
        """A new :class:`QueueDelay` (keyword arguments: its own) for the version of ``model``
        now serving; it replaces the model's previous one."""
        tracked = QueueDelay(**delay)
        tracked.on_change = lambda shedding: self._changed(model, tracked, shedding)
        self.untrack(model)
        self._delays[model] = tracked
        return tracked

    def untrack(self, model: str, delay: QueueDelay | None = None) -> None:
        """Stop deciding by ``model``'s delay (only if it is ``delay``, when given)."""
        current = self._delays.get(model)
        if current is None or (delay is not None and current is not delay):
            return
        del self._delays[model]
        if current.shedding:
            self._shedding -= 1

    def _changed(self, model: str, delay: QueueDelay, shedding: bool) -> None:
        if self._delays.get(model) is delay:
            self._shedding += 1 if shedding else -1

    @property
    def saturated(self) -> bool:
        """Whether one more scoring request would exceed the cap."""
        return self.cap is not None and self.in_flight >= self.cap

    @property
    def may_refuse(self) -> bool:
        """Whether any scoring request could be refused now (cheap: no path parsed)."""
        return self._shedding > 0 or self.saturated

    def shedding(self, model: str | None) -> QueueDelay | None:
        """The delay that refuses a new request for ``model`` now, if one does."""
        delay = self._delays.get(model) if model is not None else None
        in_progress = self._per_model.get(model, 0)
        return delay if delay is not None and delay.refuses(in_progress) else None

    def enter(self, model: str | None) -> None:
        """A scoring request for ``model`` (as its path names it) was admitted."""
        self.in_flight += 1
        self._per_model[model] = self._per_model.get(model, 0) + 1

    def leave(self, model: str | None) -> None:
        """An admitted scoring request for ``model`` ended."""
        self.in_flight -= 1
        left = self._per_model[model] - 1
        if left:
            self._per_model[model] = left
        else:
            del self._per_model[model]  # bounded by what is in progress, not by names ever seen


@dataclass(slots=True)
class Verdict:
    """The pre-routing decision about one request."""

    request_id: str
    kind: str  # route_kind(path, method)
    model: str | None  # the model a scoring path names (None for other routes)
    limit: int  # the largest body the route accepts
    refused: ServiceError | None


class Admission:
    """The decisions taken before routing, and the counting of what they refuse.

    ``limit_for(path, method)`` gives the largest body a route accepts; ``model_label(name)``
    bounds the model label to known models; ``refusal(path, headers)`` says why a caller may not
    make a request (401 / 403, :mod:`service.access`); ``scoring`` says when a scoring
    request is shed.
    """

    def __init__(
        self,
        *,
        metrics: Metrics,
        limit_for: Callable[[str, str], int],
        model_label: Callable[[str | None], str],
        scoring: ScoringLoad | None = None,
        refusal: Callable[[str, Headers], ServiceError | None] | None = None,
    ) -> None:
        self.metrics = metrics
        self.limit_for = limit_for
        self.model_label = model_label
        self.scoring = scoring if scoring is not None else ScoringLoad()
        self.refusal = refusal

    def decide(self, path: str, method: str, headers: Headers, query: bytes = b"") -> Verdict:
        """The request's id (the client's ``X-Request-ID``, else a new one), its kind of route,
        its body limit, and the refusal it gets before routing, if any: 413 for a declared
        ``Content-Length`` over the limit, then tokens, then 429 ``overloaded`` for scoring at
        the in-flight cap or for a model whose queue stands above the delay target."""
        rid, declared = _id_and_length(headers)
        # 32 random hex digits like uuid4().hex, without building a UUID object per request.
        rid = rid[:128] if rid else os.urandom(16).hex()
        limit = self.limit_for(path, method)
        kind = route_kind(path, method)
        refused: ServiceError | None = None
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            what = f"{declared} bytes" if declared.isdigit() else "the body"
            refused = PayloadTooLarge(f"{what} exceeds this route's limit of {limit} bytes")
            refused.headers = {"connection": "close"}  # the body is not read
        elif self.refusal is not None:
            refused = self.refusal(path, headers)
            if refused is not None and method in _WITH_BODY:
                refused.headers = {**refused.headers, "connection": "close"}
        model = _model_in_path(path, query) if kind == "scoring" else None
        if refused is None and kind == "scoring" and self.scoring.may_refuse:
            refused = self._overloaded(model)
        return Verdict(rid, kind, model, limit, refused)

    def _overloaded(self, model: str | None) -> ServiceError | None:
        """The 429 for a scoring request now, if it gets one. Keep-alive: the body (small,
        under the scoring limit) is read by the server's HTTP parser anyway, and a client
        retrying after 429 should not pay for a new connection."""
        load = self.scoring
        if load.saturated:
            message = (
                f"the server is at its limit of {load.cap} scoring requests in progress; "
                "retry shortly"
            )
        else:
            delay = load.shedding(model)
            if delay is None:
                return None
            message = (
                f"model {model!r} is overloaded: its requests have been waiting over "
                f"{delay.target_s * 1e3:g} ms for a batch; retry shortly"
            )
        refused = TooManyRequests(message, retry_after_s=1)
        refused.code = refused.reason = "overloaded"
        return refused

    def count_refusal(self, path: str, query: bytes, err: ServiceError) -> None:
        """Count a request refused before routing: its rejection reason and its answer."""
        metrics = self.metrics
        model = self.model_label(_model_in_path(path, query))
        if err.reason is not None:
            metrics.child(metrics.rejections, model, err.reason).inc()
        # Refused before routing: no version answered it.
        metrics.child(metrics.requests, model, "", REFUSED_ROUTE, str(err.status)).inc()


def error_response(
    rid: str, path: str, err: ServiceError
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """``err``'s body in the route's error shape, and its headers with the request id."""
    body = orjson.dumps(err.document(path, rid))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", rid.encode("latin-1")),
    ]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items()]
    return body, headers


def route_kind(path: str, method: str) -> str:
    """A bounded label for a raw path: scoring, management, health or other."""
    if path.endswith(("/predict", "/infer")):
        return "scoring"
    if path.startswith(("/models", "/v2/repository")):
        return "management"
    if path in ("/healthz", "/readyz", "/metrics") or path.startswith("/v2"):
        return "health"
    return "other"


def _id_and_length(headers: Headers) -> tuple[str | None, str | None]:
    """The first ``X-Request-ID`` and ``Content-Length`` values, in one pass over the headers."""
    rid = length = None
    for key, value in headers:
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
