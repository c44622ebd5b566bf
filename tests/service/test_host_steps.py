"""Host steps over HTTP: skops uploads referencing functions and classes of modules the operator
trusts (``KESTREL_HOST_STEP_MODULES``) compile, with those steps on the host; any other module's
are refused with a 4xx naming the setting."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest
import skops.io as sio
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from service.app import create_app
from service.artifacts import ArtifactError
from service.artifacts.skops_trust import host_step_types
from service.settings import Settings
from tests.service import host_step_functions as trusted

TOKEN = "host-step-test-token"
MODULE = trusted.__name__
RNG = np.random.default_rng(3)
X = np.round(RNG.normal(size=(160, 3)), 1)  # repeated values: ties in the ranks
Y = np.where(X[:, 0] - X[:, 2] > 0, "up", "down")


@pytest.fixture(scope="module")
def pipeline():
    steps = (
        StandardScaler(),
        trusted.Clipper(),
        FunctionTransformer(trusted.with_ranks),
        LogisticRegression(),
    )
    return make_pipeline(*steps).fit(X, Y)


def _serve(tmp_path: Path, modules: list[str], *calls):
    settings = Settings(
        store_url=str(tmp_path / "store"),
        cache_dir=None,
        admin_token=TOKEN,
        host_step_modules=modules,
    )
    app = create_app(settings)
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kestrel") as client:
            return [await call(client, auth) for call in calls]

    return asyncio.run(run())


def _register(data: bytes):
    async def call(client: httpx.AsyncClient, auth: dict[str, str]) -> httpx.Response:
        return await client.post(
            "/models",
            params={"wait": "true"},
            data={"name": "ranks", "options": '{"max_batch": 8}'},
            files={"file": ("m.skops", data)},
            headers=auth,
            timeout=300,
        )

    return call


def _get(path: str):
    async def call(client: httpx.AsyncClient, auth: dict[str, str]) -> httpx.Response:
        return await client.get(path, headers=auth)

    return call


def _predict(rows: list[list[float]]):
    async def call(client: httpx.AsyncClient, auth: dict[str, str]) -> httpx.Response:
        return await client.post("/models/ranks/predict", json=rows, headers=auth)

    return call


def test_a_trusted_modules_function_and_class_run_as_host_steps(tmp_path: Path, pipeline) -> None:
    registered, described, predicted = _serve(
        tmp_path,
        [MODULE],
        _register(sio.dumps(pipeline)),
        _get("/models/ranks"),
        _predict(X.tolist()),
    )
    assert registered.status_code == 201, registered.text
    (version,) = described.json()["versions"]
    assert version["state"] == "READY" and version["parity"]["ok"]
    steps = {s["estimator"]: s["where"] for s in version["report"]["steps"]}
    assert steps == {
        "Pipeline": "device",
        "StandardScaler": "device",
        "Clipper": "host",
        "FunctionTransformer": "host",
        "LogisticRegression": "device",
    }
    assert predicted.status_code == 200, predicted.text
    body = predicted.json()["outputs"]
    assert body["predict"] == pipeline.predict(X).tolist()
    np.testing.assert_allclose(body["predict_proba"], pipeline.predict_proba(X), atol=1e-5)


@pytest.mark.parametrize("modules", [[], ["json"]], ids=["none", "another module"])
def test_a_function_of_a_module_not_listed_is_refused_naming_the_setting(
    tmp_path: Path, pipeline, modules: list[str]
) -> None:
    (registered,) = _serve(tmp_path, modules, _register(sio.dumps(pipeline)))
    assert registered.status_code == 422, registered.text
    text = registered.text
    assert f"{MODULE}.with_ranks" in text and f"{MODULE}.Clipper" in text
    assert "KESTREL_HOST_STEP_MODULES" in text


def test_only_what_a_trusted_module_defines_is_trusted() -> None:
    assert host_step_types([f"{MODULE}.with_ranks", "os.system"], [MODULE]) == [
        f"{MODULE}.with_ranks"
    ]
    for imported in ("np", "BaseEstimator", "np.load"):  # imported there, not defined
        with pytest.raises(ArtifactError, match="KESTREL_HOST_STEP_MODULES"):
            host_step_types([f"{MODULE}.{imported}"], [MODULE])
    with pytest.raises(ArtifactError, match="cannot be found"):
        host_step_types([f"{MODULE}.missing"], [MODULE])
