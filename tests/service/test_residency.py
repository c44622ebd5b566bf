"""A replica's budget of loaded versions (service.residency), in process: the versions idle the
longest are UNLOADED, a request loads its version again (no compile, no second parity gate),
pinned models stay, and no request fails on the way."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import skops.io as sio
from prometheus_client import CollectorRegistry
from sklearn.ensemble import RandomForestRegressor
from sklearn.linear_model import LinearRegression

import lazy as lz
from service.metrics import Metrics
from service.models import ModelManager
from service.settings import Settings
from service.versions import ModelOptions, ModelVersion, State, Upload

X = np.random.default_rng(0).normal(size=(60, 3)).round(1)


def _model(i: int) -> LinearRegression:
    return LinearRegression().fit(X, X @ np.array([1.0, -2.0, 0.5]) * (i + 1) + i)


def _manager(root: Path, **settings: Any) -> ModelManager:
    s = Settings(store_url=str(root / "store"), cache_dir=root / "cache", **settings)
    cache = lz.ExecutableCache(disk_dir=s.cache_dir)
    from service.store import ModelStore

    return ModelManager(s, ModelStore(s.store_url), Metrics(CollectorRegistry()), cache)


async def _register(manager: ModelManager, name: str, model: Any) -> ModelVersion:
    upload = Upload(name, sio.dumps(model), filename="m.skops", options=ModelOptions(max_batch=8))
    mv = await manager.register(upload)
    assert await manager.wait(mv, 120)
    assert mv.state is State.READY, mv.error
    await asyncio.sleep(0)  # the unloads it caused run
    return mv


async def _answers(manager: ModelManager, name: str) -> np.ndarray:
    result = await manager.predict(name, None, X[:7].tolist(), outputs=None, deadline=None)
    (out,) = result.outputs.values()
    return np.ravel(out)


def _loaded(manager: ModelManager) -> list[str]:
    return sorted(n for n in manager.names() if manager.current(n).state is State.READY)


def _sample(metrics: Metrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def test_least_recently_used_versions_unload_and_load_again(tmp_path: Path) -> None:
    manager = _manager(tmp_path, max_loaded_models=3, pinned_models="m0")

    async def scenario() -> None:
        try:
            for i in range(3):
                await _register(manager, f"m{i}", _model(i))
            first = {f"m{i}": await _answers(manager, f"m{i}") for i in range(3)}
            await _answers(manager, "m1")  # m2 is now the least recently used unpinned
            await _register(manager, "m3", _model(3))
            assert _loaded(manager) == ["m0", "m1", "m3"]  # m0 is pinned, though oldest
            unloaded = manager.current("m2")
            assert unloaded.state is State.UNLOADED and unloaded.model is None
            assert unloaded.batcher is None and unloaded.source is not None

            compiles = manager.loader.cache.stats.total_compiles
            again = await _answers(manager, "m2")  # loaded again on demand
            np.testing.assert_array_equal(again, first["m2"])  # the same bits
            assert manager.current("m2").state is State.READY
            assert manager.loader.cache.stats.total_compiles == compiles
            await asyncio.sleep(0)
            assert _loaded(manager) == ["m0", "m2", "m3"]  # m1 was idle the longest
            assert _sample(manager.metrics, "kestrel_model_unloads_total") == 2
            assert _sample(manager.metrics, "kestrel_model_reload_duration_seconds_count") == 1
        finally:
            await manager.close()

    asyncio.run(scenario())


def test_concurrent_requests_share_one_load_and_none_fails(tmp_path: Path) -> None:
    manager = _manager(tmp_path, max_loaded_models=2)
    models = {f"m{i}": _model(i) for i in range(6)}

    async def scenario() -> None:
        try:
            for name, model in models.items():
                await _register(manager, name, model)
            rng = random.Random(0)
            names = [rng.choice(list(models)) for _ in range(120)]
            answers = await asyncio.gather(*(_answers(manager, n) for n in names))
            for name, got in zip(names, answers, strict=True):
                np.testing.assert_allclose(got, models[name].predict(X[:7]), rtol=1e-5)
            await asyncio.sleep(0)
            states = [manager.current(n).state for n in models]
            assert states.count(State.READY) <= 2, states
            assert set(states) <= {State.READY, State.UNLOADED}
            reloads = _sample(manager.metrics, "kestrel_model_reload_duration_seconds_count")
            assert 0 < reloads <= len(names)
        finally:
            await manager.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("change", ["new version", "delete"])
def test_an_unloaded_version_replaced_or_deleted_is_not_loaded_again(
    tmp_path: Path, change: str
) -> None:
    manager = _manager(tmp_path, max_loaded_models=1)

    async def scenario() -> None:
        try:
            old = await _register(manager, "a", _model(0))
            await _register(manager, "b", _model(1))
            assert old.state is State.UNLOADED
            if change == "new version":
                new = await _register(manager, "a", _model(2))
                await asyncio.sleep(0)
                assert old.state is State.RETIRED and old.source is None
                np.testing.assert_allclose(
                    await _answers(manager, "a"), _model(2).predict(X[:7]), rtol=1e-5
                )
                assert new.state is State.READY
            else:
                await manager.delete("a")
                assert not manager.knows("a") and old.source is None
        finally:
            await manager.close()

    asyncio.run(scenario())


def test_a_forest_loads_again_from_its_cached_executables(tmp_path: Path) -> None:
    forest = RandomForestRegressor(n_estimators=100, max_depth=6, random_state=0)
    forest.fit(X, X[:, 0] - X[:, 2])
    manager = _manager(tmp_path, max_loaded_models=1, host_rows=0)

    async def scenario() -> None:
        try:
            await _register(manager, "forest", forest)
            before = await _answers(manager, "forest")
            await _register(manager, "other", _model(0))
            assert manager.current("forest").state is State.UNLOADED
            compiles = manager.loader.cache.stats.total_compiles
            np.testing.assert_array_equal(await _answers(manager, "forest"), before)
            assert manager.loader.cache.stats.total_compiles == compiles
        finally:
            await manager.close()

    asyncio.run(scenario())


def test_a_shadow_version_is_not_unloaded(tmp_path: Path) -> None:
    manager = _manager(tmp_path, max_loaded_models=1)

    async def scenario() -> None:
        try:
            await _register(manager, "a", _model(0))
            upload = Upload(
                "a",
                sio.dumps(_model(1)),
                filename="m.skops",
                options=ModelOptions(max_batch=8),
                promote=False,
            )
            shadow = await manager.register(upload)
            assert await manager.wait(shadow, 120)
            await manager.set_shadow("a", shadow.version, 1.0)
            await _register(manager, "b", _model(2))
            assert shadow.state is State.READY  # mirrored to: kept, though over the budget
            assert manager.current("a").state is State.UNLOADED
        finally:
            await manager.close()

    asyncio.run(scenario())
