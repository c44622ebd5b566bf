"""The two reference servers of ``bench/load.py``: a FastAPI hello world, and the plain
FastAPI + scikit-learn server people run today.

The plain server is deliberately the straightforward one: models loaded with ``joblib.load`` at
start, a pydantic request model, ``model.predict_proba`` on every request (a ``def`` route, so
FastAPI runs it in its thread pool as its documentation advises for blocking code), and the
default JSON response. No batching, no compilation. Both use uvicorn with one worker, uvloop and
httptools (what uvicorn picks by itself when they are installed), access log off.

Usage::

    python bench/plain_server.py hello --port 8001
    python bench/plain_server.py plain --models DIR --port 8002   # DIR/<name>.joblib
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel


class PredictRequest(BaseModel):
    """The body both Kestrel and the plain server accept: ``{"rows": [[...], ...]}``."""

    rows: list[list[float]]
    outputs: list[str] | None = None  # accepted for body parity with Kestrel; always predict_proba


def hello_app() -> FastAPI:
    """FastAPI's hello world, as a POST so the load generator sends it the same body."""
    app = FastAPI()

    @app.post("/hello")
    async def hello() -> dict[str, str]:
        return {"message": "Hello World"}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def plain_app(models_dir: Path) -> FastAPI:
    """Every ``<name>.joblib`` under ``models_dir`` served at ``POST /models/<name>/predict``."""
    import joblib
    import numpy as np

    models: dict[str, Any] = {p.stem: joblib.load(p) for p in sorted(models_dir.glob("*.joblib"))}
    if not models:
        raise SystemExit(f"no *.joblib model files in {models_dir}")
    app = FastAPI()

    @app.post("/models/{name}/predict")
    def predict(name: str, request: PredictRequest) -> dict[str, Any]:
        model = models.get(name)
        if model is None:
            raise HTTPException(404, f"no model named {name!r}")
        proba = model.predict_proba(np.asarray(request.rows))
        return {"predict_proba": proba.tolist()}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("hello", "plain"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--models", type=Path, help="directory of <name>.joblib files (plain)")
    args = parser.parse_args(argv)
    if args.kind == "plain" and args.models is None:
        parser.error("plain needs --models DIR")
    app = hello_app() if args.kind == "hello" else plain_app(args.models)

    import uvicorn

    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        workers=1,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
