"""What the deploy tests read out of the dashboard and the rules: PromQL expressions and names.

``metric_names`` is a small lexer, not a PromQL parser: it drops strings, label matchers, range
and subquery brackets, grouping clauses and function calls, and keeps the identifiers left —
the metric names. Prometheus itself checks the syntax (promtool, and the live test's queries).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "kestrel.json"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "kestrel.rules.yml"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"

# Words that look like identifiers in PromQL but are not metric names.
KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"bool", "offset", "inf", "nan", "atan2"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+", re.IGNORECASE)
# An identifier not glued to a preceding digit, dot or word character (so 1e3 or 5m are skipped).
_IDENT = re.compile(r"(?<![\w.])[A-Za-z_:][\w:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*(\w+)\s*\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects, e.g. ``{"kestrel_requests_total"}``."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _BRACKETS.sub("", text)
    text = _GROUPING.sub("", text)
    text = _OFFSET.sub("", text)
    names = set()
    for match in _IDENT.finditer(text):
        name = match.group(0)
        if name in KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue  # a keyword, or a function / aggregation called here
        names.add(name)
    return names


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana variables (``$name`` and ``${name}``), longest names first."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    if "$" in expr:
        raise ValueError(f"unsubstituted variable in {expr!r}")
    return expr


def variable_selector(query: str) -> str:
    """The series selector of a Grafana ``label_values(selector, label)`` variable query."""
    match = _LABEL_VALUES.match(query)
    if match is None:
        raise ValueError(f"not a label_values(selector, label) query: {query!r}")
    return match.group(1)


@dataclass(frozen=True)
class Query:
    """One PromQL expression and where it comes from (for failure messages)."""

    where: str
    expr: str


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(dashboard: dict[str, Any]) -> list[Query]:
    """Every panel target's expression."""
    return [
        Query(f"panel {panel.get('title')!r} target {target.get('refId')}", target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def variable_queries(dashboard: dict[str, Any]) -> list[Query]:
    """Each template variable's series selector (from ``label_values(selector, label)``)."""
    out = []
    for var in dashboard["templating"]["list"]:
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        out.append(Query(f"variable {var['name']!r}", variable_selector(query)))
    return out


def load_rules(path: Path = RULES) -> list[dict[str, Any]]:
    """Every rule of every group in a Prometheus rules file."""
    doc = yaml.safe_load(path.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]
