"""deploy/k8s rendered with ``kubectl kustomize``, validated, and checked against the service.

Every kustomization is rendered by the real kubectl (``.ci/run`` installs Debian's
kubernetes-client where it is missing; without kubectl these tests fail, never skip). Core kinds
are validated strictly by kubernetes-validate, custom resources against ``crd_schemas``; then the
manifests are held to what the service really is: its routes, its settings, its port, its drain
time, its metric names.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions
from prometheus_client import CollectorRegistry

from service.metrics import Metrics
from service.settings import Settings
from tests.deploy.crd_schemas import SCHEMAS, validate_custom
from tests.deploy.promql import metric_names

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "kestrel.json"
TARGETS = ("base", "overlays/hpa", "overlays/keda", "kserve")
# The oldest and the newest Kubernetes releases kubernetes-validate has schemas for.
KUBERNETES_VERSIONS = tuple(sorted({all_versions()[0], all_versions()[-1]}))
CLUSTER_SCOPED = {"Namespace", "ClusterServingRuntime"}
SERVER_LABELS = {"app.kubernetes.io/name": "kestrel", "app.kubernetes.io/component": "server"}


# -- rendering ------------------------------------------------------------------------------------
def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail(
            "kubectl is not installed: deploy/k8s is checked by rendering it with "
            "`kubectl kustomize` (Debian: apt-get install kubernetes-client; .ci/run does it)",
            pytrace=False,
        )
    return found


def render(target: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(K8S / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {target} failed:\n{result.stderr}", pytrace=False)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {target: render(target) for target in TARGETS}


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def server_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def kserve_container(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    runtime = only(rendered["kserve"], "ClusterServingRuntime")
    (container,) = runtime["spec"]["containers"]
    return container


def config_map(docs: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    """A generated ConfigMap by its name before kustomize's hash suffix."""
    (found,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix)
    ]
    return found


