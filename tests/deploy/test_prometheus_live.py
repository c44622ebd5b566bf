"""A real Prometheus scrapes a real Kestrel that served traffic; every dashboard and rule query runs.

One Kestrel process (``kestrel serve``) and one Prometheus server (Debian's package) with the
shipped prometheus.yml, retargeted at the test server and scraping every second, and the shipped
rules. The demo model is registered with deploy/compose/register_demo.py and traffic comes from
deploy/compose/loadgen.py — the compose stack's own one-shots — including requests that fail
with 4xx. Then every PromQL expression of the dashboard and the rules goes through Prometheus'
HTTP API.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.prometheus_server import PrometheusServer
from tests.deploy.promql import (
    RULES,
    Query,
    dashboard_queries,
    load_dashboard,
    load_rules,
    metric_names,
    substitute,
    variable_queries,
)
from tests.service.live import ADMIN_TOKEN, ROOT, LiveServer

# Half a minute to bring up the stack and let Prometheus scrape: make test-slow (CI).
pytestmark = pytest.mark.slow

MODEL = "iris"
# Grafana's variables as the dashboard would send them with "All" instances and versions.
VARIABLES = {
    "instance": ".*",
    "model": MODEL,
    "version": ".*",
    "__rate_interval": "30s",
    "__interval": "5s",
    "__range": "5m",
}
# Series Prometheus makes itself for every target: not in /metrics, but real.
PROMETHEUS_SERIES = frozenset({"up"})
# Alerts that cannot fire on this healthy server; the latency one depends on machine load, so it
# is only required to parse and to have its input series.
SILENT_WHEN_HEALTHY = frozenset(
    {
        "KestrelTargetDown",
        "KestrelHigh5xxRate",
        "KestrelVersionHigh5xxRate",  # one version answers, without 5xx
        "KestrelQueueSaturated",
        "KestrelCompiledAfterReady",
        "KestrelModelLoadFailed",
        "KestrelLiveParityMismatch",
        "KestrelShadowDisagrees",
        "KestrelShadowDroppingMirrors",
        "KestrelLiveParityDroppingSamples",
        "KestrelCaptureDroppingRows",
        "KestrelDriftDroppingSamples",
        "KestrelUnknownCategories",  # the demo model has no categorical column
        "KestrelMissingValuesRose",  # nor does its traffic miss a value
    }
)


@dataclass
class Stack:
    kestrel: LiveServer
    prometheus: PrometheusServer
    exposed: set[str]  # sample names in Kestrel's /metrics after the traffic
    traffic: str  # the load generator's summary line
    psi_before: dict[str, float]  # the demo model's drift, as Prometheus has it, before a shift
    psi_after: dict[str, float]  # ... and after it


def _script(name: str, *args: str, timeout: float) -> str:
    """Run one of deploy/compose's scripts as the compose one-shots do; its output."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "compose" / name), *args],
        env={**os.environ, "KESTREL_ADMIN_TOKEN": ADMIN_TOKEN},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{name} exited {result.returncode}:\n{output}"
    return output


