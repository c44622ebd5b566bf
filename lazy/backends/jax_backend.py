"""The production lowering: JAX → XLA, compiled ahead of time per bucket.

Each (graph, bucket) becomes ``jax.jit(fn).trace(...).lower().compile()``; parameters are arguments
(placed on the device once), so executables depend on structure, not values. Gathers promise
in-bounds indices (no clamping code), matmuls run at full float32 precision (no TF32 on GPUs).
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special
import jaxlib
import numpy as np
from jax import lax
from jax.experimental import serialize_executable

from ..dtypes import DTypePolicy
from ..errors import BackendError
from ..graph import Graph
from ..node import Node
from ..ops import Op
from .base import Backend, CompileTimes, Lowering, Rule, run_rules

_GATHER = "promise_in_bounds"
_PRECISION = lax.Precision.HIGHEST


def _unary(fn: Any) -> Rule:
    return lambda n, a, low: fn(a[0])


def _binary(fn: Any) -> Rule:
    return lambda n, a, low: fn(a[0], a[1])


def _slice(n: Node, a: list[Any], low: Lowering) -> Any:
    # The IR's bounds are Python's (clamped, negative from the end); lax.slice wants them in range.
    x = a[0]
    axis = n.attr("axis") % x.ndim
    start, stop, step = slice(n.attr("start"), n.attr("stop"), n.attr("step")).indices(
        x.shape[axis]
    )
    return lax.slice_in_dim(x, start, max(start, stop), step, axis=axis)


def _take(data: Any, idx: Any, axis: int) -> Any:
    # jnp.take has no in-bounds mode; one advanced index at ``axis`` has take's semantics.
    index = (slice(None),) * (axis % data.ndim) + (idx,)
    return data.at[index].get(mode=_GATHER, wrap_negative_indices=False)


def _ctz(x: Any) -> Any:
    # ~x & (x - 1) sets exactly the trailing zero bits (all bits for 0).
    return lax.population_count(~x & (x - 1)).astype(jnp.int32)


def _reduce_and(n: Node, a: list[Any], low: Lowering) -> Any:
    axes = tuple(sorted({axis % a[0].ndim for axis in n.attr("axes")}))
    out = lax.reduce_and(a[0], axes)
    return lax.expand_dims(out, axes) if n.attr("keepdims") else out


def _loop(n: Node, a: list[Any], low: Lowering) -> Any:
    # One XLA while loop, the body lowered by this same rule table (nested loops recurse): a
    # Python-unrolled loop would hand XLA trip_count copies of the body to compile.
    body = n.attr("body")
    init, invariants = a[0], a[1:]

    def step(i: Any, carry: Any) -> Any:
        values = (i, carry, *invariants)
        names = dict(zip(body.input_names, values, strict=True))
        inner = Lowering(names, {}, low.batch, low.policy)
        (out,) = run_rules(RULES, body, inner)
        return out

    return lax.fori_loop(jnp.int32(0), jnp.int32(n.attr("trip_count")), step, init)


RULES: dict[Op, Rule] = {
    Op.INPUT: lambda n, a, low: low.inputs[n.attr("name")],
    Op.PARAM: lambda n, a, low: low.params[n.attr("name")],
    Op.CONST: lambda n, a, low: jnp.asarray(n.attr("value").array, dtype=low.dtype(n)),
    Op.NEG: _unary(jnp.negative),
    Op.ABS: _unary(jnp.abs),
    Op.EXP: _unary(jnp.exp),
    Op.LOG: _unary(jnp.log),
    Op.LOG1P: _unary(jnp.log1p),
    Op.SQRT: _unary(jnp.sqrt),
    Op.TANH: _unary(jnp.tanh),
    Op.SIGMOID: _unary(jax.nn.sigmoid),
    Op.ERF: _unary(lax.erf),
    Op.NDTRI: _unary(jax.scipy.special.ndtri),
    Op.FLOOR: _unary(jnp.floor),
    Op.ISNAN: _unary(jnp.isnan),
    Op.NOT: _unary(lax.bitwise_not),
    Op.CTZ: _unary(_ctz),
    Op.ADD: _binary(jnp.add),
    Op.SUB: _binary(jnp.subtract),
    Op.MUL: _binary(jnp.multiply),
    Op.DIV: _binary(jnp.divide),
    Op.POW: _binary(jnp.power),
    Op.MAXIMUM: _binary(jnp.maximum),
    Op.MINIMUM: _binary(jnp.minimum),
    Op.EQ: _binary(jnp.equal),
    Op.NE: _binary(jnp.not_equal),
    Op.LT: _binary(jnp.less),
    Op.LE: _binary(jnp.less_equal),
    Op.GT: _binary(jnp.greater),
    Op.GE: _binary(jnp.greater_equal),
    Op.AND: _binary(jnp.bitwise_and),
    Op.OR: _binary(jnp.bitwise_or),
    Op.XOR: _binary(jnp.bitwise_xor),
    Op.WHERE: lambda n, a, low: jnp.where(a[0], a[1], a[2]),
    Op.CAST: lambda n, a, low: a[0].astype(low.dtype(n)),
    Op.MATMUL: lambda n, a, low: jnp.matmul(a[0], a[1], precision=_PRECISION),
    Op.TAKE: lambda n, a, low: _take(a[0], a[1], n.attr("axis")),
    Op.TAKE_ALONG: lambda n, a, low: jnp.take_along_axis(
        a[0], a[1], axis=n.attr("axis"), mode=_GATHER, wrap_negative_indices=False
    ),
    Op.SUM: lambda n, a, low: jnp.sum(
        a[0], axis=n.attr("axes"), keepdims=n.attr("keepdims"), dtype=low.dtype(n)
    ),
    Op.MAX: lambda n, a, low: jnp.max(a[0], axis=n.attr("axes"), keepdims=n.attr("keepdims")),
    Op.MIN: lambda n, a, low: jnp.min(a[0], axis=n.attr("axes"), keepdims=n.attr("keepdims")),
    Op.REDUCE_AND: _reduce_and,
    Op.LOGSUMEXP: lambda n, a, low: jax.nn.logsumexp(
        a[0], axis=n.attr("axes"), keepdims=n.attr("keepdims")
    ),
    Op.ARGMAX: lambda n, a, low: jnp.argmax(a[0], axis=n.attr("axis")).astype(low.dtype(n)),
    Op.SOFTMAX: lambda n, a, low: jax.nn.softmax(a[0], axis=n.attr("axis")),
    Op.CONCAT: lambda n, a, low: jnp.concatenate(a, axis=n.attr("axis")),
    Op.SLICE: _slice,
    Op.RESHAPE: lambda n, a, low: jnp.reshape(a[0], low.shape(n)),
    Op.BROADCAST: lambda n, a, low: jnp.broadcast_to(a[0], low.shape(n)),
    Op.TRANSPOSE: lambda n, a, low: jnp.transpose(a[0], n.attr("perm")),
    Op.LOOP: _loop,
}


class JaxExecutable:
    """A compiled XLA executable for one bucket; numpy in, numpy out.

    After its first call an AOT ``Compiled`` holds a C++ dispatch function; calling that directly
    skips a Python frame on every request.
    """

    __slots__ = ("_call", "compiled")

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self._call = self._first_call

    def _first_call(self, *args: Any) -> Any:
        outs = self.compiled(*args)
        self._call = getattr(self.compiled, "_call", None) or self.compiled
        return outs

    def __call__(self, inputs: Sequence[np.ndarray], params: Sequence[Any]) -> list[np.ndarray]:
        return [np.asarray(o) for o in self._call(*inputs, *params)]


class JaxBackend(Backend):
    name = "jax"
    rules = RULES

    def __init__(self, device: Any = None) -> None:
        self.device = device if device is not None else jax.devices()[0]
        self._sharding = jax.sharding.SingleDeviceSharding(self.device)

    def fingerprint(self) -> str:
        return ";".join(
            [
                f"jax={jax.__version__}",
                f"jaxlib={jaxlib.__version__}",
                f"platform={self.device.platform}",
                f"device_kind={self.device.device_kind}",
                f"x64={bool(jax.config.jax_enable_x64)}",
                f"xla_flags={os.environ.get('XLA_FLAGS', '')}",
            ]
        )

    def _check_policy(self, policy: DTypePolicy) -> None:
        if policy is DTypePolicy.X64 and not jax.config.jax_enable_x64:
            raise BackendError("dtype policy x64 needs jax_enable_x64; use x32 or enable it")

    def prepare_params(self, values: Sequence[np.ndarray], policy: DTypePolicy) -> Any:
        self._check_policy(policy)
        return tuple(
            jax.device_put(np.asarray(v, dtype=policy.lower(v.dtype.name)), self.device)
            for v in values
        )

    def _specs(self, nodes: Sequence[Node], batch: int, policy: DTypePolicy) -> list[Any]:
        low = Lowering({}, {}, batch, policy)
        return [
            jax.ShapeDtypeStruct(low.shape(n), low.dtype(n), sharding=self._sharding) for n in nodes
        ]

    def compile(
        self, graph: Graph, bucket: int, policy: DTypePolicy
    ) -> tuple[JaxExecutable, CompileTimes]:
        self._check_policy(policy)
        names = graph.input_names
        pnames = [n.attr("name") for n in graph.param_nodes]

        def fn(*args: Any) -> tuple[Any, ...]:
            low = Lowering(
                dict(zip(names, args[: len(names)], strict=True)),
                dict(zip(pnames, args[len(names) :], strict=True)),
                bucket,
                policy,
            )
            return tuple(run_rules(RULES, graph, low))

        specs = self._specs(graph.inputs, bucket, policy) + self._specs(
            graph.param_nodes, bucket, policy
        )
        t0 = time.perf_counter()
        traced = jax.jit(fn).trace(*specs)
        t1 = time.perf_counter()
        lowered = traced.lower()
        t2 = time.perf_counter()
        compiled = lowered.compile()
        t3 = time.perf_counter()
        return JaxExecutable(compiled), CompileTimes(t1 - t0, t2 - t1, t3 - t2)

    def serialize(self, executable: Any) -> bytes:
        payload, in_tree, out_tree = serialize_executable.serialize(executable.compiled)
        return pickle.dumps((payload, in_tree, out_tree), protocol=pickle.HIGHEST_PROTOCOL)

    def deserialize(self, payload: bytes) -> JaxExecutable:
        # Only called on files whose integrity the cache checked, in a directory the operator
        # trusts: unpickling and loading an executable run code by design.
        blob, in_tree, out_tree = pickle.loads(payload)
        compiled = serialize_executable.deserialize_and_load(
            blob, in_tree, out_tree, execution_devices=[self.device]
        )
        return JaxExecutable(compiled)


BACKEND_CLASS = JaxBackend
