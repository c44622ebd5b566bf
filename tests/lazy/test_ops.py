"""The op table: completeness across every rule table, and the shape and dtype rules of the specs,
exercised through the public API (:class:`lazy.Builder` and the tensor functions).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import lazy as lz
from lazy import B, Op
from lazy import interpreter as interp
from lazy.backends import jax_backend, numpy_backend, torch_backend

# --- completeness --------------------------------------------------------------------------------

TABLES: dict[str, Any] = {
    "specs": lz.SPECS,
    "interpreter": interp.RULES,
    "jax": jax_backend.RULES,
    "torch": torch_backend.RULES,
    "numpy": numpy_backend.RULES,
}


DEVICE_TABLES = ("jax", "torch")


@pytest.mark.parametrize("table", TABLES)
def test_every_op_has_exactly_one_entry_in_every_table(table: str) -> None:
    """Every table has every op, but a device backend's has none of the host-only ones."""
    keys = set(TABLES[table])
    expected = set(Op) - lz.HOST_ONLY if table in DEVICE_TABLES else set(Op)
    if table in DEVICE_TABLES:
        assert not keys & lz.HOST_ONLY, f"{table} lowers host-only ops"
    missing = sorted(op.name for op in expected if op not in keys)
    extra = sorted(map(repr, keys - set(Op)))
    assert not missing, f"{table} has no entry for {missing}"
    assert not extra, f"{table} has entries for things that are not ops: {extra}"


@pytest.mark.parametrize("name", ["jax", "torch", "numpy"])
def test_backends_lower_with_their_module_tables(name: str) -> None:
    module = {"jax": jax_backend, "torch": torch_backend, "numpy": numpy_backend}[name]
    assert lz.get_backend(name).rules is module.RULES


def test_specs_are_keyed_by_their_op() -> None:
    for op, spec in lz.SPECS.items():
        assert spec.op is op
        assert spec.kind in {
            "leaf",
            "unary",
            "binary",
            "compare",
            "logical",
            "select",
            "contraction",
            "gather",
            "reduction",
            "layout",
            "control",
        }, op
        assert (spec.arity == 0) == (spec.kind == "leaf"), op


def test_wrong_arity_and_attributes_name_the_op() -> None:
    x = lz.Builder().input("x", (3,)).node
    with pytest.raises(lz.ShapeError, match=r"\bADD\b.*2 operand"):
        lz.Node.make(Op.ADD, [x])
    with pytest.raises(lz.ShapeError, match=r"\bCONCAT\b.*at least one"):
        lz.Node.make(Op.CONCAT, [], axis=0)
    with pytest.raises(lz.ShapeError, match=r"\bSUM\b.*attributes"):
        lz.Node.make(Op.SUM, [x], axes=(1,))


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def t() -> SimpleNamespace:
    """Batched inputs and unbatched parameters of a few shapes and dtypes."""
    b = lz.Builder()
    return SimpleNamespace(
        x=b.input("x", (3,)),  # float32[B, 3]
        x1=b.input("x1", (1,)),  # float32[B, 1]
        x3=b.input("x3", (3, 4)),  # float32[B, 3, 4]
        x64=b.input("x64", (3,), "float64"),
        i=b.input("i", (3,), "int32"),
        u=b.input("u", (3,), "uint32"),
        c=b.input("c", (3,), "bool"),
        idx=b.input("idx", (2,), "int32"),
        p=b.param(np.ones(3, np.float32), "p"),  # float32[3]
        p4=b.param(np.ones(4, np.float32), "p4"),  # float32[4]
        p23=b.param(np.ones((2, 3), np.float32), "p23"),
        p13=b.param(np.ones((1, 3), np.float32), "p13"),
        p113=b.param(np.ones((1, 1, 3), np.float32), "p113"),
        w=b.param(np.ones((3, 2), np.float32), "w"),
        w34=b.param(np.ones((3, 4), np.float32), "w34"),
        table=b.param(np.ones((5, 3), np.float32), "table"),
        pi=b.param(np.zeros(2, np.int32), "pi"),
        s=b.param(np.float32(2.0), "s"),  # float32[]
        zero=b.param(np.int32(0), "zero"),  # int32[]
        nodes=b.param(np.zeros(3, np.int32), "nodes"),  # a 3-node table of indices
        flags=b.param(np.zeros(3, bool), "flags"),
    )


