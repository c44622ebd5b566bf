"""LazyTensor: concretization errors, numpy interop, scalar lifting, indexing, constant limits."""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import lazy as lz
from lazy import B, Op
from lazy.tensor import MAX_CONST_ELEMENTS

HERE = __file__


def _line() -> int:
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def _x(shape: tuple[int, ...] = (3,), dtype: str = "float32") -> lz.LazyTensor:
    return lz.Builder().input("x", shape, dtype)


# --- concretization -----------------------------------------------------------------------------


def _if(x: lz.LazyTensor) -> None:
    if x:
        pass


CONCRETIZE: dict[str, Callable[[lz.LazyTensor], Any]] = {
    "bool": bool,
    "float": float,
    "int": int,
    "index": operator.index,
    "len": len,
    "iter": iter,
    "list": list,
    "np.asarray": np.asarray,
    "np.array-of-list": lambda x: np.array([x, x]),
    "if": _if,
    "and": lambda x: x and 1,
    "range": range,
}


@pytest.mark.parametrize("use", list(CONCRETIZE.values()), ids=list(CONCRETIZE))
def test_concretizing_names_the_op_the_scope_and_the_source_line(
    use: Callable[[lz.LazyTensor], Any],
) -> None:
    x = _x()
    with lz.scope("pipeline"), lz.scope("scaler"):
        y = lz.exp(x)
        line = _line() - 1

    with pytest.raises(lz.ConcretizationError) as info:
        use(y)

    message = str(info.value)
    assert "EXP" in message
    assert "pipeline / scaler" in message
    assert f"{HERE}:{line}" in message
    assert "Builder.host" in message
    assert isinstance(info.value, TypeError)


def test_concretizing_a_comparison_in_a_condition() -> None:
    x = _x()
    with lz.scope("threshold"):
        flag = x > 0.5
        line = _line() - 1
    with pytest.raises(lz.ConcretizationError, match=rf"GT .*threshold at .*:{line}"):
        _if(flag)


def test_unscoped_values_say_so() -> None:
    x = _x()
    with pytest.raises(lz.ConcretizationError, match="<no scope>"):
        float(x * 2.0)


def test_origin_skips_lazy_internals() -> None:
    x = _x()
    y = np.log1p(x)
    line = _line() - 1
    z = x[:, 1]
    line_z = _line() - 1
    assert y.origin == f"{HERE}:{line}"
    assert z.origin == f"{HERE}:{line_z}"


# --- numpy interop ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "op"),
    [
        (lambda x: np.log1p(x), Op.LOG1P),
        (lambda x: np.exp(x), Op.EXP),
        (lambda x: np.add(x, 1), Op.ADD),
        (lambda x: np.add(1, x), Op.ADD),
        (lambda x: np.ones(3, np.float32) - x, Op.SUB),
        (lambda x: np.maximum(x, 0.0), Op.MAXIMUM),
        (lambda x: np.float64(2.0) * x, Op.MUL),
        (lambda x: np.isnan(x), Op.ISNAN),
        (lambda x: np.less_equal(x, 0.5), Op.LE),
    ],
)
def test_numpy_ufuncs_record_nodes(call: Callable[[lz.LazyTensor], Any], op: Op) -> None:
    x = _x()
    y = call(x)
    assert isinstance(y, lz.LazyTensor)
    assert y.node.op is op
    assert x.node in y.node.inputs
    assert all(i.dtype == "float32" for i in y.node.inputs)


def test_ufunc_results_match_numpy_in_the_interpreter() -> None:
    b = lz.Builder()
    x = b.input("x", (3,), "float64")
    graph = b.graph({"y": np.log1p(np.add(x, 1)) * np.maximum(x, 0.5)})
    xs = np.array([[0.0, 1.0, 2.5], [3.0, 0.25, 7.0]])
    want = np.log1p(np.add(xs, 1)) * np.maximum(xs, 0.5)
    np.testing.assert_allclose(lz.evaluate(graph, {"x": xs})["y"], want, rtol=1e-15)


@pytest.mark.parametrize(
    "call",
    [lambda x: np.sin(x), lambda x: np.add(x, 1, out=np.empty(3)), lambda x: np.add.reduce(x)],
    ids=["unmapped-ufunc", "out-argument", "reduce-method"],
)
def test_unsupported_ufunc_calls_raise(call: Callable[[lz.LazyTensor], Any]) -> None:
    with pytest.raises(TypeError):
        call(_x())


# --- scalars and arrays in expressions ----------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "scalar"),
    [
        ("float32", 2.5),
        ("float32", 2),
        ("float64", 2.5),
        ("float64", np.float32(0.5)),
        ("int32", 3),
        ("int64", -7),
        ("uint32", 7),
    ],
)
def test_python_scalars_adopt_the_tensor_dtype(dtype: str, scalar: Any) -> None:
    x = _x(dtype=dtype)
    for y in (x + scalar, scalar + x, x * scalar, lz.maximum(x, scalar), x < scalar):
        const = next(i for i in y.node.inputs if i.op is Op.CONST)
        assert const.dtype == dtype
        assert const.shape == ()
        assert const.attr("value").array == np.asarray(scalar).astype(dtype)
    assert (x + scalar).dtype == dtype
    assert (x < scalar).dtype == "bool"


