"""lazy.verify: well-formed graphs pass; row mixing and mistyped nodes are rejected.

The verifier's point is that padding a batch (or splitting it) cannot change the real rows' results;
the property test at the end checks exactly that on random graphs built through the public API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazy as lz
from lazy import B, Node, Op
from lazy.ops import ConstValue, TensorType
from lazy.passes import optimize

K = 3


def _x() -> tuple[lz.Builder, lz.LazyTensor]:
    b = lz.Builder()
    return b, b.input("x", (K,))


# --- accepted -----------------------------------------------------------------------------------


def test_verify_accepts_and_returns_a_well_formed_graph() -> None:
    b, x = _x()
    w = b.param(np.ones((K, 2), np.float32), "w")
    table = b.param(np.arange(8, dtype=np.float32).reshape(4, 2), "table")
    idx = lz.argmax(x)  # (B,) int32
    y = lz.softmax(x @ w) + lz.take(table, idx) + lz.sum(x, axis=1, keepdims=True)
    graph = b.graph({"y": y, "label": lz.argmax(y)})

    assert lz.verify(graph) is graph


def test_verify_accepts_per_row_layout_ops() -> None:
    b, x = _x()
    y = lz.reshape(x, (B, K, 1))
    y = lz.transpose(y, (0, 2, 1))
    y = lz.concat([y, y], axis=2)
    y = lz.slice_axis(y, 2, 0, 2 * K, 2)
    y = lz.broadcast_to(lz.reshape(y, (B, 1, K)), (B, 2, K))
    graph = b.graph({"y": y})

    assert lz.verify(graph) is graph


# --- rejected: row mixing -----------------------------------------------------------------------


def _sum_over_batch(x: Node) -> Node:
    return Node.unchecked(Op.SUM, [x], {"axes": (0,), "keepdims": False}, TensorType((K,), x.dtype))


def _take_rows(x: Node) -> Node:
    idx = Node.make(Op.CONST, value=ConstValue(np.array([0], np.int32)))
    return Node.unchecked(Op.TAKE, [x, idx], {"axis": 0}, TensorType((1, K), x.dtype))


def _transpose_batch(x: Node) -> Node:
    t = Node.unchecked(Op.TRANSPOSE, [x], {"perm": (1, 0)}, TensorType((K, B), x.dtype))
    return Node.unchecked(Op.TRANSPOSE, [t], {"perm": (1, 0)}, x.type)


def _gram(x: Node) -> Node:
    # x^T @ x contracts over the batch; declared as an unbatched (K, K) matrix.
    xt = Node.unchecked(Op.TRANSPOSE, [x], {"perm": (1, 0)}, TensorType((K, B), x.dtype))
    g = Node.unchecked(Op.MATMUL, [xt, x], {}, TensorType((K, K), x.dtype))
    return Node.make(Op.SLICE, [g], axis=0, start=0, stop=1, step=1)


def _slice_rows(x: Node) -> Node:
    return Node.unchecked(
        Op.SLICE, [x], {"axis": 0, "start": 0, "stop": 1, "step": 1}, TensorType((1, K), x.dtype)
    )


def _flatten_batch(x: Node) -> Node:
    return Node.unchecked(Op.RESHAPE, [x], {"shape": (K,)}, TensorType((K,), x.dtype))


def _concat_onto_rows(x: Node) -> Node:
    p = Node.make(Op.CONST, value=ConstValue(np.zeros((1, K), np.float32)))
    return Node.unchecked(Op.CONCAT, [p, x], {"axis": 0}, TensorType((1, K), x.dtype))


ROW_MIXERS: dict[str, Callable[[Node], Node]] = {
    "sum-axis0": _sum_over_batch,
    "take-axis0": _take_rows,
    "transpose-batch": _transpose_batch,
    "matmul-over-batch": _gram,
    "slice-axis0": _slice_rows,
    "reshape-drops-batch": _flatten_batch,
    "concat-axis0": _concat_onto_rows,
}


def _mixing_graph(mixer: Callable[[Node], Node]) -> lz.Graph:
    _, x = _x()
    mixed = mixer(x.node)
    # Combine with the batched input so that the output is a well-typed (B, K) value.
    out = mixed if mixed.batched else Node.make(Op.SUB, [x.node, mixed])
    return lz.Graph([x.node], {"y": out})


@pytest.mark.parametrize("mixer", list(ROW_MIXERS.values()), ids=list(ROW_MIXERS))
def test_verify_rejects_row_mixing(mixer: Callable[[Node], Node]) -> None:
    graph = _mixing_graph(mixer)
    with pytest.raises(lz.RowMixingError) as info:
        lz.verify(graph)
    assert isinstance(info.value, lz.ShapeError)
    assert "<" in str(info.value)  # names the offending node


def test_the_public_api_refuses_to_build_row_mixing_ops() -> None:
    b, x = _x()
    p = b.param(np.zeros((1, K), np.float32), "p")
    idx = lz.const(np.array([0], np.int32))
    for build in (
        lambda: lz.sum(x, axis=0),
        lambda: lz.take(x, idx, axis=0),
        lambda: lz.transpose(x),
        lambda: lz.slice_axis(x, 0, 0, 1),
        lambda: lz.concat([p, x], axis=0),
        lambda: lz.concat([x, x], axis=0),
        lambda: lz.softmax(x, axis=0),
        lambda: lz.argmax(x, axis=0),
    ):
        with pytest.raises(lz.RowMixingError):
            build()


def test_row_mixing_changes_real_rows_when_padding() -> None:
    # Why the verifier exists: the graph it rejects gives different real rows once padded.
    graph = _mixing_graph(_sum_over_batch)
    xs = np.arange(6, dtype=np.float32).reshape(2, K)
    padded = np.concatenate([xs, np.ones((3, K), np.float32)])
    real = lz.evaluate(graph, {"x": xs})["y"]
    with_padding = lz.evaluate(graph, {"x": padded})["y"][:2]
    assert not np.array_equal(real, with_padding)


# --- rejected: declared types that disagree with the operands -----------------------------------


@pytest.mark.parametrize(
    "declared",
    [TensorType((B, K + 1), "float32"), TensorType((B, K), "float64"), TensorType((K,), "float32")],
    ids=["shape", "dtype", "batch"],
)
def test_verify_rejects_a_mistyped_node(declared: TensorType) -> None:
    _, x = _x()
    bad = Node.unchecked(Op.EXP, [x.node], {}, declared)
    out = Node.unchecked(Op.NEG, [bad], {}, TensorType((B, K), "float32"))
    graph = lz.Graph([x.node], {"y": out})
    with pytest.raises(lz.GraphError, match="declares"):
        lz.verify(graph)


def test_verify_rejects_operands_the_op_does_not_accept() -> None:
    b, x = _x()
    i = b.input("i", (K,), "int32")
    bad = Node.unchecked(Op.ADD, [x.node, i.node], {}, x.node.type)  # mixed dtypes
    graph = lz.Graph([x.node, i.node], {"y": bad})
    with pytest.raises(lz.ShapeError, match="one dtype"):
        lz.verify(graph)


def test_verify_rejects_a_wrong_arity() -> None:
    _, x = _x()
    bad = Node.unchecked(Op.ADD, [x.node], {}, x.node.type)
    with pytest.raises(lz.ShapeError, match="operand"):
        lz.verify(lz.Graph([x.node], {"y": bad}))


def test_verify_rejects_an_unbatched_output() -> None:
    b, x = _x()
    p = b.param(np.ones(K, np.float32), "p")
    graph = b.graph({"y": x + p, "p2": p * 2.0})
    with pytest.raises(lz.GraphError, match="'p2' has no batch dimension"):
        lz.verify(graph)


# --- property: padding never changes real rows --------------------------------------------------

UNARY: dict[str, Callable[[lz.LazyTensor], lz.LazyTensor]] = {
    "tanh": lz.tanh,
    "sigmoid": lz.sigmoid,
    "neg": lambda t: -t,
    "abs-log1p": lambda t: lz.log1p(abs(t)),
    "softmax": lz.softmax,
    "square": lambda t: t * t,
}


def _build(draw: Any, b: lz.Builder, pool: list[lz.LazyTensor], rng: np.random.Generator) -> None:
    """Append one new (B, k) float64 tensor to ``pool``, built from earlier ones."""
    t = draw(st.sampled_from(pool))
    k = t.shape[1]
    n = len(b._params)
    kind = draw(
        st.sampled_from(
            [
                "unary",
                "binary",
                "vector",
                "matmul",
                "reduce",
                "take",
                "take_along",
                "where",
                "concat",
                "layout",
                "index",
            ]
        )
    )
    if kind == "unary":
        out = UNARY[draw(st.sampled_from(sorted(UNARY)))](t)
    elif kind == "binary":
        same = [u for u in pool if u.shape == t.shape]
        u = draw(st.sampled_from(same))
        out = draw(
            st.sampled_from([lz.maximum, lz.minimum, lambda a, c: a + c, lambda a, c: a * c])
        )(t, u)
    elif kind == "vector":
        shape = draw(st.sampled_from([(k,), (1, k), ()]))
        v = b.param(rng.standard_normal(shape), f"v{n}")
        out = draw(st.sampled_from([lambda a: a - v, lambda a: v - a, lambda a: a * v + 1.0]))(t)
    elif kind == "matmul":
        m = draw(st.integers(1, 4))
        out = t @ b.param(rng.standard_normal((k, m)), f"w{n}")
    elif kind == "reduce":
        reduce = draw(st.sampled_from([lz.sum, lz.max, lz.min, lz.logsumexp]))
        out = reduce(t, axis=1, keepdims=True)
    elif kind == "take":
        rows_ = draw(st.integers(1, 4))
        table = b.param(rng.standard_normal((k, rows_)), f"t{n}")
        out = lz.take(table, lz.argmax(t, axis=1), axis=0)  # (B, rows_)
    elif kind == "take_along":
        idx = lz.expand_dims(lz.argmax(t, axis=1), 1)
        out = lz.take_along(t, idx, axis=1)
    elif kind == "where":
        u = draw(st.sampled_from([u for u in pool if u.shape == t.shape]))
        out = lz.where(t > u, t, u * 0.5)
    elif kind == "concat":
        u = draw(st.sampled_from(pool))
        out = lz.concat([t, u], axis=1)
    elif kind == "layout":
        y = lz.transpose(lz.reshape(t, (B, 1, k)), (0, 2, 1))  # (B, k, 1)
        y = lz.broadcast_to(y, (B, k, 2))
        out = lz.reshape(y, (B, 2 * k))
    else:
        out = t[:, ::2] if k > 1 else t[:, None, 0]
    pool.append(out)


@st.composite
def random_graphs(draw: Any) -> lz.Graph:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = lz.Builder()
    pool = [b.input("x", (draw(st.integers(1, 4)),), "float64")]
    if draw(st.booleans()):
        pool.append(b.input("z", (pool[0].shape[1],), "float64"))
    for _ in range(draw(st.integers(1, 6))):
        _build(draw, b, pool, rng)
    outputs = {"last": pool[-1], "mid": pool[len(pool) // 2]}
    return b.graph(outputs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graph=random_graphs(),
    real=st.integers(1, 5),
    extra=st.integers(1, 6),
    pad=st.sampled_from(["random", "repeat-last", "nonfinite"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_padding_never_changes_real_rows(
    graph: lz.Graph, real: int, extra: int, pad: str, seed: int
) -> None:
    assert lz.verify(graph) is graph
    rng = np.random.default_rng(seed)
    inputs = {n.attr("name"): rng.standard_normal((real, n.shape[1])) for n in graph.inputs}
    padded = {}
    for name, xs in inputs.items():
        if pad == "repeat-last":
            more = np.repeat(xs[-1:], extra, axis=0)
        elif pad == "nonfinite":
            more = rng.choice([np.nan, np.inf, -np.inf, 1e300], (extra, xs.shape[1]))
        else:
            more = rng.standard_normal((extra, xs.shape[1])) * 100
        padded[name] = np.concatenate([xs, more])

    want = lz.evaluate(graph, inputs)
    got = lz.evaluate(graph, padded)

    for name in want:
        assert got[name].shape[0] == real + extra
        np.testing.assert_allclose(got[name][:real], want[name], rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(), seed=st.integers(0, 2**32 - 1))
def test_optimized_random_graphs_still_verify_and_agree(graph: lz.Graph, seed: int) -> None:
    optimized = lz.verify(optimize(graph))
    rng = np.random.default_rng(seed)
    inputs = {n.attr("name"): rng.standard_normal((4, n.shape[1])) for n in graph.inputs}
    want = lz.evaluate(graph, inputs)
    got = lz.evaluate(optimized, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-9)