def forest(t: SimpleNamespace, **operands: Any) -> lz.LazyTensor:
    """A FOREST_SUM of ``t``'s 3-node tables, with ``operands`` (or ``trees``/``depth``) swapped."""
    args = {"x": t.x, "feature": t.nodes, "threshold": t.p, "nan_right": t.flags}
    args |= {"left": t.nodes, "value": t.w, "trees": 1, "depth": 2}
    args |= operands
    return lz.forest_sum(**args)


def forest_shap(t: SimpleNamespace, **operands: Any) -> lz.LazyTensor:
    """A FOREST_SHAP of one leaf of one element and one test, with ``operands`` swapped."""
    tables = {
        "column": np.zeros((1, 1), np.int32),
        "threshold": np.zeros((1, 1), np.float32),
        "right": np.zeros((1, 1), bool),
        "player": np.zeros(1, np.int32),
        "zero": np.ones(1),
        "offsets": np.array([0, 1], np.int32),
        "value": np.ones((1, 2)),
        "nodes": np.full((1, 1), 0.5),
        "weights": np.ones((1, 1)),
    }
    args: dict[str, Any] = {"x": t.x, "players": 1}
    args |= {name: lz.const(value) for name, value in tables.items()}
    args |= operands
    return lz.forest_shap(**args)


def shape_of(v: lz.LazyTensor) -> tuple[Any, ...]:
    return tuple(v.shape)


def names(op: Op) -> str:
    """A pattern matching the op's name as a word (TAKE does not match TAKE_ALONG)."""
    return rf"(?<![A-Z_]){re.escape(op.name)}(?![A-Z_])"


# --- broadcasting with the batch dimension ----------------------------------------------------

BROADCASTS = [
    ("batched + row vector", lambda t: t.x + t.p, (B, 3)),
    ("batched + scalar param", lambda t: t.x + t.s, (B, 3)),
    ("scalar param + batched", lambda t: t.s * t.x, (B, 3)),
    ("batched + python scalar", lambda t: t.x - 1.5, (B, 3)),
    ("batched column + row vector", lambda t: t.x1 + t.p4, (B, 4)),
    ("batched + (1, 3)", lambda t: t.x + t.p13, (B, 3)),
    ("batched + batched", lambda t: t.x + t.x, (B, 3)),
    ("batched size-1 + batched", lambda t: t.x1 * t.x, (B, 3)),
    ("3-d batched + row", lambda t: t.x3 + t.p4, (B, 3, 4)),
    ("where with param and scalar branches", lambda t: lz.where(t.c, t.p, 0.0), (B, 3)),
    ("where with unbatched condition", lambda t: lz.where(t.p > 0.0, t.x, t.p), (B, 3)),
    ("comparison", lambda t: t.x < t.p, (B, 3)),
]


@pytest.mark.parametrize(
    ("build", "shape"), [c[1:] for c in BROADCASTS], ids=[c[0] for c in BROADCASTS]
)
def test_broadcasting_keeps_the_batch_on_axis_0(
    t: SimpleNamespace, build: Callable, shape: tuple
) -> None:
    assert shape_of(build(t)) == shape


BROADCAST_ERRORS = [
    ("row of another length", Op.ADD, lambda t: t.x + t.p4),
    ("batch against a static axis", Op.MUL, lambda t: t.x * t.p23),
    ("batched operand of lower rank", Op.SUB, lambda t: t.x - t.p113),
    ("batched operand of lower rank, reversed", Op.ADD, lambda t: t.p113 + t.x),
    ("where branches", Op.WHERE, lambda t: lz.where(t.c, t.x, t.p4)),
    ("comparison", Op.GT, lambda t: t.x3 > t.p),
]


@pytest.mark.parametrize(
    ("op", "build"), [c[1:] for c in BROADCAST_ERRORS], ids=[c[0] for c in BROADCAST_ERRORS]
)
def test_shapes_that_do_not_broadcast_are_rejected_naming_the_op(
    t: SimpleNamespace, op: Op, build: Callable
) -> None:
    with pytest.raises(lz.ShapeError, match=names(op)) as info:
        build(t)
    assert not isinstance(info.value, lz.RowMixingError)


# --- dtypes ----------------------------------------------------------------------------------

