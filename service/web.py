"""Request and response primitives every route module shares (``app``, ``v2``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import Request, Response
from pydantic import TypeAdapter, ValidationError
from starlette.requests import ClientDisconnect

from service import codecs
from service.errors import BadRequest


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        codecs.encode_json(doc), status_code=status, media_type="application/json", headers=headers
    )


async def read_body(request: Request) -> bytes:
    """The whole request body, as ``request.body()`` reads it, without its async generator
    (a scoring request's largest fixed cost after the model)."""
    chunks = []
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                request._body = body  # what request.body() caches: a later call returns it too
                return body
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


_FLAG = TypeAdapter(bool)  # what FastAPI takes for a bool query parameter: true/false, 1/0, ...


def query_flag(params: Mapping[str, str], field: str, default: bool) -> bool:
    """The boolean query parameter ``field``, or ``default`` when absent; a 400 naming it else."""
    value = params.get(field)
    if value is None:
        return default
    try:
        return _FLAG.validate_python(value)
    except ValidationError:
        raise BadRequest(
            f"query parameter {field!r} must be true or false, got {value!r}"
        ) from None


#: Scoring requests with the same value of this header go to the same version where a model's
#: traffic is split (``Versions.route``).
ROUTE_KEY_HEADER = "x-kestrel-route-key"
