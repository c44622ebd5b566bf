"""The HTTP application: ``create_app(settings)``.

Routes are thin: they parse HTTP, check tokens and call the :class:`ModelManager`, which knows
nothing about HTTP. Every error leaves as ``{"error": {"code", "message", "request_id"}}``.

Registration is asynchronous: ``POST /models`` validates the upload (format, trusted types,
supported classes) and answers ``202 Accepted`` with a ``Location`` to poll while the version
compiles, warms and passes its parity check; with ``?wait=true`` it answers only when the version
is READY (``201``) or FAILED (``422`` with the reason), waiting at most ``register_wait_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import compiler
import lazy as lz
from service import artifacts, batcher, codecs, fastpath, openapi, runtime, store
from service.access import Auth
from service.admission import Admission, ScoringLoad
from service.errors import (
    BadRequest,
    Forbidden,
    InvalidInput,
    ModelRejected,
    PayloadTooLarge,
    ServiceError,
    http_error_for,
)
from service.metrics import Metrics
from service.middleware import ServiceMiddleware, request_id_var
from service.models import ModelManager
from service.preload import Preloader
from service.settings import Settings
from service.store import ModelStore
from service.versions import ModelOptions, State, Upload, failure_error
from service.web import json_response, query_flag, read_body

log = logging.getLogger("kestrel.app")

DEADLINE_HEADER = "x-kestrel-timeout-ms"
# Swagger UI's script, styles and icon (public, like /docs).
DOCS_ASSETS_URL = "/docs/static"
# Scoring routes dispatched past FastAPI's router (see service/fastpath.py).
SCORING_PATHS = (
    "/models/{name}/predict",
    "/models/{name}/versions/{version}/predict",
    "/v2/models/{name}/infer",
    "/v2/models/{name}/versions/{version}/infer",
)
# Errors of the layers below that carry a client-facing meaning (see errors.http_error_for).
LIBRARY_ERRORS: tuple[type[Exception], ...] = (
    compiler.CompilerError,
    artifacts.ArtifactError,
    batcher.BatcherError,
    store.StoreError,
    ValueError,  # parity and codec errors; anything unmapped is logged and answered 500
)


def error_response(err: ServiceError, path: str = "") -> Response:
    """The error as JSON, in the shape of the route's API (:meth:`ServiceError.document`)."""
    return json_response(err.document(path, request_id_var.get()), err.status, err.headers)


