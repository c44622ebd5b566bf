"""Execution plans: decided once, persisted as data, followed by every later compile.

A compile given the plan of an earlier one runs each bucket on the same lowering, times nothing
and compiles only what the plan runs; a plan decided for another graph, other buckets or other
backends is refused with the reason, and the buckets are placed anew.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import lazy as lz
from lazy import executor
from lazy.backends.jax_backend import JaxBackend


class CountingJax(JaxBackend):
    """JAX, recording the buckets it compiles."""

    def __init__(self) -> None:
        super().__init__()
        self.compiled: list[int] = []

    def compile(self, graph, bucket, policy):
        self.compiled.append(bucket)
        return super().compile(graph, bucket, policy)


def _first(graph: lz.Graph, **options) -> lz.CompiledProgram:
    return lz.compile(
        graph, lz.Options(max_batch=16, call_rows=16, **options), lz.ExecutableCache()
    )


def _stored(plan: lz.ExecutionPlan | None) -> lz.ExecutionPlan:
    """``plan`` after a round trip through JSON, as the model store keeps it."""
    assert plan is not None
    return lz.ExecutionPlan.from_dict(json.loads(json.dumps(plan.as_dict())))


def test_a_compile_given_a_plan_follows_it_and_times_nothing(graph, monkeypatch) -> None:
    first = _first(graph)
    plan = _stored(first.plan)
    assert plan == first.plan
    (graph_plan,) = plan.graphs
    assert [p.bucket for p in graph_plan.placements] == [1, 2, 4, 8, 16]

    def no_timing(*args: object) -> None:
        raise AssertionError("a planned bucket was timed")

    monkeypatch.setattr(executor.CompiledGraph, "_measure", no_timing)
    backend = CountingJax()
    options = lz.Options(backend=backend, max_batch=16, call_rows=16)
    again = lz.compile(graph, options, lz.ExecutableCache(), plan=plan)
    assert again.plan_refused is None
    assert again.plan == plan
    # Only the buckets the plan runs on the device were compiled.
    assert sorted(backend.compiled) == [
        p.bucket for p in graph_plan.placements if p.runs_on == "device"
    ]
    x = np.random.default_rng(0).standard_normal((37, 6)).astype(np.float32)
    for rows in (1, 3, 8, 16, 37):
        np.testing.assert_array_equal(
            again({"x": x[:rows]})["proba"], first({"x": x[:rows]})["proba"]
        )


@pytest.mark.parametrize("runs_on", ["host", "device"])
def test_every_bucket_runs_where_the_plan_says(graph, runs_on: str) -> None:
    first = _first(graph)
    assert first.plan is not None
    (graph_plan,) = first.plan.graphs
    forced = lz.GraphPlan(
        graph_plan.digest,
        graph_plan.backends,
        tuple(lz.Placement(p.bucket, runs_on, "chosen by the test") for p in graph_plan.placements),
    )
    backend = CountingJax()
    options = lz.Options(backend=backend, max_batch=16, call_rows=16)
    compiled = lz.compile(graph, options, lz.ExecutableCache(), plan=lz.ExecutionPlan((forced,)))
    assert compiled.plan_refused is None
    assert backend.compiled == ([] if runs_on == "host" else [16, 8, 4, 2, 1])
    x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)
    want = lz.evaluate(graph, {"x": x})
    np.testing.assert_allclose(compiled({"x": x})["proba"], want["proba"], rtol=1e-5, atol=1e-6)


def test_a_plan_for_other_code_or_buckets_is_refused_and_placed_anew(graph) -> None:
    first = _first(graph)
    assert first.plan is not None
    (graph_plan,) = first.plan.graphs
    elsewhere = lz.GraphPlan(graph_plan.digest, "another machine", graph_plan.placements)
    compiled = lz.compile(
        graph,
        lz.Options(max_batch=16, call_rows=16),
        lz.ExecutableCache(),
        plan=lz.ExecutionPlan((elsewhere,)),
    )
    assert compiled.plan_refused is not None and "another machine" in compiled.plan_refused
    assert compiled.plan is not None and compiled.plan.graphs[0].backends == graph_plan.backends
    other_buckets = lz.compile(
        graph, lz.Options(max_batch=8, call_rows=8), lz.ExecutableCache(), plan=first.plan
    )
    assert "places buckets [1, 2, 4, 8, 16]" in (other_buckets.plan_refused or "")
    b = lz.Builder()
    x = b.input("x", (6,))
    other = lz.compile(
        b.graph({"y": x * 2.0}),
        lz.Options(max_batch=16, call_rows=16),
        lz.ExecutableCache(),
        plan=first.plan,
    )
    assert "decided for graph" in (other.plan_refused or "")
    two = lz.ExecutionPlan((graph_plan, graph_plan))
    assert "plans 2 graphs" in (
        lz.compile(graph, lz.Options(max_batch=16, call_rows=16), plan=two).plan_refused or ""
    )


@pytest.mark.parametrize(
    "data, problem",
    [
        (None, "must be an object"),
        ({"format": 99, "graphs": []}, "format 99"),
        ({"format": 1, "graphs": "x"}, "list of objects"),
        ({"format": 1, "graphs": [{"digest": "d", "backends": "b"}]}, "list of objects"),
        (
            {"format": 1, "graphs": [{"digest": "d", "backends": "b", "placements": [{}]}]},
            "positive integer",
        ),
        (
            {
                "format": 1,
                "graphs": [
                    {
                        "digest": "d",
                        "backends": "b",
                        "placements": [{"bucket": 1, "runs_on": "gpu", "reason": "r"}],
                    }
                ],
            },
            "runs on one of",
        ),
    ],
)
def test_an_unreadable_plan_is_a_plan_error(data: object, problem: str) -> None:
    with pytest.raises(lz.PlanError, match=problem):
        lz.ExecutionPlan.from_dict(data)
