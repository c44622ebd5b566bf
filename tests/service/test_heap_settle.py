"""The serving process settles its heap (``gcpolicy.settle``: one full collection, then a freeze)
once a burst of model loads is over, not after each: a restart that loads every stored version
pays one walk of the heap, and a load that fails still leaves the heap settled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import skops.io as sio
from prometheus_client import CollectorRegistry
from sklearn.linear_model import LinearRegression

import lazy as lz
from service import gcpolicy
from service.metrics import Metrics
from service.models import ModelManager
from service.settings import Settings
from service.store import ModelStore
from service.versions import ModelOptions, State, Upload

X = np.random.default_rng(0).normal(size=(40, 3))
NAMES = ("a", "b", "c")


def _manager(root: Path) -> ModelManager:
    settings = Settings(store_url=str(root / "store"), cache_dir=root / "cache")
    return ModelManager(
        settings,
        ModelStore(settings.store_url),
        Metrics(CollectorRegistry()),
        lz.ExecutableCache(disk_dir=settings.cache_dir),
    )


def _upload(name: str, data: bytes) -> Upload:
    return Upload(name, data, filename="m.skops", options=ModelOptions(max_batch=4))


@pytest.fixture
def settles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(gcpolicy, "settle", lambda: calls.append(1))
    return calls


def test_a_restart_settles_the_heap_once_for_all_its_loads(
    tmp_path: Path, settles: list[int]
) -> None:
    data = sio.dumps(LinearRegression().fit(X, X @ [1.0, 2.0, 3.0]))

    async def scenario() -> None:
        first = _manager(tmp_path)
        try:
            for name in NAMES:  # one at a time: each load is a burst of its own
                mv = await first.register(_upload(name, data))
                assert await first.wait(mv, 120) and mv.state is State.READY, mv.error
        finally:
            await first.close()
        assert len(settles) == len(NAMES)
        settles.clear()

        restarted = _manager(tmp_path)
        try:
            await restarted.recover()
            for name in NAMES:
                assert restarted.current(name) is not None, name
                assert restarted.current(name).state is State.READY  # type: ignore[union-attr]
        finally:
            await restarted.close()
        assert len(settles) == 1

    asyncio.run(scenario())


def test_a_failed_last_load_still_settles_the_heap(tmp_path: Path, settles: list[int]) -> None:
    data = sio.dumps(LinearRegression().fit(X, X @ [1.0, 2.0, 3.0]))

    def fails(*args: object) -> None:
        raise RuntimeError("the loader ran out of memory")

    async def scenario() -> None:
        manager = _manager(tmp_path)
        manager.loader.build = fails  # type: ignore[method-assign]
        try:
            mv = await manager.register(_upload("a", data))
            await manager.wait(mv, 120)
        finally:
            await manager.close()
        assert mv.state is State.FAILED and "out of memory" in (mv.error or "")
        assert len(settles) == 1

    asyncio.run(scenario())
