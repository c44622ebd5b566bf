"""Op.LOOP and lz.fori_loop: tracing, type errors, the digest, verification, passes, the oracle
and the executable cache. Backend parity of loops lives with every other op's, in
tests/lazy/backends/test_parity.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import lazy as lz
from lazy import B, Node, Op
from lazy.errors import ShapeError
from lazy.ops import TensorType
from lazy.passes import inline_params, optimize, prune

ROOT = Path(__file__).resolve().parents[2]

BUILD = textwrap.dedent(
    """
    import numpy as np
    import lazy as lz

    def newton(i, y, a, scale):
        return 0.5 * (y + a * scale / y) + lz.cast(i, "float32") * 0.0

    def build(trip_count=6, half=0.5):
        b = lz.Builder()
        a = b.input("a", (3,))
        scale = b.param(np.ones(3, np.float32), "scale")
        body = newton if half == 0.5 else (lambda i, y, a, s: half * (y + a * s / y))
        return b.graph({"sqrt": lz.fori_loop(trip_count, body, a * 0.0 + 1.0, a, scale)})

    graph = build()
    """
)


def _build(**kw) -> lz.Graph:
    scope: dict[str, object] = {}
    exec(BUILD, scope)
    return scope["build"](**kw)  # type: ignore[operator]


def _loop_node(graph: lz.Graph) -> Node:
    (node,) = [n for n in graph.order if n.op is Op.LOOP]
    return node


# --- tracing -------------------------------------------------------------------------------------


def test_body_sees_an_unbatched_int32_index_and_the_operands_types() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    table = b.param(np.arange(6, dtype=np.int32).reshape(2, 3), "table")
    seen = {}

    def body(i, carry, table):
        seen.update(i=(i.shape, i.dtype), carry=(carry.shape, carry.dtype), table=table.shape)
        return carry

    lz.fori_loop(2, body, x, table)
    assert seen == {"i": ((), "int32"), "carry": ((B, 3), "float32"), "table": (2, 3)}


def test_loop_node_holds_trip_count_and_a_closed_body() -> None:
    node = _loop_node(_build())
    body = node.attr("body")
    assert node.attr("trip_count") == 6
    assert isinstance(body, lz.LoopBody)
    assert [n.op for n in node.inputs] == [Op.ADD, Op.INPUT, Op.PARAM]  # init, invariants
    assert body.input_names == ("loop0.i", "loop0.carry", "loop0.inv0", "loop0.inv1")
    assert body.output.type == node.type == TensorType((B, 3), "float32")


def test_body_output_of_another_shape_or_dtype_is_rejected_naming_both() -> None:
    x = lz.Builder().input("x", (3,))
    with pytest.raises(lz.ShapeError, match=r"returns float32\[B, 1\].*carry is float32\[B, 3\]"):
        lz.fori_loop(2, lambda i, c: lz.sum(c, 1, keepdims=True), x)
    with pytest.raises(lz.ShapeError, match=r"returns int32\[B, 3\].*carry is float32\[B, 3\]"):
        lz.fori_loop(2, lambda i, c: lz.cast(c, "int32"), x)


@pytest.mark.parametrize("trip_count", [-1, 2.0, True, "3", None])
def test_trip_count_must_be_a_non_negative_int(trip_count) -> None:
    x = lz.Builder().input("x", (3,))
    with pytest.raises(lz.ShapeError, match="non-negative int trip_count"):
        lz.fori_loop(trip_count, lambda i, c: c, x)


def test_numpy_int_trip_count_is_canonical() -> None:
    x = lz.Builder().input("x", (3,))
    a = lz.fori_loop(np.int64(3), lambda i, c: c * 2.0, x)
    assert a.node is lz.fori_loop(3, lambda i, c: c * 2.0, x).node


def test_body_must_return_a_lazy_value_and_take_lazy_operands() -> None:
    x = lz.Builder().input("x", (3,))
    with pytest.raises(TypeError, match="must return a LazyTensor, got ndarray"):
        lz.fori_loop(2, lambda i, c: np.zeros(3), x)
    with pytest.raises(TypeError, match="invariant 0 must be a LazyTensor"):
        lz.fori_loop(2, lambda i, c, v: c, x, np.ones(3))


def test_body_capturing_an_outer_input_or_parameter_is_rejected() -> None:
    b = lz.Builder()
    x, y = b.input("x", (3,)), b.input("y", (3,))
    w = b.param(np.ones(3, np.float32), "w")
    with pytest.raises(lz.GraphError, match=r"captures 'y'.*invariants"):
        lz.fori_loop(2, lambda i, c: c + y, x)
    with pytest.raises(lz.GraphError, match=r"captures parameter 'w'.*invariant"):
        lz.fori_loop(2, lambda i, c: c * w, x)
    # The same values passed as invariants are fine.
    lz.fori_loop(2, lambda i, c, y, w: c + y * w, x, y, w)


def test_inner_body_cannot_capture_the_outer_bodys_carry() -> None:
    # Body inputs are named by nesting depth: an outer carry captured by an inner body is not
    # mistaken for the inner body's own carry (same shape, an interned node otherwise).
    x = lz.Builder().input("x", (3,))

    def outer(i, carry):
        return lz.fori_loop(2, lambda j, c: c + carry, carry)

    with pytest.raises(lz.GraphError, match=r"captures 'loop0.carry'"):
        lz.fori_loop(2, outer, x)


def test_loop_operands_must_match_the_traced_body() -> None:
    b = lz.Builder()
    x, wide = b.input("x", (3,)), b.input("wide", (4,))
    node = lz.fori_loop(2, lambda i, c, v: c * v, x, x).node
    body = node.attr("body")
    with pytest.raises(lz.ShapeError, match=r"carry is .*\(B, 4\).*traced with .*\(B, 3\)"):
        Node.make(Op.LOOP, [wide.node, x.node], trip_count=2, body=body, stop_column=None)
    with pytest.raises(lz.ShapeError, match="a carry and 1 invariant"):
        Node.make(Op.LOOP, [x.node], trip_count=2, body=body, stop_column=None)
    with pytest.raises(lz.ShapeError, match="loop body"):
        Node.make(Op.LOOP, [x.node], trip_count=2, body="not a body", stop_column=None)


# --- identity and the digest ---------------------------------------------------------------------


def test_same_loop_traced_twice_is_one_node_with_one_digest() -> None:
    g1, g2 = _build(), _build()
    assert _loop_node(g1) is _loop_node(g2)
    assert _loop_node(g1).attr("body") == _loop_node(g2).attr("body")
    assert g1.digest == g2.digest


def test_trip_count_and_body_are_part_of_the_digest() -> None:
    base = _build()
    other_trips, other_body = _build(trip_count=7), _build(half=0.25)
    assert len({base.digest, other_trips.digest, other_body.digest}) == 3
    assert _loop_node(base).attr("body") == _loop_node(other_trips).attr("body")
    assert _loop_node(base).attr("body") != _loop_node(other_body).attr("body")


def test_loop_digest_is_identical_across_processes_and_hash_seeds() -> None:
    here = _build().digest
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    result = subprocess.run(
        [sys.executable, "-c", BUILD + "\nprint(graph.digest)"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == here


# --- verification --------------------------------------------------------------------------------


def _row_mixing_body(carry_type: TensorType) -> lz.LoopBody:
    """A body that sums its carry over the batch, declaring the carry's type (as a buggy
    deserializer might): only re-deriving the body's types catches it."""
    index = Node.make(Op.INPUT, name="loop0.i", shape=(), dtype="int32")
    carry = Node.make(Op.INPUT, name="loop0.carry", shape=carry_type.shape, dtype="float32")
    mixed = Node.unchecked(Op.SUM, [carry], {"axes": (0,), "keepdims": True}, carry_type)
    return lz.LoopBody([index, carry], mixed)


