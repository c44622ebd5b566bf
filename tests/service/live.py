"""A real ``kestrel serve`` process for API tests: started, probed, killed like in production."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ADMIN_TOKEN = "test-admin-token"
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """``python -m service.cli serve`` on a free port with its own store and compile cache."""

    def __init__(
        self, workdir: Path, *, port: int | None = None, grpc: bool = False, **env: str
    ) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # gRPC only where a test asks for it: servers running side by side would all take the
        # default port.
        self.grpc_port = free_port() if grpc else None
        self.grpc_address = f"127.0.0.1:{self.grpc_port}" if grpc else None
        inherited = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
        self.env = {
            **inherited,
            "KESTREL_STORE_URL": str(workdir / "store"),
            "KESTREL_CACHE_DIR": str(workdir / "cache"),
            "KESTREL_ADMIN_TOKEN": ADMIN_TOKEN,
            "KESTREL_POLL_INTERVAL_S": "0",
            "KESTREL_LOG_LEVEL": "info",
            "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
            "KESTREL_GRPC_PORT": str(self.grpc_port or 0),
            # One process unless a test asks for a pod (the default is one worker per core).
            "KESTREL_WORKERS": "1",
            # This checkout's code, in the server and in each of its worker processes.
            "PYTHONPATH": str(ROOT),
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"server-{self.port}.log"
        self.client = httpx.Client(base_url=self.url, timeout=120)
        self.admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def start(self, timeout: float = 120) -> LiveServer:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.logs()}")
            try:
                if self.client.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready in {timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def kill(self) -> None:
        """kill -9: no shutdown hooks, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return self.client.get("/healthz").status_code == 200

    # -- helpers -------------------------------------------------------------------------------
    def register(
        self,
        name: str,
        data: bytes,
        *,
        filename: str = "model.skops",
        sample: str | None = None,
        options: str | None = None,
        wait: bool = True,
        promote: bool = True,
        headers: dict[str, str] | None = None,
        **fields: str,
    ) -> httpx.Response:
        form: dict[str, Any] = {"name": name, **fields}
        if sample is not None:
            form["sample"] = sample
        if options is not None:
            form["options"] = options
        return self.client.post(
            "/models",
            params={"wait": str(wait).lower(), "promote": str(promote).lower()},
            data=form,
            files={"file": (filename, io.BytesIO(data))},
            headers=self.admin if headers is None else headers,
        )

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples matching ``labels`` in one /metrics scrape."""
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        text = self.client.get("/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total