RESULT_DTYPES = [
    ("comparison", lambda t: t.x < t.p, "bool"),
    ("equality of bools", lambda t: t.c == t.c, "bool"),
    ("isnan", lambda t: lz.isnan(t.x), "bool"),
    ("argmax", lambda t: lz.argmax(t.x3), "int32"),
    ("argmax of ints", lambda t: lz.argmax(t.i), "int32"),
    ("cast", lambda t: lz.cast(t.x, "int64"), "int64"),
    ("cast numpy dtype", lambda t: t.i.astype(np.float64), "float64"),
    ("int sum", lambda t: lz.sum(t.i), "int32"),
    ("uint max", lambda t: lz.max(t.u), "uint32"),
    ("float64 softmax", lambda t: lz.softmax(t.x64), "float64"),
    ("bitwise", lambda t: t.u ^ t.u, "uint32"),
    ("logical", lambda t: ~t.c & t.c, "bool"),
    ("gather keeps the data dtype", lambda t: lz.take(t.table, t.idx), "float32"),
    ("where keeps the branch dtype", lambda t: lz.where(t.c, t.i, 0), "int32"),
    ("python int lifted to uint32", lambda t: t.u + 1, "uint32"),
    ("ctz of uint32", lambda t: lz.ctz(t.u), "int32"),
    ("ctz of int64", lambda t: lz.ctz(lz.cast(t.i, "int64")), "int32"),
    ("reduce_and keeps the dtype", lambda t: lz.reduce_and(t.u), "uint32"),
    ("reduce_and of bools", lambda t: lz.reduce_and(t.c), "bool"),
]


@pytest.mark.parametrize(
    ("build", "dtype"), [c[1:] for c in RESULT_DTYPES], ids=[c[0] for c in RESULT_DTYPES]
)
def test_result_dtypes(t: SimpleNamespace, build: Callable, dtype: str) -> None:
    assert build(t).dtype == dtype


DTYPE_ERRORS = [
    ("float32 + int32", Op.ADD, lambda t: t.x + t.i),
    ("float32 * float64", Op.MUL, lambda t: t.x * t.x64),
    ("int32 - uint32", Op.SUB, lambda t: t.i - t.u),
    ("bool + bool", Op.ADD, lambda t: t.c + t.c),
    ("neg of bool", Op.NEG, lambda t: -t.c),
    ("int division", Op.DIV, lambda t: t.i / t.i),
    ("int power", Op.POW, lambda t: t.i**t.i),
    ("log of int", Op.LOG, lambda t: lz.log(t.i)),
    ("sigmoid of uint", Op.SIGMOID, lambda t: lz.sigmoid(t.u)),
    ("isnan of int", Op.ISNAN, lambda t: lz.isnan(t.i)),
    ("and of floats", Op.AND, lambda t: t.x & t.x),
    ("not of float", Op.NOT, lambda t: ~t.x),
    ("ordering bools", Op.LT, lambda t: t.c < t.c),
    ("equality across dtypes", Op.EQ, lambda t: t.i == t.u),
    ("maximum across dtypes", Op.MAXIMUM, lambda t: lz.maximum(t.x, t.x64)),
    ("where on a float condition", Op.WHERE, lambda t: lz.where(t.x, t.x, t.x)),
    ("where across branch dtypes", Op.WHERE, lambda t: lz.where(t.c, t.x, t.i)),
    ("matmul of ints", Op.MATMUL, lambda t: lz.matmul(t.i.reshape(B, 1, 3), lz.cast(t.w, "int32"))),
    ("matmul across dtypes", Op.MATMUL, lambda t: lz.matmul(t.x64, t.w)),
    ("take with float indices", Op.TAKE, lambda t: lz.take(t.table, t.x)),
    ("take with uint32 indices", Op.TAKE, lambda t: lz.take(t.table, t.u)),
    ("take_along with bool indices", Op.TAKE_ALONG, lambda t: lz.take_along(t.x, t.c, 1)),
    ("update with a float index", Op.UPDATE, lambda t: lz.update(t.p, t.s, t.s, 0)),
    ("update with a value of another dtype", Op.UPDATE, lambda t: lz.update(t.x, t.zero, t.i, 1)),
    ("sum of bools", Op.SUM, lambda t: lz.sum(t.c)),
    ("max of bools", Op.MAX, lambda t: lz.max(t.c)),
    ("logsumexp of ints", Op.LOGSUMEXP, lambda t: lz.logsumexp(t.i)),
    ("softmax of ints", Op.SOFTMAX, lambda t: lz.softmax(t.i)),
    ("argmax of bools", Op.ARGMAX, lambda t: lz.argmax(t.c)),
    ("ctz of float", Op.CTZ, lambda t: lz.ctz(t.x)),
    ("ctz of bool", Op.CTZ, lambda t: lz.ctz(t.c)),
    ("reduce_and of floats", Op.REDUCE_AND, lambda t: lz.reduce_and(t.x)),
    ("forest_sum of int rows", Op.FOREST_SUM, lambda t: forest(t, x=t.i)),
    ("forest_sum thresholds of another dtype", Op.FOREST_SUM, lambda t: forest(t, x=t.x64)),
    ("forest_sum with float children", Op.FOREST_SUM, lambda t: forest(t, left=t.p)),
    ("forest_sum with float nan_right", Op.FOREST_SUM, lambda t: forest(t, nan_right=t.p)),
    (
        "forest_sum of int leaf values",
        Op.FOREST_SUM,
        lambda t: forest(t, value=lz.cast(t.w, "int32")),
    ),
    ("couple of ints", Op.COUPLE, lambda t: lz.couple(t.i, classes=3)),
    ("concat across dtypes", Op.CONCAT, lambda t: lz.concat([t.x, t.i])),
    ("float constant with an int tensor", Op.ADD, lambda t: t.i + 0.5),
    ("bool constant with a float tensor", Op.MUL, lambda t: t.x * True),
    ("constant that does not fit", Op.ADD, lambda t: t.u + (-1)),
    ("float constant in an int where", Op.WHERE, lambda t: lz.where(t.c, t.i, 0.5)),
]


