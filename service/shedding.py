"""Load shedding inside the HTTP protocol: an overloaded scoring request refused on its headers.

Under overload most requests are refused, so what a refusal costs decides what is left for the
admitted ones (docs/reliability.md, "Refusals on the headers"). Refused in the ASGI middleware,
a request has already cost uvicorn a request/response cycle, an ``asyncio`` task, its body
gathered into one ``bytes``, and an ASGI call through the application's outer layers. :func:`protocol_for` gives uvicorn an HTTP protocol
that, when scoring is overloaded, takes the same decision (:class:`service.admission.Admission`)
as soon as the request line and headers are parsed, writes the same answer straight to the
transport, and lets the parser skip the body: no task, no ASGI call, no body kept.

Only a request with nothing ahead of it on its connection is answered here (a pipelined one
waits its turn in uvicorn, and the middleware refuses it then), and the connection is kept open
unless the client asked to close it, sent ``Expect: 100-continue`` (it may never send the body
the parser would wait for), or the refusal says to close (413: the body is not read).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service.admission import Admission, error_response
from service.errors import ServiceError


class SheddingHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing scoring requests on their headers while the
    application sheds scoring load. Subclassed per application by
    :func:`protocol_for`, which sets :attr:`admission`."""

    admission: Admission

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # While the body of a request answered here streams in: the bytes it may still send
        # before the connection is closed (its route's body limit); None when not discarding.
        self._discard_budget: int | None = None

    def on_headers_complete(self) -> None:
        if not (self.admission.scoring.may_refuse and self._refused_on_headers()):
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._discard_budget is None:
            super().on_body(body)
            return
        self._discard_budget -= len(body)
        if self._discard_budget < 0:  # a chunked body past the route's limit: stop reading it
            self.transport.close()

    def on_message_complete(self) -> None:
        if self._discard_budget is None:
            super().on_message_complete()
            return
        self._discard_budget = None
        self.on_response_complete()  # counts it, then the keep-alive timer or the next request

    def _refused_on_headers(self) -> bool:
        """Answer the request now if the application would refuse it before routing; whether
        it did. Leaves everything else, and anything not plainly a scoring POST, to uvicorn."""
        if (
            (self.cycle is not None and not self.cycle.response_complete)
            or self.root_path
            or self.parser.get_method() != b"POST"
            or self.parser.should_upgrade()
        ):
            return False
        url = httptools.parse_url(self.url)
        path = url.path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        verdict = self.admission.decide(path, "POST", self.headers, url.query or b"")
        refused = verdict.refused
        if refused is None or verdict.kind != "scoring":
            return False
        keep_alive = (
            not self.expect_100_continue
            and self.parser.should_keep_alive()
            and self.parser.get_http_version() == "1.1"
            and "connection" not in refused.headers
        )
        self.transport.write(self._response(verdict.request_id, path, refused, keep_alive))
        self.admission.count_refusal(path, url.query or b"", refused)
        if keep_alive:
            self._discard_budget = verdict.limit
        else:
            self._discard_budget = 0  # whatever arrives before the close is dropped
            self.transport.close()
        return True

    def _response(self, rid: str, path: str, err: ServiceError, keep_alive: bool) -> bytes:
        body, headers = error_response(rid, path, err)
        lines = [STATUS_LINE[err.status]]
        for name, value in (*self.server_state.default_headers, *headers):
            lines += [name, b": ", value, b"\r\n"]
        if not keep_alive and "connection" not in err.headers:
            lines.append(b"connection: close\r\n")
        lines += [b"\r\n", body]
        return b"".join(lines)


def protocol_for(admission: Admission) -> type[SheddingHttpProtocol]:
    """The HTTP protocol class to give uvicorn (``http=``) for an application deciding with
    ``admission``."""
    return type("SheddingHttpProtocol", (SheddingHttpProtocol,), {"admission": admission})