def test_verify_rejects_a_loop_whose_body_mixes_rows() -> None:
    x = lz.Builder().input("x", (3,))
    body = _row_mixing_body(x.node.type)
    loop = Node.unchecked(
        Op.LOOP, [x.node], {"trip_count": 2, "body": body, "stop_column": None}, x.node.type
    )
    graph = lz.Graph([x.node], {"y": loop})
    with pytest.raises(lz.RowMixingError, match=r"LOOP.*in the LOOP body.*SUM.*combines rows"):
        lz.verify(graph)
    with pytest.raises(lz.RowMixingError, match="in the LOOP body"):
        Node.make(Op.LOOP, [x.node], trip_count=2, body=body, stop_column=None)


def test_a_row_mixing_body_fails_while_tracing() -> None:
    x = lz.Builder().input("x", (3,))
    with pytest.raises(lz.RowMixingError, match="SUM"):
        lz.fori_loop(2, lambda i, c: c + lz.sum(c, 0, keepdims=True), x)


def test_verify_accepts_a_row_local_loop() -> None:
    assert lz.verify(_build()) is not None


# --- passes --------------------------------------------------------------------------------------


def _two_loops() -> tuple[lz.Graph, dict[str, np.ndarray]]:
    """A loop over the batch and a parameter-only loop (powers of a parameter vector)."""
    b = lz.Builder()
    x = b.input("x", (3,))
    w = b.param(np.array([0.5, 1.5, -2.0], np.float32), "w")
    powers = lz.fori_loop(4, lambda i, c, w: c * w, w * 0.0 + 1.0, w)
    decay = lz.fori_loop(5, lambda i, c, x, w: c * 0.5 + x * w, x, x, w)
    inputs = {"x": np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)}
    return b.graph({"scaled": x * powers, "decay": decay}), inputs


def test_constant_folding_folds_a_parameter_only_loop_and_keeps_the_batched_one() -> None:
    graph, inputs = _two_loops()
    folded = optimize(graph)
    (left,) = [n for n in folded.order if n.op is Op.LOOP]
    assert left.batched
    assert left.attr("body") is _loop_node(prune(graph, ["decay"])).attr("body")
    (powers,) = [v for k, v in folded.params.items() if k.startswith("folded.")]
    np.testing.assert_allclose(powers, np.array([0.5, 1.5, -2.0]) ** 4)
    want, got = lz.evaluate(graph, inputs), lz.evaluate(folded, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=name)