def environment(container: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every variable the container gets: ConfigMaps through envFrom, then its own env entries
    (a literal value, or the valueFrom reference)."""
    env: dict[str, Any] = {}
    by_name = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in by_name, f"envFrom names ConfigMap {name!r}, which is not rendered"
        env.update(by_name[name]["data"])
    for entry in container.get("env", []):
        env[entry["name"]] = entry.get("value", entry.get("valueFrom"))
    return env


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# -- validity -------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_document_validates(
    rendered: dict[str, list[dict[str, Any]]], target: str, version: str
) -> None:
    for doc in rendered[target]:
        where = f"{target}: {doc['kind']}/{doc['metadata']['name']}"
        try:
            if (doc["apiVersion"], doc["kind"]) in SCHEMAS:
                validate_custom(doc, version)
            else:
                kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{where}: no schema: {exc.message}", pytrace=False)
        except jsonschema.ValidationError as exc:
            path = ".".join(str(p) for p in exc.absolute_path)
            pytest.fail(f"{where} is invalid for Kubernetes {version} at {path}: {exc.message}")


def test_the_custom_resource_schemas_catch_mistakes() -> None:
    version = KUBERNETES_VERSIONS[-1]
    good = render("overlays/keda")
    scaled = only(good, "ScaledObject")
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 0.025  # KEDA wants strings
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'string'"):
        validate_custom(scaled, version)
    monitor = only(good, "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError, match="does not match"):
        validate_custom(monitor, version)
    runtime = only(render("kserve"), "ClusterServingRuntime")
    runtime["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True  # a typo
    with pytest.raises(jsonschema.ValidationError, match="readOnlyRootFS"):
        validate_custom(runtime, version)


def test_each_target_has_what_it_promises(rendered: dict[str, list[dict[str, Any]]]) -> None:
    common = [
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        "Namespace",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]
    assert kinds(rendered["base"]) == common
    # HPA and KEDA on one Deployment would fight over its replica count: one autoscaler each.
    assert kinds(rendered["overlays/hpa"]) == sorted([*common, "HorizontalPodAutoscaler"])
    assert kinds(rendered["overlays/keda"]) == sorted([*common, "ScaledObject"])
    assert kinds(rendered["kserve"]) == ["ClusterServingRuntime"]
    for target in ("base", "overlays/hpa", "overlays/keda"):
        for doc in rendered[target]:
            if doc["kind"] not in CLUSTER_SCOPED:
                assert doc["metadata"].get("namespace") == "kestrel", (target, doc["kind"])
        # The autoscaler owns the replica count: re-applying must not reset it.
        assert "replicas" not in only(rendered[target], "Deployment")["spec"]


# -- the pods against the service -----------------------------------------------------------------
@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """GET routes of the real application."""
    from service.app import create_app

    store = tmp_path_factory.mktemp("k8s-store")
    app = create_app(Settings(store_url=str(store), cache_dir=None), CollectorRegistry())
    return {r.path for r in app.routes if "GET" in getattr(r, "methods", ())}


def probes(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        k: container[k]
        for k in ("startupProbe", "livenessProbe", "readinessProbe")
        if k in container
    }


def test_probes_hit_the_real_health_routes(
    rendered: dict[str, list[dict[str, Any]]], routes: set[str]
) -> None:
    for container in (server_container(rendered["base"]), kserve_container(rendered)):
        found = probes(container)
        assert {"livenessProbe", "readinessProbe"} <= set(found), container["name"]
        for kind, probe in found.items():
            assert probe["httpGet"]["path"] in routes, (container["name"], kind)
        assert found["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert found["readinessProbe"]["httpGet"]["path"] == "/readyz"
    startup = probes(server_container(rendered["base"]))["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    # Generous: importing jax and the first compiles must not get the pod killed.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_pods_run_unprivileged_with_a_read_only_root(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    pod = only(rendered["base"], "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    runtime = only(rendered["kserve"], "ClusterServingRuntime")["spec"]
    for container, volumes, docs in (
        (server_container(rendered["base"]), pod["volumes"], rendered["base"]),
        (kserve_container(rendered), runtime["volumes"], rendered["kserve"]),
    ):
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        # What the server writes must be a writable volume: the root filesystem is not.
        env = environment(container, docs)
        writable = {v["name"] for v in volumes if "emptyDir" in v}
        mounted = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        needed = ["/tmp", env["KESTREL_CACHE_DIR"]]
        if "://" not in env["KESTREL_STORE_URL"]:
            needed.append(env["KESTREL_STORE_URL"])
        for path in needed:
            assert mounted.get(path) in writable, f"{container['name']}: {path} is not writable"


def test_env_names_are_real_settings_with_valid_values(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    fields = Settings.model_fields
    for container, docs in (
        (server_container(rendered["base"]), rendered["base"]),
        (kserve_container(rendered), rendered["kserve"]),
    ):
        env = environment(container, docs)
        assert env, container["name"]
        literals = {}
        for name, value in env.items():
            assert name.startswith("KESTREL_"), f"{name} is not a Kestrel setting"
            field = name.removeprefix("KESTREL_").lower()
            assert field in fields, f"{name} is not a field of service.settings.Settings"
            if isinstance(value, str) and "{{" not in value:  # KServe fills {{...}} in
                literals[field] = value
        Settings(**literals)  # the values parse (a port is a number, a duration is a float, ...)
        # Credentials only through Secrets, never as literals in the manifests.
        token = env["KESTREL_ADMIN_TOKEN"]
        assert isinstance(token, dict) and "secretKeyRef" in token, container["name"]
    store_options = environment(server_container(rendered["base"]), rendered["base"])[
        "KESTREL_STORE_OPTIONS"
    ]
    assert "secretKeyRef" in store_options


def test_the_container_runs_the_kestrel_command(rendered: dict[str, list[dict[str, Any]]]) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for container in (server_container(rendered["base"]), kserve_container(rendered)):
        command = container["command"]
        assert command[0] in scripts and command[1:] == ["serve"], command
        assert container["image"].split(":")[0] == "kestrel"


def test_ports_are_consistent(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["base"]
    container = server_container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = environment(container, docs)
    assert ports == {"http": int(env["KESTREL_PORT"]), "grpc": int(env["KESTREL_GRPC_PORT"])}
    assert ports["http"] == Settings.model_fields["port"].default
    assert ports["grpc"] == Settings.model_fields["grpc_port"].default
    service = only(docs, "Service")
    service_port, grpc_port = service["spec"]["ports"]
    assert (service_port["name"], service_port["port"]) == ("http", 8000)
    assert (grpc_port["name"], grpc_port["port"]) == ("grpc", 8081)
    assert {service_port["targetPort"], grpc_port["targetPort"]} == set(ports)
    for probe in probes(container).values():
        assert probe["httpGet"]["port"] in ports
    (endpoint,) = only(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["port"] == service_port["name"]
    # KServe sends traffic and scrapes on the runtime's port 8080.
    runtime = only(rendered["kserve"], "ClusterServingRuntime")["spec"]
    kcontainer = kserve_container(rendered)
    kport = int(environment(kcontainer, rendered["kserve"])["KESTREL_PORT"])
    assert [p["containerPort"] for p in kcontainer["ports"]] == [kport] == [8080]
    assert int(runtime["annotations"]["prometheus.kserve.io/port"]) == kport
    for probe in probes(kcontainer).values():
        assert probe["httpGet"]["port"] == kport


def test_selectors_match_the_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for target in ("overlays/hpa", "overlays/keda"):
        docs = rendered[target]
        deployment = only(docs, "Deployment")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector == SERVER_LABELS and matches(selector, pod_labels)
        service = only(docs, "Service")
        assert matches(service["spec"]["selector"], pod_labels)
        assert matches(
            only(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], pod_labels
        )
        spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert all(matches(c["labelSelector"]["matchLabels"], pod_labels) for c in spread)
        monitor = only(docs, "ServiceMonitor")
        assert matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
        assert (
            only(docs, "ServiceAccount")["metadata"]["name"]
            == deployment["spec"]["template"]["spec"]["serviceAccountName"]
        )
        scaler = only(docs, "HorizontalPodAutoscaler" if target.endswith("hpa") else "ScaledObject")
        target_ref = scaler["spec"]["scaleTargetRef"]
        assert (target_ref["apiVersion"], target_ref["kind"], target_ref["name"]) == (
            "apps/v1",
            "Deployment",
            deployment["metadata"]["name"],
        )


def test_termination_outlasts_the_drain(rendered: dict[str, list[dict[str, Any]]]) -> None:
    cli = (ROOT / "service" / "cli.py").read_text()
    match = re.search(r"timeout_graceful_shutdown=(\d+)", cli)
    assert match, "service/cli.py no longer sets uvicorn's timeout_graceful_shutdown"
    drain_s = int(match.group(1))
    pod = only(rendered["base"], "Deployment")["spec"]["template"]["spec"]
    pre_stop = server_container(rendered["base"])["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    sleep_s = int(pre_stop[1])
    assert sleep_s > 0  # endpoints are removed before SIGTERM stops new connections
    assert pod["terminationGracePeriodSeconds"] > sleep_s + drain_s
    strategy = only(rendered["base"], "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0  # old pods serve while a new one compiles


def exposed_metric_names() -> set[str]:
    """Every sample name the service's registry exposes (histograms as _bucket/_sum/_count)."""
    metrics = Metrics(CollectorRegistry())
    metrics.add_queue_collector(lambda: [])
    metrics.add_model_state_collector(lambda: [], ["READY"])
    names = set()
    for family in metrics.registry.collect():
        if family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
        elif family.type == "counter":
            names.add(f"{family.name}_total")
        else:
            names.add(family.name)
    return names


def test_keda_queries_use_real_metrics(rendered: dict[str, list[dict[str, Any]]]) -> None:
    triggers = only(rendered["overlays/keda"], "ScaledObject")["spec"]["triggers"]
    exposed = exposed_metric_names()
    used = set()
    for trigger in triggers:
        assert trigger["type"] == "prometheus"
        meta = trigger["metadata"]
        assert float(meta["threshold"]) > 0
        assert 'namespace="kestrel"' in meta["query"]  # the ServiceMonitor's target label
        names = metric_names(meta["query"])
        assert names, meta["query"]
        assert names <= exposed, f"not exposed by the service: {names - exposed}"
        used |= names
    assert {"kestrel_queue_duration_seconds_bucket", "kestrel_queue_rows"} <= used
    (endpoint,) = only(rendered["base"], "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"


def test_the_dashboard_configmap_is_the_dashboard_file(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    dashboard = config_map(rendered["base"], "kestrel-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"] == {"kestrel.json": DASHBOARD.read_text()}


def test_the_kserve_runtime_serves_v2_from_mnt_models(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    runtime = only(rendered["kserve"], "ClusterServingRuntime")
    spec = runtime["spec"]
    assert {f["name"] for f in spec["supportedModelFormats"]} == {"sklearn", "lightgbm", "xgboost"}
    # Opt-in only: KServe's usual sklearn model.joblib is a pickle Kestrel refuses by default.
    assert not any(f["autoSelect"] for f in spec["supportedModelFormats"])
    assert spec["protocolVersions"] == ["v2"]
    container = kserve_container(rendered)
    assert container["name"] == "kserve-container"  # where KServe mounts /mnt/models
    env = environment(container, rendered["kserve"])
    assert env["KESTREL_PRELOAD"] == "/mnt/models"
    assert env["KESTREL_PRELOAD_NAME"] == "{{.Name}}"  # the InferenceService's name


def iter_kustomizations() -> Iterator[Path]:
    yield from sorted((ROOT / "deploy").rglob("kustomization.yaml"))


def test_kustomizations_suit_old_and_new_kustomize() -> None:
    """Debian's kubectl 1.20 embeds kustomize v2.0.3, which loads directories only from
    ``bases`` and files only from ``resources``; current kustomize accepts both."""
    for path in iter_kustomizations():
        doc = yaml.safe_load(path.read_text())
        for entry in doc.get("resources", []):
            assert (path.parent / entry).is_file(), f"{path}: resource {entry} is not a file"
        for entry in doc.get("bases", []):
            assert (path.parent / entry).is_dir(), f"{path}: base {entry} is not a directory"
