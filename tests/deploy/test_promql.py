"""The PromQL name lexer the dashboard and rules checks rely on."""

from __future__ import annotations

import pytest

from tests.deploy.promql import metric_names, substitute, variable_selector

CASES = [
    ("up", {"up"}),
    (
        'kestrel_requests_total{status=~"5..", route="/models/{name}/predict"}',
        {"kestrel_requests_total"},
    ),
    (
        'histogram_quantile(0.99, sum by (le) (rate(kestrel_x_bucket{a="b"}[$__rate_interval])))',
        {"kestrel_x_bucket"},
    ),
    (
        "sum(rate(a_total[5m])) / (sum(rate(a_total[5m])) + sum(rate(b_total[5m])))",
        {"a_total", "b_total"},
    ),
    (
        "rate(process_cpu_seconds_total[1m]) and on (job, instance) kestrel_models",
        {"process_cpu_seconds_total", "kestrel_models"},
    ),
    ("(sum by (job) (rate(a[5m])) or sum without (x) (b) * 0) / c offset 5m", {"a", "b", "c"}),
    (
        "instance:kestrel_compiles_after_ready:increase10m > 0",
        {"instance:kestrel_compiles_after_ready:increase10m"},
    ),
    ('count(a) > bool 1e3 unless on (le) group_left (x) b{c="or d"}', {"a", "b"}),
    ("max_over_time(a[10m:1m]) > inf", {"a"}),
]


@pytest.mark.parametrize(("expr", "names"), CASES)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_substitute_and_variable_selector() -> None:
    assert (
        substitute(
            'a{m=~"$model", v=~"${version}"}[$__rate_interval]',
            {"model": "iris", "version": ".*", "__rate_interval": "30s"},
        )
        == 'a{m=~"iris", v=~".*"}[30s]'
    )
    with pytest.raises(ValueError, match=r"unsubstituted variable"):
        substitute('a{m=~"$model"}', {})
    assert variable_selector('label_values(k{i=~"$i"}, model)') == 'k{i=~"$i"}'
    with pytest.raises(ValueError, match="not a label_values"):
        variable_selector("query_result(up)")
