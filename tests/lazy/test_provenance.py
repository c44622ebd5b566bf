"""lazy.column_sources: which input columns each column of a value is computed from — exact
where ops keep columns apart, every operand column elsewhere."""

from __future__ import annotations

import numpy as np

import lazy as lz


def _sources(build, inputs=(("x", 3),)):  # type: ignore[no-untyped-def]
    """Per column of ``build(builder, *inputs)``: its sorted sources. An input of width 0 is a
    (B,) int32 column of codes."""
    b = lz.Builder()
    tensors = [
        b.input(name, (width,), "float64") if width else b.input(name, (), "int32")
        for name, width in inputs
    ]
    out = build(b, *tensors)
    return [sorted(s) for s in lz.column_sources(out.node, b.params)]


def test_elementwise_ops_keep_columns_apart_and_broadcast_a_single_one() -> None:
    got = _sources(
        lambda b, x, c: (
            (x - b.param(np.array([1.0, 2.0, 3.0]), "mean"))
            * lz.expand_dims(lz.cast(c, "float64"), 1)
        ),
        (("x", 3), ("code", 0)),
    )
    assert got == [[("code", 0), ("x", j)] for j in range(3)]


def test_slices_gathers_and_concatenation_follow_the_columns() -> None:
    got = _sources(
        lambda b, x: lz.concat(
            [x[:, 2:], lz.take(x, b.param(np.array([1, 1, 0]), "pick"), axis=1)], axis=1
        )
    )
    assert got == [[("x", 2)], [("x", 1)], [("x", 1)], [("x", 0)]]


def test_a_matrix_product_reads_its_nonzero_weights() -> None:
    weights = np.array([[1.0, 0.0], [0.0, 0.0], [2.0, 3.0]])
    got = _sources(lambda b, x: lz.matmul(x, b.param(weights, "w")))
    assert got == [[("x", 0), ("x", 2)], [("x", 2)]]


def test_per_column_tables_along_a_third_axis_keep_their_column() -> None:
    """A binning's (B, k, edges) compares, counted back to (B, k): each count is its column's;
    slices, gathers and concatenation along the trailing axis too."""
    edges = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])

    def binned(b, x):  # type: ignore[no-untyped-def]
        passed = lz.cast(lz.expand_dims(x, 2) >= b.param(edges, "edges"), "int32")
        both = lz.concat([passed, passed[:, :, :1]], axis=2)
        picked = lz.take(both, b.param(np.array([0, 2]), "pick"), axis=2)
        return lz.sum(picked, axis=2) + lz.max(passed, axis=-1)

    assert _sources(binned) == [[("x", j)] for j in range(3)]


def test_a_reduction_across_columns_mixes_them() -> None:
    got = _sources(lambda b, x: lz.sum(lz.expand_dims(x, 2), axis=(1, 2), keepdims=True)[:, 0])
    assert got == [[("x", 0), ("x", 1), ("x", 2)]]
    got = _sources(lambda b, x: lz.reshape(lz.expand_dims(x, 1), (lz.B, 3)))
    assert got == [[("x", 0), ("x", 1), ("x", 2)]] * 3


def test_a_one_hot_of_host_codes_is_its_code_column() -> None:
    got = _sources(
        lambda b, c: lz.cast(
            lz.expand_dims(c, 1) == b.param(np.arange(3, dtype=np.int32), "categories"), "float64"
        ),
        (("code", 0),),
    )
    assert got == [[("code", 0)]] * 3


def test_other_ops_make_every_column_depend_on_every_operand_column() -> None:
    got = _sources(lambda b, x: lz.softmax(x[:, :2], axis=1))
    assert got == [[("x", 0), ("x", 1)]] * 2
    got = _sources(lambda b, x: lz.expand_dims(lz.sum(x, axis=1), 1) + x)
    assert got == [[("x", 0), ("x", 1), ("x", 2)]] * 3


def test_affine_inputs_compose_projections_and_centrings() -> None:
    """Each level is the value as ``inner @ W + c``, checked by evaluating both sides; the chain
    stops at an op that is no affine step (a product of two columns)."""
    rng = np.random.default_rng(0)
    b = lz.Builder()
    x = b.input("x", (3,), "float64")
    product = x * lz.expand_dims(x[:, 0], 1)
    centred = product - b.param(np.array([1.0, 2.0, 3.0]), "mean")
    projected = lz.matmul(centred, b.param(rng.normal(size=(3, 2)), "components"))
    out = 5.0 - (projected + b.param(np.array([0.5, -0.5]), "shift"))
    levels = list(lz.affine_inputs(out.node, b.params))
    assert [level[0] for level in levels][-1] is product.node
    assert len(levels) == 5  # out, its inner sum, the projection, the centring, the product
    rows = {"x": rng.normal(size=(4, 3))}
    expected = lz.run_program(b.build({"out": out}), rows)["out"]
    for inner, weights, offset in levels:
        value = lz.run_program(b.build({"v": lz.LazyTensor(inner)}), rows)["v"]
        np.testing.assert_allclose(value @ weights + offset, expected, rtol=1e-12)
