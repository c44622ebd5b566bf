"""Static checks of the Grafana dashboard and its provisioning (queries run in the live test)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.promql import (
    DASHBOARD,
    DATASOURCES,
    ROOT,
    dashboard_queries,
    load_dashboard,
    metric_names,
    panels,
    substitute,
    variable_queries,
)

# Grafana's built-in panel plugins (a dashboard naming anything else needs a plugin installed).
CORE_PANEL_TYPES = frozenset(
    {"row", "timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "histogram"}
    | {"barchart", "piechart", "state-timeline", "status-history", "text", "logs", "news"}
    | {"nodeGraph", "traces", "flamegraph", "xychart", "trend", "candlestick", "canvas"}
    | {"dashlist", "alertlist", "annolist", "geomap", "datagrid"}
)
VARIABLES = ("instance", "model", "version")
# Counters of sampled work by result, dropped among them: each needs its panel by result and a
# dropped share (an alert watches each).
BY_RESULT = (
    "kestrel_shadow_requests_total",
    "kestrel_live_parity_samples_total",
    "kestrel_capture_rows_total",
    "kestrel_drift_samples_total",
)
DASHBOARD_PROVIDER = ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "kestrel.yml"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


@pytest.fixture(scope="module")
def datasource_uid() -> str:
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert source["type"] == "prometheus"
    return source["uid"]


def _datasource_refs(node: Any, path: str = "$") -> list[tuple[str, Any]]:
    """Every ``datasource`` value anywhere in the dashboard, with its JSON path."""
    found: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                found.append((f"{path}.{key}", value))
            found.extend(_datasource_refs(value, f"{path}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_datasource_refs(value, f"{path}[{i}]"))
    return found


def test_fixed_uid_and_unique_panel_ids(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "kestrel-overview"
    assert len(dashboard["uid"]) <= 40  # Grafana's limit
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert "__inputs" not in dashboard, "an import-style dashboard: provisioning cannot fill it"


def test_every_datasource_is_the_provisioned_one_by_uid(
    dashboard: dict[str, Any], datasource_uid: str
) -> None:
    refs = _datasource_refs(dashboard)
    assert refs, "no datasource references"
    for path, ref in refs:
        assert isinstance(ref, dict), f"{path}: a datasource by name ({ref!r}), not by uid"
        assert ref == {"type": "prometheus", "uid": datasource_uid}, f"{path}: {ref}"
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert "datasource" in panel, f"panel {panel['title']!r} has no datasource"
            for target in panel["targets"]:
                assert "datasource" in target, f"{panel['title']!r} {target['refId']}"


def test_panel_types_are_core_and_laid_out(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        assert panel["type"] in CORE_PANEL_TYPES, f"{panel['title']!r}: {panel['type']}"
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, f"{panel['title']!r}: {grid}"
        if panel["type"] != "row":
            assert panel["targets"], f"panel {panel['title']!r} has no query"
            assert panel.get("description"), f"panel {panel['title']!r} has no description"


def test_variables(dashboard: dict[str, Any], datasource_uid: str) -> None:
    variables = {var["name"]: var for var in dashboard["templating"]["list"]}
    assert tuple(variables) == VARIABLES
    for var in variables.values():
        assert var["type"] == "query" and var["includeAll"] and var["allValue"] == ".*"
    # Each variable narrows the next one's choices.
    queries = {q.where: q.expr for q in variable_queries(dashboard)}
    assert 'instance=~"$instance"' in queries["variable 'model'"]
    assert 'model=~"$model"' in queries["variable 'version'"]


def test_every_query_uses_the_variables_it_can(dashboard: dict[str, Any]) -> None:
    """Every query filters by instance; no query keeps a variable nobody defined."""
    for query in dashboard_queries(dashboard):
        assert 'instance=~"$instance"' in query.expr, query
        grafana = {"__rate_interval": "1m", "__range": "1h"}
        substitute(query.expr, dict.fromkeys(VARIABLES, ".*") | grafana)
        assert metric_names(query.expr), f"{query} selects no metric"


def test_required_panels_exist(dashboard: dict[str, Any]) -> None:
    """The issue's panel list, by the metrics each panel must show."""
    used = set().union(*(metric_names(q.expr) for q in dashboard_queries(dashboard)))
    required = {
        "kestrel_requests_total",  # requests/s and errors by status
        "kestrel_request_duration_seconds_bucket",  # p50/p90/p99
        "kestrel_queue_duration_seconds_bucket",  # p99 split
        "kestrel_compute_duration_seconds_bucket",
        "kestrel_codec_duration_seconds_bucket",
        "kestrel_batch_rows_bucket",  # heatmap
        "kestrel_batch_padded_rows_total",  # padding ratio
        "kestrel_queue_rows",  # queue depth
        "kestrel_rejections_total",  # by reason
        "kestrel_compiles_total",  # by cause, after_ready
        "kestrel_compile_seconds_total",
        "kestrel_models",  # by state
        "kestrel_model_load_duration_seconds_sum",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "kestrel_shadow_requests_total",  # mirrors compared, dropped... by result
        "kestrel_shadow_decisions_total",  # the shadow rule's promotions and rejections
        "kestrel_live_parity_samples_total",  # samples checked, dropped... by result
        "kestrel_capture_rows_total",  # captured rows written and dropped
        "kestrel_drift_samples_total",  # drift samples observed, dropped... by result
        "kestrel_explain_compute_duration_seconds_bucket",  # explanations' own latency
        "kestrel_explain_batch_rows_sum",  # rows explained
    }
    assert required - used == set(), f"no panel shows {sorted(required - used)}"
    # Sampled work is shown by result, so what was dropped is seen beside what was done.
    for name in BY_RESULT:
        exprs = [q.expr for q in dashboard_queries(dashboard) if name in metric_names(q.expr)]
        assert any(re.search(r"by \([^)]*\bresult\b", e) for e in exprs), f"{name}: {exprs}"
        assert any('result="dropped"' in e for e in exprs), f"no dropped share of {name}"
    heatmaps = [p for p in panels(dashboard) if p["type"] == "heatmap"]
    assert [t["format"] for p in heatmaps for t in p["targets"]] == ["heatmap"]


