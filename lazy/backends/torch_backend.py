"""A second lowering of the same graphs: eager torch on the host.

It exists to keep the IR honest (two independent lowerings must agree with the interpreter) and as
a fallback where XLA is unavailable. It does not serialize executables; "compiling" is cheap.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..dtypes import DTypePolicy
from ..graph import Graph
from ..node import Node
from ..ops import Op
from .base import Backend, CompileTimes, Lowering, Rule, run_rules

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


def _tdtype(node: Node, low: Lowering) -> torch.dtype:
    return _DTYPES[low.dtype(node)]


def _take(n: Node, a: list[torch.Tensor], low: Lowering) -> torch.Tensor:
    data, idx = a
    axis = n.attr("axis") % data.ndim
    flat = torch.index_select(data, axis, idx.reshape(-1).to(torch.int64))
    return flat.reshape(low.shape(n))


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
    return torch.sum(a[0], dim=n.attr("axes"), keepdim=n.attr("keepdims"), dtype=_tdtype(n, low))


RULES: dict[Op, Rule] = {
    Op.INPUT: lambda n, a, low: low.inputs[n.attr("name")],
    Op.PARAM: lambda n, a, low: low.params[n.attr("name")],
    Op.CONST: lambda n, a, low: torch.from_numpy(
        np.asarray(n.attr("value").array, dtype=low.dtype(n)).copy()
    ),
    Op.NEG: _unary(torch.neg),
    Op.ABS: _unary(torch.abs),
    Op.EXP: _unary(torch.exp),
    Op.LOG: _unary(torch.log),
    Op.LOG1P: _unary(torch.log1p),
    Op.SQRT: _unary(torch.sqrt),
    Op.TANH: _unary(torch.tanh),
    Op.SIGMOID: _unary(torch.sigmoid),
    Op.ERF: _unary(torch.erf),
    Op.FLOOR: _unary(torch.floor),
    Op.ISNAN: _unary(torch.isnan),
    Op.NOT: lambda n, a, low: (
        torch.logical_not(a[0]) if a[0].dtype == torch.bool else torch.bitwise_not(a[0])
    ),
    Op.ADD: _binary(torch.add),
    Op.SUB: _binary(torch.sub),
    Op.MUL: _binary(torch.mul),
    Op.DIV: _binary(torch.div),
    Op.POW: _binary(torch.pow),
    Op.MAXIMUM: _binary(torch.maximum),
    Op.MINIMUM: _binary(torch.minimum),
    Op.EQ: _binary(torch.eq),
    Op.NE: _binary(torch.ne),
    Op.LT: _binary(torch.lt),
    Op.LE: _binary(torch.le),
    Op.GT: _binary(torch.gt),
    Op.GE: _binary(torch.ge),
    Op.AND: _binary(torch.bitwise_and),
    Op.OR: _binary(torch.bitwise_or),
    Op.XOR: _binary(torch.bitwise_xor),
    Op.WHERE: lambda n, a, low: torch.where(a[0], a[1], a[2]),
    Op.CAST: lambda n, a, low: a[0].to(_tdtype(n, low)),
    Op.MATMUL: _binary(torch.matmul),
    Op.TAKE: _take,
    Op.TAKE_ALONG: lambda n, a, low: torch.take_along_dim(
        a[0], a[1].to(torch.int64), dim=n.attr("axis")
    ),
    Op.SUM: _sum,
    Op.MAX: _reduce(torch.amax),
    Op.MIN: _reduce(torch.amin),
    Op.LOGSUMEXP: _reduce(torch.logsumexp),
    Op.ARGMAX: lambda n, a, low: torch.argmax(a[0], dim=n.attr("axis")).to(_tdtype(n, low)),
    Op.SOFTMAX: lambda n, a, low: torch.softmax(a[0], dim=n.attr("axis")),
    Op.CONCAT: lambda n, a, low: torch.cat(a, dim=n.attr("axis")),
    Op.SLICE: _slice,
    Op.RESHAPE: lambda n, a, low: a[0].reshape(low.shape(n)),
    Op.BROADCAST: lambda n, a, low: a[0].broadcast_to(low.shape(n)),
    Op.TRANSPOSE: lambda n, a, low: a[0].permute(n.attr("perm")),
}


class TorchExecutable:
    """Runs the rule table eagerly under ``torch.inference_mode``."""

    __slots__ = ("_graph", "_inames", "_pnames", "_policy", "bucket")

    def __init__(self, graph: Graph, bucket: int, policy: DTypePolicy) -> None:
        self._graph = graph
        self._inames = graph.input_names
        self._pnames = [n.attr("name") for n in graph.param_nodes]
        self._policy = policy
        self.bucket = bucket

    def __call__(self, inputs: Sequence[np.ndarray], params: Sequence[Any]) -> list[np.ndarray]:
        with torch.inference_mode():
            low = Lowering(
                {
                    k: torch.from_numpy(np.ascontiguousarray(v))
                    for k, v in zip(self._inames, inputs, strict=True)
                },
                dict(zip(self._pnames, params, strict=True)),
                self.bucket,
                self._policy,
            )
            return [o.contiguous().numpy() for o in run_rules(RULES, self._graph, low)]


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
