"""``POST /models?wait=true`` in process: what the answer says when the version's state moves on
between its load finishing and the waiting request running again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest
import skops.io as sio
from sklearn.linear_model import LinearRegression

from service.app import create_app
from service.models import ModelManager
from service.settings import Settings
from service.versions import ModelVersion, State

TOKEN = "registration-test-token"


def test_a_version_retired_before_the_answer_is_still_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The churn test met this: the load finished (READY), a concurrent delete ran before the
    # registering request resumed, and the client was told 202 "still loading, poll Location".
    settings = Settings(store_url=str(tmp_path / "store"), cache_dir=None, admin_token=TOKEN)
    app = create_app(settings)
    manager: ModelManager = app.state.manager
    wait = manager.wait

    async def wait_then_delete(mv: ModelVersion, timeout: float) -> bool:
        done = await wait(mv, timeout)
        assert mv.state is State.READY
        await manager.delete(mv.name)  # what a DELETE scheduled first would do
        return done

    monkeypatch.setattr(manager, "wait", wait_then_delete)
    model = LinearRegression().fit(np.eye(3), [1.0, 2.0, 3.0])

    async def register() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kestrel") as client:
            return await client.post(
                "/models",
                params={"wait": "true"},
                data={"name": "gone"},
                files={"file": ("m.skops", sio.dumps(model))},
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=120,
            )

    r = asyncio.run(register())
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "RETIRED" and r.headers["location"] == "/models/gone/versions/1"