@pytest.mark.parametrize(
    ("op", "build"), [c[1:] for c in DTYPE_ERRORS], ids=[c[0] for c in DTYPE_ERRORS]
)
def test_dtype_errors_name_the_op(t: SimpleNamespace, op: Op, build: Callable) -> None:
    with pytest.raises(lz.ShapeError, match=names(op)):
        build(t)


def test_dtype_mismatch_suggests_a_cast(t: SimpleNamespace) -> None:
    with pytest.raises(lz.ShapeError, match=r"float32.*int32.*explicit cast"):
        t.x + t.i
    assert (lz.cast(t.i, "float32") + t.x).dtype == "float32"


# --- per-op shape rules ----------------------------------------------------------------------

SHAPES = [
    # contraction
    ("matmul 2-d by param", lambda t: t.x @ t.w, (B, 2)),
    ("matmul 3-d by param", lambda t: t.x3.transpose(0, 2, 1) @ t.w, (B, 4, 2)),
    ("matmul param by 3-d", lambda t: t.w34 @ t.x3.reshape(B, 4, 3), (B, 3, 3)),
    ("matmul 3-d by 3-d", lambda t: lz.matmul(t.x3, t.x3.transpose(0, 2, 1)), (B, 3, 3)),
    # gathers
    ("take rows of a table", lambda t: lz.take(t.table, t.idx), (B, 2, 3)),
    ("take columns of a batch", lambda t: lz.take(t.x3, t.pi, axis=2), (B, 3, 2)),
    ("take a scalar index", lambda t: lz.take(t.x3, lz.const(np.int32(1)), axis=1), (B, 4)),
    ("take_along", lambda t: lz.take_along(t.x3, lz.cast(t.x3, "int32"), axis=-1), (B, 3, 4)),
    ("take_along broadcast indices", lambda t: lz.take_along(t.x, t.pi.reshape(1, 2), 1), (B, 2)),
    ("take_along unbatched data", lambda t: lz.take_along(t.p13, t.idx, 1), (B, 2)),
    ("update a column", lambda t: lz.update(t.x3, t.zero, t.x3[:, 0, :] * 2.0, 1), (B, 3, 4)),
    ("update a negative axis", lambda t: lz.update(t.x3, t.zero, t.x3[:, :, 0], -1), (B, 3, 4)),
    ("update a param", lambda t: lz.update(t.p23, t.zero, t.p, 0), (2, 3)),
    ("forest_sum: rows by leaf width", lambda t: forest(t), (B, 2)),
    ("couple: rows by classes", lambda t: lz.couple(t.x, classes=3), (B, 3)),
    ("couple of two classes", lambda t: lz.couple(t.x1, classes=2), (B, 2)),
    # reductions
    ("sum last", lambda t: lz.sum(t.x3), (B, 3)),
    ("sum keepdims", lambda t: lz.sum(t.x3, 1, keepdims=True), (B, 1, 4)),
    ("max two axes", lambda t: lz.max(t.x3, (1, 2)), (B,)),
    ("min two axes keepdims", lambda t: lz.min(t.x3, (-1, 1), keepdims=True), (B, 1, 1)),
    ("repeated axis", lambda t: lz.sum(t.x3, (2, -1)), (B, 3)),
    ("no axes", lambda t: lz.sum(t.x3, ()), (B, 3, 4)),
    ("logsumexp", lambda t: lz.logsumexp(t.x3, 1), (B, 4)),
    ("reduce_and", lambda t: lz.reduce_and(lz.cast(t.x3, "uint32"), 1), (B, 4)),
    (
        "reduce_and two axes keepdims",
        lambda t: lz.reduce_and(lz.cast(t.x3, "int32"), (1, -1), keepdims=True),
        (B, 1, 1),
    ),
    ("ctz", lambda t: lz.ctz(lz.cast(t.x3, "int32")), (B, 3, 4)),
    ("argmax", lambda t: lz.argmax(t.x3, 1), (B, 4)),
    ("softmax", lambda t: lz.softmax(t.x3, 1), (B, 3, 4)),
    # layout
    ("concat", lambda t: lz.concat([t.x, t.x1, t.x], axis=1), (B, 7)),
    ("concat negative axis", lambda t: lz.concat([t.x3, t.x3], axis=-2), (B, 6, 4)),
    ("slice with step", lambda t: lz.slice_axis(t.x3, 2, 0, 4, 3), (B, 3, 2)),
    ("slice past the end", lambda t: lz.slice_axis(t.x3, 2, 1, 100), (B, 3, 3)),
    ("slice negative start", lambda t: lz.slice_axis(t.x3, 1, -2, 3), (B, 2, 4)),
    ("empty slice", lambda t: lz.slice_axis(t.x3, 1, 2, 1), (B, 0, 4)),
    ("reshape", lambda t: t.x3.reshape(B, 2, 6), (B, 2, 6)),
    ("expand_dims", lambda t: lz.expand_dims(t.x, 1), (B, 1, 3)),
    ("broadcast a param to the batch", lambda t: lz.broadcast_to(t.p, (B, 3)), (B, 3)),
    ("broadcast a param up a rank", lambda t: lz.broadcast_to(t.p13, (B, 2, 3)), (B, 2, 3)),
    ("broadcast batched size-1 axis", lambda t: lz.broadcast_to(t.x1, (B, 5)), (B, 5)),
    ("transpose keeping axis 0", lambda t: lz.transpose(t.x3, (0, 2, 1)), (B, 4, 3)),
]


