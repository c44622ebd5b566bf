"""service/fastpath.py: which routes it takes, and that it answers exactly as the router would."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from service import fastpath
from service.app import SCORING_PATHS, create_app
from service.settings import Settings


class Boom(Exception):
    pass


def _app() -> FastAPI:
    app = FastAPI()

    @app.exception_handler(Boom)
    async def boom(request: Request, exc: Boom) -> Response:
        return JSONResponse({"error": str(exc), "route": request.scope["route"].path}, 418)

    @app.post("/models/{name}/predict")
    async def predict(request: Request, name: str) -> Response:
        if name == "boom":
            raise Boom("exploded")
        body = await request.body()
        return JSONResponse({"name": name, "bytes": len(body), "via": request.scope["route"].path})

    @app.get("/models/{name}/predict")
    async def described(request: Request, name: str) -> Response:
        return JSONResponse({"get": name})

    return app


async def _post(app: FastAPI, path: str, method: str = "POST") -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.request(method, path, content=b"[1, 2]")


def test_create_app_takes_every_scoring_route(tmp_path) -> None:
    app = create_app(Settings(store_url=str(tmp_path / "store"), cache_dir=None))
    stack = app.build_middleware_stack()
    assert isinstance(stack, fastpath.ScoringFastPath)  # the outermost layer
    assert sorted(stack.paths) == sorted(SCORING_PATHS)
    taken = fastpath.install(FastAPI(), SCORING_PATHS)  # an app without them takes none
    assert taken == []


@pytest.mark.anyio
async def test_fast_answers_match_the_router() -> None:
    plain, fast = _app(), _app()
    assert fastpath.install(fast, ["/models/{name}/predict"]) == ["/models/{name}/predict"]
    for path, method in [
        ("/models/m1/predict", "POST"),
        ("/models/boom/predict", "POST"),  # the app's exception handler answers
        ("/models/m1/predict", "GET"),  # another method: the router's route
        ("/models/m1/predict/", "POST"),  # trailing slash: the router redirects
        ("/models//predict", "POST"),  # empty parameter: no route
        ("/models/a/b/predict", "POST"),
    ]:
        want, got = await _post(plain, path, method), await _post(fast, path, method)
        assert (got.status_code, got.content) == (want.status_code, want.content), path


def test_a_route_an_earlier_route_may_take_is_left_to_the_router() -> None:
    app = FastAPI()

    @app.post("/models/{anything}/{action}")
    async def catch_all(request: Request, anything: str, action: str) -> Response:
        return Response()

    @app.post("/models/{name}/predict")
    async def predict(request: Request, name: str) -> Response:
        return Response()

    assert fastpath.install(app, ["/models/{name}/predict"]) == []


def test_an_endpoint_with_other_parameters_is_left_to_the_router() -> None:
    app = FastAPI()

    @app.post("/models/{name}/predict")
    async def predict(request: Request, name: str, verbose: bool = False) -> Response:
        return Response()

    assert fastpath.install(app, ["/models/{name}/predict"]) == []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Tagging:
    """A user middleware: tags every answer, and counts the requests it saw (in a shared list,
    as state must be when the fast path instantiates middleware a second time)."""

    def __init__(self, app: Any, seen: list[str]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen.append(scope["path"])

        async def tagged(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-tag", b"seen")]
            await send(message)

        try:
            await self.app(scope, receive, tagged)
        except Exception as exc:  # as ServiceMiddleware does: unmapped errors answered here
            await JSONResponse({"unmapped": type(exc).__name__}, 500)(scope, receive, send)


def _app_with_middleware(seen: list[str]) -> FastAPI:
    app = _app()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return JSONResponse({"http": exc.detail, "route": request.scope["route"].path}, 400)

    def teapot(request: Request, exc: Exception) -> Response:  # a sync handler: threadpool
        return JSONResponse({"status": 418, "path": request.url.path}, 418)

    app.add_exception_handler(418, teapot)

    @app.post("/models/{name}/versions/{version}/predict")
    async def versioned(request: Request, name: str, version: str) -> Response:
        if version == "http":
            raise HTTPException(409, "conflict here")
        if version == "teapot":
            raise HTTPException(418, "short and stout")
        if version == "bug":
            raise KeyError(version)
        if version == "probe":  # Starlette's ExceptionMiddleware leaves this key in the scope
            return JSONResponse({"stack": "starlette.exception_handlers" in request.scope})
        return JSONResponse({"name": name, "version": version, "params": request.path_params})

    app.add_middleware(Tagging, seen=seen)
    return app


@pytest.mark.anyio
async def test_fast_answers_match_the_stack_with_middleware_and_handlers() -> None:
    seen_plain: list[str] = []
    seen_fast: list[str] = []
    plain, fast = _app_with_middleware(seen_plain), _app_with_middleware(seen_fast)
    paths = ["/models/{name}/predict", "/models/{name}/versions/{version}/predict"]
    assert sorted(fastpath.install(fast, paths)) == sorted(paths)
    cases = [
        "/models/m1/predict",
        "/models/boom/predict",  # exception class handler
        "/models/m1/versions/3/predict",
        "/models/m1/versions/http/predict",  # HTTPException handler, route in scope
        "/models/m1/versions/teapot/predict",  # status-code handler (sync)
        "/models/m1/versions/bug/predict",  # unmapped: the middleware answers (untagged)
    ]
    for path in cases:
        want, got = await _post(plain, path), await _post(fast, path)
        assert (got.status_code, got.content) == (want.status_code, want.content), path
        assert got.headers.get("x-tag") == want.headers.get("x-tag"), path
    assert seen_fast == seen_plain == cases  # the user middleware saw every request once
    assert (await _post(fast, "/models/m1/predict")).headers["x-tag"] == "seen"
    probe = "/models/m1/versions/probe/predict"
    assert (await _post(plain, probe)).json() == {"stack": True}
    assert (await _post(fast, probe)).json() == {"stack": False}  # dispatched past the stack
    stack = fast.build_middleware_stack()
    assert isinstance(stack, fastpath.ScoringFastPath)


def test_install_after_start_is_refused() -> None:
    app = _app()
    app.middleware_stack = app.build_middleware_stack()
    with pytest.raises(RuntimeError, match="before the application starts"):
        fastpath.install(app, ["/models/{name}/predict"])


def test_an_app_with_its_own_body_limit_keeps_its_stack() -> None:
    app = _app()
    app.max_body_size = 1024
    assert fastpath.install(app, ["/models/{name}/predict"]) == []


@pytest.mark.parametrize("otel", [False, True])
def test_opentelemetry_only_when_asked_for(tmp_path, monkeypatch, otel: bool) -> None:
    # A configured global tracer provider: FastAPI's native telemetry traces every request
    # through it, unless KESTREL_OTEL is off (the default), when no request even looks it up.
    from opentelemetry import trace

    looked_up: list[object] = []

    class Provider(trace.TracerProvider):
        def get_tracer(self, *args: object, **kwargs: object) -> trace.Tracer:
            return trace.NoOpTracer()

    def provider() -> trace.TracerProvider:
        looked_up.append(1)
        return Provider()

    monkeypatch.setattr(trace, "get_tracer_provider", provider)
    app = create_app(Settings(store_url=str(tmp_path / "store"), cache_dir=None, otel=otel))

    async def requests() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kestrel") as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.post("/models/absent/predict", json=[[1.0]])).status_code == 404

    asyncio.run(requests())
    assert bool(looked_up) is otel