def _row_panels(dashboard: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels laid out under the row ``title``, down to the next row."""
    rows = sorted((p["gridPos"]["y"], p["title"]) for p in panels(dashboard) if p["type"] == "row")
    top = next(y for y, t in rows if t == title)
    bottom = min((y for y, _ in rows if y > top), default=float("inf"))
    return [p for p in panels(dashboard) if p["type"] != "row" and top < p["gridPos"]["y"] < bottom]


def test_rollouts_row_shows_requests_errors_and_latency_by_version(
    dashboard: dict[str, Any],
) -> None:
    """A canary's request rate, error share and end-to-end latency beside its stable version's:
    the request families by the version that answered, without the requests that reached none
    (version ""); the Traffic and Latency rows stay per model, every version together."""
    by_version: dict[str, list[str]] = {}
    for panel in _row_panels(dashboard, "Rollouts"):
        for target in panel["targets"]:
            for name in metric_names(target["expr"]):
                by_version.setdefault(name, []).append(target["expr"])
    for name in ("kestrel_requests_total", "kestrel_request_duration_seconds_bucket"):
        assert by_version.get(name), f"the Rollouts row has no {name} query"
        for expr in by_version[name]:
            assert "by (model, version" in expr and 'version!=""' in expr, expr
    assert any('status=~"5.."' in e for e in by_version["kestrel_requests_total"])
    for row in ("Traffic", "Latency"):
        for panel in _row_panels(dashboard, row):
            for target in panel["targets"]:
                if "kestrel_request" in target["expr"]:
                    assert "version" not in target["expr"], (panel["title"], target["expr"])


def test_dashboard_provider_points_at_the_mounted_folder() -> None:
    (provider,) = yaml.safe_load(DASHBOARD_PROVIDER.read_text())["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
    assert DASHBOARD.parent == Path(ROOT / "deploy" / "grafana" / "dashboards")
