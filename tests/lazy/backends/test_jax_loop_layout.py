"""The JAX lowering's layout choices for loops: a batched invariant that the body reads only as
whole columns (TAKE of a scalar index) goes into the loop transposed, read axis first, so each
read is a contiguous row. Which invariants qualify, and that results match the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import lazy as lz
from lazy.backends.jax_backend import _column_reads


def loop_node(out: lz.LazyTensor) -> lz.Node:
    assert out.node.op is lz.Op.LOOP
    return out.node


def body_input(node: lz.Node, k: int) -> lz.Node:
    """The body's stand-in for invariant ``k``."""
    return node.attr("body").inputs[2 + k]


def column_sum(i: lz.LazyTensor, acc: lz.LazyTensor, x: lz.LazyTensor, cols: lz.LazyTensor):
    """acc + x[:, cols[i]] (B,): one column per iteration."""
    return acc + lz.take(x, lz.take(cols, i), axis=1)


def build(body, n: int = 4):
    b = lz.Builder()
    x = b.input("x", (6,))
    cols = b.param(np.array([5, 0, 3, 3, 1], np.int32), "cols")
    acc = lz.take(x, lz.take(cols, lz.const(np.int32(0))), axis=1) * 0.0
    out = lz.fori_loop(n, body, acc, x, cols)
    return b, out


def test_columns_read_by_scalar_index_are_moved() -> None:
    _, out = build(column_sum)
    node = loop_node(out)
    assert _column_reads(node.attr("body")) == {body_input(node, 0): 1}


@pytest.mark.parametrize(
    "body",
    [
        # also gathered per row: needs the batch-major layout
        lambda i, acc, x, cols: (
            acc
            + lz.reshape(
                lz.take_along(x, lz.reshape(lz.cast(acc, "int32") * 0, (lz.B, 1)), axis=1), (lz.B,)
            )
        ),
        # also read whole, elementwise
        lambda i, acc, x, cols: acc + lz.take(x, lz.take(cols, i), axis=1) + lz.sum(x, axis=1),
        # read with a vector of indices (a (B, n) gather, not a column)
        lambda i, acc, x, cols: acc + lz.sum(lz.take(x, cols, axis=1), axis=1),
        # handed to a nested loop, which lowers with its own layout
        lambda i, acc, x, cols: lz.fori_loop(2, column_sum, acc, x, cols),
    ],
    ids=["take_along", "elementwise", "vector_index", "nested_loop"],
)
def test_other_uses_keep_the_batch_major_layout(body) -> None:
    _, out = build(body)
    node = loop_node(out)
    assert body_input(node, 0) not in _column_reads(node.attr("body"))


def test_unbatched_invariants_are_not_moved() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    table = b.param(np.arange(12, dtype=np.float32).reshape(3, 4), "table")
    out = lz.fori_loop(3, lambda i, acc, t: acc + lz.sum(lz.take(t, i, axis=1)), x, table)
    assert _column_reads(loop_node(out).attr("body")) == {}


@pytest.mark.parametrize("nested", [False, True])
def test_moved_columns_compute_the_same_as_the_interpreter(nested: bool) -> None:
    def body(i, acc, x, cols):
        # a column read (moved) next to a loop-index-dependent arithmetic on the carry
        step = column_sum(i, acc, x, cols) * 0.5
        return lz.fori_loop(2, column_sum, step, x, cols) if nested else step

    b, out = build(body, n=5)
    program = b.build({"out": out})
    x = np.random.default_rng(0).standard_normal((7, 6)).astype(np.float32)
    expected = lz.run_program(program, {"x": x})["out"]
    compiled = lz.compile(program, lz.Options(backend="jax", max_batch=8), warmup=False)
    np.testing.assert_allclose(compiled({"x": x})["out"], expected, rtol=1e-6)