def create_app(
    settings: Settings | None = None, registry: CollectorRegistry | None = None
) -> FastAPI:
    """The Kestrel application for ``settings`` (environment by default)."""
    settings = settings or Settings()
    if settings.cache_dir is not None:
        # Native kernels' machine code (numba, lazy/forest.py) beside the executables, under the
        # same trust: numba reads this when a model first needs it, after start-up.
        os.environ.setdefault("NUMBA_CACHE_DIR", str(settings.cache_dir / "numba"))
    metrics = Metrics(registry)
    cache = lz.ExecutableCache(disk_dir=settings.cache_dir)
    metrics.add_cache_collector(cache)
    store = ModelStore(settings.store_url, dict(settings.store_options) or None)
    manager = ModelManager(settings, store, metrics, cache, ScoringLoad(settings.max_in_flight))
    auth = Auth(
        settings.admin_token.get_secret_value() if settings.admin_token else None,
        settings.scoring_token.get_secret_value() if settings.scoring_token else None,
    )
    # Resolved now: a preload path naming no (or several) model files stops `serve` at once.
    preloader = (
        Preloader.resolve(
            settings.preload, settings.preload_name, allow_pickle=settings.allow_pickle
        )
        if settings.preload is not None
        else None
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.start_preparing()
        tasks = [asyncio.create_task(_start(manager, settings, preloader))]
        if settings.poll_interval_s > 0:
            tasks.append(asyncio.create_task(_poll(manager, settings.poll_interval_s)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await manager.close()

    # /docs: Swagger UI with its scripts and styles served from the installed package, so it
    # renders on a machine without internet access. No /redoc: ReDoc loads its logo from a CDN.
    app = FastAPIOffline(
        static_url=DOCS_ASSETS_URL,
        redoc_url=None,
        title="Kestrel",
        version="0.1.0",
        summary="Serve scikit-learn, LightGBM and XGBoost models compiled to XLA.",
        lifespan=lifespan,
        # Off unless asked for: FastAPI looks up the global OpenTelemetry providers on every
        # request (a visible share of a single-row score's CPU) even when none is configured.
        telemetry=None if settings.otel else {"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings, app.state.manager, app.state.metrics = settings, manager, metrics
    app.state.auth, app.state.cache, app.state.store = auth, cache, store

    def is_ready() -> bool:
        """Stored models recovered, and the preloaded one (if any) READY: /readyz, /v2 ready."""
        return manager.is_ready() and (preloader is None or preloader.ready)

    app.state.is_ready = is_ready

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        _count_rejection(metrics, manager, request, exc)
        return error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        # Tokens were checked by the middleware, before the parameters were validated.
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        err = InvalidInput(f"invalid request: {problems}")
        _count_rejection(metrics, manager, request, err)
        return error_response(err, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _routing_error(request: Request, exc: StarletteHTTPException) -> Response:
        # No route (404) or no such method on it (405): the same error shape as every other.
        err = ServiceError(str(exc.detail), headers=dict(exc.headers or {}))
        err.status = exc.status_code
        err.code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        return error_response(err, request.url.path)

    async def _library_error(request: Request, exc: Exception) -> Response:
        # Registered per library base class so it runs inside the middleware (request id,
        # metrics); a bare ``Exception`` handler would run outside it.
        mapped = http_error_for(exc)
        if mapped is not None:
            _count_rejection(metrics, manager, request, mapped)
            return error_response(mapped, request.url.path)
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        internal = ServiceError(f"internal error ({type(exc).__name__}); see the log")
        return error_response(internal, request.url.path)

    for error_class in LIBRARY_ERRORS:
        app.add_exception_handler(error_class, _library_error)

    # -- health and metrics ------------------------------------------------------------------
    @app.get("/healthz", tags=["health"], summary="Liveness", responses=openapi.ok(openapi.Health))
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get(
        "/readyz",
        tags=["health"],
        summary="Readiness: stored and preloaded models loaded",
        responses={
            **openapi.ok(openapi.Health),
            503: {"model": openapi.Health, "description": "Recovering or preloading"},
        },
    )
    async def readyz() -> Response:
        if not manager.is_ready():
            return json_response({"status": "recovering"}, 503)
        if preloader is not None and not preloader.ready:
            if preloader.error is not None:
                return json_response({"status": "failed", "error": preloader.error}, 503)
            return json_response({"status": "preloading", "model": preloader.name}, 503)
        return json_response({"status": "ready"})

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics",
        response_class=PlainTextResponse,
    )
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- model management ----------------------------------------------------------------------
    @app.post(
        "/models",
        tags=["models"],
        status_code=202,
        summary="Register a model version",
        responses={
            201: {"model": openapi.VersionDescription, "description": "READY (with ?wait=true)"},
            202: {"model": openapi.VersionDescription, "description": "Accepted: poll Location"},
            **openapi.errors(400, *openapi.AUTH, 409, 413, 422),
        },
    )
    async def register_model(
        request: Request,
        file: Annotated[UploadFile, File(description="the model artifact")],
        name: Annotated[str, Form(description="model name")],
        version: Annotated[str | None, Form()] = None,
        format: Annotated[
            str | None, Form(description="skops, lightgbm, xgboost-json, ...")
        ] = None,
        sample: Annotated[str | None, Form(description="JSON rows for schema and parity")] = None,
        options: Annotated[str | None, Form(description="JSON object of ModelOptions")] = None,
        wait: Annotated[
            bool,
            Query(
                description="answer when the load ends: 201 (READY, or RETIRED since), or its error"
            ),
        ] = False,
    ) -> Response:
        data = await file.read()
        if not data:
            raise BadRequest("field 'file': the uploaded file is empty")
        if len(data) > settings.max_upload_bytes:  # the middleware refuses most before this
            raise PayloadTooLarge(f"the upload exceeds {settings.max_upload_bytes} bytes")
        upload = Upload(
            name=_form_name("name", name, "model name"),
            data=data,
            filename=file.filename or "",
            version=_form_name("version", version or None, "version"),
            format=_parse_format(format or None),
            sample=_parse_sample(sample),
            options=_parse_options(options),
        )
        fmt = upload.format
        if fmt == "pickle" or (fmt is None and data[:1] == b"\x80"):
            upload.pickle_allowed = _pickle_allowed(settings, auth, request)
        mv = await manager.register(upload)
        location = f"/models/{mv.name}/versions/{mv.version}"
        if wait:
            await manager.wait(mv, settings.register_wait_s)
            if mv.state is State.FAILED:
                raise failure_error(mv)
            # Created, whether still READY or already RETIRED (deleted or overtaken by a newer
            # version before this coroutine ran again): 202 would send the client to poll a
            # version that has finished loading.
            if mv.state is not State.LOADING:
                return json_response(mv.describe(), 201, {"Location": location})
        return json_response(mv.describe(), 202, {"Location": location})

    @app.get(
        "/models",
        tags=["models"],
        summary="List models",
        responses={**openapi.ok(openapi.ModelList), **openapi.errors(*openapi.AUTH)},
    )
    async def list_models(request: Request) -> Response:
        out = []
        for name in manager.names():
            current = manager.current(name)
            out.append(
                {
                    "name": name,
                    "current": current.version if current else None,
                    "versions": [
                        {"version": v.version, "state": v.state.value}
                        for v in manager.versions(name)
                    ],
                }
            )
        return json_response({"models": out})

    @app.get(
        "/models/{name}",
        tags=["models"],
        summary="Describe a model",
        responses={**openapi.ok(openapi.ModelDescription), **openapi.errors(*openapi.AUTH, 404)},
    )
    async def describe_model(request: Request, name: str) -> Response:
        current = manager.current(name)
        return json_response(
            {
                "name": name,
                "current": current.version if current else None,
                "versions": [v.describe() for v in manager.versions(name)],
            }
        )

    @app.get(
        "/models/{name}/versions/{version}",
        tags=["models"],
        summary="Describe a version",
        responses={**openapi.ok(openapi.VersionDescription), **openapi.errors(*openapi.AUTH, 404)},
    )
    async def describe_version(request: Request, name: str, version: str) -> Response:
        return json_response(manager.lookup(name, version).describe())

    @app.delete(
        "/models/{name}",
        tags=["models"],
        status_code=204,
        summary="Delete a model and all its versions",
        responses=openapi.errors(*openapi.AUTH, 404),
    )
    async def delete_model(request: Request, name: str) -> Response:
        await manager.delete(name)
        return Response(status_code=204)

    @app.delete(
        "/models/{name}/versions/{version}",
        tags=["models"],
        status_code=204,
        summary="Delete one version",
        responses=openapi.errors(*openapi.AUTH, 404),
    )
    async def delete_version(request: Request, name: str, version: str) -> Response:
        await manager.delete(name, version)
        return Response(status_code=204)

    # -- scoring -------------------------------------------------------------------------------
    async def score(request: Request, name: str, version: str | None) -> Response:
        body = await read_body(request)
        content_type, timeout = _scoring_headers(request.scope)
        decoded = codecs.decode_predict(body, content_type)
        query, strict = None, settings.strict_columns
        if request.scope["query_string"]:
            params = request.query_params
            query = params.get("outputs")
            strict = query_flag(params, "strict_columns", strict)
        outputs = decoded.outputs or codecs.parse_outputs(query, field="outputs")
        result = await manager.predict(
            name,
            version,
            decoded.data,
            outputs=outputs,
            deadline=deadline_from(timeout, settings),
            strict_columns=strict,
        )
        t0 = time.perf_counter()
        doc: dict[str, Any] = {
            "model": name,
            "version": result.version.version,
            "rows": result.rows,
            "outputs": {k: codecs.jsonable(v) for k, v in result.outputs.items()},
        }
        headers = None
        if result.ignored:
            doc["warnings"] = [codecs.ignored_columns_warning(result.ignored)]
            headers = {codecs.IGNORED_COLUMNS_HEADER: codecs.ignored_columns_header(result.ignored)}
        response = json_response(doc, headers=headers)
        metrics.child(metrics.codec_seconds, name, result.version.version, "encode").observe(
            result.decode_s + time.perf_counter() - t0
        )
        return response

    predict_doc = (
        "Score rows. Body by Content-Type: JSON (rows as objects or arrays, or "
        '{"rows"|"columns"|"instances": ..., "outputs": [...]}), Arrow IPC, or .npy. '
        f"Optional deadline header {DEADLINE_HEADER}."
    )

    scoring_doc: dict[str, Any] = {
        "tags": ["scoring"],
        "description": predict_doc,
        "responses": {**openapi.PREDICTION_OK, **openapi.errors(*openapi.SCORING)},
        "openapi_extra": openapi.PREDICT_EXTRA,
    }

    @app.post("/models/{name}/predict", summary="Score with the current version", **scoring_doc)
    async def predict_current(request: Request, name: str) -> Response:
        return await score(request, name, None)

    @app.post(
        "/models/{name}/versions/{version}/predict",
        summary="Score with a given version",
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

    from service.v2 import add_v2_routes

    add_v2_routes(app, manager, settings)
    fastpath.install(app, SCORING_PATHS)
    openapi.install(app)

    def limit_for(path: str, method: str) -> int:
        if method == "POST" and path.rstrip("/") in ("/models", "/v2/repository/models"):
            return settings.max_upload_bytes
        return settings.max_body_bytes

    def model_label(name: str | None) -> str:
        return name if name is not None and manager.knows(name) else "_none"

    # One for the application: the middleware's two instances (the ordinary stack's and the
    # fast path's) and the HTTP protocol of `kestrel serve` (service/shedding.py) share it.
    scoring = manager.scoring_load
    metrics.in_flight_limit.set_function(lambda: math.inf if scoring.cap is None else scoring.cap)
    app.state.admission = Admission(
        metrics=metrics,
        limit_for=limit_for,
        model_label=model_label,
        scoring=scoring,
        refusal=auth.refusal,
    )
    app.add_middleware(ServiceMiddleware, admission=app.state.admission)
    return app


_CONTENT_TYPE = b"content-type"
_DEADLINE = DEADLINE_HEADER.encode()


def _scoring_headers(scope: Any) -> tuple[str | None, str | None]:
    """The first Content-Type and deadline header values, in one pass over the raw headers."""
    content_type = timeout = None
    for key, value in scope["headers"]:
        if key == _CONTENT_TYPE:
            if content_type is None:
                content_type = value.decode("latin-1")
        elif key == _DEADLINE and timeout is None:
            timeout = value.decode("latin-1")
    return content_type, timeout


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


def _form_name(field: str, value: str | None, what: str) -> str | None:
    """A model name or version from the form, checked here to name the field it came in."""
    if value is None:
        return None
    try:
        return store.validate_name(value, what)
    except store.InvalidName as exc:
        raise BadRequest(f"field {field!r}: {exc}") from None


def _parse_format(value: str | None) -> str | None:
    if value is not None and value not in artifacts.FORMATS:
        raise ModelRejected(
            f"field 'format': unknown model format {value!r}; accepted: "
            f"{', '.join(artifacts.FORMATS)} (or leave it out: the file's content tells)"
        )
    return value


def _parse_sample(text: str | None) -> Any:
    if text is None or not text.strip():
        return None
    # NaN and Infinity too: a sample of real rows has missing values, and the parity check
    # compares the source and the compiled model on them as they are.
    doc = codecs.parse_json_field(text, "sample", allow_nan=True)
    if isinstance(doc, dict) and "rows" in doc:
        doc = doc["rows"]
    if isinstance(doc, dict) and "columns" in doc:
        doc = doc["columns"]
    if not isinstance(doc, (list, dict)) or not doc:
        raise BadRequest(
            "field 'sample' must be JSON rows (a non-empty list) or {column: [values]}"
        )
    return doc


def _parse_options(text: str | None) -> ModelOptions:
    if text is None or not text.strip():
        return ModelOptions()
    doc = codecs.parse_json_field(text, "options")
    if not isinstance(doc, dict):
        raise BadRequest(f"field 'options' must be a JSON object, got {type(doc).__name__}")
    try:
        return ModelOptions.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(options)'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInput(f"field 'options': {problems}") from None


def _pickle_allowed(settings: Settings, auth: Auth, request: Request) -> bool:
    if not settings.allow_pickle:
        raise Forbidden(
            "pickle/joblib uploads are disabled (they can run code); upload .skops, LightGBM "
            "text or XGBoost JSON, or ask the operator to set KESTREL_ALLOW_PICKLE=true"
        )
    if not auth.is_admin(request.scope["headers"]):
        raise Forbidden("pickle/joblib uploads need the admin token (KESTREL_ADMIN_TOKEN)")
    return True


def _count_rejection(
    metrics: Metrics, manager: ModelManager, request: Request, err: ServiceError
) -> None:
    if err.reason is None:
        return
    name = request.path_params.get("name") or request.query_params.get("model")
    label = name if name is not None and manager.knows(name) else "_none"
    metrics.rejections.labels(label, err.reason).inc()


async def _start(manager: ModelManager, settings: Settings, preloader: Preloader | None) -> None:
    await manager.recover()
    if preloader is not None:  # after recovery: a store already serving the file is reused
        await preloader.run(manager, settings.register_wait_s)
    if settings.demo_model:
        from service.demo_model import register_demo

        await register_demo(manager)


async def _poll(manager: ModelManager, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await manager.sync()
        except Exception:  # a store hiccup must not stop polling
            log.exception("re-reading the store's manifest failed")