@pytest.mark.parametrize(("build", "shape"), [c[1:] for c in SHAPES], ids=[c[0] for c in SHAPES])
def test_result_shapes(t: SimpleNamespace, build: Callable, shape: tuple) -> None:
    assert shape_of(build(t)) == shape


SHAPE_ERRORS = [
    ("matmul inner dimensions", Op.MATMUL, lambda t: t.x @ t.w34.transpose()),
    ("matmul of a vector", Op.MATMUL, lambda t: lz.matmul(t.x, t.p)),
    ("matmul moving the batch", Op.MATMUL, lambda t: t.x @ lz.broadcast_to(t.w, (2, 3, 2))),
    ("take of batched data by batched indices", Op.TAKE, lambda t: lz.take(t.x, t.idx, 1)),
    ("take of a table by batched indices on axis 1", Op.TAKE, lambda t: lz.take(t.table, t.idx, 1)),
    ("take axis out of range", Op.TAKE, lambda t: lz.take(t.x, t.pi, axis=2)),
    ("take_along of different ranks", Op.TAKE_ALONG, lambda t: lz.take_along(t.x3, t.idx, 1)),
    (
        "take_along other axes mismatch",
        Op.TAKE_ALONG,
        lambda t: lz.take_along(t.p23.reshape(1, 2, 3), lz.cast(t.x3, "int32"), 2),
    ),
    ("update with a vector index", Op.UPDATE, lambda t: lz.update(t.x, t.pi, t.x[:, 0], 1)),
    (
        "update with a value of the wrong shape",
        Op.UPDATE,
        lambda t: lz.update(t.x3, t.zero, t.x, 1),
    ),
    ("update of a batch by a param", Op.UPDATE, lambda t: lz.update(t.x, t.zero, t.s, 1)),
    ("forest_sum of unbatched rows", Op.FOREST_SUM, lambda t: forest(t, x=t.p23)),
    ("forest_sum of 3-d rows", Op.FOREST_SUM, lambda t: forest(t, x=t.x3)),
    ("forest_sum tables of other lengths", Op.FOREST_SUM, lambda t: forest(t, feature=t.pi)),
    ("forest_sum leaf values of rank 1", Op.FOREST_SUM, lambda t: forest(t, value=t.p)),
    ("forest_sum with more trees than nodes", Op.FOREST_SUM, lambda t: forest(t, trees=4)),
    ("forest_sum with no trees", Op.FOREST_SUM, lambda t: forest(t, trees=0)),
    ("forest_sum of negative depth", Op.FOREST_SUM, lambda t: forest(t, depth=-1)),
    ("couple of the wrong pair count", Op.COUPLE, lambda t: lz.couple(t.x, classes=4)),
    ("couple of one class", Op.COUPLE, lambda t: lz.couple(t.x1, classes=1)),
    ("couple of 3-d rows", Op.COUPLE, lambda t: lz.couple(t.x3, classes=3)),
    ("reduction axis out of range", Op.SUM, lambda t: lz.sum(t.x, 2)),
    ("argmax axis out of range", Op.ARGMAX, lambda t: lz.argmax(t.x, -3)),
    ("concat of mismatched shapes", Op.CONCAT, lambda t: lz.concat([t.x3, t.x], axis=1)),
    (
        "concat of mismatched ranks",
        Op.CONCAT,
        lambda t: lz.concat([t.x3, t.x.reshape(B, 1, 3)], axis=2),
    ),
    ("slice with a zero step", Op.SLICE, lambda t: lz.slice_axis(t.x, 1, 0, 3, 0)),
    ("slice with a negative step", Op.SLICE, lambda t: lz.slice_axis(t.x, 1, 3, 0, -1)),
    ("reshape changing the element count", Op.RESHAPE, lambda t: t.x3.reshape(B, 5)),
    ("reshape to a negative size", Op.RESHAPE, lambda t: t.x3.reshape(B, -1)),
    ("reshape moving B off axis 0", Op.RESHAPE, lambda t: t.x.reshape(3, B)),
    ("broadcast to an incompatible shape", Op.BROADCAST, lambda t: lz.broadcast_to(t.p, (B, 4))),
    ("broadcast to a lower rank", Op.BROADCAST, lambda t: lz.broadcast_to(t.p23, (3,))),
    (
        "broadcast a batched tensor up a rank",
        Op.BROADCAST,
        lambda t: lz.broadcast_to(t.x, (B, 2, 3)),
    ),
    ("transpose by a non-permutation", Op.TRANSPOSE, lambda t: lz.transpose(t.x3, (0, 1, 1))),
    ("transpose of the wrong rank", Op.TRANSPOSE, lambda t: lz.transpose(t.x3, (0, 1))),
]


