"""LazyTensor: a value whose operations are recorded as IR nodes instead of being executed.

Operators and the functions of this module only build nodes. A lazy value cannot become a Python or
numpy value: ``bool()``, ``float()``, ``int()``, ``len()``, iteration and ``np.asarray`` raise
:class:`ConcretizationError`, naming the op and the scope (pipeline step) and source line that
built it. The way back to host values is an explicit barrier (:meth:`lazy.Builder.host`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from . import dtypes as dt
from .errors import ConcretizationError, ShapeError
from .node import Node
from .ops import ConstValue, Op
from .shapes import B, Shape, is_batched

#: Largest array the operators accept as an inline constant; larger ones must be parameters.
MAX_CONST_ELEMENTS = 4096

_scope: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("lazy_scope", default=())
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Label the values built inside (e.g. with a pipeline step) for error messages."""
    token = _scope.set((*_scope.get(), name))
    try:
        yield
    finally:
        _scope.reset(token)


def _caller() -> str:
    frame = sys._getframe(2)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == (
        _PACKAGE_DIR
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class LazyTensor:
    """A node plus where it was built. Immutable; unhashable like other array types."""

    __slots__ = ("node", "origin", "scope")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, node: Node, *, scope_: tuple[str, ...] | None = None) -> None:
        self.node = node
        self.scope = _scope.get() if scope_ is None else scope_
        self.origin = _caller()

    # -- introspection -----------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        return self.node.shape

    @property
    def dtype(self) -> str:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    @property
    def batched(self) -> bool:
        return is_batched(self.node.shape)

    def where_built(self) -> str:
        step = " / ".join(self.scope) or "<no scope>"
        return f"{step} at {self.origin}"

    def __repr__(self) -> str:
        return (
            f"LazyTensor({self.node.op.name}, {self.dtype}{list(self.shape)}, {self.where_built()})"
        )

    # -- concretization is an error ----------------------------------------------------------
    def _refuse(self, what: str) -> ConcretizationError:
        return ConcretizationError(
            f"cannot use a lazy {self.node.op.name} value ({self.dtype}{list(self.shape)}) as "
            f"{what}: it was built in {self.where_built()}. Lazy values exist only inside the "
            "graph; compute with lazy ops, or move the step to the host with Builder.host()."
        )

    def __bool__(self) -> bool:
        raise self._refuse("a Python bool")

    def __float__(self) -> float:
        raise self._refuse("a Python float")

    def __int__(self) -> int:
        raise self._refuse("a Python int")

    def __index__(self) -> int:
        raise self._refuse("an index")

    def __len__(self) -> int:
        raise self._refuse("a sized sequence (len)")

    def __iter__(self) -> Iterator[Any]:
        raise self._refuse("an iterable")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise self._refuse("a numpy array")

    # numpy ufuncs applied to a lazy value record the matching op (np.log1p(x), np.add(x, 1)…)
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *args: Any, **kwargs: Any) -> Any:
        op = _UFUNCS.get(ufunc)
        if method != "__call__" or op is None or kwargs:
            return NotImplemented
        return _apply(op, *args)

    # -- operators ---------------------------------------------------------------------------
    def __add__(self, o: Any) -> LazyTensor:
        return _apply(Op.ADD, self, o)

    def __radd__(self, o: Any) -> LazyTensor:
        return _apply(Op.ADD, o, self)

    def __sub__(self, o: Any) -> LazyTensor:
        return _apply(Op.SUB, self, o)

    def __rsub__(self, o: Any) -> LazyTensor:
        return _apply(Op.SUB, o, self)

    def __mul__(self, o: Any) -> LazyTensor:
        return _apply(Op.MUL, self, o)

    def __rmul__(self, o: Any) -> LazyTensor:
        return _apply(Op.MUL, o, self)

    def __truediv__(self, o: Any) -> LazyTensor:
        return _apply(Op.DIV, self, o)

    def __rtruediv__(self, o: Any) -> LazyTensor:
        return _apply(Op.DIV, o, self)

    def __pow__(self, o: Any) -> LazyTensor:
        return _apply(Op.POW, self, o)

    def __rpow__(self, o: Any) -> LazyTensor:
        return _apply(Op.POW, o, self)

    def __mod__(self, o: Any) -> LazyTensor:
        return _apply(Op.REMAINDER, self, o)

    def __rmod__(self, o: Any) -> LazyTensor:
        return _apply(Op.REMAINDER, o, self)

    def __matmul__(self, o: Any) -> LazyTensor:
        return _apply(Op.MATMUL, self, o)

    def __rmatmul__(self, o: Any) -> LazyTensor:
        return _apply(Op.MATMUL, o, self)

    def __neg__(self) -> LazyTensor:
        return _apply(Op.NEG, self)

    def __abs__(self) -> LazyTensor:
        return _apply(Op.ABS, self)

    def __invert__(self) -> LazyTensor:
        return _apply(Op.NOT, self)

    def __and__(self, o: Any) -> LazyTensor:
        return _apply(Op.AND, self, o)

    def __rand__(self, o: Any) -> LazyTensor:
        return _apply(Op.AND, o, self)

    def __or__(self, o: Any) -> LazyTensor:
        return _apply(Op.OR, self, o)

    def __ror__(self, o: Any) -> LazyTensor:
        return _apply(Op.OR, o, self)

    def __xor__(self, o: Any) -> LazyTensor:
        return _apply(Op.XOR, self, o)

    def __rxor__(self, o: Any) -> LazyTensor:
        return _apply(Op.XOR, o, self)

    def __lt__(self, o: Any) -> LazyTensor:
        return _apply(Op.LT, self, o)

    def __le__(self, o: Any) -> LazyTensor:
        return _apply(Op.LE, self, o)

    def __gt__(self, o: Any) -> LazyTensor:
        return _apply(Op.GT, self, o)

    def __ge__(self, o: Any) -> LazyTensor:
        return _apply(Op.GE, self, o)

    def __eq__(self, o: Any) -> LazyTensor:  # type: ignore[override]
        return _apply(Op.EQ, self, o)

    def __ne__(self, o: Any) -> LazyTensor:  # type: ignore[override]
        return _apply(Op.NE, self, o)

    def __getitem__(self, key: Any) -> LazyTensor:
        return _getitem(self, key)

    # -- methods -----------------------------------------------------------------------------
    def astype(self, dtype: Any) -> LazyTensor:
        return cast(self, dtype)

    def reshape(self, *shape: Any) -> LazyTensor:
        return reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape)

    def sum(self, axis: int | Sequence[int] = -1, keepdims: bool = False) -> LazyTensor:
        return sum(self, axis, keepdims)

    def max(self, axis: int | Sequence[int] = -1, keepdims: bool = False) -> LazyTensor:
        return max(self, axis, keepdims)

    def min(self, axis: int | Sequence[int] = -1, keepdims: bool = False) -> LazyTensor:
        return min(self, axis, keepdims)

    def argmax(self, axis: int = -1) -> LazyTensor:
        return argmax(self, axis)

    def transpose(self, *perm: int) -> LazyTensor:
        return transpose(self, perm)


