"""``service.runtime``: a serving process does its one-time work (skops, the JAX backend, the
native tree kernels) as it starts, so the first upload does not wait for it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from service import runtime
from tests.service.live import LiveServer


def test_prepare_reports_each_step() -> None:
    seconds = runtime.prepare()
    assert set(seconds) == {"skops", "backend", "native kernels"}
    assert all(s >= 0 for s in seconds.values())


def test_a_failing_preparation_is_logged_not_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(backend: str = "jax") -> dict[str, float]:
        raise RuntimeError("no backend here")

    monkeypatch.setattr(runtime, "prepare", broken)
    with caplog.at_level(logging.ERROR, logger="kestrel.runtime"):
        runtime.start_preparing().join(timeout=30)
    assert "preparing the runtime failed" in caplog.text
    assert "no backend here" in caplog.text


def test_a_server_builds_its_native_kernels_into_its_cache_at_start(tmp_path: Path) -> None:
    server = LiveServer(tmp_path).start()
    try:
        deadline = time.monotonic() + 120
        while "runtime prepared" not in server.logs():
            assert time.monotonic() < deadline, server.logs()
            assert server.alive(), server.logs()
            time.sleep(0.2)
        # numba's machine code, under the server's cache directory, before any model arrived.
        built = {p.name.split(".")[0] for p in (tmp_path / "cache" / "numba").rglob("*.nbi")}
        assert {"forest", "forest_bits"} <= built, built
    finally:
        server.stop()