def test_inline_params_turns_invariants_into_constants_and_keeps_the_body() -> None:
    graph, inputs = _two_loops()
    graph = prune(graph, ["decay"])
    inlined = inline_params(graph, max_elements=16)
    assert not inlined.param_nodes
    before, after = _loop_node(graph), _loop_node(inlined)
    assert after.attr("body") is before.attr("body")
    assert after.inputs[2].op is Op.CONST
    want, got = lz.evaluate(graph, inputs), lz.evaluate(inlined, inputs)
    np.testing.assert_array_equal(got["decay"], want["decay"])


# --- the oracle and the cache --------------------------------------------------------------------


def test_interpreter_runs_newton_iterations_in_float64() -> None:
    a = np.random.default_rng(0).uniform(0.1, 100.0, (7, 3)).astype(np.float32)
    got = lz.evaluate(_build(trip_count=30), {"a": a})["sqrt"]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.sqrt(a.astype(np.float64)), rtol=1e-15)


def test_interpreter_recurrence_reads_the_index() -> None:
    b = lz.Builder()
    x = b.input("x", (2,), "int64")
    y = lz.fori_loop(6, lambda i, c, x: c * 3 + lz.cast(i, "int64") * x, x * 0, x)
    xs = np.array([[1, -2], [5, 7]], np.int64)
    want = np.zeros_like(xs)
    for i in range(6):
        want = want * 3 + i * xs
    np.testing.assert_array_equal(lz.evaluate(b.graph({"y": y}), {"x": xs})["y"], want)


def test_identical_second_compile_of_a_loop_hits_the_cache() -> None:
    cache = lz.ExecutableCache()
    # Every bucket on the device: warm-up's timing could otherwise place them on the host,
    # which compiles no executable.
    options = lz.Options(max_batch=4, host_rows=0)
    first = lz.compile(_build(), options, cache)
    compiled, misses = cache.stats.total_compiles, cache.stats.misses
    assert compiled == first.graphs[0].executables > 0
    second = lz.compile(_build(), options, cache)
    assert cache.stats.total_compiles == compiled
    assert second.graphs[0].compiles == {}
    assert cache.stats.misses == misses and cache.stats.hits > 0  # all from the cache
    a = np.random.default_rng(1).uniform(0.1, 4.0, (3, 3)).astype(np.float32)
    np.testing.assert_allclose(second({"a": a})["sqrt"], np.sqrt(a), rtol=1e-6)


def _counting_newton(x: lz.LazyTensor, trips: int) -> lz.LazyTensor:
    """carry [y, stopped, trips run]: Newton's sqrt of x, flagged once within 1e-3."""

    def body(i, carry, x):
        y = carry[:, 0:1]
        nxt = 0.5 * (y + x / y)
        done = lz.cast(abs(nxt * nxt - x) < 1e-3 * x, "float32")
        return lz.concat([nxt, done, carry[:, 2:3] + 1.0], axis=1)

    start = lz.concat([x * 0.0 + 1.0, x * 0.0, x * 0.0], axis=1)
    return lz.fori_loop(trips, body, start, x, stop_column=1)


def test_a_stopped_row_keeps_its_carry_so_its_result_ignores_the_trip_count() -> None:
    b = lz.Builder()
    out = _counting_newton(b.input("x", (1,)), 40)
    graph = b.graph({"out": out})
    x = np.array([[4.0], [1e6]], np.float32)
    result = lz.evaluate(graph, {"x": x})["out"]  # every trip runs on the interpreter
    np.testing.assert_allclose(result[:, 0], [2.0, 1000.0], rtol=1e-3)
    trips = result[:, 2]
    assert trips[0] < trips[1] < 40  # each row counted only its own trips, then froze
    for backend in ("jax", "numpy", "torch"):
        compiled = lz.compile(graph, lz.Options(backend=backend, max_batch=2, host_rows=0))
        got = compiled({"x": x})["out"]
        np.testing.assert_allclose(got, result, rtol=1e-5, err_msg=backend)
        np.testing.assert_array_equal(got[:, 2], trips, err_msg=backend)


def test_stop_column_needs_the_frozen_row_form_and_a_batched_matrix_carry() -> None:
    b = lz.Builder()
    x = b.input("x", (2,))
    with pytest.raises(ShapeError, match="stop_column 2 needs a"):
        lz.fori_loop(3, lambda i, c, x: c + x, x, x, stop_column=2)
    loop = lz.fori_loop(3, lambda i, c, x: c + x, x, x, stop_column=1).node
    body = loop.attr("body")
    plain = lz.fori_loop(3, lambda i, c, x: c + x, x, x).node.attr("body")
    with pytest.raises(ShapeError, match=r"where\(carry\[:, 1:2\] != 0, carry, next\)"):
        Node.make(Op.LOOP, [x.node, x.node], trip_count=3, body=plain, stop_column=1)
    assert Node.make(Op.LOOP, [x.node, x.node], trip_count=3, body=body, stop_column=1) is loop
