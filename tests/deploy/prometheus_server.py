"""A real Prometheus server process for tests: Debian's ``/usr/bin/prometheus`` on a free port."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.deploy.tools import require
from tests.service.live import free_port


class PromQLError(RuntimeError):
    """Prometheus refused a query (a syntax error, an unknown function, a bad range...)."""


class PrometheusServer:
    """``prometheus`` with ``config`` (a parsed prometheus.yml) and its own TSDB in ``workdir``."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def start(self, timeout: float = 30) -> PrometheusServer:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                require("prometheus"),
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.wait(lambda: self.client.get("/-/ready").status_code == 200, timeout, "ready")
        return self

    def wait(self, condition: Any, timeout: float, what: str) -> None:
        """Poll ``condition()`` every 0.2 s until it is true; fail with the server's log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}:\n{self.logs()}")
            try:
                if condition():
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus: not {what} within {timeout} s:\n{self.logs()}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at now: the result vector (a scalar comes back as one sample)."""
        response = self.client.get("/api/v1/query", params={"query": expr})
        doc = response.json()
        if doc.get("status") != "success":
            raise PromQLError(f"{expr!r}: {doc.get('errorType')}: {doc.get('error')}")
        data = doc["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def rule_groups(self) -> list[dict[str, Any]]:
        return self.client.get("/api/v1/rules").json()["data"]["groups"]

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.client.close()