@pytest.mark.parametrize(
    ("op", "build"), [c[1:] for c in SHAPE_ERRORS], ids=[c[0] for c in SHAPE_ERRORS]
)
def test_shape_errors_name_the_op(t: SimpleNamespace, op: Op, build: Callable) -> None:
    with pytest.raises(lz.ShapeError, match=names(op)) as info:
        build(t)
    assert not isinstance(info.value, lz.RowMixingError)


def test_leaves_keep_the_batch_dimension_on_axis_0() -> None:
    b = lz.Builder()
    with pytest.raises(lz.ShapeError, match="axis 0"):
        b.input("x", (B,))
    with pytest.raises(lz.ShapeError, match="batch dimension"):
        lz.Node.make(Op.PARAM, name="w", shape=(B, 3), dtype="float32")
    with pytest.raises(TypeError, match="not supported"):
        b.input("y", (3,), "float16")


# --- row mixing ------------------------------------------------------------------------------

ROW_MIXING = [
    ("sum over axis 0", Op.SUM, lambda t: lz.sum(t.x, 0)),
    ("sum over axis -ndim", Op.SUM, lambda t: lz.sum(t.x3, -3)),
    ("sum over all axes", Op.SUM, lambda t: lz.sum(t.x3, (0, 1, 2))),
    ("max over axis 0", Op.MAX, lambda t: lz.max(t.x, 0)),
    ("min over axis 0", Op.MIN, lambda t: lz.min(t.x3, (0, 2), keepdims=True)),
    ("logsumexp over axis 0", Op.LOGSUMEXP, lambda t: lz.logsumexp(t.x, 0)),
    ("reduce_and over axis 0", Op.REDUCE_AND, lambda t: lz.reduce_and(t.u, (0, 1))),
    ("argmax over axis 0", Op.ARGMAX, lambda t: lz.argmax(t.x, 0)),
    ("softmax over axis 0", Op.SOFTMAX, lambda t: lz.softmax(t.x3, 0)),
    ("concat along axis 0", Op.CONCAT, lambda t: lz.concat([t.x, t.x], axis=0)),
    ("concat of a param along axis 0", Op.CONCAT, lambda t: lz.concat([t.p23, t.x], axis=0)),
    ("slice along axis 0", Op.SLICE, lambda t: lz.slice_axis(t.x, 0, 0, 2)),
    ("slice along axis -ndim", Op.SLICE, lambda t: lz.slice_axis(t.x3, -3, 1, 2)),
    ("take along axis 0 of a batch", Op.TAKE, lambda t: lz.take(t.x, t.pi, axis=0)),
    ("take_along axis 0 of a batch", Op.TAKE_ALONG, lambda t: lz.take_along(t.x, t.idx, 0)),
    ("update of a row of a batch", Op.UPDATE, lambda t: lz.update(t.x, t.zero, t.p, 0)),
    ("forest_sum of per-row tables", Op.FOREST_SUM, lambda t: forest(t, threshold=t.x)),
    ("forest_shap of per-row zero fractions", Op.FOREST_SHAP, lambda t: forest_shap(t, zero=t.x)),
    ("matmul contracting over the batch", Op.MATMUL, lambda t: lz.matmul(t.w34, t.x)),
    ("matmul of batch by batch", Op.MATMUL, lambda t: t.x @ t.x),
    ("transpose moving axis 0", Op.TRANSPOSE, lambda t: lz.transpose(t.x3, (1, 0, 2))),
    ("transpose reversing all axes", Op.TRANSPOSE, lambda t: t.x.transpose()),
    ("reshape dropping the batch", Op.RESHAPE, lambda t: t.x.reshape(3)),
    ("reshape giving a param a batch", Op.RESHAPE, lambda t: t.p.reshape(B, 3)),
]


