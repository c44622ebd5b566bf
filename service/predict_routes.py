"""The native scoring routes: ``POST /models/{name}[/versions/{version}]/predict`` and
``POST /predict?model=``. Their handlers are dispatched past FastAPI's router
(:mod:`service.fastpath`); FastAPI still documents them."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response

from service import codecs, openapi
from service.components import Components
from service.errors import BadRequest
from service.scoring import CONTRIBUTIONS
from service.settings import Settings
from service.web import ROUTE_KEY_HEADER, json_response, query_flag, read_body

DEADLINE_HEADER = "x-kestrel-timeout-ms"

PREDICT_DOC = (
    "Score rows. Body by Content-Type: JSON (rows as objects or arrays, or "
    '{"rows"|"columns"|"instances": ..., "outputs": [...]}), Arrow IPC, or .npy. '
    f"Optional deadline header {DEADLINE_HEADER}. The output 'contributions' (a version "
    'registered with options {"explain": true}) gives each row\'s per-column contributions.'
)


def add_predict_routes(app: FastAPI, parts: Components) -> None:
    settings, manager, metrics = parts.settings, parts.manager, parts.metrics

    async def score(request: Request, name: str, version: str | None) -> Response:
        body = await read_body(request)
        content_type, timeout, key = _scoring_headers(request.scope)
        decoded = codecs.decode_predict(body, content_type)
        query, strict, top_k = None, settings.strict_columns, None
        if request.scope["query_string"]:
            params = request.query_params
            query = params.get("outputs")
            strict = query_flag(params, "strict_columns", strict)
            top_k = codecs.parse_top_k(params.get("top_k"))
        outputs = decoded.outputs or codecs.parse_outputs(query, field="outputs")
        if top_k is not None and CONTRIBUTIONS not in (outputs or ()):
            raise BadRequest("query parameter 'top_k' applies to the output 'contributions'")
        result = await manager.predict(
            name,
            version,
            decoded.data,
            outputs=outputs,
            deadline=deadline_from(timeout, settings),
            strict_columns=strict,
            route_key=key,
        )
        t0 = time.perf_counter()
        doc: dict[str, Any] = {
            "model": result.version.name,
            "version": result.version.version,
            "rows": result.rows,
            "outputs": {k: codecs.jsonable(v) for k, v in result.outputs.items()},
        }
        explained = result.explained
        if explained is not None:
            contributions = result.outputs[CONTRIBUTIONS]
            doc["outputs"][CONTRIBUTIONS] = codecs.contribution_rows(
                contributions, explained.columns, top_k
            )
            if explained.outputs is not None:
                doc["contribution_outputs"] = explained.outputs
        headers = None
        if result.ignored:
            doc["warnings"] = [codecs.ignored_columns_warning(result.ignored)]
            headers = {codecs.IGNORED_COLUMNS_HEADER: codecs.ignored_columns_header(result.ignored)}
        response = json_response(doc, headers=headers)
        served = result.version
        metrics.child(metrics.codec_seconds, served.name, served.version, "encode").observe(
            result.decode_s + time.perf_counter() - t0
        )
        return response

    scoring_doc: dict[str, Any] = {
        "tags": ["scoring"],
        "description": PREDICT_DOC,
        "responses": {**openapi.PREDICTION_OK, **openapi.errors(*openapi.SCORING)},
        "openapi_extra": openapi.PREDICT_EXTRA,
    }

    @app.post(
        "/models/{name}/predict",
        summary="Score with the current version (name@alias: the version an alias names)",
        **scoring_doc,
    )
    async def predict_current(request: Request, name: str) -> Response:
        return await score(request, name, None)

    @app.post(
        "/models/{name}/versions/{version}/predict",
        summary="Score with a given version (or alias)",
        **scoring_doc,
    )
    async def predict_version(request: Request, name: str, version: str) -> Response:
        return await score(request, name, version)

    @app.post("/predict", summary="Score (model named by ?model=)", **scoring_doc)
    async def predict(
        request: Request,
        model: Annotated[str, Query(description="model name")],
        version: Annotated[str | None, Query()] = None,
    ) -> Response:
        return await score(request, model, version)


_CONTENT_TYPE = b"content-type"
_DEADLINE = DEADLINE_HEADER.encode()
_ROUTE_KEY = ROUTE_KEY_HEADER.encode()


def _scoring_headers(scope: Any) -> tuple[str | None, str | None, str | None]:
    """The first Content-Type, deadline and route key header values, in one pass over the raw
    headers."""
    content_type = timeout = route_key = None
    for key, value in scope["headers"]:
        if key == _CONTENT_TYPE:
            if content_type is None:
                content_type = value.decode("latin-1")
        elif key == _DEADLINE and timeout is None:
            timeout = value.decode("latin-1")
        elif key == _ROUTE_KEY and route_key is None:
            route_key = value.decode("latin-1")
    return content_type, timeout, route_key


def deadline_from(header: str | None, settings: Settings) -> float | None:
    """Absolute ``time.monotonic()`` deadline from a relative timeout in milliseconds."""
    timeout_s = settings.request_timeout_s
    if header is not None:
        try:
            ms = float(header)
        except ValueError:
            raise BadRequest(f"{DEADLINE_HEADER} must be a number of milliseconds") from None
        if not ms > 0:
            raise BadRequest(f"{DEADLINE_HEADER} must be positive, got {header}")
        timeout_s = ms / 1e3 if timeout_s is None else min(timeout_s, ms / 1e3)
    return None if timeout_s is None else time.monotonic() + timeout_s
