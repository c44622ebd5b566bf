"""``service.runtime``: a serving process does its one-time work as it starts: skops and the JAX
backend on the loader thread before any load, the native tree kernels once the stored versions
are loaded."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import skops.io as sio
from sklearn.ensemble import RandomForestClassifier

from service import runtime
from tests.service.live import LiveServer

KERNELS_READY = "native kernels ready"


def test_prepare_reports_each_step() -> None:
    seconds = runtime.prepare()
    assert set(seconds) == {"skops", "backend"}
    assert all(s >= 0 for s in seconds.values())


def test_a_failing_preparation_is_logged_not_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(backend: str = "jax") -> dict[str, float]:
        raise RuntimeError("no backend here")

    monkeypatch.setattr(runtime, "prepare", broken)
    with caplog.at_level(logging.ERROR, logger="kestrel.runtime"):
        runtime.prepare_logged()
    assert "preparing the runtime failed" in caplog.text
    assert "no backend here" in caplog.text


def test_failing_kernel_builds_are_logged_not_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> float:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(runtime.compiler.kernels, "KERNEL_BUILDS", (broken,))
    with caplog.at_level(logging.ERROR, logger="kestrel.runtime"):
        runtime.start_building_kernels().join(30)
    assert "building the native kernels failed" in caplog.text
    assert "no compiler here" in caplog.text


def test_a_stopping_server_starts_no_further_kernel_build(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The build is no daemon (an exit mid-compile aborts in LLVM): a stopping server lets the
    family in the works finish and starts no other."""
    started = threading.Event()
    release = threading.Event()
    built: list[str] = []

    def slow() -> float:
        started.set()
        release.wait(30)
        built.append("slow")
        return 0.0

    def later() -> float:
        built.append("later")
        return 0.0

    monkeypatch.setattr(runtime.compiler.kernels, "KERNEL_BUILDS", (slow, later))
    with caplog.at_level(logging.INFO, logger="kestrel.runtime"):
        thread = runtime.start_building_kernels()
        assert not thread.daemon
        assert started.wait(30)
        runtime.stop_building_kernels()
        release.set()
        thread.join(30)
    assert built == ["slow"]
    assert "stopped building the native kernels" in caplog.text


def _wait_for(server: LiveServer, line: str, since: int = 0) -> str:
    """The server's whole log from ``since`` once ``line`` is in it."""
    deadline = time.monotonic() + 120
    while line not in (text := server.log_path.read_text(errors="replace")[since:]):
        assert time.monotonic() < deadline, server.logs()
        assert server.alive(), server.logs()
        time.sleep(0.2)
    return text


def test_a_server_builds_its_native_kernels_into_its_cache_at_start(tmp_path: Path) -> None:
    """After the runtime's preparation even with no stored version: a registration that arrives
    at start waits for skops, which would share the core with the kernel build."""
    server = LiveServer(tmp_path).start()
    try:
        text = _wait_for(server, KERNELS_READY)
        assert text.index("runtime prepared") < text.index(KERNELS_READY), text
        # numba's machine code, under the server's cache directory, before any model arrived.
        built = {p.name.split(".")[0] for p in (tmp_path / "cache" / "numba").rglob("*.nbi")}
        assert {"forest", "forest_bits"} <= built, built
    finally:
        server.stop()


def test_a_restart_loads_after_the_runtime_and_before_the_kernels(tmp_path: Path) -> None:
    """The loads need skops and the backend, so those come first, on the loader thread; the
    kernels' thread would only contend with the loads, which build what they run themselves."""
    x = np.random.default_rng(0).integers(0, 4, size=(120, 3)).astype(np.float64)
    forest = RandomForestClassifier(n_estimators=3, max_depth=3, random_state=0)
    forest.fit(x, x[:, 0] > 1)
    server = LiveServer(tmp_path).start()
    try:
        assert server.register("forest", sio.dumps(forest)).status_code == 201, server.logs()
        server.stop()
        since = server.log_path.stat().st_size
        server.start()
        text = _wait_for(server, KERNELS_READY, since)
    finally:
        server.stop()
    prepared, ready = text.index("runtime prepared"), text.index(" READY in ")
    assert prepared < ready < text.index(KERNELS_READY), text