def test_numpy_arrays_adopt_the_tensor_dtype() -> None:
    x = _x()
    y = x + np.array([1.0, 2.0, 3.0])  # float64 array, float32 tensor
    const = y.node.inputs[1]
    assert const.op is Op.CONST and const.dtype == "float32" and const.shape == (3,)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint32", "bool"])
@pytest.mark.parametrize("scalar", [0.5, 1.0, np.float32(2.0)])
def test_a_float_scalar_with_an_int_tensor_raises(dtype: str, scalar: Any) -> None:
    x = _x(dtype=dtype)
    with pytest.raises(lz.ShapeError, match="float constant"):
        x + scalar
    with pytest.raises(lz.ShapeError, match="float constant"):
        scalar * x


@pytest.mark.parametrize(("dtype", "scalar"), [("int32", 2**31), ("uint32", -1), ("bool", 2)])
def test_an_int_scalar_that_does_not_fit_raises(dtype: str, scalar: int) -> None:
    with pytest.raises(lz.ShapeError):
        _x(dtype=dtype) + scalar


def test_a_bool_scalar_with_a_numeric_tensor_raises() -> None:
    with pytest.raises(lz.ShapeError, match="boolean"):
        _x() + True


def test_two_tensors_of_different_dtypes_need_a_cast() -> None:
    b = lz.Builder()
    x, i = b.input("x", (3,)), b.input("i", (3,), "int32")
    with pytest.raises(lz.ShapeError, match="explicit cast"):
        x + i
    assert (x + lz.cast(i, "float32")).dtype == "float32"


# --- indexing -----------------------------------------------------------------------------------

INDICES: list[Any] = [
    (slice(None), 1),
    (slice(None), -1),
    (slice(None), slice(1, 3)),
    (slice(None), slice(None, None, 2)),
    (Ellipsis, -1),
    (Ellipsis, 1, slice(3, None)),
    (slice(None), 2, 4),
    (slice(None), None, 1),
    (slice(None), 1, None),
    (slice(None), slice(0, 2), None, -2),
    (Ellipsis, None),
    (slice(None), np.int64(3)),
    Ellipsis,
    slice(None),
]


@pytest.mark.parametrize("key", INDICES, ids=[repr(k) for k in INDICES])
def test_basic_indexing_on_non_batch_axes_matches_numpy(key: Any) -> None:
    b = lz.Builder()
    x = b.input("x", (4, 5), "float64")
    y = x[key]
    xs = np.arange(2 * 4 * 5, dtype=np.float64).reshape(2, 4, 5)
    want = xs[key]
    assert y.shape == (B, *want.shape[1:])
    got = lz.evaluate(b.graph({"y": y}), {"x": xs})["y"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("key", "match"),
    [
        (0, "batch axis"),
        (slice(1, None), "batch axis"),
        ((slice(None), 4), "out of bounds"),
        ((slice(None), -5), "out of bounds"),
        ((slice(None), 0, 0, 0), "too many indices"),
        ((Ellipsis, 0, Ellipsis), "one ellipsis"),
        ((slice(None), [0, 1]), "take"),
        ((slice(None), np.array([0, 1])), "take"),
        ((slice(None), True), "take"),
        (None, "batch"),
    ],
)
def test_unsupported_indexing_raises(key: Any, match: str) -> None:
    with pytest.raises(lz.ShapeError, match=match):
        _x((4, 5))[key]


def test_indexing_with_a_lazy_value_raises_without_recording_comparisons() -> None:
    b = lz.Builder()
    x = b.input("x", (4,))
    i = b.input("i", (), "int32")
    with pytest.raises(lz.ShapeError, match="take"):
        x[:, i]
    with pytest.raises(lz.ShapeError, match="take"):
        x[i, ...]


# --- constants ----------------------------------------------------------------------------------


def test_constants_up_to_the_limit_are_accepted() -> None:
    c = lz.const(np.zeros(MAX_CONST_ELEMENTS, np.float32))
    assert c.node.op is Op.CONST and c.shape == (MAX_CONST_ELEMENTS,)


def test_too_large_constants_raise() -> None:
    with pytest.raises(lz.ShapeError, match=r"too large.*Builder\.param"):
        lz.const(np.zeros(MAX_CONST_ELEMENTS + 1, np.float32))
    x = _x((MAX_CONST_ELEMENTS + 1,))
    with pytest.raises(lz.ShapeError, match="too large"):
        x + np.ones(MAX_CONST_ELEMENTS + 1)


def test_constants_are_immutable_snapshots() -> None:
    value = np.array([1.0, 2.0], np.float32)
    c = lz.const(value)
    value[0] = 99.0
    stored = c.node.attr("value").array
    assert stored[0] == 1.0
    with pytest.raises(ValueError):
        stored[0] = 5.0


def test_lazy_tensors_are_unhashable() -> None:
    with pytest.raises(TypeError):
        hash(_x())
