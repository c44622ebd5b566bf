"""Register the iris demo model with a running Kestrel through ``kestrel register`` (HTTP upload).

The compose stack's one-shot ``register-demo`` service runs this inside the Kestrel image, so the
demo model takes the path every user's model takes: multipart upload → allow-listed load →
compile → warm-up → parity check → READY, into the shared store (MinIO). It waits for the server's
readiness first and does nothing when the model is already registered, so ``docker compose up``
can be run again.

Usage: ``python register_demo.py [--url URL] [--name iris]``; the admin token comes from
``KESTREL_ADMIN_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from service.cli import main as kestrel
from service.demo_model import demo_artifact


def wait_ready(client: httpx.Client, timeout_s: float) -> None:
    """Poll ``/readyz`` until the server has recovered its stored models."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = client.get("/readyz")
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.TransportError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(1.0)
    raise SystemExit(f"{client.base_url} was not ready within {timeout_s:.0f} s (last: {last})")


def already_registered(client: httpx.Client, name: str, token: str | None) -> bool:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = client.get(f"/models/{name}", headers=headers)
    if response.status_code == 200:
        return True
    if response.status_code == 404:
        return False
    raise SystemExit(f"GET /models/{name} answered {response.status_code}: {response.text[:300]}")


def register(
    url: str, name: str, token: str | None, ready_timeout_s: float, max_batch: int = 256
) -> int:
    """Upload the demo model unless ``name`` exists; the exit code of ``kestrel register``."""
    with httpx.Client(base_url=url, timeout=30) as client:
        wait_ready(client, ready_timeout_s)
        if already_registered(client, name, token):
            print(f"model {name!r} is already registered at {url}; nothing to do")
            return 0
    data, sample = demo_artifact()
    with tempfile.TemporaryDirectory(prefix="kestrel-demo-") as tmp:
        model_path, sample_path = Path(tmp) / f"{name}.skops", Path(tmp) / "sample.json"
        model_path.write_bytes(data)
        sample_path.write_text(json.dumps(sample))
        argv = ["register", str(model_path), "--name", name, "--url", url]
        argv += ["--sample", str(sample_path), "--options", json.dumps({"max_batch": max_batch})]
        if token:
            argv += ["--token", token]
        return kestrel(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("KESTREL_URL", "http://kestrel:8000"))
    parser.add_argument("--name", default="iris", help="model name (default iris)")
    parser.add_argument(
        "--ready-timeout", type=float, default=300.0, help="seconds to wait for /readyz"
    )
    parser.add_argument(
        "--max-batch", type=int, default=256, help="largest compiled batch bucket (default 256)"
    )
    args = parser.parse_args(argv)
    token = os.environ.get("KESTREL_ADMIN_TOKEN") or None
    return register(args.url.rstrip("/"), args.name, token, args.ready_timeout, args.max_batch)


if __name__ == "__main__":
    sys.exit(main())