# --- building nodes -----------------------------------------------------------------------------


def _make(op: Op, inputs: Sequence[LazyTensor], **attrs: Any) -> LazyTensor:
    try:
        node = Node.make(op, [t.node for t in inputs], **attrs)
    except ShapeError as exc:
        where = next((t.where_built() for t in inputs), "")
        step = " / ".join(_scope.get()) or "<no scope>"
        raise type(exc)(f"{exc} [building {op.name} in {step}; operand from {where}]") from None
    return LazyTensor(node)


def const(value: Any, dtype: Any = None) -> LazyTensor:
    """A small array baked into the graph."""
    array = np.asarray(value, dtype=dtype)
    if array.size > MAX_CONST_ELEMENTS:
        raise ShapeError(
            f"a constant of {array.size} elements is too large to bake into the graph "
            f"(max {MAX_CONST_ELEMENTS}); pass it as Builder.param(...)"
        )
    return LazyTensor(Node.make(Op.CONST, value=ConstValue(array)))


def _lift(value: Any, like: LazyTensor) -> LazyTensor:
    """Python scalars and numpy arrays in an expression become constants of the tensor's dtype."""
    if isinstance(value, LazyTensor):
        return value
    array = np.asarray(value)
    if array.dtype.kind == "b" and like.dtype != "bool":
        raise ShapeError(f"cannot combine a boolean constant with a {like.dtype} tensor")
    if array.dtype.kind == "f" and like.dtype in dt.INTS | {"bool"}:
        raise ShapeError(f"cannot combine a float constant with a {like.dtype} tensor; cast first")
    converted = array.astype(like.dtype)
    if array.dtype.kind in "iu" and not np.array_equal(converted, array):
        raise ShapeError(f"constant {value!r} does not fit {like.dtype}")
    return const(converted)


