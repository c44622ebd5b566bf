"""Every op, on every backend, against the float64 reference interpreter.

The parametrization is generated from :class:`lazy.Op`: each op needs at least one entry in
:data:`CASES`, and an op without one shows up as a failing ``<OP>-missing-case`` test, so a new op
cannot reach the backends untested. Each case is a small graph built with :class:`lazy.Builder`
around the op under test, fed random rows; it is compiled per backend (max batch 8: buckets 1, 2,
4, 8) and run on 5 rows (padded to 8) and 21 rows (chunked 8 + 8 + 5); ops whose lowering reads
the bucket's batch size also run on 1, 2 and 3 rows, so on every bucket.

Outputs must have the dtype the X32 policy lowers the declared dtype to (a float32 graph gives
float32), the interpreter's shape, integers and bools exactly, and floats within a tolerance. The
default float tolerance is ``rtol=1e-6, atol=1e-6`` (a float32 result is rounded to ~6e-8 of
itself); cases whose float32 result is legitimately further from the float64 value say why.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import lazy as lz
from lazy import B, Op
from tests.lazy.forest_tables import forest_tables

BACKENDS = ("jax", "torch", "numpy")
MAX_BATCH = 8
#: Rows each case runs on: 5 pads to bucket 8; 21 chunks into 8 + 8 + 5 (padded to 8). One bucket
#: keeps XLA compiles (most of this file's time) to one per case and backend.
ROWS = (5, 21)
#: Ops whose lowerings read the (static) batch size of a bucket run on every bucket: 1, 2, 4 and 8.
BATCH_SIZED = frozenset({Op.INPUT, Op.RESHAPE, Op.BROADCAST, Op.TAKE})
EVERY_BUCKET_ROWS = (1, 2, 3, 5, 21)

Draw = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]

# --- random row generators -------------------------------------------------------------------


def normal(scale: float = 1.0) -> Draw:
    return lambda rng, shape: rng.normal(0.0, scale, shape)


def uniform(lo: float, hi: float) -> Draw:
    return lambda rng, shape: rng.uniform(lo, hi, shape)


def integers(lo: int, hi: int) -> Draw:
    """Integers in [lo, hi)."""
    return lambda rng, shape: rng.integers(lo, hi, shape, dtype=np.int64)


def choice(*values: Any) -> Draw:
    """Values from a small set: ties, signed zeros, infinities, NaNs where the case wants them."""
    return lambda rng, shape: rng.choice(np.array(values), shape)


def bools() -> Draw:
    return lambda rng, shape: rng.random(shape) < 0.5


def with_nans(draw: Draw, fraction: float = 0.3) -> Draw:
    def sample(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        x = draw(rng, shape).astype(np.float64)
        x[rng.random(shape) < fraction] = np.nan
        return x

    return sample


def high_uint32() -> Draw:
    """uint32 values on both sides of 2**31 (a signed lowering would misorder them)."""
    return lambda rng, shape: (
        rng.integers(0, 2**32, shape, dtype=np.uint64)
        | (rng.integers(0, 2, shape, dtype=np.uint64) << np.uint64(31))
    )


# --- cases -----------------------------------------------------------------------------------


class Trace:
    """A Builder that remembers how to draw rows for each input it declares."""

    def __init__(self, seed: int) -> None:
        self.builder = lz.Builder()
        self.rng = np.random.default_rng(seed)
        self._draws: dict[str, tuple[tuple[int, ...], str, Draw]] = {}

    def input(
        self, name: str, shape: tuple[int, ...], dtype: str = "float32", draw: Draw | None = None
    ) -> lz.LazyTensor:
        self._draws[name] = (shape, dtype, draw or normal())
        return self.builder.input(name, shape, dtype)

    def param(
        self, name: str, shape: tuple[int, ...], dtype: str = "float32", draw: Draw | None = None
    ) -> lz.LazyTensor:
        return self.builder.param(self.sample(shape, dtype, draw or normal()), name)

    def sample(self, shape: tuple[int, ...], dtype: str, draw: Draw) -> np.ndarray:
        value = np.asarray(draw(self.rng, shape))
        if np.dtype(dtype).kind == "f":
            # Representable in float32, so the X32 lowering of a float64 input loses nothing.
            value = value.astype(np.float32)
        return value.astype(dtype)

    def rows(self, n: int) -> dict[str, np.ndarray]:
        return {
            name: self.sample((n, *shape), dtype, draw)
            for name, (shape, dtype, draw) in self._draws.items()
        }


Build = Callable[[Trace], Mapping[str, lz.LazyTensor]]


@dataclass(frozen=True)
class Case:
    name: str
    build: Build
    rtol: float = 1e-6
    atol: float = 1e-6
    why: str = field(default="", compare=False)  # why the tolerance is wider than the default


CASES: dict[Op, list[Case]] = {}


def case(op: Op, name: str, **tolerance: Any) -> Callable[[Build], Build]:
    def register(build: Build) -> Build:
        CASES.setdefault(op, []).append(Case(name, build, **tolerance))
        return build

    return register


def unary_cases(op: Op, fn: Callable[[lz.LazyTensor], lz.LazyTensor], **draws: Draw) -> None:
    """One case per dtype (and data) given, each a (B, 2, 3) input through ``fn``."""
    for label, draw in draws.items():
        dtype = label.split("_")[0]

        def build(t: Trace, draw: Draw = draw, dtype: str = dtype) -> dict[str, lz.LazyTensor]:
            return {"y": fn(t.input("x", (2, 3), dtype, draw))}

        case(op, label)(build)


def binary_cases(op: Op, fn: Callable[[Any, Any], lz.LazyTensor], **draws: Draw) -> None:
    """Per dtype: batched ⊙ batched, batched ⊙ broadcast parameter, parameter ⊙ batched."""
    for label, draw in draws.items():
        dtype = label.split("_")[0]

        def build(t: Trace, draw: Draw = draw, dtype: str = dtype) -> dict[str, lz.LazyTensor]:
            x = t.input("x", (2, 3), dtype, draw)
            y = t.input("y", (2, 3), dtype, draw)
            row = t.param("row", (3,), dtype, draw)
            col = t.param("col", (2, 1), dtype, draw)
            return {"xy": fn(x, y), "xrow": fn(x, row), "colx": fn(col, x)}

        case(op, label)(build)


# leaves


@case(Op.INPUT, "float32")
def _(t: Trace):
    return {"y": t.input("x", (3,))}


@case(Op.INPUT, "int64_lowered_to_int32")
def _(t: Trace):
    return {"y": t.input("x", (2, 2), "int64", integers(-1000, 1000))}


@case(Op.INPUT, "float64_lowered_to_float32")
def _(t: Trace):
    return {"y": t.input("x", (3,), "float64")}


@case(Op.PARAM, "float32")
def _(t: Trace):
    return {"y": t.input("x", (3,)) + t.param("p", (3,))}


@case(Op.PARAM, "int32_2d")
def _(t: Trace):
    x = t.input("x", (2, 3), "int32", integers(-100, 100))
    return {"y": x * t.param("p", (2, 3), "int32", integers(-100, 100))}


@case(Op.CONST, "float32_vector")
def _(t: Trace):
    return {"y": t.input("x", (3,)) + lz.const(np.array([1.5, -2.0, 0.25], np.float32))}


@case(Op.CONST, "scalars")
def _(t: Trace):
    x = t.input("x", (3,))
    i = t.input("i", (3,), "int32", integers(-100, 100))
    return {"y": x * 2.5 - 1.0, "j": i + 7, "k": lz.where(x > 0.0, i, -1)}


@case(Op.CONST, "uint32")
def _(t: Trace):
    u = t.input("u", (3,), "uint32", high_uint32())
    return {"y": u ^ lz.const(np.array([0, 2**31, 2**32 - 1], np.uint32))}


# elementwise, one operand

unary_cases(
    Op.NEG,
    lz.LazyTensor.__neg__,
    float32=normal(3.0),
    int32=integers(-1000, 1000),
    uint32=high_uint32(),
)
unary_cases(
    Op.ABS,
    abs,
    float32=choice(-0.0, 0.0, -2.5, 3.0, -np.inf, np.inf),
    int32=integers(-1000, 1000),
    uint32=high_uint32(),
)
unary_cases(Op.EXP, lz.exp, float32=normal(3.0), float32_extremes=choice(-np.inf, -200.0, 100.0))
unary_cases(
    Op.LOG,
    lz.log,
    float32=uniform(1e-3, 1e3),
    float32_zero_negative=choice(0.0, -0.0, -1.0, np.inf, 1.0),
)
unary_cases(
    Op.LOG1P,
    lz.log1p,
    float32=uniform(-0.99, 10.0),
    float32_edges=choice(-1.0, -2.0, np.inf),
)
case(Op.LOG1P, "float32_tiny", atol=0.0)(
    lambda t: {"y": lz.log1p(t.input("x", (4,), draw=normal(1e-6)))}
)  # log1p exists for its relative accuracy near 0: no absolute slack
unary_cases(
    Op.EXPM1,
    lz.expm1,
    float32=normal(3.0),
    float32_extremes=choice(-np.inf, -200.0, 100.0, np.inf, 0.0, -0.0),
)
case(Op.EXPM1, "float32_tiny", atol=0.0)(
    lambda t: {"y": lz.expm1(t.input("x", (4,), draw=normal(1e-6)))}
)  # expm1 exists for its relative accuracy near 0 (np.expm1 of TransformedTargetRegressor)
unary_cases(Op.SQRT, lz.sqrt, float32=uniform(0.0, 100.0), float32_negative=choice(-1.0, 0.0, 4.0))
unary_cases(Op.TANH, lz.tanh, float32=normal(2.0), float32_saturated=choice(-50.0, 50.0, 0.0))
unary_cases(
    Op.SIGMOID,
    lz.sigmoid,
    float32=normal(4.0),
    float32_saturated=choice(-200.0, -30.0, 0.0, 30.0, 200.0, -np.inf, np.inf),
)
unary_cases(Op.ERF, lz.erf, float32=normal(1.5), float32_tails=choice(-6.0, -0.0, 6.0, np.inf))
_NDTRI_ULPS = "XLA's and torch's float32 ndtri are within 4 ulp of the float64 value"
case(Op.NDTRI, "float32", rtol=2e-6, why=_NDTRI_ULPS)(
    lambda t: {"y": lz.ndtri(t.input("x", (2, 3), draw=uniform(0.0, 1.0)))}
)
case(Op.NDTRI, "float32_edges", rtol=2e-6, why=_NDTRI_ULPS)(
    # the poles, the far tails (1e-30 is a normal float32: XLA flushes subnormals to zero),
    # the float32 just below 1, and arguments outside [0, 1]
    lambda t: {
        "y": lz.ndtri(
            t.input(
                "x", (2, 3), draw=choice(0.0, 1.0, 0.5, 1e-30, 1e-7, 1 - 2**-24, -0.5, 1.5, np.nan)
            )
        )
    }
)
unary_cases(
    Op.FLOOR,
    lz.floor,
    float32=normal(5.0),
    float32_integral=choice(-2.0, -1.5, -0.5, -0.0, 0.0, 0.5, 1.0, 2.5),
)
unary_cases(Op.ISNAN, lz.isnan, float32=with_nans(normal()), float64=with_nans(normal()))
unary_cases(
    Op.NOT,
    lz.LazyTensor.__invert__,
    int32=integers(-(2**31), 2**31),
    uint32=high_uint32(),
    bool=bools(),
)

unary_cases(
    Op.CTZ,
    lz.ctz,
    int32=integers(-(2**31), 2**31),
    int32_edges=choice(0, 1, -1, -(2**31), 2**30, 12, -8),
    uint32=high_uint32(),
    uint32_edges=choice(0, 1, 2**31, 2**32 - 1, 2**31 + 2**16, 96),
)

# elementwise, two operands

_INT32 = integers(-1000, 1000)
_SMALL_INT32 = integers(-40, 40)  # products stay far from overflow
binary_cases(
    Op.ADD, lambda a, b: a + b, float32=normal(), int32=_INT32, uint32_wrapping=high_uint32()
)
binary_cases(
    Op.SUB, lambda a, b: a - b, float32=normal(), int32=_INT32, uint32_wrapping=high_uint32()
)
binary_cases(
    Op.MUL, lambda a, b: a * b, float32=normal(), int32=_SMALL_INT32, uint32_wrapping=high_uint32()
)
binary_cases(
    Op.DIV, lambda a, b: a / b, float32=normal(), float32_zeros=choice(-1.0, 0.0, -0.0, 2.0)
)
binary_cases(
    Op.POW,
    lambda a, b: a**b,
    float32=uniform(0.1, 3.0),
    float32_integral_exponents=choice(-2.0, -1.5, 0.0, 1.0, 2.0, 3.0),
)
binary_cases(
    Op.REMAINDER,
    lambda a, b: a % b,
    float32=normal(3.0),
    float32_signed_zeros_and_infinities=choice(-7.5, -2.0, -0.0, 0.0, 0.5, 3.0, np.inf, -np.inf),
)
case(Op.POW, "constant_exponent")(lambda t: {"y": t.input("x", (3,), draw=normal(2.0)) ** 2.0})
binary_cases(
    Op.MAXIMUM,
    lz.maximum,
    float32=normal(),
    float32_nan=with_nans(normal()),
    int32=_INT32,
    uint32=high_uint32(),
)
binary_cases(
    Op.MINIMUM,
    lz.minimum,
    float32=normal(),
    float32_nan=with_nans(normal()),
    int32=_INT32,
    uint32=high_uint32(),
)

_TIES = choice(-1.0, -0.0, 0.0, 0.5, 1.0, np.inf)  # equal values are common, ±0 compare equal
for _op, _fn in [
    (Op.EQ, lambda a, b: a == b),
    (Op.NE, lambda a, b: a != b),
    (Op.LT, lambda a, b: a < b),
    (Op.LE, lambda a, b: a <= b),
    (Op.GT, lambda a, b: a > b),
    (Op.GE, lambda a, b: a >= b),
]:
    binary_cases(
        _op,
        _fn,
        float32=_TIES,
        float32_nan=with_nans(_TIES),
        int32=integers(-3, 3),
        uint32=high_uint32(),
    )
for _op in (Op.EQ, Op.NE):
    binary_cases(
        _op, (lambda a, b: a == b) if _op is Op.EQ else (lambda a, b: a != b), bool=bools()
    )

for _op, _fn in [
    (Op.AND, lambda a, b: a & b),
    (Op.OR, lambda a, b: a | b),
    (Op.XOR, lambda a, b: a ^ b),
]:
    binary_cases(_op, _fn, int32=integers(-(2**31), 2**31), uint32=high_uint32(), bool=bools())

# elementwise, other


@case(Op.WHERE, "float32")
def _(t: Trace):
    c = t.input("c", (2, 3), "bool", bools())
    x, y = t.input("x", (2, 3)), t.input("y", (2, 3))
    p = t.param("p", (3,))
    return {"xy": lz.where(c, x, y), "xp": lz.where(c, x, p), "scalar": lz.where(c, 0.0, y)}


@case(Op.WHERE, "computed_condition_int32")
def _(t: Trace):
    x = t.input("x", (4,))
    i = t.input("i", (4,), "int32", _INT32)
    return {"y": lz.where(x > 0.0, i, -i)}


@case(Op.WHERE, "uint32_and_bool")
def _(t: Trace):
    c = t.input("c", (3,), "bool", bools())
    u, v = t.input("u", (3,), "uint32", high_uint32()), t.input("v", (3,), "uint32", high_uint32())
    a, b = t.input("a", (3,), "bool", bools()), t.input("b", (3,), "bool", bools())
    return {"u": lz.where(c, u, v), "b": lz.where(c, a, b)}


@case(Op.WHERE, "unbatched_condition")
def _(t: Trace):
    c = t.param("c", (3,), "bool", bools())
    return {"y": lz.where(c, t.input("x", (3,)), 1.0)}


def cast_case(source: str, target: str, draw: Draw) -> None:
    case(Op.CAST, f"{source}_to_{target}")(
        lambda t: {"y": lz.cast(t.input("x", (2, 3), source, draw), target)}
    )


cast_case("float32", "int32", normal(1000.0))  # truncates toward zero
cast_case("float32", "uint32", uniform(0.0, 4e9))
cast_case("float32", "bool", choice(-1.5, -0.0, 0.0, 0.25, np.inf))
cast_case("float32", "float64", normal())  # X32: float32 -> float32
cast_case("float64", "float32", normal())
cast_case("int32", "float32", integers(-(2**24), 2**24))
cast_case("int32", "bool", integers(-2, 3))
cast_case("int32", "uint32", integers(0, 2**31))
cast_case("int32", "int64", _INT32)
cast_case("uint32", "int32", integers(0, 2**31))
cast_case("uint32", "float32", integers(0, 2**24))
cast_case("bool", "float32", bools())
cast_case("bool", "int32", bools())
cast_case("bool", "uint32", bools())

# contraction

_MATMUL = {
    "rtol": 1e-5,
    "atol": 1e-5,
    "why": "float32 dot products of a few terms: rounding grows with the inner dimension",
}


@case(Op.MATMUL, "2d_by_param", **_MATMUL)
def _(t: Trace):
    return {"y": t.input("x", (4,)) @ t.param("w", (4, 3))}


@case(Op.MATMUL, "3d_batched_by_param", **_MATMUL)
def _(t: Trace):
    return {"y": t.input("x", (2, 4)) @ t.param("w", (4, 3))}


@case(Op.MATMUL, "3d_batched_by_batched", **_MATMUL)
def _(t: Trace):
    return {"y": lz.matmul(t.input("x", (2, 4)), t.input("y", (4, 3)))}


@case(Op.MATMUL, "3d_batched_by_3d_param", **_MATMUL)
def _(t: Trace):
    return {"y": t.input("x", (2, 4)) @ t.param("w", (1, 4, 3))}


@case(Op.MATMUL, "param_by_3d_batched", **_MATMUL)
def _(t: Trace):
    return {"y": t.param("w", (3, 4)) @ t.input("x", (4, 2))}


@case(Op.MATMUL, "4d_batched", **_MATMUL)
def _(t: Trace):
    return {"y": t.input("x", (2, 3, 5)) @ t.param("w", (2, 5, 4))}


# gathers


@case(Op.TAKE, "unbatched_table_batched_int32_indices")
def _(t: Trace):
    table = t.param("table", (5, 3))
    return {"y": lz.take(table, t.input("i", (2,), "int32", integers(0, 5)), axis=0)}


@case(Op.TAKE, "unbatched_table_batched_int64_indices")
def _(t: Trace):
    table = t.param("table", (5,), "int32", _INT32)
    return {"y": lz.take(table, t.input("i", (4,), "int64", integers(0, 5)))}


@case(Op.TAKE, "batched_data_unbatched_indices_axis1")
def _(t: Trace):
    x = t.input("x", (5, 2))
    return {
        "param": lz.take(x, t.param("i", (3,), "int32", integers(0, 5)), axis=1),
        "const": lz.take(x, lz.const(np.array([[4, 0], [0, 4]], np.int32)), axis=1),
        "scalar": lz.take(x, lz.const(np.int32(2)), axis=1),
    }


@case(Op.TAKE, "batched_data_negative_axis")
def _(t: Trace):
    x = t.input("x", (2, 5))
    return {"y": lz.take(x, t.param("i", (4,), "int64", integers(0, 5)), axis=-1)}


@case(Op.TAKE, "uint32_and_bool_data")
def _(t: Trace):
    u = t.input("u", (5,), "uint32", high_uint32())
    c = t.input("c", (5,), "bool", bools())
    i = t.param("i", (3,), "int32", integers(0, 5))
    return {"u": lz.take(u, i, axis=1), "c": lz.take(c, i, axis=1)}


@case(Op.TAKE_ALONG, "batched_indices")
def _(t: Trace):
    x = t.input("x", (5,))
    return {"y": lz.take_along(x, t.input("i", (3,), "int32", integers(0, 5)), axis=1)}


@case(Op.TAKE_ALONG, "unbatched_indices_broadcast")
def _(t: Trace):
    x = t.input("x", (5,))
    return {"y": lz.take_along(x, t.param("i", (1, 3), "int64", integers(0, 5)), axis=-1)}


@case(Op.TAKE_ALONG, "unbatched_data_batched_indices")
def _(t: Trace):
    table = t.param("table", (1, 5))
    return {"y": lz.take_along(table, t.input("i", (4,), "int32", integers(0, 5)), axis=1)}


@case(Op.TAKE_ALONG, "3d_middle_axis")
def _(t: Trace):
    x = t.input("x", (4, 3))
    return {"y": lz.take_along(x, t.input("i", (2, 3), "int32", integers(0, 4)), axis=1)}


@case(Op.TAKE_ALONG, "uint32_data")
def _(t: Trace):
    u = t.input("u", (5,), "uint32", high_uint32())
    return {"y": lz.take_along(u, t.input("i", (5,), "int32", integers(0, 5)), axis=1)}


def forest_case(name: str, dtype: str, index: str, depth_attr: int) -> None:
    def build(t: Trace) -> dict[str, lz.LazyTensor]:
        x = t.input("x", (6,), dtype, choice(-1.0, 0.0, 0.25, 0.5, 1.0, 2.0, np.nan))
        feature, threshold, nan_right, left, value = forest_tables(t.rng, 5, 4, 6, 2)
        b = t.builder
        tables = [
            b.param(feature.astype(index), "feature"),
            b.param(threshold.astype(dtype), "threshold"),
            b.param(nan_right, "nan_right"),
            b.param(left.astype(index), "left"),
            b.param(value.astype(dtype), "value"),
        ]
        return {"y": lz.forest_sum(x, *tables, trees=5, depth=depth_attr)}

    CASES.setdefault(Op.FOREST_SUM, []).append(Case(name, build, rtol=1e-5, atol=1e-5))


forest_case("float32_int32_tables", "float32", "int32", 4)
forest_case("float64_int64_tables", "float64", "int64", 4)
# Steps beyond every leaf stay there; a depth of 0 sums the roots' values.
forest_case("depth_beyond_the_leaves", "float32", "int64", 9)
forest_case("depth_zero", "float32", "int32", 0)


def forest_shap_case(name: str, dtype: str, tests: int, tolerance: float) -> None:
    """Random leaf tables: 7 leaves of 0 to 4 elements over 3 features, ``tests`` tests each
    on 5 columns (NaN among the values), Gauss-Legendre nodes of each leaf's own degree."""

    def build(t: Trace) -> dict[str, lz.LazyTensor]:
        x = t.input("x", (5,), dtype, choice(-1.0, 0.0, 0.25, 0.5, 1.0, np.nan))
        rng, b = t.rng, t.builder
        count = rng.integers(0, 5, 7)
        elements = int(count.sum())
        q = 2
        nodes, weights = np.full((7, q), 0.5), np.zeros((7, q))
        for leaf, m in enumerate(count):
            n, w = np.polynomial.legendre.leggauss(max(1, -(-int(m) // 2)))
            nodes[leaf, : len(n)], weights[leaf, : len(n)] = (n + 1) / 2, w / 2
        tables = [
            b.param(rng.integers(0, 5, (elements, tests)).astype(np.int32), "column"),
            b.param(rng.choice([-0.5, 0.25, 0.75], (elements, tests)).astype(dtype), "threshold"),
            b.param(rng.random((elements, tests)) < 0.5, "right"),
            b.param(rng.integers(0, 3, elements).astype(np.int32), "player"),
            b.param(rng.uniform(0.05, 1.0, elements), "zero"),
            b.param(np.concatenate([[0], np.cumsum(count)]).astype(np.int32), "offsets"),
            b.param(rng.normal(size=(7, 2)), "value"),
            b.param(nodes, "nodes"),
            b.param(weights, "weights"),
        ]
        return {"y": lz.forest_shap(x, *tables, players=3)}

    case = Case(name, build, rtol=tolerance, atol=tolerance)
    CASES.setdefault(Op.FOREST_SHAP, []).append(case)


# Under the x32 policy the float64 output is compared in float32.
forest_shap_case("float32_one_test", "float32", 1, 1e-6)
forest_shap_case("float64_three_tests", "float64", 3, 1e-6)


def couple_case(name: str, dtype: str, classes: int, draw: Draw) -> None:
    def build(t: Trace) -> dict[str, lz.LazyTensor]:
        r = t.input("r", (classes * (classes - 1) // 2,), dtype, draw)
        return {"p": lz.couple(r, classes=classes)}

    CASES.setdefault(Op.COUPLE, []).append(Case(name, build))


couple_case("float32_two_classes", "float32", 2, uniform(1e-7, 1.0 - 1e-7))
couple_case("float64_four_classes", "float64", 4, uniform(1e-7, 1.0 - 1e-7))
# Clipped extremes and ties: rows that stop at once next to rows that take many sweeps.
couple_case("float32_extremes", "float32", 3, choice(1e-7, 1.0 - 1e-7, 0.5, 0.01, 0.99))


# reductions


def reduction_cases(op: Op, fn: Callable[..., lz.LazyTensor], **draws: Draw) -> None:
    """Per dtype: one axis, several axes with and without keepdims, a negative axis, no axes."""
    for label, draw in draws.items():
        dtype = label.split("_")[0]

        def build(t: Trace, draw: Draw = draw, dtype: str = dtype) -> dict[str, lz.LazyTensor]:
            x = t.input("x", (3, 4), dtype, draw)
            x3 = t.input("x3", (2, 3, 4), dtype, draw)
            return {
                "last": fn(x, 1),
                "keep": fn(x, 1, keepdims=True),
                "two_axes": fn(x3, (1, 2)),
                "two_axes_keep": fn(x3, (2, 1), keepdims=True),
                "middle_negative": fn(x3, -2),
                "no_axes": fn(x3, ()),
            }

        case(op, label)(build)


reduction_cases(
    Op.SUM,
    lz.sum,
    float32=normal(),
    int32=_INT32,
    uint32_wrapping=high_uint32(),
)
reduction_cases(
    Op.MAX,
    lz.max,
    float32=normal(),
    float32_nan=with_nans(normal(), 0.1),
    int32=_INT32,
    uint32=high_uint32(),
)
reduction_cases(
    Op.MIN,
    lz.min,
    float32=normal(),
    float32_nan=with_nans(normal(), 0.1),
    int32=_INT32,
    uint32=high_uint32(),
)
reduction_cases(
    Op.REDUCE_AND,
    lz.reduce_and,
    int32=integers(-(2**31), 2**31),
    uint32=high_uint32(),
    uint32_mostly_ones=choice(2**32 - 1, 2**32 - 1, 2**32 - 2, 2**31 - 1, 2**32 - 2**16),
    bool=choice(True, True, True, False),
)
reduction_cases(
    Op.LOGSUMEXP,
    lz.logsumexp,
    float32=normal(3.0),
    float32_infinities=choice(-np.inf, -np.inf, -np.inf, 0.0, 80.0),
)


def argmax_case(name: str, dtype: str, draw: Draw) -> None:
    def build(t: Trace) -> dict[str, lz.LazyTensor]:
        x = t.input("x", (5,), dtype, draw)
        x3 = t.input("x3", (3, 4), dtype, draw)
        return {"last": lz.argmax(x), "middle": lz.argmax(x3, 1), "negative": lz.argmax(x3, -1)}

    case(Op.ARGMAX, name)(build)


argmax_case("float32", "float32", normal())
argmax_case("float32_ties", "float32", choice(-np.inf, 0.0, 1.0))  # the first maximum wins
argmax_case("float32_nan", "float32", with_nans(normal(), 0.2))  # NaN is the maximum
argmax_case("int32_ties", "int32", integers(-2, 2))
argmax_case("uint32", "uint32", high_uint32())


@case(Op.SOFTMAX, "float32")
def _(t: Trace):
    x, x3 = t.input("x", (5,), draw=normal(3.0)), t.input("x3", (3, 4), draw=normal(3.0))
    return {"last": lz.softmax(x), "middle": lz.softmax(x3, 1), "negative": lz.softmax(x3, -1)}


@case(Op.SOFTMAX, "float32_large_and_masked")
def _(t: Trace):
    x = t.input("x", (4,), draw=choice(-np.inf, -50.0, 0.0, 80.0))
    return {"y": lz.softmax(lz.concat([x, lz.broadcast_to(lz.const(np.float32(1.0)), (B, 1))]))}


# layout


@case(Op.CONCAT, "float32_axis1")
def _(t: Trace):
    return {"y": lz.concat([t.input("a", (2,)), t.input("b", (3,))], axis=1)}


@case(Op.CONCAT, "three_3d_last_axis_with_parameter")
def _(t: Trace):
    a, b = t.input("a", (2, 1)), t.input("b", (2, 3))
    p = lz.broadcast_to(t.param("p", (2, 2)), (B, 2, 2))
    return {"y": lz.concat([a, b, p], axis=-1), "middle": lz.concat([a, a], axis=1)}


@case(Op.CONCAT, "int32_uint32_bool")
def _(t: Trace):
    i, j = t.input("i", (2,), "int32", _INT32), t.input("j", (1,), "int32", _INT32)
    u = t.input("u", (2,), "uint32", high_uint32())
    c = t.input("c", (2,), "bool", bools())
    return {"i": lz.concat([i, j]), "u": lz.concat([u, u]), "c": lz.concat([c, c])}


@case(Op.SLICE, "step")
def _(t: Trace):
    x = t.input("x", (9,))
    return {"step2": lz.slice_axis(x, 1, 1, 8, 2), "step3": lz.slice_axis(x, -1, 0, 9, 3)}


@case(Op.SLICE, "indexing")
def _(t: Trace):
    x = t.input("x", (3, 6), "int32", _INT32)
    return {"cols": x[:, 1, ::2], "rows": x[:, -2:], "ellipsis": x[..., 1:5]}


@case(Op.SLICE, "out_of_range_bounds")
def _(t: Trace):
    # Bounds follow Python's slice(start, stop, step) on the axis: clamped, negatives from the end.
    x = t.input("x", (6,))
    return {
        "stop_past_end": lz.slice_axis(x, 1, 2, 100),
        "start_before_begin": lz.slice_axis(x, 1, -100, 4, 2),
        "negative_both": lz.slice_axis(x, 1, -4, -1),
        "empty": lz.slice_axis(x, 1, 4, 2),
    }


@case(Op.RESHAPE, "merge_split_expand")
def _(t: Trace):
    x = t.input("x", (2, 3))
    return {
        "merge": lz.reshape(x, (B, 6)),
        "split": lz.reshape(lz.reshape(x, (B, 6)), (B, 3, 2)),
        "expand": lz.expand_dims(x, 1),
    }


@case(Op.RESHAPE, "uint32")
def _(t: Trace):
    return {"y": t.input("u", (2, 3), "uint32", high_uint32()).reshape(B, 3, 1, 2)}


@case(Op.BROADCAST, "unbatched_param_to_batch")
def _(t: Trace):
    t.input("x", (3,))  # the batch size comes from the graph's input
    return {
        "vector": lz.broadcast_to(t.param("p", (3,)), (B, 3)),
        "ranked_up": lz.broadcast_to(t.param("q", (2, 1)), (B, 2, 3)),
        "int32": lz.broadcast_to(t.param("i", (1, 2), "int32", _INT32), (B, 2)),
    }


@case(Op.BROADCAST, "batched_size_one_axis")
def _(t: Trace):
    x = t.input("x", (1, 3))
    return {"y": lz.broadcast_to(x, (B, 4, 3)), "same": lz.broadcast_to(x, (B, 1, 3))}


@case(Op.TRANSPOSE, "keeping_axis0")
def _(t: Trace):
    x = t.input("x", (2, 3, 4))
    return {"swap": lz.transpose(x, (0, 2, 1, 3)), "rotate": x.transpose(0, 3, 1, 2)}


@case(Op.TRANSPOSE, "int32_and_bool")
def _(t: Trace):
    i = t.input("i", (2, 3), "int32", _INT32)
    c = t.input("c", (2, 3), "bool", bools())
    return {"i": lz.transpose(i, (0, 2, 1)), "c": lz.transpose(c, (0, 2, 1))}


# updates


@case(Op.UPDATE, "batched_column_and_unbatched_row")
def _(t: Trace):
    x = t.input("x", (4, 3))
    table = t.param("table", (3, 2), "int32", _INT32)
    return {
        "column": lz.update(x, lz.const(np.int32(2)), x[:, 0, :] * 2.0, axis=1),
        "last_axis": lz.update(x, lz.const(np.int64(0)), x[:, :, 1], axis=-1),
        # outputs are batched: the updated table joins a batched value
        "row": lz.update(table, lz.const(np.int32(1)), table[0] + 1, axis=0)
        + lz.cast(x[:, :3, :2], "int32"),
    }


@case(Op.UPDATE, "filled_by_a_loop_uint32")
def _(t: Trace):
    # A loop writing one column per iteration, as the tree strategies collect per-tree results.
    u = t.input("u", (5,), "uint32", high_uint32())

    def body(i, acc, u):
        return lz.update(acc, i, lz.take(u, 4 - i, axis=1) ^ acc[:, 0], axis=1)

    # (and one outside the loop, where the parity check can see it)
    return {
        "y": lz.fori_loop(5, body, u, u),
        "outside": lz.update(u, lz.const(np.int32(0)), u[:, 3], 1),
    }


@case(Op.LOOP, "filling_its_carry_column_by_column")
def _(t: Trace):
    # A loop whose carry only ever has its trip's column replaced (the tree strategies' exit
    # leaves), over an init holding values of its own: the JAX lowering carries it transposed.
    u = t.input("u", (5,), "uint32", high_uint32())
    x = t.input("x", (3,))

    def leaves(i, acc, u):
        return lz.update(acc, i, lz.take(u, 4 - i, axis=1) * np.uint32(3), axis=1)

    def last(i, acc, x):  # axis -1, fewer trips than columns: the last column keeps its init
        return lz.update(acc, i, lz.take(x, i, axis=1) * 2.0 + 1.0, axis=-1)

    return {"u": lz.fori_loop(5, leaves, u, u), "x": lz.fori_loop(2, last, x, x)}


# control flow


@case(Op.LOOP, "newton_sqrt_with_param_invariant")
def _(t: Trace):
    a = t.input("a", (2, 3), draw=uniform(0.05, 50.0))
    scale = t.param("scale", (3,), draw=uniform(0.5, 2.0))

    def newton(i, y, a, scale):
        return 0.5 * (y + a * scale / y)

    return {"sqrt": lz.fori_loop(12, newton, a * 0.0 + 4.0, a, scale)}


@case(Op.LOOP, "recurrence_reading_the_index", rtol=1e-5, why="12 float32 roundings accumulate")
def _(t: Trace):
    x = t.input("x", (4,))
    codes = t.input("codes", (4,), "int32", _INT32)

    def decay(i, carry, x):
        return carry * 0.75 + x * lz.cast(i, "float32")

    def count(i, acc, codes):
        return acc + codes * (i + 1)

    return {"float": lz.fori_loop(12, decay, x, x), "int32": lz.fori_loop(5, count, codes, codes)}


@case(Op.LOOP, "nested_and_zero_trips")
def _(t: Trace):
    x = t.input("x", (3,), draw=uniform(-1.0, 1.0))

    def outer(i, carry, x):
        inner = lz.fori_loop(3, lambda j, c, x: c * x + lz.cast(j, "float32"), carry, x)
        return inner * 0.5 + lz.cast(i, "float32")

    return {"nested": lz.fori_loop(4, outer, x, x), "zero_trips": lz.fori_loop(0, outer, x, x)}


@case(Op.LOOP, "stop_column_rows_converge_at_different_trips", rtol=1e-5, why="Newton steps")
def _(t: Trace):
    # The interpreter runs every trip; backends may end once all rows of a call have stopped
    # (a one-row bucket stops at its row's own trip): each row must come out the same.
    a = t.input("a", (1,), draw=uniform(0.05, 5000.0))

    def newton(i, carry, a):
        y = carry[:, 0:1]
        nxt = 0.5 * (y + a / y)
        done = lz.cast(abs(nxt * nxt - a) < 1e-3 * a, "float32")
        return lz.concat([nxt, done], axis=1)

    start = lz.concat([a * 0.0 + 4.0, a * 0.0], axis=1)
    return {"sqrt": lz.fori_loop(12, newton, start, a, stop_column=1)}


@case(Op.VARIANT, "two_formulations_of_one_value")
def _(t: Trace):
    x = t.input("x", (4,), draw=normal())
    w = t.param("w", (4, 3), "float32", normal())
    # Devices take the product; the host (numpy) the sum of broadcast terms: equal up to rounding.
    host = lz.sum(lz.reshape(x, (B, 4, 1)) * w, axis=1)
    return {"y": lz.variant(x @ w, host)}


# --- the tests -------------------------------------------------------------------------------


def _parity_params() -> list[Any]:
    params = []
    for op in Op:
        cases = CASES.get(op, [])
        if not cases:
            params.append(pytest.param(op, None, None, id=f"{op.name}-missing-case"))
        for c in cases:
            for backend in ("numpy",) if op in lz.HOST_ONLY else BACKENDS:
                params.append(pytest.param(op, c, backend, id=f"{op.name}-{c.name}-{backend}"))
    return params


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "numpy"])
@pytest.mark.parametrize("op", sorted(lz.HOST_ONLY, key=lambda op: op.name))
def test_device_backends_refuse_host_only_ops_by_name(op: Op, backend: str) -> None:
    t = Trace(_seed(op, CASES[op][0]))
    graph = t.builder.graph(dict(CASES[op][0].build(t)))
    with pytest.raises(lz.BackendError, match=f"{backend} backend has no lowering for {op.name}"):
        lz.compile(graph, lz.Options(backend=backend, max_batch=MAX_BATCH), warmup=False)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "numpy"])
def test_device_backends_refuse_host_only_ops_inside_loop_bodies(backend: str) -> None:
    b = lz.Builder()
    r = b.input("r", (1,), "float32")
    out = lz.fori_loop(2, lambda i, carry: lz.couple(carry, classes=2)[:, :1], r)
    graph = b.graph({"p": out})
    with pytest.raises(lz.BackendError, match=f"{backend} backend has no lowering for COUPLE"):
        lz.compile(graph, lz.Options(backend=backend, max_batch=MAX_BATCH), warmup=False)


def test_every_op_has_a_parity_case() -> None:
    missing = [op.name for op in Op if not CASES.get(op)]
    assert not missing, f"ops without a parity case in CASES: {missing}"
    names = {op: [c.name for c in cs] for op, cs in CASES.items()}
    assert all(len(set(n)) == len(n) for n in names.values()), names


def _seed(op: Op, c: Case) -> int:
    return zlib.crc32(f"{op.name}/{c.name}".encode())


@pytest.mark.parametrize(("op", "c", "backend"), _parity_params())
def test_backend_matches_interpreter(op: Op, c: Case | None, backend: str) -> None:
    assert c is not None, f"{op.name} has no parity case: add one to CASES in {__file__}"
    t = Trace(_seed(op, c))
    graph = t.builder.graph(dict(c.build(t)))
    compiled = lz.compile(
        graph,
        lz.Options(backend=backend, max_batch=MAX_BATCH),
        cache=lz.ExecutableCache(),
        warmup=False,  # compile only the buckets the rows below use
    )
    (stage,) = compiled.graphs
    lowered = {n.op for n in stage.graph.order}
    if op is Op.VARIANT:  # resolved before lowering: each backend compiles its own formulation
        assert op not in lowered and op in {n.op for n in graph.order}
    else:
        assert op in lowered, f"the passes removed {op.name} from the case: it tests nothing"

    for rows in EVERY_BUCKET_ROWS if op in BATCH_SIZED else ROWS:
        inputs = t.rows(rows)
        expected = lz.evaluate(graph, inputs)
        got = compiled(inputs)
        assert set(got) == set(expected)
        for (name, node), want in zip(graph.outputs, expected.values(), strict=True):
            out = got[name]
            what = f"{op.name}/{c.name} output {name!r} on {backend}, {rows} rows"
            assert out.dtype == np.dtype(lz.DTypePolicy.X32.lower(node.dtype)), what
            assert out.shape == want.shape, what
            if out.dtype.kind == "f":
                # The oracle's float64 value rounded to the output's dtype: overflow to ±inf and
                # underflow to 0 are what a float32 result must show.
                with np.errstate(over="ignore"):
                    rounded = want.astype(out.dtype)
                np.testing.assert_allclose(
                    out,
                    rounded,
                    rtol=c.rtol,
                    atol=c.atol,
                    equal_nan=True,
                    err_msg=what,
                )
            else:
                np.testing.assert_array_equal(out, want, err_msg=what, strict=False)


def test_torch_x64_keeps_64_bit_integers_exact() -> None:
    """Under the X64 policy torch computes int64 and uint64 as declared, including uint64 values
    of 2**63 and above, which torch can only order and add through signed stand-ins."""
    rng = np.random.default_rng(64)
    b = lz.Builder()
    u, v = b.input("u", (4,), "uint64"), b.input("v", (4,), "uint64")
    i, j = b.input("i", (4,), "int64"), b.input("j", (4,), "int64")
    c = b.input("c", (4,), "bool")
    idx = b.input("idx", (4,), "int64")
    outputs = {
        "add": u + v,
        "sub": u - v,
        "mul": u * v,
        "neg": -u,
        "abs": abs(u),
        "not": ~u,
        "and": u & v,
        "or": u | v,
        "xor": u ^ v,
        "maximum": lz.maximum(u, v),
        "minimum": lz.minimum(u, v),
        "lt": u < v,
        "le": u <= v,
        "gt": u > v,
        "ge": u >= v,
        "eq": u == v,
        "where": lz.where(c, u, v),
        "sum": lz.sum(u, 1, keepdims=True),
        "max": lz.max(u, 1, keepdims=True),
        "min": lz.min(u, 1, keepdims=True),
        "argmax": lz.argmax(u),
        "take": lz.take(u, lz.const(np.array([3, 0], np.int64)), axis=1),
        "take_along": lz.take_along(u, idx, axis=1),
        "to_float": lz.cast(u, "float64"),
        "i_add": i + j,
        "i_mul": i * j,
        "i_max": lz.max(i, 1, keepdims=True),
        "i_sum": lz.sum(i, 1, keepdims=True),
        "i_argmax": lz.argmax(i),
    }
    graph = b.graph(outputs)
    compiled = lz.compile(
        graph,
        lz.Options(backend="torch", max_batch=MAX_BATCH, dtype_policy=lz.DTypePolicy.X64),
        cache=lz.ExecutableCache(),
    )
    for rows in ROWS:
        inputs = {
            "u": rng.integers(0, 2**64, (rows, 4), dtype=np.uint64),  # half of them >= 2**63
            "v": rng.integers(0, 2**64, (rows, 4), dtype=np.uint64),
            "i": rng.integers(-(2**40), 2**40, (rows, 4)),
            "j": rng.integers(-(2**20), 2**20, (rows, 4)),
            "c": rng.random((rows, 4)) < 0.5,
            "idx": rng.integers(0, 4, (rows, 4)),
        }
        expected = lz.evaluate(graph, inputs)
        got = compiled(inputs)
        for name, node in graph.outputs:
            assert got[name].dtype == np.dtype(node.dtype), name
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
