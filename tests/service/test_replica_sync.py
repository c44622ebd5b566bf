"""ModelManager.sync() edge cases, in process: two managers on one local store are two replicas.

The live, multi-process version (S3 on moto, polling) is in test_replicas.py; these pin the races
that are hard to hit on purpose there: stale manifest reads, slow loads overtaken by newer ones,
failed loads on one replica, version-name conflicts between replicas.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import skops.io as sio
from prometheus_client import CollectorRegistry
from sklearn.linear_model import LinearRegression

import lazy as lz
from service.errors import NotFound
from service.metrics import Metrics
from service.models import ModelManager
from service.settings import Settings
from service.store import Manifest, ModelStore
from service.versions import ModelOptions, ModelVersion, State, Upload

X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)


def _linear(coef: list[float], intercept: float) -> LinearRegression:
    return LinearRegression().fit(X, X @ np.asarray(coef, np.float32) + intercept)


MODELS = {"a": _linear([1, 2, 3], 0.0), "b": _linear([-3, 0.5, 1], 10.0)}


class LaggingStore(ModelStore):
    """A store whose next manifest read returns an earlier snapshot: what a read that started
    before a write and finished after it sees (object stores give no read-your-writes across
    requests in flight)."""

    stale: Manifest | None = None

    def load_manifest(self) -> Manifest:
        if self.stale is not None:
            manifest, self.stale = self.stale, None
            return manifest
        return super().load_manifest()


def replica(root: Path, *, poll_interval_s: float = 0.05, lagging: bool = False) -> ModelManager:
    """A manager on the shared store ``root/store`` (its compile cache shared too, for speed)."""
    settings = Settings(
        store_url=str(root / "store"), cache_dir=root / "cache", poll_interval_s=poll_interval_s
    )
    store = (LaggingStore if lagging else ModelStore)(settings.store_url)
    cache = lz.ExecutableCache(disk_dir=settings.cache_dir)
    return ModelManager(settings, store, Metrics(CollectorRegistry()), cache)


def upload(kind: str, version: str | None = None) -> Upload:
    return Upload(
        "m",
        sio.dumps(MODELS[kind]),
        filename="m.skops",
        version=version,
        options=ModelOptions(max_batch=4),
    )


async def registered(manager: ModelManager, kind: str, version: str | None = None) -> ModelVersion:
    mv = await manager.register(upload(kind, version))
    assert await manager.wait(mv, 120)
    assert mv.state is State.READY, mv.error
    return mv


async def serves(manager: ModelManager, kind: str, version: str) -> None:
    """``manager`` answers for "m" with version ``version``, computing model ``kind``."""
    result = await manager.predict("m", None, X[:5].tolist(), outputs=None, deadline=None)
    assert result.version.version == version
    (out,) = result.outputs.values()
    np.testing.assert_allclose(np.ravel(out), MODELS[kind].predict(X[:5]), rtol=1e-4, atol=1e-4)


def run(*managers: ModelManager) -> Callable[[Callable[[], Coroutine[Any, Any, None]]], None]:
    def runner(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
        async def main() -> None:
            try:
                await scenario()
            finally:
                for manager in managers:
                    await manager.close()

        asyncio.run(main())

    return runner


def test_new_version_swaps_in_and_own_commits_are_not_reloaded(tmp_path: Path) -> None:
    a, b = replica(tmp_path), replica(tmp_path)

    async def scenario() -> None:
        await registered(a, "a")
        await b.recover()
        await serves(b, "a", "1")
        mine = await registered(b, "b")
        batcher = mine.batcher
        await b.sync()  # the generation moved, but only by b's own commit
        assert b.current("m") is mine and mine.batcher is batcher and mine.state is State.READY

        await a.sync()
        await serves(a, "b", "2")
        old = a.lookup("m", "1")
        await asyncio.sleep(0)  # let the old version's retirement run
        assert old.state is State.RETIRED and old.batcher is None and old.model is None

    run(a, b)(scenario)


def test_deleted_versions_and_models_are_dropped_with_fallback(tmp_path: Path) -> None:
    a, b = replica(tmp_path), replica(tmp_path)

    async def scenario() -> None:
        await registered(a, "a")
        await registered(a, "b")
        await b.recover()
        await serves(b, "b", "2")
        await a.delete("m", "2")  # the current one: a falls back to 1 at once
        await serves(a, "a", "1")
        await b.sync()
        await serves(b, "a", "1")
        with pytest.raises(NotFound, match="no version '2'"):
            b.lookup("m", "2")
        await a.delete("m")
        await b.sync()
        assert not b.knows("m") and b.names() == []

    run(a, b)(scenario)


def test_a_stale_manifest_read_does_not_undo_a_local_registration(tmp_path: Path) -> None:
    a = replica(tmp_path, lagging=True)

    async def scenario() -> None:
        await registered(a, "a")
        before = a.store.load_manifest()
        second = await registered(a, "b")
        assert isinstance(a.store, LaggingStore)
        a.store.stale = before  # says version 1 is current: a read from before our commit
        await a.sync()
        assert a.current("m") is second
        await serves(a, "b", "2")

    run(a)(scenario)


def test_a_slow_sync_load_does_not_replace_a_newer_local_registration(tmp_path: Path) -> None:
    a, b = replica(tmp_path), replica(tmp_path)

    async def scenario() -> None:
        await registered(a, "a", "first")
        await b.recover()
        await registered(b, "b", "from-b")
        # a compiles its own upload; the sync queues the load of b's version behind it on the
        # loader thread, so that load (from an older manifest) finishes after a's commit.
        mine = await a.register(upload("a", "from-a"))
        await a.sync()
        assert await a.wait(mine, 120)
        assert a.store.load_manifest().models["m"].current == "from-a"
        assert a.current("m") is mine
        assert a.lookup("m", "from-b").state is State.RETIRED
        await serves(a, "a", "from-a")
        await b.sync()
        await serves(b, "a", "from-a")

    run(a, b)(scenario)


def test_a_failed_load_on_one_replica_is_reported_and_retried(tmp_path: Path) -> None:
    a, b = replica(tmp_path), replica(tmp_path, poll_interval_s=0.5)

    async def scenario() -> None:
        await registered(a, "a")
        await b.recover()
        mv = await registered(a, "b")
        blob = Path(a.store.url) / "blobs/sha256" / mv.record.artifact[:2] / mv.record.artifact
        data = blob.read_bytes()
        blob.unlink()  # this replica can not read it, for now

        await b.sync()
        failed = b.lookup("m", "2")
        assert failed.state is State.FAILED and "not found" in (failed.error or "")
        assert failed.describe()["failed_loads"] == 1
        await serves(b, "a", "1")  # the old version keeps serving meanwhile
        await b.sync()  # unchanged manifest, back-off not over: no new attempt
        assert failed.failed_loads == 1

        a.store.put_blob(data)
        await asyncio.sleep(max(0.0, failed.retry_at - time.monotonic()))
        await b.sync()
        assert failed.state is State.READY and failed.failed_loads == 0 and failed.error is None
        await serves(b, "b", "2")

    run(a, b)(scenario)


def test_a_local_upload_that_lost_a_version_name_gives_way_to_the_stored_one(
    tmp_path: Path,
) -> None:
    a, b = replica(tmp_path), replica(tmp_path)

    async def scenario() -> None:
        await registered(b, "b", "x")
        mine = await a.register(upload("a", "x"))  # a has not synced: it does not know b's x
        assert await a.wait(mine, 120)
        assert mine.state is State.FAILED and "already has version 'x'" in (mine.error or "")
        await a.sync()
        await serves(a, "b", "x")

    run(a, b)(scenario)
