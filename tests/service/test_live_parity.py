"""Live parity: sampled served answers rescored by the source estimator in the background."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import skops.io as sio
from prometheus_client import CollectorRegistry
from sklearn.tree import DecisionTreeClassifier

import lazy as lz
from service.codecs import head
from service.metrics import Metrics
from service.models import ModelManager
from service.settings import Settings
from service.versions import ModelOptions, State, Upload

X = np.random.default_rng(0).normal(size=(200, 3))
Y = (X[:, 0] + X[:, 1] > 0).astype(int)


def _manager(root: Path, share: float) -> ModelManager:
    settings = Settings(
        store_url=str(root / "store"),
        cache_dir=root / "cache",
        poll_interval_s=0,
        live_parity_share=share,
        live_parity_rows=8,
        live_parity_cpu=1.0,
    )
    cache = lz.ExecutableCache(disk_dir=settings.cache_dir)
    return ModelManager(settings, _store(settings), Metrics(CollectorRegistry()), cache)


def _store(settings: Settings):  # type: ignore[no-untyped-def]
    from service.store import ModelStore

    return ModelStore(settings.store_url)


def _sample(manager: ModelManager, name: str, **labels: str) -> float:
    value = manager.metrics.registry.get_sample_value(
        name, {"model": "m", "version": "1", **labels}
    )
    return value or 0.0


async def _settled(manager: ModelManager, rows: float) -> None:
    deadline = time.monotonic() + 30
    while _sample(manager, "kestrel_live_parity_rows_total") < rows:
        assert time.monotonic() < deadline, "live parity did not check the samples"
        await asyncio.sleep(0.02)


def test_served_answers_agree_with_the_source_until_it_decides_otherwise(tmp_path: Path) -> None:
    manager = _manager(tmp_path, share=1.0)
    tree = DecisionTreeClassifier(max_depth=4, random_state=0).fit(X, Y)

    async def scenario() -> None:
        try:
            mv = await manager.register(
                Upload("m", sio.dumps(tree), filename="m.skops", options=ModelOptions(max_batch=8))
            )
            assert await manager.wait(mv, 120) and mv.state is State.READY, mv.error
            for i in range(10):
                rows = X[10 * i : 10 * i + 10].tolist()
                await manager.predict("m", None, rows, outputs=None, deadline=None)
            await _settled(manager, 10 * 8)  # 8 rows of each request
            assert _sample(manager, "kestrel_live_parity_samples_total", result="checked") == 10
            for output in ("predict", "predict_proba"):
                assert (
                    _sample(manager, "kestrel_live_parity_mismatched_rows_total", output=output)
                    == 0
                )

            # The source now sends rows near its root split the other way (as a compiler that
            # decided otherwise would): every served label that differs is counted.
            root = mv.source.tree_
            feature, threshold = root.feature[0], root.threshold[0]
            near = X[np.argsort(np.abs(X[:, feature] - threshold))[:8]]
            before = mv.source.predict(near)
            root.threshold[0] = threshold + 2 * float(np.abs(near[:, feature] - threshold).max())
            flipped = int((mv.source.predict(near) != before).sum())
            assert flipped > 0
            await manager.predict("m", None, near.tolist(), outputs=None, deadline=None)
            await _settled(manager, 10 * 8 + 8)
            found = _sample(manager, "kestrel_live_parity_mismatched_rows_total", output="predict")
            assert found == flipped
        finally:
            await manager.close()

    asyncio.run(scenario())


def test_the_queue_is_bounded_and_every_request_form_is_cut(tmp_path: Path) -> None:
    from service import live_parity

    checker = _manager(tmp_path, share=1.0).live_parity
    checker._worker._thread.ensure = lambda: None  # type: ignore[method-assign]  # no worker: it fills
    mv = type("Version", (), {"name": "m", "version": "1", "source": object()})()
    for _ in range(live_parity.QUEUE + 5):
        checker.offer(mv, [[0.0]], {"predict": np.zeros(1)}, 1)  # type: ignore[arg-type]
    dropped = checker.metrics.registry.get_sample_value(
        "kestrel_live_parity_samples_total", {"model": "m", "version": "1", "result": "dropped"}
    )
    assert dropped == 5
    assert head([[1], [2], [3]], 2) == [[1], [2]]
    assert head({"a": [1, 2, 3]}, 1) == {"a": [1]}
    assert head(np.arange(5), 2).tolist() == [0, 1]
    assert head(object(), 2) is None
    pytest.importorskip("pyarrow")
    import pyarrow as pa

    assert head(pa.table({"a": [1, 2, 3]}), 2)["a"].tolist() == [1, 2]
