"""Immutable, hash-consed IR nodes.

Building the same op on the same operands with the same attributes returns the *same* node object,
so equal subgraphs are shared (common-subexpression elimination for free) and node identity is a
cheap equality test. Interning is process-local bookkeeping; the portable identity of a graph is
its digest (:mod:`lazy.digest`), which never uses ``hash()`` or ``id()``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from . import dtypes as dt
from .errors import ShapeError
from .ops import SPECS, ConstValue, GraphAttr, Op, TensorType
from .shapes import B, Shape, is_batched, normalize


def _canonical_attr(value: Any) -> Any:
    """A hashable, order-preserving canonical form of an attribute value."""
    if value is B or isinstance(value, (str, bool, ConstValue, GraphAttr)) or value is None:
        return value
    if isinstance(value, int):  # includes numpy ints via __index__ below
        return int(value)
    if isinstance(value, (tuple, list)):
        return tuple(_canonical_attr(v) for v in value)
    if hasattr(value, "__index__"):
        return int(value.__index__())
    if hasattr(value, "name") and hasattr(value, "itemsize"):  # numpy dtype
        return str(value.name)
    raise TypeError(f"unsupported attribute value {value!r} ({type(value).__name__})")


def _keep(value: Any) -> Any:
    return value


_NORMALIZERS = {"shape": normalize, "dtype": dt.canonical}


_INTERNED: weakref.WeakValueDictionary[tuple[Any, ...], Node] = weakref.WeakValueDictionary()
_INTERN_LOCK = threading.Lock()


def _canonical_axes(attrs: tuple[tuple[str, Any], ...], rank: int) -> tuple[tuple[str, Any], ...]:
    """Axes counted from the end become non-negative (and ``axes`` sorted, unique), so that
    ``softmax(x, -1)`` and ``softmax(x, 1)`` are one node with one digest. Out-of-range axes are
    left for the op's shape rule to reject."""

    def fix(axis: int) -> int:
        return axis % rank if -rank <= axis < rank else axis

    out = []
    for key, value in attrs:
        if key == "axis":
            value = fix(value)
        elif key == "axes":
            value = tuple(sorted({fix(a) for a in value}))
        out.append((key, value))
    return tuple(out)


class Node:
    """One operation of the IR. Construct with :meth:`Node.make`; never mutate."""

    __slots__ = ("__weakref__", "attrs", "dtype", "inputs", "op", "shape")

    op: Op
    inputs: tuple[Node, ...]
    attrs: tuple[tuple[str, Any], ...]
    shape: Shape
    dtype: str

    def __init__(self) -> None:  # pragma: no cover - guarded
        raise TypeError("build nodes with Node.make(...)")

    @classmethod
    def make(cls, op: Op, inputs: Sequence[Node] = (), **attrs: Any) -> Node:
        """Build (or fetch the interned) node, inferring and checking its type."""
        spec = SPECS[op]
        spec.check_arity(len(inputs))
        if set(attrs) != set(spec.attrs):
            raise ShapeError(f"{op.name} takes attributes {spec.attrs}, got {tuple(attrs)}")
        canon = tuple((name, _canonical_attr(attrs[name])) for name in spec.attrs)
        canon = tuple((k, _NORMALIZERS.get(k, _keep)(v)) for k, v in canon)
        if inputs:
            canon = _canonical_axes(canon, len(inputs[0].shape))
        result = spec.infer([n.type for n in inputs], dict(canon))
        return cls._intern(op, tuple(inputs), canon, result)

    @classmethod
    def unchecked(
        cls, op: Op, inputs: Sequence[Node], attrs: Mapping[str, Any], result: TensorType
    ) -> Node:
        """Build a node with a *declared* type, skipping inference.

        For deserializers and tests of the verifier only: :func:`lazy.verify.verify` re-checks.
        """
        canon = tuple((name, _canonical_attr(attrs[name])) for name in SPECS[op].attrs)
        return cls._intern(op, tuple(inputs), canon, result)

    @classmethod
    def _intern(
        cls, op: Op, inputs: tuple[Node, ...], attrs: tuple[tuple[str, Any], ...], t: TensorType
    ) -> Node:
        key = (op, inputs, attrs, t.shape, t.dtype)
        with _INTERN_LOCK:
            node = _INTERNED.get(key)
            if node is None:
                node = object.__new__(cls)
                for name, value in (
                    ("op", op),
                    ("inputs", inputs),
                    ("attrs", attrs),
                    ("shape", t.shape),
                    ("dtype", t.dtype),
                ):
                    object.__setattr__(node, name, value)
                _INTERNED[key] = node
            return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("nodes are immutable")

    def __reduce__(self) -> Any:
        raise TypeError("nodes are process-local; serialize a graph with lazy.digest instead")

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)

    @property
    def batched(self) -> bool:
        return is_batched(self.shape)

    def attr(self, name: str) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        raise KeyError(f"{self.op.name} has no attribute {name!r}")

    def with_inputs(self, inputs: Sequence[Node]) -> Node:
        """The same op and attributes applied to other operands (type re-inferred)."""
        if tuple(inputs) == self.inputs:
            return self
        return Node.make(self.op, inputs, **dict(self.attrs))

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs)
        return (
            f"<{self.op.name}{'(' + attrs + ')' if attrs else ''}: {self.dtype}{list(self.shape)}>"
        )


def topological(roots: Iterable[Node]) -> list[Node]:
    """Every node reachable from ``roots``, operands before users; iterative (deep graphs)."""
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, Iterator[Node]]] = []
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack.append((root, iter(root.inputs)))
        while stack:
            node, pending = stack[-1]
            for child in pending:
                if id(child) not in seen:
                    seen.add(id(child))
                    stack.append((child, iter(child.inputs)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def is_leaf(node: Node) -> bool:
    return node.op in (Op.INPUT, Op.PARAM, Op.CONST)


def depends_on_input(order: Sequence[Node]) -> dict[Node, bool]:
    """For each node of a topological order, whether any INPUT lies below it."""
    result: dict[Node, bool] = {}
    for node in order:
        result[node] = node.op is Op.INPUT or any(result[i] for i in node.inputs)
    return result
