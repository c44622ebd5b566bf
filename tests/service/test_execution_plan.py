"""One execution plan per model version, across processes (real ``kestrel serve`` processes).

The server that registers a version decides where each bucket runs (lazy/plan.py) and stores
that plan with the version; every other process that loads the version follows it, so that two
replicas answer the same rows with the same bits, and a restart places and times nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import skops.io as sio
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from service.store import ModelStore
from tests.service.live import LiveServer

FEATURES = 24


def _rows(n: int, seed: int) -> np.ndarray:
    """Real data shapes: integer counts, a binary flag, repeated and continuous values."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES))
    x[:, 0] = rng.integers(0, 5, n)
    x[:, 1] = rng.integers(0, 2, n)
    x[:, 2] = np.round(x[:, 2], 1)
    return x


X = _rows(600, 0)
MODEL = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(
    X, X[:, 1] + X[:, 3] + X[:, 0] * X[:, 4] > 1
)


def _answers(server: LiveServer) -> list[Any]:
    out = []
    for rows in (1, 2, 5, 17, 64, 300):
        x = _rows(rows, rows)
        r = server.client.post(
            "/models/m/predict", content=json.dumps(x.tolist()), params={"outputs": "predict_proba"}
        )
        assert r.status_code == 200, r.text
        out.append(r.json()["outputs"])
    return out


def _version(server: LiveServer) -> dict[str, Any]:
    (doc,) = server.client.get("/models/m", headers=server.admin).json()["versions"]
    assert doc["state"] == "READY", doc
    return doc


def _plan(server: LiveServer) -> list[Any]:
    return _version(server)["plan"]


def _phases_add_up(server: LiveServer, phases: set[str]) -> None:
    """The version reports the phases its load went through, and the loader thread's share
    of the load is theirs: no phase left untimed, none counted twice."""
    doc = _version(server)
    assert set(doc["load_phases"]) == phases
    assert 0 < sum(doc["load_phases"].values()) <= doc["load_seconds"]
    for phase in phases:
        assert server.metric("kestrel_model_load_phase_duration_seconds_count", phase=phase) == 1


@pytest.mark.slow  # three server processes in turn: half a minute
def test_replicas_follow_the_stored_plan_bit_for_bit_and_a_restart_compiles_nothing(
    tmp_path: Path,
) -> None:
    a = LiveServer(tmp_path).start()
    b_env = {"KESTREL_CACHE_DIR": str(tmp_path / "cache-b")}
    try:
        r = a.register("m", sio.dumps(MODEL), options='{"max_batch": 64}')
        assert r.status_code == 201, r.text
        plan_a = _plan(a)
        _phases_add_up(a, {"trace", "buckets", "parity", "store"})
        (graph,) = plan_a
        assert [p["bucket"] for p in graph] == [1, 2, 4, 8, 16, 32, 64]
        assert {p["runs_on"] for p in graph} <= {"host", "device"}
        assert any(p["reason"] == "measured" for p in graph)
        # The plan is stored with the version, whole.
        record = ModelStore(str(tmp_path / "store")).load_manifest().current("m")
        assert record is not None and record.plan is not None
        assert [[p for p in g["placements"]] for g in record.plan["graphs"]] == plan_a
        answers_a = _answers(a)

        # Another process, its own executable cache, the same store: it loads the version at
        # start and follows the stored plan (the same placements, timings included: it measured
        # nothing), so its answers are the same bits.
        b = LiveServer(tmp_path, **b_env).start()
        try:
            assert _plan(b) == plan_a
            assert _answers(b) == answers_a
            assert "not following its stored execution plan" not in b.logs()
        finally:
            b.stop()

        # B again, on its own cache: nothing to compile, nothing to time, the same answers.
        b = LiveServer(tmp_path, **b_env).start()
        try:
            assert _plan(b) == plan_a
            assert b.metric("kestrel_compiles_total") == 0
            _phases_add_up(b, {"read", "trace", "buckets", "parity"})
            assert _answers(b) == answers_a
        finally:
            b.stop()
    finally:
        a.stop()