def _lift_operands(op: Op, operands: Sequence[Any], like: LazyTensor) -> list[LazyTensor]:
    """:func:`_lift` each operand; an error names the op being built, like :func:`_make`'s."""
    try:
        return [_lift(o, like) for o in operands]
    except ShapeError as exc:
        step = " / ".join(_scope.get()) or "<no scope>"
        raise ShapeError(
            f"{exc} [building {op.name} in {step}; operand from {like.where_built()}]"
        ) from None


def _apply(op: Op, *operands: Any) -> LazyTensor:
    like = next((o for o in operands if isinstance(o, LazyTensor)), None)
    if like is None:
        raise TypeError(f"{op.name} needs at least one lazy operand")
    return _make(op, _lift_operands(op, operands, like))


def _axes(axis: int | Sequence[int]) -> tuple[int, ...]:
    return (axis,) if isinstance(axis, int) else tuple(axis)


# --- the functional API -------------------------------------------------------------------------


def exp(x: LazyTensor) -> LazyTensor:
    return _apply(Op.EXP, x)


def log(x: LazyTensor) -> LazyTensor:
    return _apply(Op.LOG, x)


def log1p(x: LazyTensor) -> LazyTensor:
    return _apply(Op.LOG1P, x)


def expm1(x: LazyTensor) -> LazyTensor:
    return _apply(Op.EXPM1, x)


def sqrt(x: LazyTensor) -> LazyTensor:
    return _apply(Op.SQRT, x)


def tanh(x: LazyTensor) -> LazyTensor:
    return _apply(Op.TANH, x)


def sigmoid(x: LazyTensor) -> LazyTensor:
    return _apply(Op.SIGMOID, x)


def erf(x: LazyTensor) -> LazyTensor:
    return _apply(Op.ERF, x)


def ndtri(x: LazyTensor) -> LazyTensor:
    """The standard normal quantile function (the inverse of its CDF): -inf at 0, +inf at 1,
    NaN outside [0, 1]."""
    return _apply(Op.NDTRI, x)


def floor(x: LazyTensor) -> LazyTensor:
    return _apply(Op.FLOOR, x)


def isnan(x: LazyTensor) -> LazyTensor:
    return _apply(Op.ISNAN, x)


def ctz(x: LazyTensor) -> LazyTensor:
    """Count trailing zeros of integers: the lowest set bit's index (the bit width for 0), int32."""
    return _apply(Op.CTZ, x)


def remainder(a: Any, b: Any) -> LazyTensor:
    """numpy's ``a % b`` on floats, bit for bit: ``fmod(a, b)`` (exact), plus ``b`` where the
    two differ in sign (one rounding), a zero result signed as ``b``."""
    return _apply(Op.REMAINDER, a, b)


def maximum(a: Any, b: Any) -> LazyTensor:
    return _apply(Op.MAXIMUM, a, b)


def minimum(a: Any, b: Any) -> LazyTensor:
    return _apply(Op.MINIMUM, a, b)


def where(cond: LazyTensor, a: Any, b: Any) -> LazyTensor:
    like = next((o for o in (a, b) if isinstance(o, LazyTensor)), None)
    if like is None:
        raise TypeError("where needs a lazy value for at least one branch")
    return _make(Op.WHERE, [cond, *_lift_operands(Op.WHERE, (a, b), like)])


def variant(device: LazyTensor, host: LazyTensor) -> LazyTensor:
    """One value in two formulations of equal meaning (same shape and dtype; floats may differ
    in rounding): ``device`` for compiled backends (XLA, torch), ``host`` for the numpy backend,
    whose cost is the number of numpy calls rather than the work. Each backend computes only its
    own; the reference interpreter computes ``device``."""
    return _make(Op.VARIANT, [device, host])