def _prometheus_config(target: str) -> dict[str, Any]:
    """The shipped prometheus.yml, scraping ``target`` every second with the shipped rules."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(RULES)]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "kestrel"
    job["static_configs"] = [{"targets": [target]}]
    return config


def _latest_scrape(prometheus: PrometheusServer) -> float:
    samples = prometheus.query('timestamp(up{job="kestrel"} == 1)')
    return float(samples[0]["value"][1]) if samples else 0.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Live parity samples a fifth of the requests, payload capture a fifth (written every
    # second) and drift monitoring every one, so their series exist after a few seconds; the
    # workers get half a core, so none drops a sample on this healthy server.
    kestrel = LiveServer(
        tmp_path_factory.mktemp("kestrel"),
        KESTREL_LIVE_PARITY_SHARE="0.2",
        KESTREL_LIVE_PARITY_CPU="0.5",
        KESTREL_CAPTURE_SHARE="0.2",
        KESTREL_CAPTURE_FLUSH_S="1",
        KESTREL_DRIFT_SHARE="1",
        KESTREL_DRIFT_CPU="0.5",
        # Two loaded versions and iris pinned (its serving and shadow versions): a second and a
        # third model then unload and load each other (_reload), the drift series untouched.
        KESTREL_MAX_LOADED_MODELS="2",
        KESTREL_PINNED_MODELS=MODEL,
    )
    kestrel.start()
    prometheus = PrometheusServer(
        tmp_path_factory.mktemp("prometheus"), _prometheus_config(f"127.0.0.1:{kestrel.port}")
    )
    try:
        prometheus.start()
        # Scraped before the model loads, so counters are seen rising (increase() needs that).
        prometheus.wait(lambda: _latest_scrape(prometheus) > 0, 30, "scraping Kestrel")
        # Four buckets (1, 2, 4, 8) keep the compile short; 64-row requests run as 8 batches.
        _script(
            "register_demo.py",
            *("--url", kestrel.url, "--ready-timeout", "60", "--max-batch", "8"),
            timeout=300,
        )
        _stage_shadow_rule(kestrel)
        _stage_shadow(kestrel)
        traffic = _script(
            "loadgen.py",
            *("--url", kestrel.url, "--model", MODEL, "--seconds", "4"),
            *("--concurrency", "2", "--bad-fraction", "0.2"),
            timeout=60,
        )
        psi_before = _wait_for_psi(prometheus, lambda v: True)
        # The same flowers with petals 1.6 times as long: the inputs drift, and so do answers.
        _script(
            "loadgen.py",
            *("--url", kestrel.url, "--model", MODEL, "--seconds", "4", "--shift", "1.6"),
            *("--concurrency", "2", "--bad-fraction", "0"),
            timeout=60,
        )
        psi_after = _wait_for_psi(prometheus, lambda v: v > 0.25)
        _explain(kestrel)  # late: the explanation panels' rates look back half a minute
        _reload(kestrel)  # as late: so do the reload panel's
        done = time.time()
        prometheus.wait(lambda: _latest_scrape(prometheus) >= done + 2, 30, "scraped twice")
        prometheus.wait(
            lambda: all(_epoch(g["lastEvaluation"]) > done for g in prometheus.rule_groups()),
            30,
            "evaluating the rules",
        )
        text = kestrel.client.get("/metrics").text
        exposed = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
        yield Stack(kestrel, prometheus, exposed, traffic, psi_before, psi_after)
    finally:
        prometheus.stop()
        kestrel.stop()


# Version 2 serves the traffic: the shadow rule promoted it (_stage_shadow_rule).
SERVING = "2"
PSI_QUERIES = {
    "inputs": f'max(kestrel_input_psi_max{{model="{MODEL}", version="{SERVING}"}})',
    "petal_length": f'max(kestrel_input_psi{{model="{MODEL}", version="{SERVING}", column="petal_length"}})',
    "sepal_width": f'max(kestrel_input_psi{{model="{MODEL}", version="{SERVING}", column="sepal_width"}})',
    "predict": f'max(kestrel_prediction_psi{{model="{MODEL}", version="{SERVING}", output="predict"}})',
}


def _wait_for_psi(
    prometheus: PrometheusServer, done: Callable[[float], bool], timeout: float = 60
) -> dict[str, float]:
    """The demo model's PSI figures once Prometheus has all of them and the inputs' passes
    ``done``."""
    values: dict[str, float] = {}

    def scraped() -> bool:
        values.clear()
        for key, query in PSI_QUERIES.items():
            samples = prometheus.query(query)
            if samples:
                values[key] = float(samples[0]["value"][1])
        return len(values) == len(PSI_QUERIES) and done(values["inputs"])

    prometheus.wait(scraped, timeout, "the drift metrics")
    return dict(values)


def _stage_version(
    kestrel: LiveServer, version: str, shadow: dict[str, Any], options: str = '{"max_batch": 8}'
) -> None:
    """The demo model again (with its sample, as register_demo.py sends it) as ``version``,
    stored only, then set as the shadow ``shadow`` (without the version)."""
    import json

    from service.demo_model import demo_artifact

    data, sample = demo_artifact()
    r = kestrel.register(
        MODEL,
        data,
        filename="iris.skops",
        sample=json.dumps(sample),
        options=options,
        promote=False,
    )
    assert r.status_code == 201 and r.json()["version"] == version, r.text
    body = {"version": version, **shadow}
    r = kestrel.client.put(f"/models/{MODEL}/shadow", json=body, headers=kestrel.admin)
    assert r.status_code == 200, r.text


def _stage_shadow_rule(kestrel: LiveServer) -> None:
    """Version 2 as a shadow whose rule promotes it after one compared row, before the traffic
    (so the decisions' series exists): version 2 serves from then on."""
    # It explains (the demo's linear model, against its sample): the explanation panels' data.
    rule = {"share": 1.0, "rule": {"after_rows": 1}}
    _stage_version(kestrel, SERVING, rule, options='{"max_batch": 8, "explain": true}')
    flower = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
    deadline = time.monotonic() + 30
    while (
        kestrel.client.get(f"/models/{MODEL}", headers=kestrel.admin).json()["current"] != SERVING
    ):
        assert time.monotonic() < deadline, "the shadow rule did not promote version 2"
        r = kestrel.client.post(f"/models/{MODEL}/predict", json=[flower])
        assert r.status_code == 200, r.text
        time.sleep(0.2)
    decided = {"model": MODEL, "shadow": SERVING, "decision": "promote"}
    assert kestrel.metric("kestrel_shadow_decisions_total", **decided) == 1


def _explain(kestrel: LiveServer) -> None:
    """A few requests for contributions of the serving version, which explains."""
    flowers = [
        {"sepal_length": 5.1 + i / 10, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
        for i in range(12)
    ]
    for _ in range(5):
        r = kestrel.client.post(f"/models/{MODEL}/predict?outputs=contributions", json=flowers)
        assert r.status_code == 200, r.text
        assert len(r.json()["outputs"]["contributions"]) == len(flowers)
        time.sleep(0.5)


def _reload(kestrel: LiveServer) -> None:
    """Two more models over the budget of two (iris pinned): the second unloads the first, and
    a request for the first loads it again: the residency panel's data."""
    import json

    from service.demo_model import demo_artifact

    data, sample = demo_artifact()
    for name in ("spare", "spare2"):
        r = kestrel.register(name, data, filename="iris.skops", sample=json.dumps(sample))
        assert r.status_code == 201, r.text
    assert kestrel.metric("kestrel_models", state="UNLOADED") == 1
    flower = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
    r = kestrel.client.post("/models/spare/predict", json=[flower])
    assert r.status_code == 200, r.text
    assert kestrel.metric("kestrel_model_reload_duration_seconds_count") == 1


def _stage_shadow(kestrel: LiveServer) -> None:
    """The demo model again as version 3, shadowing every request (so the shadow series
    exist)."""
    _stage_version(kestrel, "3", {"share": 1.0})


def _epoch(rfc3339: str) -> float:
    """Seconds since the epoch of Prometheus' RFC 3339 times (nanosecond fractions included)."""
    match = re.fullmatch(r"(.+?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", rfc3339)
    assert match is not None, f"not an RFC 3339 time: {rfc3339!r}"
    whole, fraction, zone = match.groups()
    stamp = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    return stamp.timestamp() + float(f"0.{fraction or 0}")


def _finite(samples: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in samples)


def _failures(stack: Stack, queries: list[Query]) -> list[str]:
    """Queries that fail or return no finite value."""
    problems = []
    for query in queries:
        expr = substitute(query.expr, VARIABLES)
        samples = stack.prometheus.query(expr)
        if not _finite(samples):
            problems.append(f"{query.where}: {expr} -> {samples}")
    return problems


def test_traffic_included_client_errors(stack: Stack) -> None:
    assert "200:" in stack.traffic and "404:" in stack.traffic, stack.traffic
    assert "400:" in stack.traffic or "422:" in stack.traffic, stack.traffic


def test_drift_metrics_move_when_the_inputs_shift(stack: Stack) -> None:
    before, after = stack.psi_before, stack.psi_after
    # Flowers drawn from the registration sample itself: no column scores as drifted.
    assert before["inputs"] < 0.25, before
    # Longer petals: that column and the answers drift, sepal widths do not.
    assert after["petal_length"] > 0.25 and after["predict"] > before["predict"], after
    assert after["sepal_width"] < 0.25, after
    # Values beyond the sample's range are counted, per column, through the recording rule.
    ratio = stack.prometheus.query(
        "instance_model_column:kestrel_input_out_of_range:ratio_rate15m"
        f'{{model="{MODEL}", version="{SERVING}", column="petal_length"}}'
    )
    assert ratio and float(ratio[0]["value"][1]) > 0, ratio


def test_every_metric_name_exists_in_metrics(stack: Stack) -> None:
    rules = load_rules()
    recorded = {rule["record"] for rule in rules if "record" in rule}
    exprs = [q.expr for q in dashboard_queries(load_dashboard())]
    exprs += [q.expr for q in variable_queries(load_dashboard())]
    exprs += [rule["expr"] for rule in rules]
    used = set().union(*map(metric_names, exprs)) - recorded - PROMETHEUS_SERIES
    assert used, "no metric names found"
    assert used - stack.exposed == set(), f"not in /metrics: {sorted(used - stack.exposed)}"


def test_dashboard_queries_return_data(stack: Stack) -> None:
    dashboard = load_dashboard()
    assert _failures(stack, dashboard_queries(dashboard)) == []
    assert _failures(stack, variable_queries(dashboard)) == []


def test_recording_rules_return_data(stack: Stack) -> None:
    records = [rule for rule in load_rules() if "record" in rule]
    assert _failures(stack, [Query(f"rule {r['record']}", r["expr"]) for r in records]) == []
    # ... and the server evaluated them under their recorded names.
    assert _failures(stack, [Query("recorded series", r["record"]) for r in records]) == []


def test_alert_expressions_parse_and_their_inputs_have_data(stack: Stack) -> None:
    alerts = {rule["alert"] for rule in load_rules() if "alert" in rule}
    assert SILENT_WHEN_HEALTHY - alerts == set(), "alerts missing from the rules file"
    for rule in (rule for rule in load_rules() if "alert" in rule):
        firing = stack.prometheus.query(rule["expr"])  # raises PromQLError if it does not parse
        if rule["alert"] in SILENT_WHEN_HEALTHY:
            assert firing == [], f"{rule['alert']} fires on a healthy server: {firing}"
        for name in metric_names(rule["expr"]):
            assert stack.prometheus.query(name), f"{rule['alert']}: {name} has no data"


def test_rule_groups_are_healthy(stack: Stack) -> None:
    rules = [rule for group in stack.prometheus.rule_groups() for rule in group["rules"]]
    assert len(rules) == len(load_rules())
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert unhealthy == []
