"""The op set of the IR: one enum, one table of specs.

Each :class:`OpSpec` says how many operands an op takes, which attributes it carries, and how the
result's shape and dtype follow from its operands (raising :class:`ShapeError` or
:class:`RowMixingError` for what the op does not accept). The same rule runs when a node is built
and when :func:`lazy.verify.verify` re-checks a whole graph, so the two can never disagree.

The one control-flow op is LOOP: a fixed number of iterations of a closed body sub-graph (see
:mod:`lazy.loop`). VARIANT holds two formulations of one value, for devices and for the host; the
executor keeps one of them per backend before lowering (:func:`lazy.passes.specialize`). The batch
dimension stays on axis 0 of every batched value.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import dtypes as dt
from .errors import GraphError, RowMixingError, ShapeError
from .shapes import B, Shape, broadcast, is_batched, normalize, normalize_axis, static_size


class Op(enum.Enum):
    # leaves
    INPUT = "input"
    PARAM = "param"
    CONST = "const"
    # elementwise, one operand
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    LOG = "log"
    LOG1P = "log1p"
    EXPM1 = "expm1"
    SQRT = "sqrt"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    ERF = "erf"
    NDTRI = "ndtri"  # the standard normal quantile function (inverse CDF)
    FLOOR = "floor"
    ISNAN = "isnan"
    NOT = "not"
    CTZ = "ctz"
    # elementwise, two operands
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    REMAINDER = "remainder"  # numpy's float ``%``: an exact fmod, signed as the divisor
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    AND = "and"
    OR = "or"
    XOR = "xor"
    # elementwise, other
    WHERE = "where"
    CAST = "cast"
    # contraction and gathers
    MATMUL = "matmul"
    TAKE = "take"
    TAKE_ALONG = "take_along"
    UPDATE = "update"  # one index along an axis replaced (a dynamic update slice)
    FOREST_SUM = "forest_sum"  # the sum of the leaves a walk of node tables reaches (trees)
    COUPLE = "couple"  # class probabilities from pairwise ones, as libsvm couples them
    FOREST_SHAP = "forest_shap"  # per-feature TreeSHAP contributions, leaf by leaf (trees)
    # reductions over non-batch axes
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    REDUCE_AND = "reduce_and"
    ARGMAX = "argmax"
    LOGSUMEXP = "logsumexp"
    SOFTMAX = "softmax"
    # layout
    CONCAT = "concat"
    SLICE = "slice"
    RESHAPE = "reshape"
    BROADCAST = "broadcast"
    TRANSPOSE = "transpose"
    # control flow
    LOOP = "loop"
    # Two formulations of one value, for devices and for the host (see VARIANT_OPERANDS).
    VARIANT = "variant"


#: The VARIANT operand each target runs (see :func:`lazy.variant`): stated once, here.
VARIANT_OPERANDS = {"device": 0, "host": 1}


class TensorType(NamedTuple):
    shape: Shape
    dtype: str


class ConstValue:
    """An immutable array baked into a graph; equal and hashed by dtype, shape and bytes."""

    __slots__ = ("_key", "array")

    def __init__(self, value: Any) -> None:
        array = np.array(value, copy=True)
        array = array.astype(dt.canonical(array.dtype), copy=False)
        array.flags.writeable = False
        self.array = array
        self._key = (array.dtype.name, array.shape, array.tobytes())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConstValue) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        if self.array.size <= 8:
            return f"const({self.array.tolist()!r}, {self.array.dtype.name})"
        return f"const(<{self.array.dtype.name}{list(self.array.shape)}>)"


class GraphAttr(abc.ABC):
    """An attribute value that is itself a closed sub-graph (a LOOP body).

    Immutable; equal and hashed by its digest. The graph digest nests its :meth:`document`.
    """

    __slots__ = ()

    @abc.abstractmethod
    def document(self) -> Any:
        """The canonical JSON-able serialization of the sub-graph (see :mod:`lazy.digest`)."""


Attrs = Mapping[str, Any]
InferRule = Callable[[Sequence[TensorType], Attrs], TensorType]


@dataclass(frozen=True)
class OpSpec:
    op: Op
    arity: int | None  # None: variadic (at least one operand)
    attrs: tuple[str, ...]
    infer: InferRule
    kind: str

    def check_arity(self, n: int) -> None:
        if self.arity is None and n < 1:
            raise ShapeError(f"{self.op.name} takes at least one operand")
        if self.arity is not None and n != self.arity:
            raise ShapeError(f"{self.op.name} takes {self.arity} operand(s), got {n}")


# --- dtype checks -------------------------------------------------------------------------------


def _require(op: Op, dtype: str, allowed: frozenset[str], what: str) -> None:
    if dtype not in allowed:
        raise ShapeError(f"{op.name} needs {what} operands, got {dtype}")


def _same_dtype(op: Op, types: Sequence[TensorType]) -> str:
    kinds = {t.dtype for t in types}
    if len(kinds) != 1:
        raise ShapeError(
            f"{op.name} needs operands of one dtype, got {[t.dtype for t in types]}; "
            "insert an explicit cast"
        )
    return kinds.pop()


# --- rules --------------------------------------------------------------------------------------


def _leaf(_: Sequence[TensorType], attrs: Attrs) -> TensorType:
    return TensorType(normalize(attrs["shape"]), dt.canonical(attrs["dtype"]))


def _param(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    result = _leaf(types, attrs)
    if is_batched(result.shape):
        raise ShapeError(f"parameter {attrs['name']!r} cannot have a batch dimension")
    return result


def _const(_: Sequence[TensorType], attrs: Attrs) -> TensorType:
    array = attrs["value"].array
    return TensorType(tuple(array.shape), array.dtype.name)


def _unary(allowed: frozenset[str], what: str, result: str | None = None) -> Callable[..., Any]:
    def rule(op: Op) -> InferRule:
        def infer(types: Sequence[TensorType], _: Attrs) -> TensorType:
            (x,) = types
            _require(op, x.dtype, allowed, what)
            return TensorType(x.shape, result or x.dtype)

        return infer

    return rule


def _binary(allowed: frozenset[str], what: str, result: str | None = None) -> Callable[..., Any]:
    def rule(op: Op) -> InferRule:
        def infer(types: Sequence[TensorType], _: Attrs) -> TensorType:
            dtype = _same_dtype(op, types)
            _require(op, dtype, allowed, what)
            return TensorType(broadcast(*(t.shape for t in types)), result or dtype)

        return infer

    return rule


_ANY = frozenset(dt.SUPPORTED)
_LOGICAL = dt.INTS | {"bool"}
_float_unary = _unary(dt.FLOATS, "floating-point")
_numeric_unary = _unary(dt.NUMERIC, "numeric")
_numeric_binary = _binary(dt.NUMERIC, "numeric")
_float_binary = _binary(dt.FLOATS, "floating-point")
_compare = _binary(dt.NUMERIC, "numeric", result="bool")
_equality = _binary(_ANY, "any", result="bool")
_logical = _binary(_LOGICAL, "boolean or integer")


def _where(types: Sequence[TensorType], _: Attrs) -> TensorType:
    cond, a, b = types
    if cond.dtype != "bool":
        raise ShapeError(f"WHERE needs a bool condition, got {cond.dtype}")
    dtype = _same_dtype(Op.WHERE, (a, b))
    return TensorType(broadcast(cond.shape, a.shape, b.shape), dtype)


def _cast(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    (x,) = types
    return TensorType(x.shape, dt.canonical(attrs["dtype"]))


def _matmul(types: Sequence[TensorType], _: Attrs) -> TensorType:
    a, b = types
    dtype = _same_dtype(Op.MATMUL, types)
    _require(Op.MATMUL, dtype, dt.FLOATS, "floating-point")
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError(f"MATMUL needs operands of rank >= 2, got {a.shape} @ {b.shape}")
    (n, k), (k2, m) = a.shape[-2:], b.shape[-2:]
    if k2 is B or m is B:
        raise RowMixingError(f"MATMUL {a.shape} @ {b.shape} contracts over the batch dimension")
    if k != k2:
        raise ShapeError(f"MATMUL inner dimensions differ: {a.shape} @ {b.shape}")
    lead = broadcast(a.shape[:-2], b.shape[:-2]) if (a.shape[:-2] or b.shape[:-2]) else ()
    if n is B and lead:
        raise ShapeError(f"MATMUL {a.shape} @ {b.shape} would move the batch dimension off axis 0")
    return TensorType((*lead, n, m), dtype)


def _take(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    data, idx = types
    _require(Op.TAKE, idx.dtype, dt.INDEX, "int32/int64 index")
    axis = normalize_axis(attrs["axis"], len(data.shape))
    if is_batched(data.shape) and axis == 0:
        raise RowMixingError("TAKE along axis 0 of a batched tensor gathers across rows")
    if is_batched(data.shape) and is_batched(idx.shape):
        raise ShapeError("TAKE with batched data and batched indices: use TAKE_ALONG")
    if is_batched(idx.shape) and axis != 0:
        raise ShapeError("TAKE with batched indices must index axis 0 of an unbatched table")
    return TensorType((*data.shape[:axis], *idx.shape, *data.shape[axis + 1 :]), data.dtype)


def _take_along(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    data, idx = types
    _require(Op.TAKE_ALONG, idx.dtype, dt.INDEX, "int32/int64 index")
    if len(data.shape) != len(idx.shape):
        raise ShapeError(f"TAKE_ALONG needs equal ranks, got {data.shape} and {idx.shape}")
    axis = normalize_axis(attrs["axis"], len(data.shape))
    if is_batched(data.shape) and axis == 0:
        raise RowMixingError("TAKE_ALONG axis 0 of a batched tensor gathers across rows")
    others = broadcast(
        tuple(1 if i == axis else d for i, d in enumerate(data.shape)),
        tuple(1 if i == axis else d for i, d in enumerate(idx.shape)),
    )
    shape = tuple(idx.shape[axis] if i == axis else d for i, d in enumerate(others))
    return TensorType(shape, data.dtype)


def _update(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    x, idx, value = types
    _require(Op.UPDATE, idx.dtype, dt.INDEX, "int32/int64 index")
    if idx.shape != ():
        raise ShapeError(f"UPDATE needs a scalar index, got shape {idx.shape}")
    axis = normalize_axis(attrs["axis"], len(x.shape))
    if is_batched(x.shape) and axis == 0:
        raise RowMixingError("UPDATE along axis 0 of a batched tensor writes across rows")
    want = tuple(d for i, d in enumerate(x.shape) if i != axis)
    if value.shape != want:
        raise ShapeError(
            f"UPDATE of {x.shape} at one index of axis {axis} needs a value of shape {want}, "
            f"got {value.shape}"
        )
    _same_dtype(Op.UPDATE, (x, value))
    return x


def _axes(attrs: Attrs, x: TensorType, op: Op) -> tuple[int, ...]:
    axes = tuple(sorted({normalize_axis(a, len(x.shape)) for a in attrs["axes"]}))
    if is_batched(x.shape) and 0 in axes:
        raise RowMixingError(f"{op.name} over axis 0 of a batched tensor combines rows")
    return axes


def _reduction(allowed: frozenset[str], what: str) -> Callable[[Op], InferRule]:
    def rule(op: Op) -> InferRule:
        def infer(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
            (x,) = types
            _require(op, x.dtype, allowed, what)
            axes = _axes(attrs, x, op)
            if attrs["keepdims"]:
                shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
            else:
                shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
            return TensorType(shape, x.dtype)

        return infer

    return rule


def _one_axis(x: TensorType, attrs: Attrs, op: Op) -> int:
    axis = normalize_axis(attrs["axis"], len(x.shape))
    if is_batched(x.shape) and axis == 0:
        raise RowMixingError(f"{op.name} over axis 0 of a batched tensor combines rows")
    return axis


def _argmax(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    (x,) = types
    _require(Op.ARGMAX, x.dtype, dt.NUMERIC, "numeric")
    axis = _one_axis(x, attrs, Op.ARGMAX)
    return TensorType(tuple(d for i, d in enumerate(x.shape) if i != axis), "int32")


def _softmax(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    (x,) = types
    _require(Op.SOFTMAX, x.dtype, dt.FLOATS, "floating-point")
    _one_axis(x, attrs, Op.SOFTMAX)
    return x


def _concat(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    dtype = _same_dtype(Op.CONCAT, types)
    first = types[0].shape
    axis = normalize_axis(attrs["axis"], len(first))
    for t in types:
        if len(t.shape) != len(first) or any(
            i != axis and d != first[i] for i, d in enumerate(t.shape)
        ):
            raise ShapeError(
                f"CONCAT along axis {axis} of mismatched shapes {[t.shape for t in types]}"
            )
    if axis == 0 and any(is_batched(t.shape) for t in types):
        raise RowMixingError("CONCAT along axis 0 of batched tensors combines rows")
    return TensorType(
        tuple(sum(t.shape[axis] for t in types) if i == axis else d for i, d in enumerate(first)),
        dtype,
    )


def _slice(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    (x,) = types
    axis = normalize_axis(attrs["axis"], len(x.shape))
    if is_batched(x.shape) and axis == 0:
        raise RowMixingError("SLICE along axis 0 of a batched tensor selects rows")
    start, stop, step = attrs["start"], attrs["stop"], attrs["step"]
    if step < 1:
        raise ShapeError(f"SLICE needs a positive step, got {step}")
    size = len(range(*slice(start, stop, step).indices(x.shape[axis])))
    return TensorType(tuple(size if i == axis else d for i, d in enumerate(x.shape)), x.dtype)


def _reshape(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    (x,) = types
    shape = normalize(attrs["shape"])
    if is_batched(x.shape) != is_batched(shape):
        raise RowMixingError(
            f"RESHAPE {x.shape} -> {shape} must keep the batch dimension on axis 0"
        )
    if static_size(x.shape) != static_size(shape):
        raise ShapeError(f"RESHAPE {x.shape} -> {shape} changes the number of elements")
    return TensorType(shape, x.dtype)


def _broadcast(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    (x,) = types
    shape = normalize(attrs["shape"])
    if is_batched(x.shape) and len(x.shape) != len(shape):
        raise ShapeError(f"BROADCAST of batched {x.shape} to {shape} must keep its rank")
    if len(x.shape) > len(shape) or broadcast(x.shape, shape) != shape:
        raise ShapeError(f"cannot BROADCAST {x.shape} to {shape}")
    return TensorType(shape, x.dtype)


def _transpose(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    (x,) = types
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(len(x.shape))):
        raise ShapeError(f"TRANSPOSE perm {perm} is not a permutation of rank {len(x.shape)}")
    if is_batched(x.shape) and perm[0] != 0:
        raise RowMixingError(f"TRANSPOSE {perm} moves the batch dimension off axis 0")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def recheck(order: Sequence[Any]) -> None:
    """Re-derive every node's type from its operands with its spec; raise if one differs.

    ``order`` lists nodes operands first. Row mixing raises :class:`RowMixingError`, types that a
    node declares but its operands do not give raise :class:`GraphError`.
    """
    for node in order:
        spec = SPECS[node.op]
        try:
            spec.check_arity(len(node.inputs))
            inferred = spec.infer([i.type for i in node.inputs], dict(node.attrs))
        except ShapeError as exc:
            raise type(exc)(f"{node!r}: {exc}") from None
        if inferred != node.type:
            raise GraphError(f"{node!r} declares {node.type} but its operands give {inferred}")


def check_stop_column(carry: TensorType, column: Any) -> None:
    """``column`` names a column of ``carry``, a batched (B, k) matrix."""
    if isinstance(column, bool) or not isinstance(column, int):
        raise ShapeError(f"LOOP stop_column must be an int or None, got {column!r}")
    if len(carry.shape) != 2 or not is_batched(carry.shape) or not 0 <= column < carry.shape[1]:
        raise ShapeError(
            f"LOOP stop_column {column} needs a (B, k) carry with k > {column}, got "
            f"{carry.dtype}{list(carry.shape)}"
        )


def _check_stop_column(body: Any, column: Any) -> None:
    """A LOOP may stop early once every row's carry has a nonzero ``stop_column`` (a flag the
    body sets): only sound if a flagged row's carry never changes again, so the body's output
    must be ``where(carry[:, c:c+1] != 0, carry, next)``, as ``fori_loop(stop_column=c)`` builds
    it. Then each row's result is its own, however many trips the loop makes."""
    if column is None:
        return
    carry = body.inputs[1]
    check_stop_column(carry.type, column)
    out = body.output
    flag = out.inputs[0] if out.op is Op.WHERE else None
    column_read = flag.inputs[0] if flag is not None and flag.op is Op.NE else None
    zero = flag.inputs[1] if column_read is not None else None
    if not (
        out.op is Op.WHERE
        and out.inputs[1] is carry
        and column_read is not None
        and column_read.op is Op.SLICE
        and column_read.inputs[0] is carry
        and normalize_axis(column_read.attr("axis"), 2) == 1
        and (column_read.attr("start"), column_read.attr("stop")) == (column, column + 1)
        and column_read.attr("step") == 1
        and zero is not None
        and zero.op is Op.CONST
        and not np.any(zero.attr("value").array)
    ):
        raise ShapeError(
            f"a LOOP with stop_column {column} must end its body with "
            f"where(carry[:, {column}:{column + 1}] != 0, carry, next) (fori_loop builds it)"
        )


