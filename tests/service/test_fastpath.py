"""service/fastpath.py: which routes it takes, and that it answers exactly as the router would."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request
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
    assert isinstance(app.router.middleware_stack, fastpath.ScoringFastPath)
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
