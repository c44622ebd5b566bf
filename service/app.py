"""The HTTP application: ``create_app(settings)``, assembled from its parts.

Routes are thin: they parse HTTP, check tokens and call the :class:`ModelManager`, which knows
nothing about HTTP. Every error leaves as ``{"error": {"code", "message", "request_id"}}``.
The routes live by concern: health and metrics here, model management in
:mod:`service.model_routes`, native scoring in :mod:`service.predict_routes`, the Open Inference
Protocol in :mod:`service.v2` (and over gRPC, :mod:`service.grpc_v2`, started by the lifespan on
its own port); admission and the error shape in :mod:`service.middleware`.

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
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

import compiler
from service import artifacts, batcher, fastpath, openapi, runtime, store
from service.admission import Admission
from service.components import Components
from service.errors import InvalidInput, ServiceError, http_error_for
from service.middleware import ServiceMiddleware, request_id_var
from service.model_routes import add_model_routes
from service.models import ModelManager
from service.pod_sync import SettleWrites
from service.predict_routes import add_predict_routes
from service.settings import Settings
from service.v2 import add_v2_routes
from service.web import json_response

log = logging.getLogger("kestrel.app")

VERSION = "0.1.0"

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
    settings: Settings | None = None,
    registry: CollectorRegistry | None = None,
    *,
    pod_dir: Path | None = None,
) -> FastAPI:
    """The Kestrel application for ``settings`` (environment by default); ``pod_dir``: that of
    the pod this process is a worker of (service/pod.py)."""
    parts = Components.build(settings or Settings(), registry, pod_dir)
    admission = _admission(parts)
    # /docs: Swagger UI with its scripts and styles served from the installed package, so it
    # renders on a machine without internet access. No /redoc: ReDoc loads its logo from a CDN.
    app = FastAPIOffline(
        static_url=DOCS_ASSETS_URL,
        redoc_url=None,
        title="Kestrel",
        version=VERSION,
        summary="Serve scikit-learn, LightGBM and XGBoost models compiled to XLA.",
        lifespan=_lifespan(parts, admission, VERSION),
        # Off unless asked for: FastAPI looks up the global OpenTelemetry providers on every
        # request (a visible share of a single-row score's CPU) even when none is configured.
        telemetry=(
            None if parts.settings.otel else {"tracing": False, "metrics": False, "logs": False}
        ),
    )
    for part in ("settings", "manager", "metrics", "auth", "cache", "store"):
        setattr(app.state, part, getattr(parts, part))
    app.state.is_ready = parts.is_ready
    _add_error_handlers(app, parts)
    _add_health_routes(app, parts)
    add_model_routes(app, parts)
    add_predict_routes(app, parts)
    add_v2_routes(app, parts.manager, parts.settings)
    fastpath.install(app, SCORING_PATHS)
    openapi.install(app)
    app.state.admission = admission
    if parts.pod is not None:  # inside ServiceMiddleware: the wait is part of the request
        app.add_middleware(SettleWrites, pod=parts.pod.sync)
    app.add_middleware(ServiceMiddleware, admission=admission)
    return app


def _lifespan(
    parts: Components, admission: Admission, version: str
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        grpc_server = None
        # Bound first: a taken port stops the start. Imported only when on (grpcio, protobuf).
        if parts.settings.grpc_port is not None:
            from service.grpc_v2 import GrpcServer, InferenceServicer

            servicer = InferenceServicer(
                parts.manager, parts.settings, admission, parts.is_ready, version
            )
            grpc_server = GrpcServer(servicer, parts.settings, share_port=parts.pod is not None)
            await grpc_server.start()
        prepared = parts.manager.loader.prepare_runtime()
        tasks = [asyncio.create_task(_start(parts, prepared))]
        if parts.settings.poll_interval_s > 0:
            tasks.append(asyncio.create_task(_poll(parts.manager, parts.settings.poll_interval_s)))
        if parts.pod is not None:
            tasks += [asyncio.create_task(loop) for loop in parts.pod.tasks()]
            # A worker takes connections only once it serves what the store holds: the port is
            # its siblings' meanwhile (all of them wait at the pod's start: /healthz waits too).
            await parts.pod.sync.join()
        try:
            yield
        finally:
            runtime.stop_building_kernels()
            for task in tasks:
                task.cancel()
            if grpc_server is not None:  # its calls end before the batchers close
                await grpc_server.stop()
            await parts.manager.close()
            if parts.pod is not None:
                parts.pod.leave()

    return lifespan


def _add_error_handlers(app: FastAPI, parts: Components) -> None:
    def count_rejection(request: Request, err: ServiceError) -> None:
        if err.reason is None:
            return
        name = request.path_params.get("name") or request.query_params.get("model")
        label = name if name is not None and parts.manager.knows(name) else "_none"
        parts.metrics.rejections.labels(label, err.reason).inc()

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        count_rejection(request, exc)
        return error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        # Tokens were checked by the middleware, before the parameters were validated.
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        err = InvalidInput(f"invalid request: {problems}")
        count_rejection(request, err)
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
            count_rejection(request, mapped)
            return error_response(mapped, request.url.path)
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        internal = ServiceError(f"internal error ({type(exc).__name__}); see the log")
        return error_response(internal, request.url.path)

    for error_class in LIBRARY_ERRORS:
        app.add_exception_handler(error_class, _library_error)


def _add_health_routes(app: FastAPI, parts: Components) -> None:
    manager, preloader = parts.manager, parts.preloader

    @app.get("/healthz", tags=["health"], summary="Liveness", responses=openapi.ok(openapi.Health))
    async def healthz() -> Response:
        if parts.pod is not None:  # which worker answered, for an operator (and the tests)
            return json_response({"status": "ok", "worker": os.getpid()})
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
        if parts.pod is None:
            body = generate_latest(parts.metrics.registry)
        else:  # the whole pod's, from every worker's snapshot (service/pod_metrics.py)
            parts.pod.metrics.publish()
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(None, parts.pod.metrics.scrape)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


def _admission(parts: Components) -> Admission:
    """One for the application: the middleware's two instances (the ordinary stack's and the
    fast path's) and the HTTP protocol of `kestrel serve` (service/shedding.py) share it."""
    settings, manager = parts.settings, parts.manager

    def limit_for(path: str, method: str) -> int:
        if method == "POST" and path.rstrip("/") in ("/models", "/v2/repository/models"):
            return settings.max_upload_bytes
        return settings.max_body_bytes

    def model_label(name: str | None) -> str:
        return name if name is not None and manager.knows(name) else "_none"

    scoring = manager.scoring_load
    parts.metrics.in_flight_limit.set_function(
        lambda: math.inf if scoring.cap is None else scoring.cap
    )
    return Admission(
        metrics=parts.metrics,
        limit_for=limit_for,
        model_label=model_label,
        scoring=scoring,
        refusal=parts.auth.refusal,
    )


async def _start(parts: Components, prepared: asyncio.Future[None]) -> None:
    try:
        await parts.manager.recover()
    finally:
        # After the runtime's preparation and the stored versions' loads, so that neither
        # shares the core with the kernel build (prepare_logged never raises).
        await prepared
        runtime.start_building_kernels()
    if parts.preloader is None and not parts.settings.demo_model:
        return
    async with contextlib.AsyncExitStack() as stack:
        if parts.pod is not None:
            # One worker at a time registers, the next ones find the store serving it.
            await stack.enter_async_context(parts.pod.exclusive("start-up"))
            await parts.manager.sync()
        if parts.preloader is not None:  # after recovery: a store serving the file is reused
            await parts.preloader.run(parts.manager, parts.settings.register_wait_s)
        if parts.settings.demo_model:
            from service.demo_model import register_demo

            await register_demo(parts.manager)


async def _poll(manager: ModelManager, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await manager.sync()
        except Exception:  # a store hiccup must not stop polling
            log.exception("re-reading the store's manifest failed")
