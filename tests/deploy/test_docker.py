"""Static checks of the Dockerfile and the compose stack (no Docker engine runs on CI machines)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.tools import docker_compose_env, require, run

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LONG_RUNNING = ("minio", "kestrel", "prometheus", "grafana")
ONE_SHOTS = ("create-bucket", "register-demo")


def test_hadolint_passes() -> None:
    hadolint = require("hadolint")
    run([hadolint, "--failure-threshold", "info", str(DOCKERFILE)], cwd=ROOT)


def test_dockerfile_runtime_contract() -> None:
    """What the issue asks of the image, checked on the final stage's instructions."""
    text = DOCKERFILE.read_text()
    stages = re.split(r"^FROM\s", text, flags=re.M)
    assert len(stages) == 3, "two stages: builder and runtime"
    runtime = stages[-1]
    assert re.search(r"^USER\s+10001:10001$", runtime, re.M), "runtime runs as a non-root user"
    cmd = re.search(r"^CMD\s+(\[.*\])$", runtime, re.M)
    assert cmd is not None, "CMD must be in exec form (JSON array)"
    assert json.loads(cmd.group(1)) == ["kestrel", "serve", "--host", "0.0.0.0"]
    assert "/healthz" in runtime.split("HEALTHCHECK", 1)[1].split("\n\n", 1)[0]
    volume = re.search(r"^VOLUME\s+(\[.*\])$", runtime, re.M)
    assert volume is not None, "the store and the compile cache are volumes"
    assert json.loads(volume.group(1)) == ["/var/lib/kestrel/store", "/var/cache/kestrel"]
    assert "KESTREL_STORE_URL=/var/lib/kestrel/store" in runtime
    assert "KESTREL_CACHE_DIR=/var/cache/kestrel" in runtime
    builder = stages[1]
    assert re.search(r"^ARG ACCELERATOR=cpu$", builder, re.M)
    assert '"jax[cuda12]' in builder
    assert "[test]" not in text and "torch" not in builder.split("RUN if", 1)[1]


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``docker compose --profile load config`` as JSON: the stack as Compose resolves it."""
    docker = require("docker")
    env = docker_compose_env(tmp_path_factory.mktemp("docker-config"))
    version = run([docker, "compose", "version"], cwd=ROOT, env=env)
    assert "Docker Compose" in version, version
    run([docker, "compose", "config", "--quiet"], cwd=ROOT, env=env)
    out = run(
        [docker, "compose", "--profile", "load", "config", "--format", "json"], cwd=ROOT, env=env
    )
    return json.loads(out)


def test_compose_services_and_dependencies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {*LONG_RUNNING, *ONE_SHOTS, "loadgen"}
    for name in LONG_RUNNING:
        check = services[name].get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), f"{name} needs a healthcheck"
    depends = {name: svc.get("depends_on", {}) for name, svc in services.items()}
    assert depends["create-bucket"]["minio"]["condition"] == "service_healthy"
    assert depends["kestrel"]["create-bucket"]["condition"] == "service_completed_successfully"
    assert depends["register-demo"]["kestrel"]["condition"] == "service_healthy"
    assert depends["grafana"]["prometheus"]["condition"] == "service_healthy"
    assert depends["loadgen"]["register-demo"]["condition"] == "service_completed_successfully"
    assert services["loadgen"]["profiles"] == ["load"]


def test_compose_wires_store_metrics_and_dashboards(compose: dict[str, Any]) -> None:
    services = compose["services"]
    kestrel = services["kestrel"]
    env = kestrel["environment"]
    assert env["KESTREL_STORE_URL"].startswith("s3://")
    options = json.loads(env["KESTREL_STORE_OPTIONS"])
    assert options["client_kwargs"]["endpoint_url"] == "http://minio:9000"
    assert env["KESTREL_ADMIN_TOKEN"], "0.0.0.0 without a token: kestrel serve refuses to start"
    assert kestrel["build"]["args"]["ACCELERATOR"] == "cpu"
    mounts = {
        svc: {v["target"]: v.get("source") for v in services[svc].get("volumes", [])}
        for svc in services
    }
    assert Path(mounts["prometheus"]["/etc/prometheus"]) == ROOT / "deploy" / "prometheus"
    assert Path(mounts["grafana"]["/etc/grafana/provisioning"]) == (
        ROOT / "deploy" / "grafana" / "provisioning"
    )
    assert Path(mounts["grafana"]["/etc/grafana/dashboards"]) == (
        ROOT / "deploy" / "grafana" / "dashboards"
    )
    grafana_env = services["grafana"]["environment"]
    assert grafana_env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert grafana_env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    for script_user in ("register-demo", "loadgen"):
        script = Path(services[script_user]["command"][1].replace("/opt/kestrel-demo", ""))
        assert (ROOT / "deploy" / "compose" / script.name).is_file()


def test_compose_without_load_profile_has_no_load_generator(tmp_path: Path) -> None:
    docker = require("docker")
    env = docker_compose_env(tmp_path)
    out = run([docker, "compose", "config", "--services"], cwd=ROOT, env=env)
    assert "loadgen" not in out.split()
    assert {"kestrel", "register-demo", "grafana"} <= set(out.split())
