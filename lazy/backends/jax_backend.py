"""The production lowering: JAX → XLA, compiled ahead of time per bucket.

Each (graph, bucket) becomes ``jax.jit(fn).trace(...).lower().compile()``; parameters are arguments
(placed on the device once), so executables depend on structure, not values. Gathers promise
in-bounds indices (no clamping code), matmuls run at full float32 precision (no TF32 on GPUs).
Buckets larger than ``row_block`` rows run the graph as a loop over blocks of rows.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special
import jaxlib
import numpy as np
from jax import lax
from jax.experimental import serialize_executable

from ..dtypes import FLOATS, DTypePolicy
from ..errors import BackendError
from ..graph import Graph
from ..node import Node
from ..ops import VARIANT_OPERANDS, Op
from ..shapes import is_batched, static_size
from .base import Backend, CompileTimes, Lowering, Rule, run_rules

# 64-bit types as declared: a graph's float64 values (exact decisions, float64 models) stay float64
# without an environment variable. The x32 policy declares every narrowed type explicitly, so
# float32 graphs lower to the same code either way.
jax.config.update("jax_enable_x64", True)

_GATHER = "promise_in_bounds"
_PRECISION = lax.Precision.HIGHEST

#: The most rows one pass of a graph handles; larger buckets loop over blocks of rows. Graphs
#: never mix rows, so blocking changes nothing but the working set: a tree ensemble's (B, T)
#: per-tree tables for 100k rows (40 MB at T = 100) outgrow the caches, and one pass over them
#: takes far longer than the same rows in blocks (docs/design-figures.md).
ROW_BLOCK = 16384
#: Graphs that gather single values from batched rows inside a loop (tree walks: a row's feature
#: at its node, every step) take blocks whose gathered rows fit this many bytes, so the steps'
#: random reads hit L2 (deep forests walked tree by tree gain most, lockstep walks less).
GATHER_BLOCK_BYTES = 1 << 18
#: Bumped whenever this module lowers the same graph to different code (2: loop-invariant
#: columns padded to an odd number of cache lines; 3: column-filled loop carries transposed).
#: It keys the executable cache, so an upgrade never reuses executables a persisted cache holds
#: from an older lowering.
LOWERING_REVISION = 3

#: A value of one XLA compile option (a ``DebugOptions`` field, set per executable).
OptionValue = str | bool | int
#: Per-executable XLA options on CPU devices: none, jaxlib's defaults. Tried on jaxlib 0.10.2
#: (bench/xla_options.py, bench/call_overhead.py's notes): turning its YNNPACK library fusions off
#: (``{"xla_cpu_experimental_ynn_fusion_type": ""}``) sped up a bare MLP, but not Kestrel's
#: compiled MLP / LR / forest: no gain to take; fast math, vector width and opt presets compiled
#: to the same code or timed within noise.
CPU_COMPILER_OPTIONS: dict[str, OptionValue] = {}


def gather_row_block(graph: Graph, policy: DTypePolicy, row_block: int) -> int:
    """Rows per block for ``graph``: ``row_block``, or fewer where a loop body gathers from
    batched rows (TAKE_ALONG) — as many as keep the widest gathered rows in GATHER_BLOCK_BYTES."""
    widest = 0
    bodies = [n.attr("body") for n in graph.order if n.op is Op.LOOP]
    while bodies:
        body = bodies.pop()
        for node in body.order:
            if node.op is Op.LOOP:
                bodies.append(node.attr("body"))
            elif node.op is Op.TAKE_ALONG and is_batched(node.inputs[0].shape):
                data = node.inputs[0]
                itemsize = np.dtype(policy.lower(data.dtype)).itemsize
                widest = max(widest, static_size(data.shape) * itemsize)
    if widest == 0:
        return row_block
    # Not below 256 rows: per-block loop overhead would then outweigh the cache misses saved.
    return min(row_block, max(256, GATHER_BLOCK_BYTES // widest))


def _unary(fn: Any) -> Rule:
    return lambda n, a, low: fn(a[0])


def _binary(fn: Any) -> Rule:
    return lambda n, a, low: fn(a[0], a[1])


def _divide(n: Node, a: list[Any], low: Lowering) -> Any:
    # XLA's algebraic simplifier rewrites float divisions into forms that round otherwise: by a
    # broadcast value (a fitted scale, a constant) into a product with its reciprocal,
    # ``a / sqrt(b)`` into ``a * rsqrt(b)``, ``a / exp(b)`` into ``a * exp(-b)``,
    # ``a / (b / c)`` into ``(a * c) / b`` and ``(a / b) / c`` into ``a / (b * c)``
    # (docs/exactness.md has how often each misses numpy's quotient). float64 steps compute as
    # their source does (the values may reach decisions), so there the divisor, broadcast to
    # the quotient's shape, and a dividend that is itself a quotient sit behind barriers the
    # simplifier cannot see through; float32 steps are within tolerance either way and keep
    # the cheaper forms.
    x, y = a
    if jnp.result_type(x, y) == jnp.float64:
        y = lax.optimization_barrier(jnp.broadcast_to(y, jnp.broadcast_shapes(x.shape, y.shape)))
        if _is_quotient(n.inputs[0]):
            x = lax.optimization_barrier(x)
    return jnp.divide(x, y)


def _constant(n: Node, a: list[Any], low: Lowering) -> Any:
    # XLA's simplifier reassociates arithmetic with constants: ``(a + c1) + c2`` into
    # ``a + (c1 + c2)``, ``(a * c1) * c2`` into ``a * (c1 * c2)``, ``a * c + b * c`` into
    # ``(a + b) * c``, each rounding otherwise than the source's order of operations. A float64
    # constant sits behind a barrier, which the simplifier cannot fold through (parameters are
    # the executable's arguments, never folded).
    value = jnp.asarray(n.attr("value").array, dtype=low.dtype(n))
    return lax.optimization_barrier(value) if value.dtype == jnp.float64 else value


def _is_quotient(node: Node) -> bool:
    """Whether ``node`` is a division, perhaps moved by layout ops."""
    while node.op in _LAYOUT:
        node = node.inputs[0]
    return node.op is Op.DIV


# Ops that move a mask's values without changing them (XLA's simplifier looks through them).
_LAYOUT = frozenset({Op.RESHAPE, Op.BROADCAST, Op.TRANSPOSE, Op.SLICE})


def _is_mask(node: Node) -> bool:
    """Whether ``node`` is a boolean cast to a number, perhaps moved by layout ops."""
    while node.op in _LAYOUT:
        node = node.inputs[0]
    return node.op is Op.CAST and node.inputs[0].dtype == "bool"


def _multiply(n: Node, a: list[Any], low: Lowering) -> Any:
    # XLA's algebraic simplifier turns ``convert(mask) * x`` into ``select(mask, x, 0)``, which
    # answers 0 where numpy's ``0.0 * x`` is NaN (x NaN or infinite) or -0.0 (x negative). The
    # same select, with numpy's product as its other branch, keeps every bit and still fuses.
    x, y = a
    if n.dtype in FLOATS:
        for operand, mask, value in ((0, x, y), (1, y, x)):
            if _is_mask(n.inputs[operand]):
                return jnp.where(mask != 0, value, value * 0)
    return jnp.multiply(x, y)


def _remainder(n: Node, a: list[Any], low: Lowering) -> Any:
    # numpy's float %. XLA's rem is C's fmod, exact; jnp.remainder differs only in the sign of
    # a zero result, kept here as numpy signs it (as the divisor).
    x, y = a
    r = jnp.fmod(x, y)
    r = jnp.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)
    return jnp.where(r == 0, jnp.copysign(jnp.zeros_like(r), y), r)


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


def _take_along(data: Any, idx: Any, axis: int) -> Any:
    # A 1-D gather from the flattened data at row-major linear indices: XLA:CPU runs it faster
    # than take_along_axis's multi-dimensional gather (tree traversal steps are these).
    axis %= data.ndim
    shape = jnp.broadcast_shapes(
        tuple(1 if d == axis else n for d, n in enumerate(data.shape)),
        tuple(1 if d == axis else n for d, n in enumerate(idx.shape)),
    )
    shape = tuple(idx.shape[axis] if d == axis else n for d, n in enumerate(shape))
    wide = jnp.int64 if data.size >= 2**31 else jnp.int32
    strides = np.cumprod((*data.shape[1:], 1)[::-1])[::-1]
    linear = jnp.broadcast_to(idx.astype(wide), shape) * int(strides[axis])
    for d, n in enumerate(data.shape):
        if d != axis and n > 1:  # a size-1 data axis broadcasts: its coordinate is always 0
            linear = linear + lax.broadcasted_iota(wide, shape, d) * int(strides[d])
    return data.reshape(-1).at[linear].get(mode=_GATHER, wrap_negative_indices=False)


def _ctz(x: Any) -> Any:
    # ~x & (x - 1) sets exactly the trailing zero bits (all bits for 0).
    return lax.population_count(~x & (x - 1)).astype(jnp.int32)


def _reduce_and(n: Node, a: list[Any], low: Lowering) -> Any:
    axes = tuple(sorted({axis % a[0].ndim for axis in n.attr("axes")}))
    out = lax.reduce_and(a[0], axes)
    return lax.expand_dims(out, axes) if n.attr("keepdims") else out


def _column_reads(body: Any) -> dict[Node, int]:
    """Batched invariants the body reads only as whole columns: TAKE of one scalar index along
    one axis ≥ 1. Maps each such body input to that axis."""
    candidates = {node for node in body.inputs[2:] if is_batched(node.shape)} - {body.output}
    axes: dict[Node, int] = {}
    for node in body.order:
        for k, operand in enumerate(node.inputs):
            if operand not in candidates:
                continue
            if node.op is Op.TAKE and k == 0 and node.inputs[1].shape == ():
                axis = node.attr("axis") % len(operand.shape)
                if axes.setdefault(operand, axis) == axis:
                    continue
            candidates.discard(operand)
    return {node: axis for node, axis in axes.items() if node in candidates}


def _fills_columns(body: Any) -> bool:
    """Whether the loop body's result is its 2-D carry with one column replaced (an UPDATE along
    axis 1), the carry's only use."""
    out, carry = body.output, body.inputs[1]
    return (
        out.op is Op.UPDATE
        and out.inputs[0] is carry
        and len(carry.shape) == 2
        and out.attr("axis") % 2 == 1
        and sum(node.inputs.count(carry) for node in body.order) == 1
    )


