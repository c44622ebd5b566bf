"""Milliseconds to load an UNLOADED version again (service.residency), per pipeline.

In process, a ModelManager with a budget of one loaded version registers each pipeline and a
small linear model; requests then alternate between the two, so every request finds its
version UNLOADED and waits for it to be loaded again: from its kept source estimator, through
the executable cache, following its stored plan (no compile, no parity gate). The reload is
timed by ``kestrel_model_reload_duration_seconds`` and, from the client's side, by the whole
request. Placement as the service decides it (measured), and every bucket on the device
(``host_rows 0``: the executables come from the cache).

Usage::

    python bench/reload.py [--pipelines rf,hgb,lr] [--rounds 20] [--max-batch 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import skops.io as sio
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.linear_model import LinearRegression, LogisticRegression

import lazy as lz
from service.metrics import Metrics
from service.models import ModelManager
from service.settings import Settings
from service.store import ModelStore
from service.versions import ModelOptions, State, Upload

RNG = np.random.default_rng(0)
X = RNG.normal(size=(4000, 20))
Y = (X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(int)
PIPELINES = {  # key: (label, a fresh estimator)
    "rf": (
        "RF 100 trees, depth 8",
        lambda: RandomForestClassifier(100, max_depth=8, random_state=0),
    ),
    "hgb": (
        "HGB 100 iterations",
        lambda: HistGradientBoostingClassifier(max_iter=100, random_state=0),
    ),
    "lr": ("logistic regression", lambda: LogisticRegression(max_iter=500)),
}


async def _measure(root: Path, make: Any, host_rows: int | None, rounds: int, max_batch: int):
    settings = Settings(
        store_url=str(root / "store"),
        cache_dir=root / "cache",
        max_loaded_models=1,
        **({} if host_rows is None else {"host_rows": host_rows}),
    )
    metrics = Metrics(CollectorRegistry())
    cache = lz.ExecutableCache(disk_dir=settings.cache_dir)
    manager = ModelManager(settings, ModelStore(settings.store_url), metrics, cache)
    try:
        options = ModelOptions(max_batch=max_batch)
        for name, model in (("model", make().fit(X, Y)), ("other", LinearRegression().fit(X, Y))):
            mv = await manager.register(
                Upload(name, sio.dumps(model), filename="m.skops", options=options)
            )
            await manager.wait(mv, 600)
            assert mv.state is State.READY, mv.error
        rows = X[:1].tolist()
        requests = []
        compiles = cache.stats.total_compiles
        for _ in range(rounds):
            for name in ("model", "other"):
                await asyncio.sleep(0.01)  # the unload the last load caused completes
                t0 = time.perf_counter()
                await manager.predict(name, None, rows, outputs=None, deadline=None)
                if name == "model":
                    requests.append(time.perf_counter() - t0)
        assert cache.stats.total_compiles == compiles, "a reload compiled"
        reload_s = metrics.registry.get_sample_value("kestrel_model_reload_duration_seconds_sum")
        count = metrics.registry.get_sample_value("kestrel_model_reload_duration_seconds_count")
        return reload_s / count, statistics.median(requests), max(requests)
    finally:
        await manager.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--max-batch", type=int, default=1024)
    args = parser.parse_args()
    table = Table(title=f"Loading an UNLOADED version again (max_batch {args.max_batch})")
    for column in ("pipeline", "placement", "reload mean ms", "request p50 ms", "request max ms"):
        table.add_column(column)
    for key in args.pipelines.split(","):
        label, make = PIPELINES[key]
        for placement, host_rows in (("measured", None), ("all on the device", 0)):
            with tempfile.TemporaryDirectory() as tmp:
                mean, p50, worst = asyncio.run(
                    _measure(Path(tmp), make, host_rows, args.rounds, args.max_batch)
                )
            table.add_row(
                label, placement, f"{mean * 1e3:.0f}", f"{p50 * 1e3:.0f}", f"{worst * 1e3:.0f}"
            )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