def _loop(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    trip_count, body = attrs["trip_count"], attrs["body"]
    if isinstance(trip_count, bool) or not isinstance(trip_count, int) or trip_count < 0:
        raise ShapeError(f"LOOP needs a non-negative int trip_count, got {trip_count!r}")
    if not isinstance(body, GraphAttr):
        raise ShapeError(f"LOOP needs a loop body (lazy.loop.LoopBody), got {body!r}")
    index, *declared = (n.type for n in body.inputs)
    if index != TensorType((), "int32"):
        raise ShapeError(f"LOOP body's iteration index must be int32[], got {index}")
    if len(types) != len(declared):
        raise ShapeError(
            f"LOOP body takes a carry and {len(declared) - 1} invariant(s), got {len(types)} operands"
        )
    for k, (given, want) in enumerate(zip(types, declared, strict=True)):
        what = "carry" if k == 0 else f"invariant {k - 1}"
        if given != want:
            raise ShapeError(f"LOOP {what} is {given} but the body was traced with {want}")
    out = body.output.type
    if out != types[0]:
        raise ShapeError(
            f"LOOP body returns {out.dtype}{list(out.shape)} but the carry is "
            f"{types[0].dtype}{list(types[0].shape)}"
        )
    _check_stop_column(body, attrs["stop_column"])
    if any(n.op is Op.VARIANT for n in body.order):
        raise ShapeError("a LOOP body cannot hold a VARIANT: choose between whole loops instead")
    # The body's inputs carry the outer operands' batch axes, so re-deriving its nodes checks that
    # the body keeps rows apart (RowMixingError otherwise): the loop is row-local iff its body is.
    try:
        recheck(body.order)
    except (ShapeError, GraphError) as exc:
        raise type(exc)(f"in the LOOP body: {exc}") from None
    return types[0]


def _forest_sum(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    x, feature, threshold, nan_right, left, value = types
    if len(x.shape) != 2 or not is_batched(x.shape):
        raise ShapeError(f"FOREST_SUM reads rows × features, got {list(x.shape)}")
    _require(Op.FOREST_SUM, x.dtype, dt.FLOATS, "floating-point feature")
    tables = (feature, threshold, nan_right, left)
    if any(is_batched(t.shape) for t in (*tables, value)):
        # A walk gathers from its tables by node id: batched tables would hand it other rows'.
        raise RowMixingError("FOREST_SUM walks unbatched node tables; these hold rows")
    if any(len(t.shape) != 1 for t in tables) or len(value.shape) != 2:
        raise ShapeError(
            "FOREST_SUM needs (N,) feature, threshold, nan_right and left tables and (N, K) "
            f"leaf values, got {[list(t.shape) for t in (*tables, value)]}"
        )
    if len({t.shape[0] for t in (*tables, value)}) != 1:
        raise ShapeError(
            f"FOREST_SUM's node tables disagree on the node count: "
            f"{[t.shape[0] for t in (*tables, value)]}"
        )
    for table, what in ((feature, "feature"), (left, "left")):
        _require(Op.FOREST_SUM, table.dtype, dt.INDEX, f"int32/int64 {what}")
    if threshold.dtype != x.dtype:
        raise ShapeError(f"FOREST_SUM thresholds are {threshold.dtype}, the features {x.dtype}")
    _require(Op.FOREST_SUM, nan_right.dtype, frozenset({"bool"}), "boolean nan_right")
    _require(Op.FOREST_SUM, value.dtype, dt.FLOATS, "floating-point leaf value")
    trees, depth = attrs["trees"], attrs["depth"]
    if not isinstance(trees, int) or not 1 <= trees <= feature.shape[0]:
        raise ShapeError(f"FOREST_SUM needs 1 <= trees <= {feature.shape[0]} nodes, got {trees!r}")
    if not isinstance(depth, int) or depth < 0:
        raise ShapeError(f"FOREST_SUM needs a depth >= 0, got {depth!r}")
    return TensorType((x.shape[0], value.shape[1]), value.dtype)


def _forest_shap(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    x, column, threshold, right, player, zero, offsets, value, nodes, weights = types
    players = attrs["players"]
    if not isinstance(players, int) or players < 1:
        raise ShapeError(f"FOREST_SHAP needs an integer players >= 1, got {players!r}")
    if len(x.shape) != 2 or not is_batched(x.shape):
        raise ShapeError(f"FOREST_SHAP reads rows × features, got {list(x.shape)}")
    _require(Op.FOREST_SHAP, x.dtype, dt.FLOATS, "floating-point feature")
    tables = (column, threshold, right, player, zero, offsets, value, nodes, weights)
    if any(is_batched(t.shape) for t in tables):
        raise RowMixingError("FOREST_SHAP reads unbatched leaf tables; these hold rows")
    tests = (column, threshold, right)
    if (
        any(len(t.shape) != 2 or t.shape != column.shape for t in tests)
        or any(len(t.shape) != 1 or t.shape[0] != column.shape[0] for t in (player, zero))
        or len(offsets.shape) != 1
        or any(len(t.shape) != 2 for t in (value, nodes, weights))
        or nodes.shape != weights.shape
        or offsets.shape[0] != value.shape[0] + 1
        or nodes.shape[0] != value.shape[0]
    ):
        raise ShapeError(
            "FOREST_SHAP needs (E, C) tests, (E,) players and zero fractions, (L + 1,) offsets, "
            "(L, K) values and (L, Q) nodes and weights, got "
            f"{[list(t.shape) for t in tables]}"
        )
    if threshold.dtype != x.dtype or right.dtype != "bool":
        raise ShapeError("FOREST_SHAP thresholds take the features' dtype and directions bool")
    return TensorType((x.shape[0], players, value.shape[1]), "float64")


def _couple(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    (r,) = types
    classes = attrs["classes"]
    if not isinstance(classes, int) or classes < 2:
        raise ShapeError(f"COUPLE needs an integer classes >= 2, got {classes!r}")
    _require(Op.COUPLE, r.dtype, dt.FLOATS, "floating-point")
    pairs = classes * (classes - 1) // 2
    if len(r.shape) != 2 or r.shape[1] != pairs:
        raise ShapeError(
            f"COUPLE of {classes} classes reads rows × {pairs} pairwise probabilities, "
            f"got {list(r.shape)}"
        )
    return TensorType((r.shape[0], classes), r.dtype)


def _variant(types: Sequence[TensorType], _: Attrs) -> TensorType:
    device, host = types
    if device != host:
        raise ShapeError(
            f"VARIANT formulations must agree in shape and dtype: device "
            f"{device.dtype}{list(device.shape)}, host {host.dtype}{list(host.shape)}"
        )
    return device


def _build_table() -> dict[Op, OpSpec]:
    table: dict[Op, OpSpec] = {}

    def add(op: Op, arity: int | None, attrs: tuple[str, ...], infer: InferRule, kind: str):
        table[op] = OpSpec(op, arity, attrs, infer, kind)

    add(Op.INPUT, 0, ("name", "shape", "dtype"), _leaf, "leaf")
    add(Op.PARAM, 0, ("name", "shape", "dtype"), _param, "leaf")
    add(Op.CONST, 0, ("value",), _const, "leaf")
    for op in (
        Op.EXP,
        Op.LOG,
        Op.LOG1P,
        Op.EXPM1,
        Op.SQRT,
        Op.TANH,
        Op.SIGMOID,
        Op.ERF,
        Op.NDTRI,
        Op.FLOOR,
    ):
        add(op, 1, (), _float_unary(op), "unary")
    for op in (Op.NEG, Op.ABS):
        add(op, 1, (), _numeric_unary(op), "unary")
    add(Op.ISNAN, 1, (), _unary(dt.FLOATS, "floating-point", result="bool")(Op.ISNAN), "unary")
    add(Op.NOT, 1, (), _unary(_LOGICAL, "boolean or integer")(Op.NOT), "unary")
    # Count trailing zeros: the index of the lowest set bit (the bit width for 0), as int32.
    add(Op.CTZ, 1, (), _unary(dt.INTS, "integer", result="int32")(Op.CTZ), "unary")
    for op in (Op.ADD, Op.SUB, Op.MUL, Op.MAXIMUM, Op.MINIMUM):
        add(op, 2, (), _numeric_binary(op), "binary")
    for op in (Op.DIV, Op.POW, Op.REMAINDER):
        add(op, 2, (), _float_binary(op), "binary")
    for op in (Op.LT, Op.LE, Op.GT, Op.GE):
        add(op, 2, (), _compare(op), "compare")
    for op in (Op.EQ, Op.NE):
        add(op, 2, (), _equality(op), "compare")
    for op in (Op.AND, Op.OR, Op.XOR):
        add(op, 2, (), _logical(op), "logical")
    add(Op.WHERE, 3, (), _where, "select")
    add(Op.CAST, 1, ("dtype",), _cast, "unary")
    add(Op.MATMUL, 2, (), _matmul, "contraction")
    add(Op.TAKE, 2, ("axis",), _take, "gather")
    add(Op.TAKE_ALONG, 2, ("axis",), _take_along, "gather")
    # Operands: the tensor, a scalar index, the value written at that index along ``axis``.
    add(Op.UPDATE, 3, ("axis",), _update, "layout")
    # Operands: rows (B, F), then the node tables feature, threshold, nan_right, left (N,) and
    # the leaf values (N, K); see lazy.forest_sum.
    add(Op.FOREST_SUM, 6, ("trees", "depth"), _forest_sum, "gather")
    # Each row's pairwise probabilities (B, k(k-1)/2) → its k class probabilities, iterated row
    # by row (rows never mix, as in a LOOP); see lazy.couple.
    add(Op.COUPLE, 1, ("classes",), _couple, "control")
    # Operands: rows (B, W), then the leaf tables (see lazy.forest_shap); (B, P, K) float64.
    add(Op.FOREST_SHAP, 10, ("players",), _forest_shap, "gather")
    for op in (Op.SUM, Op.MAX, Op.MIN):
        add(op, 1, ("axes", "keepdims"), _reduction(dt.NUMERIC, "numeric")(op), "reduction")
    # Bitwise AND over axes (logical for bools); the empty AND is all ones.
    add(
        Op.REDUCE_AND,
        1,
        ("axes", "keepdims"),
        _reduction(_LOGICAL, "boolean or integer")(Op.REDUCE_AND),
        "reduction",
    )
    add(
        Op.LOGSUMEXP,
        1,
        ("axes", "keepdims"),
        _reduction(dt.FLOATS, "float")(Op.LOGSUMEXP),
        "reduction",
    )
    add(Op.ARGMAX, 1, ("axis",), _argmax, "reduction")
    add(Op.SOFTMAX, 1, ("axis",), _softmax, "reduction")
    add(Op.CONCAT, None, ("axis",), _concat, "layout")
    add(Op.SLICE, 1, ("axis", "start", "stop", "step"), _slice, "layout")
    add(Op.RESHAPE, 1, ("shape",), _reshape, "layout")
    add(Op.BROADCAST, 1, ("shape",), _broadcast, "layout")
    add(Op.TRANSPOSE, 1, ("perm",), _transpose, "layout")
    # Operands: the initial carry, then the invariants (values every iteration reads).
    add(Op.LOOP, None, ("trip_count", "body", "stop_column"), _loop, "control")
    add(Op.VARIANT, 2, (), _variant, "control")
    return table


SPECS: dict[Op, OpSpec] = _build_table()
#: Ops only the host lowers (the numpy backend; the interpreter states their meaning). A device
#: graph holds them only as the host formulation of a VARIANT, which the device never compiles:
#: FOREST_SUM and COUPLE are native loops; the compiler's tree strategies and
#: :func:`lazy.coupling.couple_loop` are their device formulations.
HOST_ONLY: frozenset[Op] = frozenset({Op.FOREST_SUM, Op.COUPLE, Op.FOREST_SHAP})
ELEMENTWISE_KINDS = frozenset({"unary", "binary", "compare", "logical", "select"})
