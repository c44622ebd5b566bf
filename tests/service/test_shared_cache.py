"""The compile cache shared through the store: real ``kestrel serve`` processes on one S3
endpoint (moto's server mode), each with its own empty local cache directory."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import skops.io as sio
from sklearn.ensemble import HistGradientBoostingRegressor, RandomForestClassifier

from service import score
from service.settings import Settings
from service.shared_cache import StoreTier
from service.store import InvalidName, ModelStore
from tests.service.live import LiveServer

OPTIONS = '{"max_batch": 8}'
# Loads a stored version as `kestrel score` does and prints its cache's stats.
OFFLINE = (
    "import json, sys; from service import score; from service.settings import Settings; "
    "model = score.load_model(sys.argv[1], Settings()).model; "
    "print(json.dumps(model.options.cache.stats.snapshot()))"
)
KEY = "a secret every server of the fleet shares"


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 4)).round(1)  # repeated values: rows land on split thresholds
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    return {
        "rf": RandomForestClassifier(n_estimators=6, max_depth=4, random_state=0).fit(x, y),
        "hgb": HistGradientBoostingRegressor(max_iter=8, random_state=0).fit(x, x[:, 2]),
        "rows": x[:40],
    }


@pytest.fixture
def s3(s3_storage_options: dict[str, Any], s3_bucket: str) -> dict[str, Any]:
    return {"url": f"s3://{s3_bucket}/kestrel", "options": s3_storage_options}


def _server(tmp_path: Path, name: str, s3: dict[str, Any], **env: str) -> LiveServer:
    workdir = tmp_path / name
    workdir.mkdir()
    return LiveServer(
        workdir,
        # Every bucket on the device: on these two cores the host wins small forests, and a
        # host plan is rebuilt, never cached.
        KESTREL_HOST_ROWS="0",
        KESTREL_STORE_URL=s3["url"],
        KESTREL_STORE_OPTIONS=json.dumps(s3["options"]),
        **env,
    )


def _on_device(server: LiveServer, name: str) -> int:
    """Buckets the version's stored plan runs on the device: those that need an executable."""
    (version,) = server.client.get(f"/models/{name}", headers=server.admin).json()["versions"]
    assert version["state"] == "READY", version
    return sum(p["runs_on"] == "device" for graph in version["plan"] for p in graph)


def _answers(server: LiveServer, rows: np.ndarray) -> dict[str, Any]:
    return {
        name: server.client.post(f"/models/{name}/predict", json=rows.tolist()).json()["outputs"]
        for name in ("rf", "hgb")
    }


@pytest.fixture
def fleet(tmp_path: Path, s3: dict[str, Any]) -> Iterator[dict[str, LiveServer]]:
    """Replicas a and b, sharing a signing key, each with its own local cache."""
    servers = {
        "a": _server(tmp_path, "a", s3, KESTREL_CACHE_SIGNING_KEY=KEY),
        "b": _server(tmp_path, "b", s3, KESTREL_CACHE_SIGNING_KEY=KEY),
    }
    try:
        yield servers
    finally:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.stop(), servers.values()))


@pytest.mark.slow  # two server processes and an S3 server: half a minute
def test_a_second_replica_is_ready_without_compiling(
    fleet: dict[str, LiveServer],
    s3: dict[str, Any],
    models: dict[str, Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = fleet["a"].start()
    for name in ("rf", "hgb"):
        r = a.register(name, sio.dumps(models[name]), options=OPTIONS)
        assert r.status_code == 201, r.text
    on_device = sum(_on_device(a, name) for name in ("rf", "hgb"))
    assert on_device > 0
    assert a.metric("kestrel_compiles_total") == on_device
    written = a.metric("kestrel_executable_cache_tier_events_total", tier="store", event="writes")
    assert written == on_device

    b = fleet["b"].start()  # on an empty local cache
    assert b.metric("kestrel_compiles_total") == 0
    assert b.metric("kestrel_executable_cache_tier_events_total", tier="store", event="loads") == (
        on_device
    )
    assert _answers(b, models["rows"]) == _answers(a, models["rows"])

    # Offline scoring, as a process of the fleet's configuration, reads the fleet's executables
    # and never writes the store.
    store = ModelStore(s3["url"], s3["options"])
    before = store.executable_names("")  # every entry
    env = {
        **a.env,
        "KESTREL_CACHE_DIR": str(tmp_path / "offline"),
        "KESTREL_CACHE_SIGNING_KEY": KEY,
    }
    stats = json.loads(
        subprocess.run(
            [sys.executable, "-c", OFFLINE, "rf@1"],
            env={**env, "KESTREL_LOG_LEVEL": "info"},
            capture_output=True,
            check=True,
        ).stdout.splitlines()[-1]
    )
    assert stats["total_compiles"] == 0, json.dumps(stats)
    assert stats["tier_loads"] == {"store": _on_device(a, "rf")}
    assert store.executable_names("") == before

    # This test process runs XLA with other flags: another backend, which compiles for itself
    # (and places anew: the stored plan is bound to the backend too) and says why.
    settings = Settings(
        store_url=s3["url"],
        store_options=s3["options"],
        cache_dir=tmp_path / "here",
        cache_signing_key=KEY,
    )
    with caplog.at_level(logging.INFO, logger="kestrel.lazy.cache"):
        here = score.load_model("rf@1", settings).model.options.cache.stats.snapshot()
    assert here["tier_foreign"].get("store", 0) >= 1 and not here["tier_loads"]
    assert "xla_flags --xla_cpu_multi_thread_eigen=false (here" in caplog.text
    assert store.executable_names("") == before


def test_store_tier_names_are_validated(tmp_path: Path) -> None:
    tier = StoreTier(ModelStore(str(tmp_path)), writable=True)
    name = "ab" * 32 + "-" + "cd" * 8 + ".xc"
    assert tier.read(name) is None
    tier.write(name, b"entry")
    assert tier.read(name) == b"entry"
    assert tier.names("ab" * 32 + "-") == [name]
    for bad in ("../manifest.json", "ab" * 32 + "-x.xc", name + "/.."):
        with pytest.raises(InvalidName):
            tier.read(bad)
    for pattern in ("*", "ab/", "[a-f]"):
        with pytest.raises(InvalidName):
            tier.names(pattern)
