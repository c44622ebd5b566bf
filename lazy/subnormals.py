"""Subnormal inputs on backends that flush them to zero.

XLA:CPU runs its executables with flush-to-zero and denormals-are-zero set: a subnormal float
(0 < |x| < 1.2e-38 in float32) reads as zero. A tree split at 0.0 then sends x = 1e-45 left,
where scikit-learn (numpy, which honours subnormals) sends it right — and the parity gate's
probes, the float32 neighbours of every threshold, are such values. Whether a backend flushes is
measured, not assumed (:func:`flushes`: a one-compare graph run once per backend and dtype), and
where it does the executor recomputes the rows holding a subnormal input on the host plan
(:func:`subnormal_rows` finds them in one pass over the inputs' bits). Each row's answer then
depends on that row alone, and a batch without subnormals — every real one, nearly — runs as
before.

Only inputs that reach a decision (:func:`decision_inputs`: a comparison, a floor, a tree walk,
a max) other than through a sum are checked. A sum (a matmul, a reduction) absorbs a subnormal
term below the float32 resolution of its other terms and its intercept: a linear model's
flushed input moves its scores far less than float32 rounding already does, and no check is
paid for it.

A threshold that is itself subnormal is read as zero too, and zero sits on the other side of
some of them: XGBoost's ``x < 0.0`` becomes ``x > -1.4e-45`` in the trees' ``x > t`` form, which
a flushing backend reads as ``x > 0`` and so sends ``x = 0`` left. :func:`for_flushing` moves
every subnormal parameter a comparison reads to the nearest zero or normal value on the side that
orders every zero and normal operand as the subnormal does; the host plan keeps the parameters as
they are. Subnormals a graph computes from normal inputs (a difference of two numbers below
2.4e-38) are still flushed on such a backend; the parity gate is what would see a decision they
change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import native
from .backends.base import Backend
from .dtypes import FLOATS, DTypePolicy
from .graph import Graph
from .loop import within
from .node import Node
from .ops import Op
from .program import Builder

# Per float dtype: its bits as an unsigned integer, the mask of all bits but the sign, and the
# largest subnormal's bits (a magnitude of bits 1 .. this is subnormal).
_BITS = {
    np.dtype(np.float32): (np.uint32, np.uint32(0x7FFF_FFFF), np.uint32(0x007F_FFFF)),
    np.dtype(np.float64): (
        np.uint64,
        np.uint64(0x7FFF_FFFF_FFFF_FFFF),
        np.uint64(0x000F_FFFF_FFFF_FFFF),
    ),
}
_measured: dict[tuple[str, str], bool] = {}
_lock = threading.Lock()


def flushes(backend: Backend, policy: DTypePolicy) -> bool:
    """Whether ``backend``'s executables read a subnormal float (the policy's widest) as zero."""
    dtype = policy.lower("float64")
    key = (backend.fingerprint(), dtype)
    with _lock:
        if key not in _measured:
            _measured[key] = _reads_as_zero(backend, policy, np.dtype(dtype))
        return _measured[key]


# Ops whose result a subnormal operand can flip, not merely nudge: comparisons, a floor
# (floor(-1e-45) is -1), tree walks, maxima, a cast to an integer or boolean (1e-45 != 0), and
# nodes holding graphs of their own (loops, variants), taken whole.
_DECISIONS = frozenset(
    {
        Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.FLOOR, Op.REMAINDER, Op.FOREST_SUM, Op.FOREST_SHAP,
        Op.MAX, Op.MIN, Op.ARGMAX, Op.MAXIMUM, Op.MINIMUM, Op.COUPLE, Op.LOOP, Op.VARIANT,
    }
)  # fmt: skip
# Ops that sum their operands' terms: a subnormal term is lost below the others' resolution.
_SUMS = frozenset({Op.MATMUL, Op.SUM, Op.LOGSUMEXP, Op.SOFTMAX})


def decision_inputs(graph: Graph) -> frozenset[str]:
    """The inputs whose values reach a decision of ``graph`` other than through a sum."""
    reach: dict[Node, frozenset[str]] = {}
    found: set[str] = set()
    for node in graph.order:
        if node.op is Op.INPUT:
            reach[node] = frozenset({node.attr("name")})
            continue
        upstream = frozenset().union(*(reach.get(n, frozenset()) for n in node.inputs))
        decides = node.op in _DECISIONS or (
            node.op is Op.CAST and node.dtype not in FLOATS and node.inputs[0].dtype in FLOATS
        )
        if decides:
            found |= upstream
        reach[node] = frozenset() if node.op in _SUMS else upstream
    return frozenset(found)


def subnormal_rows(arrays: Sequence[np.ndarray]) -> np.ndarray | None:
    """The indices of the rows holding a subnormal value in any float array (None: none)."""
    found: np.ndarray | None = None
    for array in arrays:
        bits = _BITS.get(array.dtype)
        if bits is None or array.size == 0:
            continue
        unsigned, magnitude, largest = bits
        flat = array.reshape(-1).view(unsigned)
        if not _any(flat, magnitude, largest):  # every batch, nearly: one fused pass
            continue
        rows = _hits(flat, magnitude, largest).reshape(len(array), -1).any(axis=1)
        found = rows if found is None else found | rows
    return None if found is None else np.flatnonzero(found)


def _hits(bits: np.ndarray, magnitude: np.unsignedinteger, largest: np.unsignedinteger) -> Any:
    # One compare for 1 <= m <= largest: m - 1 wraps to the top for zero.
    return (bits & magnitude) - bits.dtype.type(1) < largest


def _lowest_loop(word: type) -> Callable[..., Any]:
    """The min reduction of :func:`_any` for ``word`` (its bits' unsigned type): numba widens
    scalar integer arithmetic to 64 bits, and the cast back keeps LLVM's vectors 32-bit wide
    for float32's bits."""

    def lowest_of(bits: np.ndarray, magnitude: Any, one: Any) -> Any:
        lowest = word(-1)  # the top: ``one`` keeps the arithmetic unsigned
        for i in range(bits.size):  # a min reduction, vectorized by LLVM
            lowest = min(lowest, word((bits[i] & magnitude) - one))
        return lowest

    return lowest_of


_kernels: dict[np.dtype, Any] = {}


def _any(bits: np.ndarray, magnitude: np.unsignedinteger, largest: np.unsignedinteger) -> bool:
    """Whether any of ``bits`` is a subnormal's: the smallest magnitude less one (zero wraps to
    the top), compared once. numba's single pass where installed (numpy's takes three, each
    with its temporary)."""
    one = bits.dtype.type(1)
    if not native.AVAILABLE:
        return bool(((bits & magnitude) - one).min() < largest)
    kernel = _kernels.get(bits.dtype)
    if kernel is None:
        kernel = _kernels[bits.dtype] = native.compile_kernel(_lowest_loop(bits.dtype.type))
    return bool(kernel(bits, magnitude, one) < largest)


def _reads_as_zero(backend: Backend, policy: DTypePolicy, dtype: np.dtype) -> bool:
    b = Builder()
    x = b.input("x", (1,), str(dtype))
    graph = b.graph({"positive": x > 0})
    exe, _ = backend.compile(graph, 1, policy)
    tiny = np.full((1, 1), np.finfo(dtype).smallest_subnormal, dtype)
    (positive,) = exe([tiny], backend.prepare_params(graph.param_values(), policy))
    return not bool(np.asarray(positive).ravel()[0])


# How a comparison's parameter operand must be rounded off the subnormals so that every zero and
# normal operand on the other side is ordered as before: to the largest zero-or-normal value at or
# below it where the comparison holds strictly above the parameter (``x > t``, ``x <= t``), to the
# smallest at or above it where it holds strictly below (``x < t``, ``x >= t``), and to NaN where
# only equality is asked (no zero or normal value equals a subnormal).
_BELOW, _ABOVE, _UNEQUAL, _OTHER = "below", "above", "unequal", "other"
_ROUNDING = {  # op → (rounding of its left operand, of its right operand)
    Op.GT: (_ABOVE, _BELOW),
    Op.LE: (_ABOVE, _BELOW),
    Op.LT: (_BELOW, _ABOVE),
    Op.GE: (_BELOW, _ABOVE),
    Op.EQ: (_UNEQUAL, _UNEQUAL),
    Op.NE: (_UNEQUAL, _UNEQUAL),
}
# Ops whose result holds some of their first operand's values unchanged (the others, if any,
# are indices or more of the same values: CONCAT's every operand).
_CARRY_FIRST = frozenset({Op.TAKE, Op.TAKE_ALONG, Op.RESHAPE, Op.BROADCAST, Op.TRANSPOSE, Op.SLICE})


def for_flushing(graph: Graph, backend: Backend, policy: DTypePolicy) -> Graph:
    """``graph`` as ``backend`` must run it if it flushes subnormals (see the module doc): each
    float parameter holding a subnormal (in the dtype the policy lowers it to) whose values reach
    only comparisons, all rounding it one way, is moved off the subnormals that way. Parameters
    with any other use keep their values; so does every graph without a subnormal parameter.
    Exact for every zero and normal operand: rows with a subnormal input run on the host plan."""
    subnormal = {
        node.attr("name")
        for node in graph.param_nodes
        if node.dtype in FLOATS and _holds_subnormal(graph.params[node.attr("name")], policy)
    }
    if not subnormal or not flushes(backend, policy):
        return graph
    roundings: dict[str, set[str]] = {name: set() for name in subnormal}
    carried = _trace(graph.order, {n: {n.attr("name")} & subnormal for n in graph.param_nodes})
    for node in graph.output_nodes:
        for name in carried(node):
            roundings[name].add(_OTHER)
    _collect(graph.order, carried, roundings)
    moved = {
        name: _rounded(graph.params[name], next(iter(ways)), policy)
        for name, ways in roundings.items()
        if len(ways) == 1 and _OTHER not in ways
    }
    return graph.replace(params=moved) if moved else graph


def _holds_subnormal(value: np.ndarray, policy: DTypePolicy) -> bool:
    lowered = value.astype(policy.lower(value.dtype.name), copy=False)
    tiny = np.finfo(lowered.dtype).tiny
    magnitude = np.abs(lowered)
    return bool(np.any((magnitude > 0) & (magnitude < tiny)))


def _rounded(value: np.ndarray, way: str, policy: DTypePolicy) -> np.ndarray:
    lowered = value.astype(policy.lower(value.dtype.name))
    tiny = lowered.dtype.type(np.finfo(lowered.dtype).tiny)
    magnitude = np.abs(lowered)
    sub = (magnitude > 0) & (magnitude < tiny)
    negative = np.signbit(lowered)
    if way == _UNEQUAL:
        moved = np.full_like(lowered, np.nan)
    elif way == _BELOW:
        moved = np.where(negative, -tiny, lowered.dtype.type(0.0))
    else:
        moved = np.where(negative, lowered.dtype.type(-0.0), tiny)
    return np.where(sub, moved, lowered).astype(value.dtype)


Carried = Callable[[Node], set[str]]


def _trace(order: Sequence[Node], seeds: dict[Node, set[str]]) -> Carried:
    """Which parameters' values each node of ``order`` holds unchanged (a gather, a reshape or
    a concatenation of them), LOOP bodies' invariants included."""
    carries: dict[Node, set[str]] = dict(seeds)
    for node, _ in within(order):
        if node.op is Op.LOOP:  # operand k is the body's input k + 1 (after the trip index)
            body = node.attr("body")
            for stand_in, operand in zip(body.inputs[1:], node.inputs, strict=True):
                # The same body may serve two loops: it holds what either passes.
                carries[stand_in] = carries.get(stand_in, set()) | carries.get(operand, set())
        elif node.op in _CARRY_FIRST:
            carries[node] = carries.get(node.inputs[0], set())
        elif node.op is Op.CONCAT:
            carries[node] = set().union(*(carries.get(n, set()) for n in node.inputs))
    return lambda node: carries.get(node, set())


def _collect(order: Sequence[Node], carried: Carried, roundings: dict[str, set[str]]) -> None:
    """Each parameter's roundings: one per comparison that reads it, ``other`` per other use."""
    for node, _ in within(order):
        ways = _ROUNDING.get(node.op)
        for k, operand in enumerate(node.inputs):
            names = carried(operand)
            if not names:
                continue
            if ways is not None:
                way = ways[k]
            elif node.op is Op.LOOP:
                way = _OTHER if k == 0 else None  # a carry may be changed; invariants traced
            elif (node.op in _CARRY_FIRST and k == 0) or node.op is Op.CONCAT:
                way = None  # traced on through the node itself
            else:
                way = _OTHER
            if way is not None:
                for name in names:
                    roundings[name].add(way)
        if node.op is Op.LOOP:
            for name in carried(node.attr("body").output):
                roundings[name].add(_OTHER)
