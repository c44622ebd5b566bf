"""Which input columns each column of a value is computed from.

An explanation of a model's answer in terms of its features is only useful to a client in terms
of the columns it sent: a one-hot column is its string column, a scaled column the raw one. This
analysis reads that off the graph: for every column (axis 1) of a batched value, the set of
(input name, column) pairs some path of ops leads from. It is exact where ops keep columns
apart — elementwise arithmetic with broadcasting, slices and constant gathers, concatenation,
a matrix product with a parameter (its nonzero entries), table look-ups by batched indices
(category codes), and on (B, k, ...) values reshapes,
reductions, slices and gathers along the trailing axes (a binning's (B, k, edges) compares) —
and conservative elsewhere: any other op makes each of its output columns depend on every
column of every operand.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

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
    """The columns of a batched value: 1 for (B,), k for (B, k, ...) (axis 1; the trailing
    axes are within a column)."""
    return int(node.shape[1]) if len(node.shape) >= 2 else 1


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
    kind = SPECS[op].kind
    if kind in ELEMENTWISE_KINDS:
        return _elementwise(node, operands)
    if op in _AXES_REDUCTIONS:
        return _reduction(node, operands)
    rule = _RULES.get(op)
    return rule(node, operands, params) if rule is not None else _everywhere(node, operands)


def _elementwise(node: Node, operands: list[Columns]) -> Columns:
    width, rank = _width(node), len(node.shape)
    out = [set() for _ in range(width)]
    for columns, operand in zip(operands, node.inputs, strict=True):
        if columns is None:
            continue
        same_rank = len(operand.shape) == rank
        if len(columns) == width and same_rank:
            for j, sources in enumerate(columns):
                out[j] |= sources
        elif len(columns) == 1 and (same_rank or rank <= 2):
            # (B, 1, ...), or (B,) beside (B, k): broadcast along the columns
            for j in range(width):
                out[j] |= columns[0]
        else:
            return _everywhere(node, operands)
    return tuple(frozenset(s) for s in out)


def _reduction(node: Node, operands: list[Columns]) -> Columns:
    """A reduction over trailing axes only keeps each column's sources."""
    (columns,) = operands
    rank = len(node.inputs[0].shape)
    axes = {a % rank for a in node.attr("axes")}
    if columns is None or axes & {0, 1}:
        return _everywhere(node, operands)
    return columns


def _slice(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    (columns,) = operands
    rank = len(node.inputs[0].shape)
    axis = node.attr("axis") % rank
    if columns is None or axis == 0 or rank == 1:
        return _everywhere(node, operands)
    if axis > 1:  # within each column
        return columns
    return columns[node.attr("start") : node.attr("stop") : node.attr("step")]


def _take(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    data, indices = operands
    source, index = node.inputs
    rank = len(source.shape)
    axis = node.attr("axis") % rank if rank else 0
    if data is None and indices is not None and axis == 0:
        # A table look-up by batched indices: the output is indices.shape + the table's
        # trailing shape, so each output column is its index column's (a (B,) index: all of
        # the output's columns are that one's).
        if len(index.shape) >= 2:
            return indices
        return indices * _width(node)
    if data is not None and indices is None and axis >= 1:
        if axis > 1:  # unbatched indices along a trailing axis: within each column
            return data
        picked = _value(index, params)
        if picked is not None and picked.ndim == 1:
            return tuple(data[int(j)] for j in picked)
    return _everywhere(node, operands)


def _concat(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    rank = len(node.shape)
    axis = node.attr("axis") % rank
    if axis > 1 and all(len(i.shape) == rank for i in node.inputs):  # within each column
        return _elementwise(node, operands)
    if axis != 1 or rank != 2:
        return _everywhere(node, operands)
    out: list[frozenset[Source]] = []
    for columns, operand in zip(operands, node.inputs, strict=True):
        width = int(operand.shape[1]) if len(operand.shape) == 2 else 1
        out += [_EMPTY] * width if columns is None else list(columns)
    return tuple(out)


def _reshape(node: Node, operands: list[Columns], params: Mapping[str, np.ndarray]) -> Columns:
    (columns,) = operands
    if columns is not None and len(columns) == _width(node):
        # (B,) ↔ (B, 1), or (B, k, ...) → (B, k, ...): row-major, the same axis 1 keeps each
        # element in its column
        return columns
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


#: Reductions over an ``axes`` attribute.
_AXES_REDUCTIONS = frozenset({Op.SUM, Op.MAX, Op.MIN, Op.REDUCE_AND, Op.LOGSUMEXP})

_RULES = {
    Op.SLICE: _slice,
    Op.TAKE: _take,
    Op.CONCAT: _concat,
    Op.RESHAPE: _reshape,
    Op.BROADCAST: _broadcast,
    Op.MATMUL: _matmul,
}


#: An affine map of a batched value: (inner (B, G), W (G, F), c (F,)), the value being
#: ``inner @ W + c``.
Affine = tuple[Node, np.ndarray, np.ndarray]


def affine_inputs(node: Node, params: Mapping[str, np.ndarray]) -> Iterator[Affine]:
    """``node`` (B, F) as affine maps of earlier values, shallowest first: ``(node, I, 0)``,
    then one step back at a time through a matrix product by a parameter (a projection), the
    addition or subtraction of an unbatched parameter or constant (a centring), or a float
    cast, for as long as the steps are such. ``params`` gives PARAM values by name."""
    width = _width(node)
    weights, offset = np.eye(width), np.zeros(width)
    current: Node | None = node
    while current is not None:
        yield current, weights, offset
        step = _affine_step(current, params)
        if step is None:
            return
        current, w, c = step  # the old current is ``current @ w + c``
        offset = c @ weights + offset
        weights = w @ weights


def _affine_step(node: Node, params: Mapping[str, np.ndarray]) -> Affine | None:
    if len(node.shape) != 2 or not is_batched(node.shape):
        return None
    width = int(node.shape[1])
    inputs = node.inputs
    if node.op is Op.CAST and node.dtype in ("float32", "float64"):
        (inner,) = inputs
        if len(inner.shape) == 2 and inner.dtype in ("float32", "float64"):
            return inner, np.eye(width), np.zeros(width)
        return None
    if node.op is Op.MATMUL:
        inner, right = inputs
        weights = _value(right, params)
        if is_batched(inner.shape) and len(inner.shape) == 2 and weights is not None:
            return inner, np.asarray(weights, np.float64), np.zeros(width)
        return None
    if node.op in (Op.ADD, Op.SUB):
        batched = [is_batched(i.shape) for i in inputs]
        if batched.count(True) != 1:
            return None
        inner = inputs[batched.index(True)]
        value = _value(inputs[batched.index(False)], params)
        if inner.shape != node.shape or value is None or value.size not in (1, width):
            return None
        shift = np.broadcast_to(np.asarray(value, np.float64).reshape(-1), (width,))
        sign = -1.0 if node.op is Op.SUB and batched[1] else 1.0  # value - inner
        if node.op is Op.SUB and batched[0]:
            shift = -shift
        return inner, sign * np.eye(width), shift.copy()
    return None
