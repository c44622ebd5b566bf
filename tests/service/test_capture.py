"""Payload capture: sampled requests and answers written to the store as Parquet, read back with
pyarrow, and old partitions removed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import skops.io as sio
from prometheus_client import CollectorRegistry
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

import lazy as lz
from service.capture import hour_of
from service.metrics import Metrics
from service.models import ModelManager
from service.settings import Settings
from service.store import ModelStore
from service.versions import ModelOptions, State, Upload


def _frame(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": rng.integers(0, 5, n).astype(float),
            "plan": rng.choice(["x", "y"], n),
        }
    )


def _fitted() -> tuple[object, pd.DataFrame]:
    df = _frame(200)
    y = (df["a"] > 0).astype(int)
    ct = ColumnTransformer(
        [("num", StandardScaler(), ["a", "b"]), ("cat", OneHotEncoder(), ["plan"])]
    )
    return make_pipeline(ct, LogisticRegression()).fit(df, y), df


def _manager(tmp_path: Path, **capture: object) -> ModelManager:
    """A manager capturing every request, flushed by hand unless ``capture`` says otherwise."""
    settings = Settings(
        store_url=str(tmp_path / "store"),
        cache_dir=tmp_path / "cache",
        poll_interval_s=0,
        **{"capture_share": 1.0, "capture_flush_s": 3600, **capture},
        live_parity_share=0,
    )
    store = ModelStore(settings.store_url)
    return ModelManager(settings, store, Metrics(CollectorRegistry()), lz.ExecutableCache())


async def _score(manager: ModelManager, model: object, df: pd.DataFrame) -> list[dict]:
    """Register ``model`` as m and score five requests of four rows: the rows sent."""
    mv = await manager.register(
        Upload("m", sio.dumps(model), filename="m.skops", options=ModelOptions(max_batch=8))
    )
    assert await manager.wait(mv, 120) and mv.state is State.READY, mv.error
    sent = []
    for i in range(5):
        rows = df.iloc[4 * i : 4 * i + 4].to_dict("records")
        await manager.predict("m", None, rows, outputs=None, deadline=None)
        sent.extend(rows)
    return sent


def test_captured_requests_read_back_with_pyarrow(tmp_path: Path) -> None:
    model, df = _fitted()
    manager = _manager(tmp_path, capture_retention_hours=2)
    store = manager.store
    old = hour_of(time.time() - 5 * 3600)
    store.put_capture("m", "1", old, "old.parquet", b"expired")

    async def scenario() -> list[dict[str, object]]:
        try:
            sent = await _score(manager, model, df)
            manager.capture.flush()
            return sent
        finally:
            await manager.close()

    sent = asyncio.run(scenario())
    root = tmp_path / "store" / "capture"
    assert [p.name for p in root.glob("model=m/version=1/hour=*")] == [
        f"hour={hour_of(time.time())}"
    ]
    captured = ds.dataset(root, format="parquet", partitioning="hive").to_table().to_pandas()
    assert len(captured) == len(sent) == 20
    assert set(captured["model"]) == {"m"} and set(captured["version"].astype(str)) == {"1"}
    captured = captured.sort_values("kestrel_time", kind="stable").reset_index(drop=True)
    expected = pd.DataFrame(sent)
    np.testing.assert_allclose(captured["a"], expected["a"])
    assert captured["plan"].tolist() == expected["plan"].tolist()
    assert captured["output_predict"].tolist() == model.predict(expected).tolist()
    proba = np.stack(captured["output_predict_proba"].to_numpy())
    np.testing.assert_allclose(proba, model.predict_proba(expected), atol=1e-6)
    written = manager.metrics.registry.get_sample_value(
        "kestrel_capture_rows_total", {"model": "m", "version": "1", "result": "written"}
    )
    assert written == 20


def test_a_quarter_full_buffer_is_written_before_the_next_tick(tmp_path: Path) -> None:
    """With an hour between ticks and room for 40 rows, the writer flushes once 10 are held."""
    model, df = _fitted()
    manager = _manager(tmp_path, capture_max_rows=40)

    async def scenario() -> bool:
        try:
            await _score(manager, model, df)
            for _ in range(200):  # the writer thread writes without being asked
                if list((tmp_path / "store" / "capture").glob("model=m/*/*/*.parquet")):
                    return True
                await asyncio.sleep(0.05)
            return False
        finally:
            await manager.close()

    assert asyncio.run(scenario()), "nothing written within 10 s of a quarter-full buffer"
    written = manager.metrics.registry.get_sample_value(
        "kestrel_capture_rows_total", {"model": "m", "version": "1", "result": "written"}
    )
    assert written == 20  # the early writes and the last one at close; nothing dropped


def test_a_table_keeps_each_requests_rows_and_nulls_for_heads_it_did_not_ask() -> None:
    from sklearn.linear_model import LogisticRegression as Model

    import compiler
    from service.capture import _Request, table

    x = np.random.default_rng(1).normal(size=(10, 3))
    compiled = compiler.compile(
        Model().fit(x, x[:, 0] > 0), options=compiler.CompileOptions(warmup=False)
    )
    proba = np.arange(12, dtype=np.float64).reshape(6, 2)
    requests = [
        _Request(compiled.schema, x[:4].tolist(), {"predict": np.array([0, 1, 1, 0])}, 4, 1.0),
        _Request(compiled.schema, x[4:].tolist(), {"predict_proba": proba}, 6, 2.0),
    ]
    got = table(requests).to_pydict()
    np.testing.assert_array_equal(np.array([got[f"x{i}"] for i in range(3)]).T, x)
    assert got["kestrel_time"] == [1.0] * 4 + [2.0] * 6
    assert got["output_predict"] == [0, 1, 1, 0] + [None] * 6
    assert got["output_predict_proba"] == [None] * 4 + proba.tolist()