@pytest.mark.parametrize(
    ("op", "build"), [c[1:] for c in ROW_MIXING], ids=[c[0] for c in ROW_MIXING]
)
def test_row_mixing_is_rejected_naming_the_op(t: SimpleNamespace, op: Op, build: Callable) -> None:
    with pytest.raises(lz.RowMixingError, match=names(op)):
        build(t)


def test_every_op_that_could_mix_rows_has_a_row_mixing_case() -> None:
    could_mix = {
        op
        for op, spec in lz.SPECS.items()
        if spec.kind in {"contraction", "gather", "reduction", "layout"}
    } - {Op.BROADCAST}  # BROADCAST cannot move B: a batched tensor keeps its rank and axis 0
    assert could_mix <= {op for _, op, _ in ROW_MIXING}


def test_the_same_ops_on_unbatched_params_are_fine(t: SimpleNamespace) -> None:
    # Row mixing is about the batch only: axis 0 of a parameter is an ordinary axis.
    assert shape_of(lz.sum(t.p23, 0)) == (3,)
    assert shape_of(lz.concat([t.p23, t.p13], axis=0)) == (3, 3)
    assert shape_of(lz.transpose(t.p23)) == (3, 2)
    assert shape_of(lz.take(t.table, t.pi, axis=0)) == (2, 3)
    assert shape_of(t.p23.reshape(6)) == (6,)


def test_row_mixing_errors_are_shape_errors_that_say_where(t: SimpleNamespace) -> None:
    with lz.scope("MyScaler"), pytest.raises(lz.ShapeError) as info:
        lz.sum(t.x, 0)
    assert isinstance(info.value, lz.RowMixingError)
    assert "MyScaler" in str(info.value)
    assert "test_ops.py" in str(info.value)