def cast(x: LazyTensor, dtype: Any) -> LazyTensor:
    return _make(Op.CAST, [x], dtype=dt.canonical(dtype))


def matmul(a: LazyTensor, b: LazyTensor) -> LazyTensor:
    return _make(Op.MATMUL, [a, b])


def take(data: LazyTensor, indices: LazyTensor, axis: int = 0) -> LazyTensor:
    """``np.take``: indices must be in bounds (backends may assume so)."""
    return _make(Op.TAKE, [data, indices], axis=axis)


def take_along(data: LazyTensor, indices: LazyTensor, axis: int) -> LazyTensor:
    """``np.take_along_axis``: indices must be in bounds (backends may assume so)."""
    return _make(Op.TAKE_ALONG, [data, indices], axis=axis)


def forest_sum(
    x: LazyTensor,
    feature: LazyTensor,
    threshold: LazyTensor,
    nan_right: LazyTensor,
    left: LazyTensor,
    value: LazyTensor,
    *,
    trees: int,
    depth: int,
) -> LazyTensor:
    """(B, K): the sum over ``trees`` walks of node tables of the leaf values they reach.

    Walk ``t`` starts at node ``t`` and takes up to ``depth`` steps; at node ``n`` it stays if
    ``left[n] == n`` (a leaf), else goes to ``left[n] + 1`` when ``x[row, feature[n]] >
    threshold[n]`` or that value is NaN and ``nan_right[n]``, to ``left[n]`` otherwise. Tables
    are (N,) (``threshold`` in ``x``'s dtype, ``nan_right`` bool) and ``value`` (N, K); every
    ``feature`` must index ``x``'s columns and every non-leaf's ``left[n] + 1`` a node. One op
    where tensor formulations need several per level: the host runs it as a native loop
    (:mod:`lazy.forest`). Host only (:data:`lazy.HOST_ONLY`): a device graph holds it as the host
    formulation of :func:`variant`."""
    operands = [x, feature, threshold, nan_right, left, value]
    return _make(Op.FOREST_SUM, operands, trees=int(trees), depth=int(depth))


def update(x: LazyTensor, index: LazyTensor, value: LazyTensor, axis: int) -> LazyTensor:
    """``x`` with the slice at scalar ``index`` along ``axis`` replaced by ``value`` (the shape
    of ``x`` without that axis): numpy's ``y = x.copy(); y[..., index, ...] = value``. The index
    must be in bounds (backends may assume so). Inside a loop it fills one slice per iteration
    (in place on XLA)."""
    return _make(Op.UPDATE, [x, index, value], axis=axis)


def sum(x: LazyTensor, axis: int | Sequence[int] = -1, keepdims: bool = False) -> LazyTensor:
    return _make(Op.SUM, [x], axes=_axes(axis), keepdims=keepdims)


def max(x: LazyTensor, axis: int | Sequence[int] = -1, keepdims: bool = False) -> LazyTensor:
    return _make(Op.MAX, [x], axes=_axes(axis), keepdims=keepdims)


def min(x: LazyTensor, axis: int | Sequence[int] = -1, keepdims: bool = False) -> LazyTensor:
    return _make(Op.MIN, [x], axes=_axes(axis), keepdims=keepdims)


def reduce_and(x: LazyTensor, axis: int | Sequence[int] = -1, keepdims: bool = False) -> LazyTensor:
    """Bitwise AND over ``axis`` (logical AND for bools)."""
    return _make(Op.REDUCE_AND, [x], axes=_axes(axis), keepdims=keepdims)


def logsumexp(x: LazyTensor, axis: int | Sequence[int] = -1, keepdims: bool = False) -> LazyTensor:
    return _make(Op.LOGSUMEXP, [x], axes=_axes(axis), keepdims=keepdims)


def argmax(x: LazyTensor, axis: int = -1) -> LazyTensor:
    """Index of the first maximum along ``axis``, as int32."""
    return _make(Op.ARGMAX, [x], axis=axis)


def softmax(x: LazyTensor, axis: int = -1) -> LazyTensor:
    return _make(Op.SOFTMAX, [x], axis=axis)