#: Cache line and L1 set span (bytes) behind :func:`_column_major`'s padding.
_LINE = 64


def _column_major(x: Any, axis: int) -> tuple[Any, int]:
    """``x`` with ``axis`` moved first, and the rows' own length: a 2-D result's rows are padded
    to an odd number of cache lines. Bucket sizes are powers of two, so unpadded rows start a
    multiple of 4 KB apart and all map to the same few L1 sets; a loop step that reads 30 of
    them (a bit-vector tree's splits) then missed L1 on every read."""
    x = jnp.moveaxis(x, axis, 0)
    length = x.shape[-1]
    if x.ndim != 2:
        return x, length
    itemsize = x.dtype.itemsize
    lines = -(-length * itemsize // _LINE)
    lines += 1 - lines % 2  # odd: consecutive rows spread over every set
    pad = (lines * _LINE) // itemsize - length
    return (jnp.pad(x, ((0, 0), (0, pad))) if pad > 0 else x), length


def _loop(n: Node, a: list[Any], low: Lowering) -> Any:
    # One XLA while loop, the body lowered by this same rule table (nested loops recurse): a
    # Python-unrolled loop would hand XLA trip_count copies of the body to compile.
    body = n.attr("body")
    init, invariants = a[0], list(a[1:])
    # An invariant read column by column goes in with the read axis first (transposed once,
    # outside the loop): each read is then one contiguous row that vectorizes across the batch,
    # instead of a strided gather per element.
    moved = _column_reads(body)
    lengths: dict[Node, int] = {}  # a moved invariant's row length, before padding
    for k, node in enumerate(body.inputs[2:]):
        if node in moved:
            invariants[k], lengths[node] = _column_major(invariants[k], moved[node])
    rules = dict(RULES)
    if moved:

        def take(m: Node, args: list[Any], inner: Lowering) -> Any:
            if m.inputs[0] in moved:
                row = lax.dynamic_index_in_dim(args[0], args[1], 0, keepdims=False)
                return row if row.ndim != 1 else row[: lengths[m.inputs[0]]]
            return RULES[Op.TAKE](m, args, inner)

        rules[Op.TAKE] = take
    # A carry the body fills one column at a time goes round transposed: each trip then writes
    # one contiguous row, where a column of the row-major carry is a strided store per element
    # (on XLA:CPU it slowed a bit-vector trip writing its trees' exit leaves by far more than
    # the transposes outside the loop cost).
    column_filled = n.attr("stop_column") is None and _fills_columns(body)
    if column_filled:
        init = init.T

        def update(m: Node, args: list[Any], inner: Lowering) -> Any:
            if m is body.output:
                return lax.dynamic_update_index_in_dim(args[0], args[2], args[1], 0)
            return RULES[Op.UPDATE](m, args, inner)

        rules[Op.UPDATE] = update

    def step(i: Any, carry: Any) -> Any:
        values = (i, carry, *invariants)
        names = dict(zip(body.input_names, values, strict=True))
        inner = Lowering(names, {}, low.batch, low.policy)
        (out,) = run_rules(rules, body, inner)
        return out

    trips, stop = jnp.int32(n.attr("trip_count")), n.attr("stop_column")
    if stop is None:
        out = lax.fori_loop(jnp.int32(0), trips, step, init)
        return out.T if column_filled else out

    # Ends once every row has stopped (each block of rows on its own): a stopped row's carry no
    # longer changes (the body's form, checked by the op), so the remaining trips are no-ops.
    def running(state: tuple[Any, Any]) -> Any:
        i, carry = state
        return (i < trips) & ~jnp.all(carry[:, stop] != 0)

    def trip(state: tuple[Any, Any]) -> tuple[Any, Any]:
        i, carry = state
        return i + 1, step(i, carry)

    return lax.while_loop(running, trip, (jnp.int32(0), init))[1]


RULES: dict[Op, Rule] = {
    Op.INPUT: lambda n, a, low: low.inputs[n.attr("name")],
    Op.PARAM: lambda n, a, low: low.params[n.attr("name")],
    Op.CONST: _constant,
    Op.NEG: _unary(jnp.negative),
    Op.ABS: _unary(jnp.abs),
    Op.EXP: _unary(jnp.exp),
    Op.LOG: _unary(jnp.log),
    Op.LOG1P: _unary(jnp.log1p),
    Op.EXPM1: _unary(jnp.expm1),
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
    Op.MUL: _multiply,
    Op.DIV: _divide,
    Op.POW: _binary(jnp.power),
    Op.REMAINDER: _remainder,
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
    Op.TAKE_ALONG: lambda n, a, low: _take_along(a[0], a[1], n.attr("axis")),
    Op.UPDATE: lambda n, a, low: lax.dynamic_update_index_in_dim(
        a[0], a[2], a[1], n.attr("axis") % a[0].ndim
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
    # The executor specializes graphs first; unspecialized, the host side is traced and dropped.
    Op.VARIANT: lambda n, a, low: a[VARIANT_OPERANDS["device"]],
}


class JaxExecutable:
    """A compiled XLA executable for one bucket; numpy in, numpy out.

    After its first call an AOT ``Compiled`` holds a C++ dispatch function; calling that directly
    skips a Python frame on every request.
    """

    __slots__ = ("_call", "compiled")
    any_rows = False  # static shapes: fewer rows are padded to the bucket

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self._call = self._first_call

    def _first_call(self, *args: Any) -> Any:
        outs = self.compiled(*args)
        self._call = getattr(self.compiled, "_call", None) or self.compiled
        return outs

    def __call__(self, inputs: Sequence[np.ndarray], params: Sequence[Any]) -> list[np.ndarray]:
        # ``params`` are the device arrays ``prepare_params`` placed once: nothing but the rows
        # is copied in. ``np.asarray`` of a CPU result is a zero-copy view (buffer protocol);
        # map() runs it without a Python frame per output.
        return list(map(np.asarray, self._call(*inputs, *params)))


def _checked_options(options: dict[str, OptionValue], device: Any) -> dict[str, OptionValue]:
    """``options`` if XLA accepts them; a clear error naming the bad one otherwise."""
    for key, value in options.items():
        if not isinstance(key, str) or not isinstance(value, str | bool | int):
            raise BackendError(
                f"compiler option {key!r}={value!r}: names are str, values str, bool or int"
            )
    if options:
        _try_options(tuple(sorted(options.items())), device)
    return options


@lru_cache(maxsize=16)
def _try_options(items: tuple[tuple[str, OptionValue], ...], device: Any) -> None:
    # XLA checks option names and values only when compiling: compile a one-op program once per
    # set, so a typo fails at backend creation, not at the first request of some bucket.
    sharding = jax.sharding.SingleDeviceSharding(device)
    spec = jax.ShapeDtypeStruct((1,), jnp.float32, sharding=sharding)
    lowered = jax.jit(lambda x: x + 1).trace(spec).lower()
    try:
        lowered.compile(compiler_options=dict(items))
    except Exception as exc:  # XLA raises its own runtime error type; name the options
        raise BackendError(f"XLA rejected compiler_options {dict(items)}: {exc}") from exc


class JaxBackend(Backend):
    name = "jax"
    rules = RULES
    dense_calls = True

    def __init__(
        self,
        device: Any = None,
        row_block: int = ROW_BLOCK,
        compiler_options: Mapping[str, OptionValue] | None = None,
    ) -> None:
        """``compiler_options``: XLA options for every executable this backend compiles (None:
        :data:`CPU_COMPILER_OPTIONS` on a CPU device, none elsewhere); checked here, once."""
        if row_block < 1:
            raise ValueError(f"row_block must be >= 1, got {row_block}")
        self.device = device if device is not None else jax.devices()[0]
        self.row_block = row_block
        if compiler_options is None:
            compiler_options = CPU_COMPILER_OPTIONS if self.device.platform == "cpu" else {}
        self.compiler_options = _checked_options(dict(compiler_options), self.device)
        self._sharding = jax.sharding.SingleDeviceSharding(self.device)

    def fingerprint(self) -> str:
        parts = [
            f"jax={jax.__version__}",
            f"jaxlib={jaxlib.__version__}",
            f"platform={self.device.platform}",
            f"device_kind={self.device.device_kind}",
            f"x64={bool(jax.config.jax_enable_x64)}",
            f"xla_flags={os.environ.get('XLA_FLAGS', '')}",
            f"row_block={self.row_block}",
            f"gather_block_bytes={GATHER_BLOCK_BYTES}",
            f"lowering={LOWERING_REVISION}",
        ]
        if self.compiler_options:  # only when set: keys cached without options stay valid
            parts.append(f"compiler_options={sorted(self.compiler_options.items())}")
        return ";".join(parts)

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

        def lower(batch: int, inputs: Sequence[Any], params: Sequence[Any]) -> tuple[Any, ...]:
            low = Lowering(
                dict(zip(names, inputs, strict=True)),
                dict(zip(pnames, params, strict=True)),
                batch,
                policy,
            )
            return tuple(run_rules(RULES, graph, low))

        blocks = -(-bucket // gather_row_block(graph, policy, self.row_block))
        size = -(-bucket // blocks)  # rows per block: the least padding for that many blocks

        def fn(*args: Any) -> tuple[Any, ...]:
            inputs, params = args[: len(names)], args[len(names) :]
            if blocks == 1:
                return lower(bucket, inputs, params)
            # Inputs (all batched) padded by repeating the last row, as the executor pads
            # buckets, then one loop iteration per block of rows; padded rows are sliced off.
            stacked = tuple(
                jnp.pad(
                    x, [(0, blocks * size - bucket)] + [(0, 0)] * (x.ndim - 1), mode="edge"
                ).reshape(blocks, size, *x.shape[1:])
                for x in inputs
            )
            outs = lax.map(lambda block: lower(size, block, params), stacked)
            return tuple(o.reshape(blocks * size, *o.shape[2:])[:bucket] for o in outs)

        specs = self._specs(graph.inputs, bucket, policy) + self._specs(
            graph.param_nodes, bucket, policy
        )
        t0 = time.perf_counter()
        traced = jax.jit(fn).trace(*specs)
        t1 = time.perf_counter()
        lowered = traced.lower()
        t2 = time.perf_counter()
        compiled = lowered.compile(compiler_options=dict(self.compiler_options))
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
