"""The torch backend's compiled plans: loops split by iteration, in-place and scattered updates,
cached parameter-only values, chunking. Results are checked against the float64 interpreter and,
bit for bit, against the same loop run one iteration at a time (no batching rules)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import lazy as lz
from lazy import Op
from lazy.backends import torch_backend as tb
from lazy.backends import torch_plan
from lazy.backends.base import Lowering
from lazy.graph import Graph

POLICY = lz.DTypePolicy.X32
BUCKET = 8
#: The same backend with no batching rule: every loop runs one iteration at a time.
SEQUENTIAL = torch_plan.RuleSet(
    tb.RULES, lambda n, varying, low: None, tb.scatter, tb.assign, tb.specialise
)


def _run(graph: Graph, x: np.ndarray, ruleset: torch_plan.RuleSet = tb.RULESET) -> list[Any]:
    leaves = (*graph.inputs, *graph.param_nodes)
    plan = torch_plan.Plan(
        graph.order, leaves, graph.output_nodes, Lowering({}, {}, BUCKET, POLICY), ruleset
    )
    params = tb.TorchBackend().prepare_params(graph.param_values(), POLICY)
    with torch.inference_mode():
        return [o.numpy() for o in plan([torch.from_numpy(x), *params])]


def _check(graph: Graph, x: np.ndarray) -> list[Any]:
    """Batched == sequential bit for bit, and both match the interpreter."""
    got = _run(graph, x)
    for fast, slow in zip(got, _run(graph, x, SEQUENTIAL), strict=True):
        np.testing.assert_array_equal(fast, slow)
    want = lz.evaluate(graph, {"x": x})
    for out, (name, _) in zip(got, graph.outputs, strict=True):
        np.testing.assert_allclose(out, want[name], rtol=1e-6, atol=1e-6, err_msg=name)
    return got


def _loop_node(graph: Graph) -> Any:
    return next(n for n in graph.order if n.op is Op.LOOP)


def _forest_like(b: lz.Builder, trees: int = 6) -> lz.LazyTensor:
    """A loop filling one column per iteration from parameter tables: a map over iterations."""
    x = b.input("x", (4,))
    column = b.param(np.arange(trees, dtype=np.int32) % 4, "column")
    threshold = b.param(np.linspace(-1, 1, trees).astype(np.float32), "threshold")

    def body(i, acc, x, column, threshold):
        value = lz.take(x, lz.take(column, i), axis=1)
        return lz.update(acc, i, lz.cast(value > lz.take(threshold, i), "int32"), axis=1)

    init = lz.cast(x[:, :1] * 0.0, "int32") + lz.const(np.zeros((1, trees), np.int32))
    return lz.fori_loop(trees, body, init, x, column, threshold)


def test_map_loop_is_batched_and_scattered() -> None:
    b = lz.Builder()
    graph = b.graph({"leaves": _forest_like(b)})
    step = torch_plan.LoopStep(_loop_node(graph), Lowering({}, {}, BUCKET, POLICY), tb.RULESET)
    kinds = step.kinds()
    body = _loop_node(graph).attr("body")
    assert kinds[body.output] is torch_plan.Kind.SEQUENTIAL  # it writes the carry...
    takes = [n for n in body.order if n.op is Op.TAKE]
    assert takes and all(kinds[n] is torch_plan.Kind.VARYING for n in takes)
    assert step._scatter  # ...with one scatter per chunk, no per-iteration steps
    x = np.random.default_rng(0).normal(size=(BUCKET, 4)).astype(np.float32)
    _check(graph, x)


def test_update_in_place_keeps_values_used_elsewhere() -> None:
    # The loop's initial carry is also an output, and the body's value is a reduction (no
    # batching rule: the UPDATE runs per iteration, in place). The outside value must survive.
    b = lz.Builder()
    x = b.input("x", (3,))
    init = x * 2.0

    def body(i, acc, x):
        return lz.update(acc, i, lz.sum(x * lz.cast(i, "float32"), axis=1), axis=1)

    graph = b.graph({"filled": lz.fori_loop(3, body, init, x), "init": init, "x_again": x + 0.0})
    step = torch_plan.LoopStep(_loop_node(graph), Lowering({}, {}, BUCKET, POLICY), tb.RULESET)
    assert not step._scatter and step._owns_carry
    x_value = np.random.default_rng(1).normal(size=(BUCKET, 3)).astype(np.float32)
    before = x_value.copy()
    _, init_out, x_again = _check(graph, x_value)
    np.testing.assert_array_equal(init_out, before * 2.0)
    np.testing.assert_array_equal(x_again, before)
    np.testing.assert_array_equal(x_value, before)  # the caller's array is not written either


def test_scatter_with_repeated_slots_keeps_the_last_write() -> None:
    b = lz.Builder()
    x = b.input("x", (4,))

    def body(i, acc, x):  # iterations 2k and 2k + 1 write slot k: the odd one must win
        slot = lz.cast(lz.cast(i, "float32") * 0.5, "int32")
        return lz.update(acc, slot, x[:, 0] + lz.cast(i, "float32"), axis=1)

    graph = b.graph({"y": lz.fori_loop(8, body, x, x)})
    x_value = np.random.default_rng(2).normal(size=(BUCKET, 4)).astype(np.float32)
    (y,) = _check(graph, x_value)
    np.testing.assert_array_equal(y[:, 3], x_value[:, 0] + 7.0)


def test_fold_over_the_carry_stays_a_left_fold() -> None:
    # Float additions in iteration order: batching the addends must not reassociate the sum.
    b = lz.Builder()
    x = b.input("x", (5,))
    weights = b.param(np.geomspace(1e-4, 1e4, 40).astype(np.float32), "weights")

    def body(i, acc, x, weights):
        return acc + lz.exp(x * 0.1) * lz.take(weights, i)

    graph = b.graph({"y": lz.fori_loop(40, body, x * 0.0, x, weights)})
    _check(graph, np.random.default_rng(3).normal(size=(BUCKET, 5)).astype(np.float32))


def test_chunked_iterations_match(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        torch_plan, "CHUNK_ELEMENTS", 3 * BUCKET
    )  # widest: (B,), so 3 iterations a chunk
    b = lz.Builder()
    graph = b.graph({"leaves": _forest_like(b, trees=10)})
    step = torch_plan.LoopStep(_loop_node(graph), Lowering({}, {}, BUCKET, POLICY), tb.RULESET)
    assert len(step._chunks) == 4
    _check(graph, np.random.default_rng(4).normal(size=(BUCKET, 4)).astype(np.float32))


def test_cached_parameter_values_follow_new_parameters() -> None:
    # Executables are shared by models of the same structure: a second parameter set must not
    # reuse the first one's cached per-tree values.
    b = lz.Builder()
    graph = b.graph({"leaves": _forest_like(b)})
    backend = tb.TorchBackend()
    exe, _ = backend.compile(graph, BUCKET, POLICY)
    x = np.random.default_rng(5).normal(size=(BUCKET, 4)).astype(np.float32)
    first = backend.prepare_params(graph.param_values(), POLICY)
    flipped = {k: (-v if v.dtype.kind == "f" else v) for k, v in graph.params.items()}
    second = backend.prepare_params(
        tuple(flipped[n.attr("name")] for n in graph.param_nodes), POLICY
    )
    for params, values in ((first, None), (second, flipped), (first, None)):
        (got,) = exe([x], params)
        want = lz.evaluate(graph, {"x": x}, values)["leaves"]
        np.testing.assert_array_equal(got, want)


def test_uint32_map_loop() -> None:
    # Unsigned tables go through signed views (index_select has no uint32 kernel).
    b = lz.Builder()
    x = b.input("x", (3,))
    masks = b.param(np.array([0xFFFF_FFF0, 7, 2**31 + 5], dtype=np.uint32), "masks")
    init = lz.cast(x * 0.0, "uint32")

    def body(i, acc, x, masks):
        bit = lz.where(x[:, 0] > 0.0, lz.take(masks, i), lz.const(np.uint32(1)))
        return lz.update(acc, i, bit & lz.take(masks, 2 - i), axis=1)

    graph = b.graph({"y": lz.fori_loop(3, body, init, x, masks)})
    _check(graph, np.random.default_rng(6).normal(size=(BUCKET, 3)).astype(np.float32))
