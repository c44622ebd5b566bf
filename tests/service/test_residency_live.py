"""Hundreds of models on one replica with a budget of loaded versions: a real ``kestrel serve``
process, 300 registered models, 50 loaded at most, random traffic over all of them."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import skops.io as sio
from sklearn.linear_model import LinearRegression

from tests.service.live import LiveServer

MODELS = 300
BUDGET = 50
X = np.random.default_rng(0).normal(size=(30, 3)).round(2)


def _model(i: int) -> LinearRegression:
    return LinearRegression().fit(X, X @ np.array([1.0, -2.0, 0.5]) + i)


@pytest.mark.slow  # 300 registrations: make test-slow (CI)
def test_300_models_within_a_budget_of_50_loaded(tmp_path: Path) -> None:
    live = LiveServer(tmp_path, KESTREL_MAX_LOADED_MODELS=str(BUDGET)).start()
    try:
        blobs = {i: sio.dumps(_model(i)) for i in range(MODELS)}
        for i, blob in blobs.items():
            r = live.register(f"m{i}", blob, options='{"max_batch": 4}')
            assert r.status_code == 201, r.text
            if i == BUDGET - 1:
                at_budget = live.metric("process_resident_memory_bytes")
        registered = live.metric("process_resident_memory_bytes")
        assert live.metric("kestrel_models", state="READY") <= BUDGET

        rng = random.Random(0)
        picks = [rng.randrange(MODELS) for _ in range(1500)]

        def ask(i: int) -> float:
            r = live.client.post(f"/models/m{i}/predict", json=X[:2].tolist())
            assert r.status_code == 200, (i, r.status_code, r.text)
            (out,) = r.json()["outputs"].values()
            got = np.ravel(out)
            np.testing.assert_allclose(got, _model(i).predict(X[:2]), rtol=1e-5, atol=1e-5)
            return r.elapsed.total_seconds()

        with ThreadPoolExecutor(8) as pool:
            latencies = list(pool.map(ask, picks))
        assert live.metric("kestrel_models", state="READY") <= BUDGET
        assert live.metric("kestrel_models", state="UNLOADED") >= MODELS - BUDGET
        reloads = live.metric("kestrel_model_reload_duration_seconds_count")
        assert reloads > 0
        assert live.metric("kestrel_compiles_total", cause="after_ready") == 0
        end = live.metric("process_resident_memory_bytes")
        print(
            f"\n300 models, budget {BUDGET}: RSS {at_budget / 2**20:.0f} MiB at {BUDGET} "
            f"registered, {registered / 2**20:.0f} MiB at {MODELS}, {end / 2**20:.0f} MiB after "
            f"{len(picks)} requests ({reloads:.0f} reloads, mean "
            f"{live.metric('kestrel_model_reload_duration_seconds_sum') / reloads * 1e3:.0f} ms); "
            f"request p50 {np.percentile(latencies, 50) * 1e3:.1f} ms, "
            f"p99 {np.percentile(latencies, 99) * 1e3:.1f} ms"
        )
    finally:
        live.stop()