def concat(tensors: Sequence[LazyTensor], axis: int = -1) -> LazyTensor:
    return _make(Op.CONCAT, list(tensors), axis=axis)


def slice_axis(x: LazyTensor, axis: int, start: int, stop: int, step: int = 1) -> LazyTensor:
    return _make(Op.SLICE, [x], axis=axis, start=start, stop=stop, step=step)


def reshape(x: LazyTensor, shape: Sequence[Any]) -> LazyTensor:
    return _make(Op.RESHAPE, [x], shape=tuple(shape))


def broadcast_to(x: LazyTensor, shape: Sequence[Any]) -> LazyTensor:
    return _make(Op.BROADCAST, [x], shape=tuple(shape))


def transpose(x: LazyTensor, perm: Sequence[int] = ()) -> LazyTensor:
    perm = tuple(perm) or tuple(reversed(range(x.ndim)))
    return _make(Op.TRANSPOSE, [x], perm=perm)


def expand_dims(x: LazyTensor, axis: int) -> LazyTensor:
    rank = x.ndim + 1
    axis = axis % rank
    shape = list(x.shape)
    shape.insert(axis, 1)
    return reshape(x, shape)


def _getitem(x: LazyTensor, key: Any) -> LazyTensor:
    """Basic indexing: ints, slices, ``...`` and ``None`` on non-batch axes."""
    key = key if isinstance(key, tuple) else (key,)
    # Compare by identity only: ``==`` on a lazy value in the key would record an op.
    new_axes = len([k for k in key if k is None])
    if ellipses := [i for i, k in enumerate(key) if k is Ellipsis]:
        if len(ellipses) > 1:
            raise ShapeError("an index can only have one ellipsis")
        i = ellipses[0]
        fill = x.ndim - (len(key) - 1 - new_axes)
        key = key[:i] + (slice(None),) * fill + key[i + 1 :]
    if len(key) - new_axes > x.ndim:
        raise ShapeError(f"too many indices {key!r} for a tensor of rank {x.ndim}")
    out, axis = x, 0
    shape: list[Any] = []  # the result's shape, built in output order (numpy's rules)
    for k in key:
        if k is None:
            shape.append(1)
            continue
        if isinstance(k, slice):
            if k != slice(None):
                start, stop, step = k.indices(_static_dim(x, axis))
                out = slice_axis(out, axis, start, stop, step)
            shape.append(out.shape[axis])
        elif isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            dim = _static_dim(x, axis)
            if not -dim <= int(k) < dim:
                raise ShapeError(f"index {int(k)} is out of bounds for axis {axis} of size {dim}")
            i = int(k) % dim
            out = slice_axis(out, axis, i, i + 1)
        else:
            raise ShapeError(f"unsupported index {k!r}; use take() for gathers")
        axis += 1
    shape.extend(out.shape[axis:])
    return out if tuple(shape) == out.shape else reshape(out, shape)


def _static_dim(x: LazyTensor, axis: int) -> int:
    dim = x.shape[axis]
    if dim is B:
        raise ShapeError("indexing the batch axis would select rows; index other axes only")
    return dim  # type: ignore[return-value]


_UFUNCS: dict[np.ufunc, Op] = {
    np.add: Op.ADD,
    np.subtract: Op.SUB,
    np.multiply: Op.MUL,
    np.true_divide: Op.DIV,
    np.power: Op.POW,
    np.remainder: Op.REMAINDER,  # also np.mod
    np.maximum: Op.MAXIMUM,
    np.minimum: Op.MINIMUM,
    np.negative: Op.NEG,
    np.absolute: Op.ABS,
    np.exp: Op.EXP,
    np.log: Op.LOG,
    np.log1p: Op.LOG1P,
    np.expm1: Op.EXPM1,
    np.sqrt: Op.SQRT,
    np.tanh: Op.TANH,
    np.floor: Op.FLOOR,
    np.isnan: Op.ISNAN,
    np.equal: Op.EQ,
    np.not_equal: Op.NE,
    np.less: Op.LT,
    np.less_equal: Op.LE,
    np.greater: Op.GT,
    np.greater_equal: Op.GE,
    np.invert: Op.NOT,
    np.bitwise_and: Op.AND,
    np.bitwise_or: Op.OR,
    np.bitwise_xor: Op.XOR,
}
