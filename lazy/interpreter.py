"""The reference interpreter: numpy in float64, the oracle every backend is tested against.

Floating-point values are computed in float64 and signed integers in int64 whatever their declared
dtype, so the interpreter states what a graph *means* rather than how one backend rounds it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import coupling, forest, treeshap
from . import dtypes as dt
from .errors import InputError
from .graph import Graph
from .node import Node
from .ops import VARIANT_OPERANDS, Op
from .program import HostStage, Program, run_stages
from .shapes import concrete


@dataclass(frozen=True)
class Context:
    """What leaf rules read, and the batch size BROADCAST may need."""

    inputs: Mapping[str, Any]
    params: Mapping[str, np.ndarray]
    batch: int


Rule = Callable[[Node, list[np.ndarray], Context], np.ndarray]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


_erf = np.frompyfunc(math.erf, 1, 1)


def _ndtri(p: np.ndarray) -> np.ndarray:
    # Imported on first use: scipy.special takes longer to import than the rest of lazy.
    from scipy.special import ndtri

    return ndtri(np.asarray(p, np.float64))


# The helpers below keep their operands' float dtype, so the numpy backend shares them; callers
# run them with float errors ignored (log(0) is -inf, as on every backend).
def logsumexp(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axes)


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _in_bounds(n: Node, data: np.ndarray, idx: np.ndarray) -> np.ndarray:
    # Backends may assume in-bounds indices (no clamping or fill): the oracle enforces it.
    size = data.shape[n.attr("axis")]
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise IndexError(f"{n!r}: indices outside [0, {size}): {idx.min()}..{idx.max()}")
    return idx


def update_at(x: np.ndarray, axis: int, index: int, value: np.ndarray) -> np.ndarray:
    """A copy of ``x`` with ``value`` at ``index`` of ``axis`` (``x`` itself is never written)."""
    out = x.copy()
    out[(slice(None),) * axis + (index,)] = value
    return out


def _update(n: Node, x: np.ndarray, idx: np.ndarray, value: np.ndarray) -> np.ndarray:
    _in_bounds(n, x, idx)
    return update_at(x, n.attr("axis") % x.ndim, int(idx), value)


def _ctz(n: Node, x: np.ndarray) -> np.ndarray:
    # The lowest set bit, isolated in the operand's own width, is a power of two that float64
    # holds exactly: frexp gives its exponent. The oracle widens int32, so take the width from
    # the declared dtype.
    bits = np.dtype(n.inputs[0].dtype).itemsize * 8
    u = x.astype(np.dtype(f"uint{bits}"))
    low = u & (~u + np.array(1, u.dtype))
    exponent = np.frexp(low.astype(np.float64))[1]
    return np.where(u == 0, bits, exponent - 1)


def _reduce_and(n: Node, x: np.ndarray) -> np.ndarray:
    return np.bitwise_and.reduce(x, axis=n.attr("axes"), keepdims=n.attr("keepdims"))


def _slice(n: Node, x: np.ndarray) -> np.ndarray:
    axis = n.attr("axis") % x.ndim
    index = (slice(None),) * axis + (slice(n.attr("start"), n.attr("stop"), n.attr("step")),)
    return x[index]


def _couple(n: Node, r: np.ndarray) -> np.ndarray:
    # COUPLE means its LOOP formulation: the reference runs that.
    graph = coupling.loop_graph(n.attr("classes"), dt.oracle(n.dtype))
    return evaluate(graph, {"r": r})["p"]


def _loop(n: Node, args: list[np.ndarray], ctx: Context) -> np.ndarray:
    # A Python loop over the body's nodes: the index is a scalar, the carry and the invariants
    # keep their (float64 / int64) oracle arrays from iteration to iteration. Every trip runs,
    # stop_column or not: backends that end early are checked against the full count.
    body = n.attr("body")
    carry, invariants = args[0], args[1:]
    for i in range(n.attr("trip_count")):
        values = (np.asarray(i, dtype=dt.oracle("int32")), carry, *invariants)
        inner = Context(dict(zip(body.input_names, values, strict=True)), ctx.params, ctx.batch)
        carry = _run(body.order, inner)[body.output]
    return carry


def _elementwise(fn: Callable[..., Any]) -> Rule:
    return lambda n, args, ctx: fn(*args)


RULES: dict[Op, Rule] = {
    Op.INPUT: lambda n, a, ctx: np.asarray(ctx.inputs[n.attr("name")]),
    Op.PARAM: lambda n, a, ctx: np.asarray(ctx.params[n.attr("name")]),
    Op.CONST: lambda n, a, ctx: n.attr("value").array,
    Op.NEG: _elementwise(np.negative),
    Op.ABS: _elementwise(np.abs),
    Op.EXP: _elementwise(np.exp),
    Op.LOG: _elementwise(np.log),
    Op.LOG1P: _elementwise(np.log1p),
    Op.EXPM1: _elementwise(np.expm1),
    Op.SQRT: _elementwise(np.sqrt),
    Op.TANH: _elementwise(np.tanh),
    Op.SIGMOID: _elementwise(_sigmoid),
    Op.ERF: lambda n, a, ctx: _erf(a[0]).astype(np.float64),
    Op.NDTRI: _elementwise(_ndtri),
    Op.FLOOR: _elementwise(np.floor),
    Op.ISNAN: _elementwise(np.isnan),
    Op.NOT: lambda n, a, ctx: np.logical_not(a[0]) if a[0].dtype == bool else np.invert(a[0]),
    Op.CTZ: lambda n, a, ctx: _ctz(n, a[0]),
    Op.ADD: _elementwise(np.add),
    Op.SUB: _elementwise(np.subtract),
    Op.MUL: _elementwise(np.multiply),
    Op.DIV: _elementwise(np.divide),
    Op.POW: _elementwise(np.power),
    Op.REMAINDER: _elementwise(np.remainder),
    Op.MAXIMUM: _elementwise(np.maximum),
    Op.MINIMUM: _elementwise(np.minimum),
    Op.EQ: _elementwise(np.equal),
    Op.NE: _elementwise(np.not_equal),
    Op.LT: _elementwise(np.less),
    Op.LE: _elementwise(np.less_equal),
    Op.GT: _elementwise(np.greater),
    Op.GE: _elementwise(np.greater_equal),
    Op.AND: _elementwise(np.bitwise_and),
    Op.OR: _elementwise(np.bitwise_or),
    Op.XOR: _elementwise(np.bitwise_xor),
    Op.WHERE: _elementwise(np.where),
    Op.CAST: lambda n, a, ctx: a[0].astype(dt.oracle(n.dtype)),
    Op.MATMUL: _elementwise(np.matmul),
    Op.TAKE: lambda n, a, ctx: np.take(a[0], _in_bounds(n, a[0], a[1]), axis=n.attr("axis")),
    Op.TAKE_ALONG: lambda n, a, ctx: np.take_along_axis(
        a[0], _in_bounds(n, a[0], a[1]), axis=n.attr("axis")
    ),
    Op.UPDATE: lambda n, a, ctx: _update(n, *a),
    Op.FOREST_SUM: lambda n, a, ctx: forest.reference(
        *a, trees=n.attr("trees"), depth=n.attr("depth")
    ),
    Op.COUPLE: lambda n, a, ctx: _couple(n, a[0]),
    Op.FOREST_SHAP: lambda n, a, ctx: treeshap.reference(*a, players=n.attr("players")),
    Op.SUM: lambda n, a, ctx: np.sum(a[0], axis=n.attr("axes"), keepdims=n.attr("keepdims")),
    Op.MAX: lambda n, a, ctx: np.max(a[0], axis=n.attr("axes"), keepdims=n.attr("keepdims")),
    Op.MIN: lambda n, a, ctx: np.min(a[0], axis=n.attr("axes"), keepdims=n.attr("keepdims")),
    Op.REDUCE_AND: lambda n, a, ctx: _reduce_and(n, a[0]),
    Op.LOGSUMEXP: lambda n, a, ctx: logsumexp(a[0], n.attr("axes"), n.attr("keepdims")),
    Op.ARGMAX: lambda n, a, ctx: np.argmax(a[0], axis=n.attr("axis")),
    Op.SOFTMAX: lambda n, a, ctx: softmax(a[0], n.attr("axis")),
    Op.CONCAT: lambda n, a, ctx: np.concatenate(a, axis=n.attr("axis")),
    Op.SLICE: lambda n, a, ctx: _slice(n, a[0]),
    Op.RESHAPE: lambda n, a, ctx: np.reshape(a[0], concrete(n.shape, ctx.batch)),
    Op.BROADCAST: lambda n, a, ctx: np.broadcast_to(a[0], concrete(n.shape, ctx.batch)),
    Op.TRANSPOSE: lambda n, a, ctx: np.transpose(a[0], n.attr("perm")),
    Op.LOOP: _loop,
    Op.VARIANT: lambda n, a, ctx: a[VARIANT_OPERANDS["device"]],  # the reference: the device one
}


def evaluate(
    graph: Graph,
    inputs: Mapping[str, Any],
    params: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Run ``graph`` on ``inputs`` (and optionally other parameter values) in float64."""
    ctx = Context(inputs, graph.params if params is None else params, _batch_size(graph, inputs))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        env = _run(graph.order, ctx)
    return {name: env[node] for name, node in graph.outputs}


def _run(order: Sequence[Node], ctx: Context) -> dict[Node, np.ndarray]:
    """Every node of ``order`` (operands first) evaluated with the rule table."""
    env: dict[Node, np.ndarray] = {}
    for node in order:
        out = RULES[node.op](node, [env[i] for i in node.inputs], ctx)
        env[node] = np.asarray(out).astype(dt.oracle(node.dtype), copy=False)
    return env


def _batch_size(graph: Graph, inputs: Mapping[str, Any]) -> int:
    sizes = set()
    for node in graph.inputs:
        name = node.attr("name")
        if name not in inputs:
            raise InputError(f"missing input {name!r}")
        sizes.add(np.shape(inputs[name])[0])
    if not sizes:
        return 0
    if len(sizes) != 1:
        raise InputError(f"inputs have different numbers of rows: {sorted(sizes)}")
    return sizes.pop()


def run_program(program: Program, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Run a whole program (graph segments and host steps) on the interpreter."""
    runners = [
        s if isinstance(s, HostStage) else (lambda env, g=s.graph: evaluate(g, env))
        for s in program.stages
    ]
    return run_stages(program, runners, inputs)
