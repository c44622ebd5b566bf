"""Which input columns each column of a value is computed from.

An explanation of a model's answer in terms of its features is only useful to a client in terms
of the columns it sent: a one-hot column is its string column, a scaled column the raw one. This
analysis reads that off the graph: for every column (axis 1) of a batched value, the set of
(input name, column) pairs some path of ops leads from. It is exact where ops keep columns
apart — elementwise arithmetic with broadcasting, slices and constant gathers, concatenation,
a matrix product with a parameter (its nonzero entries) — and conservative elsewhere: any other
op makes each of its output columns depend on every column of every operand.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .node import Node, topological
from .ops import ELEMENTWISE_KINDS, SPECS, Op
from .shapes import is_batched

#: An input column: (input name, column; 0 for a (B,) input).
Source = tuple[str, int]
#: Per column of a batched (B,) or (B, k) value (a (B,) value is one column), or None for an
#: unbatched one (parameters, constants: no input reaches them).
Columns = tuple[frozenset[Source], ...] | None

_EMPTY: frozenset[Source] = frozenset()


def column_sources(node: Node, params: Mapping[str, np.ndarray]) -> tuple[frozenset[Source], ...]:
    """Per column of the batched ``node``: the input columns it depends on. ``params`` gives
    PARAM values by name (a matrix product reads which weights are zero)."""
    if not is_batched(node.shape):
        raise ValueError(f"column_sources needs a batched value, got shape {node.shape}")
    known: dict[Node, Columns] = {}
    for current in topological([node]):
        known[current] = _columns(current, [known[i] for i in current.inputs], params)
    out = known[node]
    assert out is not None
    return out


def _width(node: Node) -> int:
    """The columns of a batched value: 1 for (B,), k for (B, k), 1 for anything wider (its
    trailing axes are not columns this analysis follows)."""
    return int(node.shape[1]) if len(node.shape) == 2 else 1


def _union(operands: list[Columns]) -> frozenset[Source]:
    out: set[Source] = set()
    for columns in operands:
        for sources in columns or ():
            out |= sources
    return frozenset(out)


def _everywhere(node: Node, operands: list[Columns]) -> Columns:
    """Every output column depends on every operand column."""
    return (_union(operands),) * _width(node)


def _columns(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    op = node.op
    if op is Op.INPUT:
        if not is_batched(node.shape):
            return None  # a loop's trip index
        name = node.attr("name")
        return tuple(frozenset({(name, j)}) for j in range(_width(node)))
    if not is_batched(node.shape):  # parameters, constants and what they alone compute
        return None
    if len(node.shape) > 2 or any(
        o is not None and len(i.shape) > 2 for o, i in zip(operands, node.inputs, strict=True)
    ):
        return _everywhere(node, operands)
    kind = SPECS[op].kind
    if kind in ELEMENTWISE_KINDS:
        return _elementwise(node, operands)
    rule = _RULES.get(op)
    return rule(node, operands, params) if rule is not None else _everywhere(node, operands)


def _elementwise(node: Node, operands: list[Columns]) -> Columns:
    width = _width(node)
    out = [set() for _ in range(width)]
    for columns, operand in zip(operands, node.inputs, strict=True):
        if columns is None:
            continue
        if len(columns) == width and (len(operand.shape) == len(node.shape)):
            for j, sources in enumerate(columns):
                out[j] |= sources
        elif len(columns) == 1:  # (B, 1) or (B,) broadcast along the columns
            for j in range(width):
                out[j] |= columns[0]
        else:
            return _everywhere(node, operands)
    return tuple(frozenset(s) for s in out)


def _slice(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    (columns,) = operands
    source = node.inputs[0]
    if columns is None or len(source.shape) != 2 or node.attr("axis") != 1:
        return _everywhere(node, operands)
    return columns[node.attr("start") : node.attr("stop") : node.attr("step")]


def _take(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    data, indices = operands
    source, index = node.inputs
    if data is not None and indices is None and len(source.shape) == 2 and node.attr("axis") == 1:
        picked = _value(index, params)
        if picked is not None and picked.ndim == 1:
            return tuple(data[int(j)] for j in picked)
    return _everywhere(node, operands)


def _concat(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    if node.attr("axis") not in (1, -1) or len(node.shape) != 2:
        return _everywhere(node, operands)
    out: list[frozenset[Source]] = []
    for columns, operand in zip(operands, node.inputs, strict=True):
        width = int(operand.shape[1]) if len(operand.shape) == 2 else 1
        out += [_EMPTY] * width if columns is None else list(columns)
    return tuple(out)


def _reshape(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    (columns,) = operands
    if columns is not None and len(columns) == _width(node):
        return columns  # (B,) ↔ (B, 1), or the same (B, k)
    return _everywhere(node, operands)


def _broadcast(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    (columns,) = operands
    if columns is not None and len(columns) == 1:
        return columns * _width(node)
    return _reshape(node, operands, params)


def _matmul(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    a, b = operands
    weights = _value(node.inputs[1], params)
    if a is None or b is not None or weights is None or weights.ndim != 2:
        return _everywhere(node, operands)
    used = weights != 0
    return tuple(
        frozenset().union(*(a[i] for i in np.flatnonzero(used[:, j])))
        for j in range(weights.shape[1])
    )


def _value(node: Node, params: Mapping[str, np.ndarray]) -> np.ndarray | None:
    if node.op is Op.CONST:
        return np.asarray(node.attr("value").array)
    if node.op is Op.PARAM:
        value = params.get(node.attr("name"))
        return None if value is None else np.asarray(value)
    return None


_RULES = {
    Op.SLICE: _slice,
    Op.TAKE: _take,
    Op.CONCAT: _concat,
    Op.RESHAPE: _reshape,
    Op.BROADCAST: _broadcast,
    Op.MATMUL: _matmul,
}
