"""A second lowering of the same graphs: eager torch on the host.

It exists to keep the IR honest (two independent lowerings must agree with the interpreter) and as
a fallback where XLA is unavailable. It does not serialize executables; "compiling" is cheap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..dtypes import DTypePolicy
from ..graph import Graph
from ..node import Node
from ..ops import ELEMENTWISE_KINDS, SPECS, VARIANT_OPERANDS, Op
from .base import Backend, CompileTimes, Lowering, Rule
from .torch_plan import LoopStep, Plan, RuleSet

_DTYPES = {
    "bool": torch.bool,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint32": torch.uint32,
    "uint64": torch.uint64,
    "float32": torch.float32,
    "float64": torch.float64,
}


def _unary(fn: Any) -> Rule:
    return lambda n, a, low: fn(a[0])


def _binary(fn: Any) -> Rule:
    return lambda n, a, low: fn(a[0], a[1])


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    # IEEE's square root is correctly rounded; torch's vectorized float64 one is not on every
    # CPU build (docs/exactness.md), so float64 takes numpy's.
    if x.dtype == torch.float64:
        with np.errstate(invalid="ignore"):  # NaN for a negative value, as torch's, silently
            return torch.from_numpy(np.sqrt(x.numpy()))
    return torch.sqrt(x)


def _remainder(n: Node, a: list[Any], low: Lowering) -> torch.Tensor:
    # numpy's float %: torch.remainder goes through a floor division (inexact); fmod is exact.
    x, y = a
    r = torch.fmod(x, y)
    r = torch.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)
    return torch.where(r == 0, torch.copysign(torch.zeros_like(r), y), r)


def _tdtype(node: Node, low: Lowering) -> torch.dtype:
    return _DTYPES[low.dtype(node)]


# torch has few CPU kernels for uint32 / uint64 (no add, compare, max, sum, gather, ...). Unsigned
# operands are lowered onto signed ones: wrapping arithmetic, bitwise ops and data movement act on
# the same bits viewed as the signed type of the same width; order-dependent ops act on a signed
# key of the same order (uint32 widened to int64; uint64 with its top bit flipped).
_SIGNED = {torch.uint32: torch.int32, torch.uint64: torch.int64}
_INT64_MIN = -(2**63)


def _order_key(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.uint32:
        return t.to(torch.int64)
    if t.dtype == torch.uint64:
        return t.view(torch.int64) ^ _INT64_MIN
    return t


def _from_order_key(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.uint32:
        return t.to(torch.uint32)
    return (t ^ _INT64_MIN).view(torch.uint64)


class _Unsigned:
    """A rule with its lowering for unsigned operands, chosen per call; :meth:`specialise`
    chooses once, from the node's static operand dtypes (no per-call dtype dispatch)."""

    __slots__ = ("lowered", "rule", "static")

    def __init__(
        self, rule: Rule, lowered: Rule, static: Callable[[Node, Lowering], Rule] | None
    ) -> None:
        self.rule = rule
        self.lowered = lowered
        self.static = static  # the unsigned lowering for one node; None: ``lowered`` as it is

    def __call__(self, n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
        return self.lowered(n, a, low)

    def specialise(self, n: Node, low: Lowering) -> Rule:
        if not any(_DTYPES[low.dtype(i)] in _SIGNED for i in n.inputs):
            return self.rule
        return self.static(n, low) if self.static else self.lowered


def specialise(rule: Rule, n: Node, low: Lowering) -> Rule:
    """``rule`` for ``n``'s static operand dtypes (see :class:`_Unsigned`)."""
    return rule.specialise(n, low) if isinstance(rule, _Unsigned) else rule


def _signed_bits(rule: Rule, *, native: bool = False) -> Rule:
    """``rule`` on unsigned operands viewed as signed; an unsigned result is viewed back.

    ``native``: torch has unsigned kernels for the op (where, bitwise and/or/xor), so a node whose
    dtypes are known needs no views.
    """

    def lowered(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
        if not any(t.dtype in _SIGNED for t in a):
            return rule(n, a, low)
        out = rule(n, [t.view(_SIGNED[t.dtype]) if t.dtype in _SIGNED else t for t in a], low)
        want = _tdtype(n, low)
        return out.view(want) if want in _SIGNED else out

    def static(n: Node, low: Lowering) -> Rule:
        if native:
            return rule
        views = [_SIGNED.get(_DTYPES[low.dtype(i)]) for i in n.inputs]
        back = _tdtype(n, low) if _tdtype(n, low) in _SIGNED else None

        def viewed(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
            out = rule(n, [t.view(v) if v else t for t, v in zip(a, views, strict=True)], low)
            return out.view(back) if back else out

        return viewed

    return _Unsigned(rule, lowered, static)


def _signed_order(rule: Rule, *, values: bool) -> Rule:
    """``rule`` on order keys of unsigned operands; ``values``: its result is a key to map back."""

    def lowered(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
        dtype = next((t.dtype for t in a if t.dtype in _SIGNED), None)
        if dtype is None:
            return rule(n, a, low)
        out = rule(n, [_order_key(t) for t in a], low)
        return _from_order_key(out, dtype) if values else out

    return _Unsigned(rule, lowered, None)


def _abs(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
    return a[0] if a[0].dtype in _SIGNED else torch.abs(a[0])


def _take(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
    data, idx = a
    axis = n.attr("axis") % data.ndim
    flat = torch.index_select(data, axis, idx.reshape(-1))  # int32 or int64 indices
    return flat.reshape(low.shape(n))


def _update(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
    x, idx, value = a
    out = x.clone()  # values are immutable: a loop's carry is copied once per iteration
    out.select(n.attr("axis") % x.ndim, int(idx)).copy_(value)
    return out


def _slice(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
    x = a[0]
    axis = n.attr("axis") % x.ndim
    index = (slice(None),) * axis + (slice(n.attr("start"), n.attr("stop"), n.attr("step")),)
    return x[index]


def _reduce(fn: Any) -> Rule:
    def rule(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
        axes = n.attr("axes")
        if not axes:  # torch reads an empty dim list as "all axes"
            return a[0]
        return fn(a[0], dim=axes, keepdim=n.attr("keepdims"))

    return rule


def _sum(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
    if not n.attr("axes"):
        return a[0]
    dtype = _tdtype(n, low)
    dtype = _SIGNED.get(dtype, dtype)  # unsigned sums run on signed views (see _signed_bits)
    return torch.sum(a[0], dim=n.attr("axes"), keepdim=n.attr("keepdims"), dtype=dtype)


def _ctz(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
    # torch has no bit counting: the lowest set bit x & -x (on the signed view) is ±2**k, which
    # float64 holds exactly; frexp gives k + 1.
    x = a[0]
    bits = torch.iinfo(x.dtype).bits
    lowest = (x & torch.neg(x)).to(torch.float64).abs()
    k = torch.frexp(lowest).exponent - 1
    return torch.where(x == 0, bits, k).to(torch.int32)


def _reduce_and(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
    # No bitwise reduction in torch: AND halves of the reduced axes until one element is left.
    x = a[0]
    axes = sorted({axis % x.ndim for axis in n.attr("axes")})
    keep = [i for i in range(x.ndim) if i not in axes]
    if any(x.shape[i] == 0 for i in axes):  # the empty AND: all ones
        return torch.full(low.shape(n), -1 if x.dtype != torch.bool else True, dtype=x.dtype)
    x = x.permute(*keep, *axes).reshape(*(x.shape[i] for i in keep), -1)
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = torch.cat([x[..., :half] & x[..., half : 2 * half], x[..., 2 * half :]], dim=-1)
    return x.squeeze(-1).reshape(low.shape(n))


def _loop(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
    # Outside a compiled plan (a rule table run directly): compile this one loop and run it.
    return LoopStep(n, low, RULESET)(a)


RULES: dict[Op, Rule] = {
    Op.INPUT: lambda n, a, low: low.inputs[n.attr("name")],
    Op.PARAM: lambda n, a, low: low.params[n.attr("name")],
    Op.CONST: lambda n, a, low: torch.from_numpy(
        np.asarray(n.attr("value").array, dtype=low.dtype(n)).copy()
    ),
    Op.NEG: _signed_bits(_unary(torch.neg)),
    Op.ABS: _abs,
    Op.EXP: _unary(torch.exp),
    Op.LOG: _unary(torch.log),
    Op.LOG1P: _unary(torch.log1p),
    Op.EXPM1: _unary(torch.expm1),
    Op.SQRT: _unary(_sqrt),
    Op.TANH: _unary(torch.tanh),
    Op.SIGMOID: _unary(torch.sigmoid),
    Op.ERF: _unary(torch.erf),
    Op.NDTRI: _unary(torch.special.ndtri),
    Op.FLOOR: _unary(torch.floor),
    Op.ISNAN: _unary(torch.isnan),
    Op.NOT: _signed_bits(
        lambda n, a, low: (
            torch.logical_not(a[0]) if a[0].dtype == torch.bool else torch.bitwise_not(a[0])
        )
    ),
    Op.CTZ: _signed_bits(_ctz),
    Op.ADD: _signed_bits(_binary(torch.add)),
    Op.SUB: _signed_bits(_binary(torch.sub)),
    Op.MUL: _signed_bits(_binary(torch.mul)),
    Op.DIV: _binary(torch.div),
    Op.POW: _binary(torch.pow),
    Op.REMAINDER: _remainder,
    Op.MAXIMUM: _signed_order(_binary(torch.maximum), values=True),
    Op.MINIMUM: _signed_order(_binary(torch.minimum), values=True),
    Op.EQ: _binary(torch.eq),
    Op.NE: _binary(torch.ne),
    Op.LT: _signed_order(_binary(torch.lt), values=False),
    Op.LE: _signed_order(_binary(torch.le), values=False),
    Op.GT: _signed_order(_binary(torch.gt), values=False),
    Op.GE: _signed_order(_binary(torch.ge), values=False),
    Op.AND: _signed_bits(_binary(torch.bitwise_and), native=True),
    Op.OR: _signed_bits(_binary(torch.bitwise_or), native=True),
    Op.XOR: _signed_bits(_binary(torch.bitwise_xor), native=True),
    Op.WHERE: _signed_bits(lambda n, a, low: torch.where(a[0], a[1], a[2]), native=True),
    Op.CAST: lambda n, a, low: a[0].to(_tdtype(n, low)),
    Op.MATMUL: _binary(torch.matmul),
    Op.TAKE: _signed_bits(_take),
    Op.TAKE_ALONG: _signed_bits(
        lambda n, a, low: torch.take_along_dim(a[0], a[1].to(torch.int64), dim=n.attr("axis"))
    ),
    Op.UPDATE: _signed_bits(_update),
    Op.SUM: _signed_bits(_sum),
    Op.MAX: _signed_order(_reduce(torch.amax), values=True),
    Op.MIN: _signed_order(_reduce(torch.amin), values=True),
    Op.REDUCE_AND: _signed_bits(_reduce_and),
    Op.LOGSUMEXP: _reduce(torch.logsumexp),
    Op.ARGMAX: _signed_order(
        lambda n, a, low: torch.argmax(a[0], dim=n.attr("axis")).to(_tdtype(n, low)), values=False
    ),
    Op.SOFTMAX: lambda n, a, low: torch.softmax(a[0], dim=n.attr("axis")),
    Op.CONCAT: lambda n, a, low: torch.cat(a, dim=n.attr("axis")),
    Op.SLICE: _slice,
    Op.RESHAPE: lambda n, a, low: a[0].reshape(low.shape(n)),
    Op.BROADCAST: lambda n, a, low: a[0].broadcast_to(low.shape(n)),
    Op.TRANSPOSE: lambda n, a, low: a[0].permute(n.attr("perm")),
    Op.LOOP: _loop,
    # The executor specializes graphs before lowering; a graph given as is runs the device one.
    Op.VARIANT: lambda n, a, low: a[VARIANT_OPERANDS["device"]],
}


# --- batching over loop iterations (see torch_plan) ---------------------------------------------
# A varying value of logical shape ``s`` is held as ``(iterations, *s)``.


def _unsqueeze(x: torch.Tensor, pad: int) -> torch.Tensor:
    """``x`` with ``pad`` unit axes after its leading (iteration) axis."""
    for _ in range(pad):
        x = x.unsqueeze(1)
    return x


def _batched_elementwise(n: Node, varying: tuple[bool, ...], low: Lowering) -> Rule:
    rule = specialise(RULES[n.op], n, low)
    rank = len(n.shape)
    # Invariant operands broadcast against the leading iteration axis as they are; a varying one
    # of lower rank than the result needs its broadcast axes between the iteration axis and its own.
    pads = tuple(
        rank - len(i.shape) if v and len(i.shape) < rank else 0
        for i, v in zip(n.inputs, varying, strict=True)
    )
    if not any(pads):
        return rule

    def batched(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
        return rule(n, [_unsqueeze(x, p) for x, p in zip(a, pads, strict=True)], low)

    return batched


def _batched_take(n: Node, varying: tuple[bool, ...], low: Lowering) -> Rule | None:
    data_varies, idx_varies = varying
    if data_varies and idx_varies:  # a different table per iteration: left sequential
        return None
    data_node, idx_node = n.inputs
    axis = n.attr("axis") % len(data_node.shape)
    flat = len(idx_node.shape) == 0  # one index per iteration: no reshapes around index_select
    if data_varies:

        def rows(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
            data, idx = a
            if flat:
                return torch.index_select(data, axis + 1, idx.reshape(1)).squeeze(axis + 1)
            out = torch.index_select(data, axis + 1, idx.reshape(-1))
            return out.reshape(*data.shape[: axis + 1], *idx.shape, *data.shape[axis + 2 :])

        return specialise(_signed_bits(rows), n, low)

    def tables(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
        data, idx = a
        if flat:
            out = torch.index_select(data, axis, idx)
        else:
            out = torch.index_select(data, axis, idx.reshape(-1))
            out = out.reshape(*data.shape[:axis], *idx.shape, *data.shape[axis + 1 :])
        return out.movedim(axis, 0) if axis else out

    return specialise(_signed_bits(tables), n, low)


def batcher(n: Node, varying: tuple[bool, ...], low: Lowering) -> Rule | None:
    """The rule computing ``n`` for a chunk of loop iterations at once, or None (see torch_plan)."""
    if SPECS[n.op].kind in ELEMENTWISE_KINDS:
        return _batched_elementwise(n, varying, low)
    if n.op is Op.TAKE:
        return _batched_take(n, varying, low)
    return None


def _signed(t: torch.Tensor) -> torch.Tensor:
    return t.view(_SIGNED[t.dtype]) if t.dtype in _SIGNED else t


def scatter(carry: torch.Tensor, axis: int, idx: torch.Tensor, values: torch.Tensor) -> None:
    """``carry[..., idx[k], ...] = values[..., k, ...]`` along ``axis``, in place."""
    _signed(carry).index_copy_(axis, idx.to(torch.int64), _signed(values))


def assign(carry: torch.Tensor, axis: int, idx: int, value: torch.Tensor) -> None:
    """``carry[..., idx, ...] = value`` along ``axis``, in place."""
    _signed(carry).select(axis, idx).copy_(_signed(value))


RULESET = RuleSet(RULES, batcher, scatter, assign, specialise)


class TorchExecutable:
    """A graph flattened once into a :class:`~.torch_plan.Plan`, run eagerly under
    ``torch.inference_mode``."""

    __slots__ = ("_plan", "bucket")
    any_rows = False  # its plan's reshapes bake in the bucket's rows

    def __init__(self, graph: Graph, bucket: int, policy: DTypePolicy) -> None:
        # Leaves are fed per call: the inputs, then the parameters (in param_nodes order).
        low = Lowering({}, {}, bucket, policy)
        leaves = (*graph.inputs, *graph.param_nodes)
        self._plan = Plan(graph.order, leaves, graph.output_nodes, low, RULESET)
        self.bucket = bucket

    def __call__(self, inputs: Sequence[np.ndarray], params: Sequence[Any]) -> list[np.ndarray]:
        with torch.inference_mode():
            leaves = [torch.from_numpy(np.ascontiguousarray(v)) for v in inputs]
            leaves.extend(params)
            return [o.contiguous().numpy() for o in self._plan(leaves)]


class TorchBackend(Backend):
    name = "torch"
    rules = RULES

    def fingerprint(self) -> str:
        return f"torch={torch.__version__};device=cpu;threads={torch.get_num_threads()}"

    def prepare_params(self, values: Sequence[np.ndarray], policy: DTypePolicy) -> Any:
        return tuple(
            torch.from_numpy(np.array(v, dtype=policy.lower(v.dtype.name))) for v in values
        )

    def compile(
        self, graph: Graph, bucket: int, policy: DTypePolicy
    ) -> tuple[TorchExecutable, CompileTimes]:
        t0 = time.perf_counter()
        exe = TorchExecutable(graph, bucket, policy)
        return exe, CompileTimes(compile_s=time.perf_counter() - t0)


BACKEND_CLASS = TorchBackend
