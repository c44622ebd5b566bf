"""The host lowering: a graph as straight-line numpy on the calling thread, for tiny buckets.

A device call has a fixed cost before any work: XLA:CPU's runtime per call, and more for the
first dot of a call (its thunk hands the dot to the intra-op pool). For one row of a logistic
regression or an MLP that is most of the time; numpy runs the same few ops in less time.
The executor (:class:`lazy.executor.CompiledGraph`) times this lowering against its backend on the
smallest buckets at warm-up and keeps whichever is faster there.

Each node binds once to a numpy callable with its attributes applied (a rule of :data:`RULES`
takes the node and the bucket's :class:`Lowering`, and returns that callable); ``compile`` then
generates one Python function that calls them in order, so a call costs the numpy calls and
nothing else. Values keep the dtypes the policy lowers to (float32 stays float32), except signed
integers, which are numpy's index type (``intp``) inside a plan: numpy gathers with any other
index dtype convert the indices first, costing more than the gather itself on a small tree
walk. Integer inputs are widened on entry and integer outputs narrowed back on return,
and ops whose result depends on the width (CTZ) compute in the lowered one. A dry run on the
bucket's shapes finds the nodes where numpy's result type differs and casts there.

An elementwise step writes its result into an operand's buffer when that operand is read for the
last time there and no later value views it (never the caller's rows, a parameter or a constant):
fresh arrays of a few hundred KB come from mmap, page-faulted on every call.

Kernels take numpy's cheapest entry points: indexing rather than ``np.take`` (a Python wrapper,
costly on small arrays), and a flat gather rather than ``np.take_along_axis`` (much Python per
call) for the row-wise gathers of tree walks.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import scipy
import scipy.special

from .. import coupling, forest, native, treeshap
from ..dtypes import DTypePolicy
from ..errors import BackendError
from ..graph import Graph
from ..interpreter import logsumexp, softmax, update_at
from ..node import Node
from ..ops import VARIANT_OPERANDS, Op
from ..shapes import is_batched
from .base import Backend, CompileTimes, Lowering

#: Bumped whenever this module lowers the same graph to different code.
LOWERING_REVISION = 5

#: The dtype signed integers have inside a plan (see the module docstring).
HOST_INT = np.dtype(np.intp)

#: A numpy callable of a node's operands, with the node's attributes applied.
Kernel = Callable[..., Any]
#: Node and bucket → its kernel.
Binder = Callable[[Node, "HostLowering"], Kernel]

_LEAVES = frozenset({Op.INPUT, Op.PARAM, Op.CONST})


def host_dtype(dtype: Any) -> np.dtype:
    """The dtype a value of lowered dtype ``dtype`` has inside a plan."""
    dtype = np.dtype(dtype)
    return HOST_INT if dtype.kind == "i" else dtype


class HostLowering(Lowering):
    """A bucket's :class:`Lowering` whose ``dtype`` is the value's dtype inside a plan."""

    def dtype(self, node: Node) -> str:
        return host_dtype(super().dtype(node)).name

    def lowered(self, node: Node) -> np.dtype:
        """The dtype the policy lowers ``node`` to: what callers give and get."""
        return np.dtype(super().dtype(node))


def _leaf(n: Node, low: HostLowering) -> Kernel:
    # Leaves become the generated function's arguments (inputs, parameters) or bound constants,
    # never calls; this entry keeps the table complete and says where each leaf comes from.
    raise BackendError(f"{n.op.name} is a leaf: the plan binds it, no kernel computes it")


def _fixed(fn: Kernel) -> Binder:
    """A kernel that needs nothing of the node (elementwise ufuncs)."""
    return lambda n, low: fn


def _reduce(ufunc: np.ufunc, *, typed: bool = False) -> Binder:
    def bind(n: Node, low: HostLowering) -> Kernel:
        axes, keepdims = tuple(n.attr("axes")), n.attr("keepdims")
        if typed:  # SUM: accumulate in the result's own dtype (bools count in int32)
            dtype = np.dtype(low.dtype(n))
            return lambda x: ufunc.reduce(x, axis=axes, dtype=dtype, keepdims=keepdims)
        return lambda x: ufunc.reduce(x, axis=axes, keepdims=keepdims)

    return bind


def _ctz(n: Node, low: HostLowering) -> Kernel:
    # ~x & (x - 1) sets exactly the trailing zero bits (all of them for 0); count them, in the
    # operand's lowered width (a widened int32 zero has 32 trailing zeros, not 64).
    unsigned = np.dtype(f"uint{low.lowered(n.inputs[0]).itemsize * 8}")
    one, result = unsigned.type(1), np.dtype(low.dtype(n))
    return lambda x: np.bitwise_count(~(u := x.astype(unsigned)) & (u - one)).astype(result)


def _cast(n: Node, low: HostLowering) -> Kernel:
    dtype = np.dtype(low.dtype(n))
    return lambda x: x.astype(dtype)


def _take(n: Node, low: HostLowering) -> Kernel:
    # Indexing with one integer array at ``axis`` is np.take without its Python wrapper (indices
    # are in bounds: the IR's contract, which the reference interpreter enforces).
    axis = n.attr("axis") % len(n.inputs[0].shape)
    if axis == 0:
        return operator.getitem
    head = (slice(None),) * axis
    return lambda data, idx: data[(*head, idx)]


def _forest_sum(n: Node, low: HostLowering) -> Kernel:
    trees, depth = n.attr("trees"), n.attr("depth")
    if native.AVAILABLE:
        return forest.native(trees, depth)
    return partial(forest.reference, trees=trees, depth=depth)


def _forest_shap(n: Node, low: HostLowering) -> Kernel:
    players = n.attr("players")
    if native.AVAILABLE:
        return treeshap.native(players)
    return partial(treeshap.reference, players=players)


def _couple(n: Node, low: HostLowering) -> Kernel:
    classes = n.attr("classes")
    if native.AVAILABLE:
        return coupling.native(classes)
    # Without numba: the LOOP formulation, lowered as a loop body's plan is. Its start carry
    # is broadcast to the bucket's rows, so a call of fewer rows is padded with rows of even
    # odds (they stop before the first sweep).
    graph = coupling.loop_graph(classes, low.dtype(n))
    inner = HostLowering({}, {}, low.batch, low.policy)
    plan = _Plan(graph.order, graph.inputs, (), graph.output_nodes, inner, narrow=False)

    def couple(r: np.ndarray) -> np.ndarray:
        rows = len(r)
        padding = np.full((low.batch - rows, r.shape[1]), 0.5, r.dtype)
        return plan.function(np.concatenate([r, padding]))[0][:rows]  # type: ignore[no-any-return]

    return couple


def _take_along(n: Node, low: HostLowering) -> Kernel:
    data, idx = (low.shape(i) for i in n.inputs)
    axis = n.attr("axis") % len(data)
    if len(data) != 2 or axis != 1 or len(idx) != 2 or idx[0] != data[0]:
        return lambda d, i: np.take_along_axis(d, i, axis=axis)
    # Row r's entries start at r * width of the flattened rows: one gather, no per-row Python.
    if data[0] == 1:
        return lambda d, i: d.reshape(-1)[i]
    offsets = (np.arange(data[0], dtype=HOST_INT) * data[1])[:, None]
    if is_batched(n.inputs[0].shape):  # the rows a call has, up to the bucket's (any_rows)
        return lambda d, i: d.reshape(-1)[i + offsets[: len(d)]]
    return lambda d, i: d.reshape(-1)[i + offsets]


def _update(n: Node, low: HostLowering) -> Kernel:
    axis = n.attr("axis") % len(n.shape)
    return lambda x, idx, value: update_at(x, axis, int(idx), value)


def _concat(*xs: np.ndarray, axis: int) -> np.ndarray:
    return np.concatenate(xs, axis=axis)


def _argmax(n: Node, low: HostLowering) -> Kernel:
    axis, dtype = n.attr("axis"), np.dtype(low.dtype(n))
    return lambda x: np.argmax(x, axis=axis).astype(dtype)


def _slice(n: Node, low: HostLowering) -> Kernel:
    axis = n.attr("axis") % len(n.shape)
    index = (slice(None),) * axis + (slice(n.attr("start"), n.attr("stop"), n.attr("step")),)
    return lambda x: x[index]


def _keeps_rows(n: Node) -> bool:
    """Rows in, rows out: the kernel may take its row count from its operand (any_rows)."""
    return is_batched(n.shape) and is_batched(n.inputs[0].shape)


def _reshape(n: Node, low: HostLowering) -> Kernel:
    shape = low.shape(n)
    if _keeps_rows(n):
        rest = shape[1:]
        return lambda x: x.reshape((len(x), *rest))
    return lambda x: x.reshape(shape)


def _broadcast(n: Node, low: HostLowering) -> Kernel:
    shape = low.shape(n)
    if _keeps_rows(n):
        rest = shape[1:]
        return lambda x: np.broadcast_to(x, (len(x), *rest))
    return lambda x: np.broadcast_to(x, shape)  # a parameter to rows: bucket-bound


def _bucket_bound(order: Sequence[Node]) -> bool:
    """Whether a plan of ``order`` is only right for exactly its bucket's rows: where it
    broadcasts a row-free value to rows (that many rows are baked in). Every other kernel takes
    its row count from its operands."""
    return any(
        _bucket_bound(n.attr("body").order)
        if n.op is Op.LOOP
        else n.op is Op.BROADCAST and is_batched(n.shape) and not _keeps_rows(n)
        for n in order
    )


def _transpose(n: Node, low: HostLowering) -> Kernel:
    perm = tuple(n.attr("perm"))
    return lambda x: x.transpose(perm)


def _loop(n: Node, low: HostLowering) -> Kernel:
    # A Python loop over the body's own generated function (nested loops recurse). Loops of many
    # steps are what this lowering is slow at; the executor's timing keeps them on the device.
    body = n.attr("body")
    inner = HostLowering({}, {}, low.batch, low.policy)
    step = _Plan(body.order, body.inputs, (), [body.output], inner, narrow=False).function
    indices = [np.asarray(i, HOST_INT) for i in range(n.attr("trip_count"))]
    stop = n.attr("stop_column")

    def loop(carry: Any, *invariants: Any) -> Any:
        for i in indices:
            if stop is not None and carry[:, stop].all():
                break  # every row stopped: the remaining trips change nothing (see ops)
            (carry,) = step(i, carry, *invariants)
        return carry

    return loop


RULES: dict[Op, Binder] = {
    Op.INPUT: _leaf,
    Op.PARAM: _leaf,
    Op.CONST: _leaf,
    Op.NEG: _fixed(np.negative),
    Op.ABS: _fixed(np.abs),
    Op.EXP: _fixed(np.exp),
    Op.LOG: _fixed(np.log),
    Op.LOG1P: _fixed(np.log1p),
    Op.EXPM1: _fixed(np.expm1),
    Op.SQRT: _fixed(np.sqrt),
    Op.TANH: _fixed(np.tanh),
    Op.SIGMOID: _fixed(scipy.special.expit),
    Op.ERF: _fixed(scipy.special.erf),
    Op.NDTRI: _fixed(scipy.special.ndtri),
    Op.FLOOR: _fixed(np.floor),
    Op.ISNAN: _fixed(np.isnan),
    Op.NOT: _fixed(np.invert),  # logical on bools, bitwise on integers
    Op.CTZ: _ctz,
    Op.ADD: _fixed(np.add),
    Op.SUB: _fixed(np.subtract),
    Op.MUL: _fixed(np.multiply),
    Op.DIV: _fixed(np.divide),
    Op.POW: _fixed(np.power),
    Op.REMAINDER: _fixed(np.remainder),
    Op.MAXIMUM: _fixed(np.maximum),
    Op.MINIMUM: _fixed(np.minimum),
    Op.EQ: _fixed(np.equal),
    Op.NE: _fixed(np.not_equal),
    Op.LT: _fixed(np.less),
    Op.LE: _fixed(np.less_equal),
    Op.GT: _fixed(np.greater),
    Op.GE: _fixed(np.greater_equal),
    Op.AND: _fixed(np.bitwise_and),
    Op.OR: _fixed(np.bitwise_or),
    Op.XOR: _fixed(np.bitwise_xor),
    Op.WHERE: _fixed(np.where),
    Op.CAST: _cast,
    Op.MATMUL: _fixed(np.matmul),
    Op.TAKE: _take,
    Op.TAKE_ALONG: _take_along,
    Op.FOREST_SUM: _forest_sum,
    Op.COUPLE: _couple,
    Op.FOREST_SHAP: _forest_shap,
    Op.UPDATE: _update,
    Op.SUM: _reduce(np.add, typed=True),
    Op.MAX: _reduce(np.maximum),
    Op.MIN: _reduce(np.minimum),
    Op.REDUCE_AND: _reduce(np.bitwise_and),
    Op.LOGSUMEXP: lambda n, low: lambda x: logsumexp(x, tuple(n.attr("axes")), n.attr("keepdims")),
    Op.ARGMAX: _argmax,
    Op.SOFTMAX: lambda n, low: lambda x: softmax(x, n.attr("axis")),
    Op.CONCAT: lambda n, low: partial(_concat, axis=n.attr("axis")),
    Op.SLICE: _slice,
    Op.RESHAPE: _reshape,
    Op.BROADCAST: _broadcast,
    Op.TRANSPOSE: _transpose,
    Op.LOOP: _loop,
    # The host's formulation. The executor specializes graphs first, so the other is never run.
    Op.VARIANT: _fixed(lambda *formulations: formulations[VARIANT_OPERANDS["host"]]),
}


def _reusable(
    node: Node,
    k: int,
    kernel: Kernel,
    result: np.ndarray,
    values: Mapping[Node, Any],
    last_use: Mapping[Node, int],
) -> Node | None:
    """An operand of ``node`` (step ``k``) whose buffer its ufunc may write its result into: of
    the result's shape and dtype, read for the last time here, and sharing memory with no value
    read later (leaves — the caller's rows, parameters, constants — are read "later" forever).
    Fresh result arrays of a few hundred KB come from mmap and cost page faults on every call;
    a reused buffer is warm."""
    if not isinstance(kernel, np.ufunc):
        return None
    for operand in dict.fromkeys(node.inputs):
        value = values[operand]
        if (
            last_use[operand] != k
            or is_batched(operand.shape) != is_batched(node.shape)  # equal at this bucket only
            or not isinstance(value, np.ndarray)
            or value.shape != result.shape
            or value.dtype != result.dtype
            or not value.flags.writeable
        ):
            continue
        live = (v for n, v in values.items() if n is not operand and last_use.get(n, -1) > k)
        if not any(np.may_share_memory(value, other) for other in live):
            return operand
    return None


class _Plan:
    """``order`` (operands first) as one generated Python function of ``args`` then ``params``
    (leaf nodes), returning the values of ``outputs`` as a list.

    The dry run that specializes it executes every kernel once on zeros of the bucket's shapes
    (``params`` on their values): it checks each result's shape, casts where numpy's result
    dtype is not the node's dtype in the plan, and copies outputs that would otherwise be views
    of a leaf. ``narrow``: ``args`` come, and outputs go, in the policy's lowered dtypes (a
    graph's plan); else in the plan's own (a loop body's, called from its graph's plan).
    """

    def __init__(
        self,
        order: Sequence[Node],
        args: Sequence[Node],
        params: Sequence[tuple[Node, np.ndarray]],
        outputs: Sequence[Node],
        low: HostLowering,
        *,
        narrow: bool = True,
    ) -> None:
        names: dict[Node, str] = {}
        namespace: dict[str, Any] = {}
        values: dict[Node, Any] = {}
        lines: list[str] = []
        for k, node in enumerate(args):
            names[node] = f"a{k}"
            given, own = low.lowered(node) if narrow else low.dtype(node), low.dtype(node)
            values[node] = np.zeros(low.shape(node), own)
            if given != own:
                lines.append(f"    a{k} = a{k}.astype({np.dtype(own).name!r})")
        for k, (node, value) in enumerate(params):
            names[node] = f"p{k}"
            values[node] = value
        # Where each value is read last (outputs: never dead); leaves are never written.
        last_use: dict[Node, int] = {}
        for k, node in enumerate(order):
            for operand in node.inputs:
                last_use[operand] = k
        for node in [*outputs, *args, *(n for n, _ in params), *order]:
            if node in outputs or node.op in _LEAVES:
                last_use[node] = len(order)
        for k, node in enumerate(order):
            if node in names:
                continue
            if node.op is Op.CONST:
                names[node] = f"c{k}"
                namespace[names[node]] = values[node] = np.asarray(
                    node.attr("value").array, low.dtype(node)
                )
                continue
            if node.op in _LEAVES:
                raise BackendError(f"{node!r} is not among the plan's arguments")
            kernel = RULES[node.op](node, low)
            operands = [values[i] for i in node.inputs]
            with np.errstate(all="ignore"):
                # As returned, not np.asarray'd: a 0-d result is a numpy scalar at run time too,
                # and indexing with a scalar gives a view where a 0-d array gives a copy.
                result = kernel(*operands)
            dtype, shape = np.dtype(low.dtype(node)), low.shape(node)
            if np.shape(result) != shape:
                raise BackendError(
                    f"numpy lowering of {node!r} gave shape {np.shape(result)}, expected {shape}"
                )
            cast = result.dtype != dtype
            reuse = None if cast else _reusable(node, k, kernel, result, values, last_use)
            if reuse is not None:
                # The dry run writes in place too, so later alias checks see what runs.
                with np.errstate(all="ignore"):
                    result = kernel(*operands, out=values[reuse])
            values[node] = result.astype(dtype) if cast else result
            names[node] = f"v{k}"
            namespace[f"f{k}"] = kernel
            call = ", ".join(names[i] for i in node.inputs)
            if reuse is not None:
                call += f", out={names[reuse]}"
            lines.append(
                f"    v{k} = f{k}({call}).astype({dtype.name!r})"
                if cast
                else f"    v{k} = f{k}({call})"
            )
        leaves = [values[n] for n in args] + [v for _, v in params]
        leaves += [values[n] for n in order if n.op is Op.CONST]
        returned = []
        for node in outputs:
            name = names[node]
            if narrow and low.lowered(node) != values[node].dtype:
                returned.append(f"{name}.astype({low.lowered(node).name!r})")  # a copy
            elif any(np.shares_memory(values[node], leaf) for leaf in leaves):
                returned.append(f"{name}.copy()")
            else:
                returned.append(name)
        signature = ", ".join([names[n] for n in args] + [names[n] for n, _ in params])
        source = "\n".join(
            [f"def plan({signature}):", *lines, f"    return [{', '.join(returned)}]"]
        )
        # Code generated from the graph's structure only: names are slot numbers, and every
        # value (constants, kernels) is bound through the namespace, never spliced into source.
        exec(compile(source, "<kestrel numpy plan>", "exec"), namespace)
        self.source = source
        self.function: Callable[..., list[Any]] = namespace["plan"]


class NumpyExecutable:
    """A graph's generated numpy function for one bucket; numpy in, numpy out. ``any_rows``:
    it also runs any fewer rows as they are, unpadded (see ``_bucket_bound``)."""

    __slots__ = ("_function", "any_rows", "source")

    def __init__(self, plan: _Plan, any_rows: bool = False) -> None:
        self._function = plan.function
        self.source = plan.source  # the generated Python, for debugging
        self.any_rows = any_rows

    def __call__(self, inputs: Sequence[np.ndarray], params: Sequence[Any]) -> list[np.ndarray]:
        # Float errors (overflow to inf, 0/0) give the IEEE values the device gives, silently.
        with np.errstate(all="ignore"):
            return self._function(*inputs, *params)


class NumpyBackend(Backend):
    name = "numpy"
    target = "host"
    rules: Mapping[Op, Binder] = RULES  # type: ignore[assignment]  # binders, not eager rules

    def fingerprint(self) -> str:
        kernels = f"numba={native.numba_version()}" if native.AVAILABLE else "reference"
        return (
            f"numpy={np.__version__};scipy={scipy.__version__};kernels={kernels};"
            f"lowering={LOWERING_REVISION}"
        )

    def prepare_params(self, values: Sequence[np.ndarray], policy: DTypePolicy) -> Any:
        # Read-only, whatever the caller's arrays are: no kernel may write a fitted value, and
        # numba types a read-only array apart from a writable one (a compile per combination).
        return tuple(
            _read_only(np.ascontiguousarray(v, dtype=host_dtype(policy.lower(v.dtype.name))))
            for v in values
        )

    def compile(
        self, graph: Graph, bucket: int, policy: DTypePolicy
    ) -> tuple[NumpyExecutable, CompileTimes]:
        t0 = time.perf_counter()
        params = self.prepare_params(graph.param_values(), policy)
        low = HostLowering({}, {}, bucket, policy)
        plan = _Plan(
            graph.order,
            graph.inputs,
            list(zip(graph.param_nodes, params, strict=True)),
            graph.output_nodes,
            low,
        )
        exe = NumpyExecutable(plan, any_rows=not _bucket_bound(graph.order))
        return exe, CompileTimes(trace_s=time.perf_counter() - t0)


def _read_only(array: np.ndarray) -> np.ndarray:
    if array.flags.writeable:
        array = array.view()
        array.flags.writeable = False
    return array


BACKEND_CLASS = NumpyBackend
