"""Programs: compiled graph segments with host steps between them (the barrier).

A :class:`Builder` records a traced computation. :meth:`Builder.host` is the barrier: the lazy values
passed to it are materialized (they become outputs of the current graph segment), a Python function
runs on them as numpy arrays, and its results re-enter the trace as fresh inputs of the next
segment. :meth:`Builder.build` partitions the trace into stages. Parameter-only subgraphs are
shared by every segment that uses them; batched values cross stages by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from . import dtypes as dt
from .errors import GraphError, InputError
from .graph import Graph, Signature
from .node import Node, topological
from .ops import Op, TensorType
from .passes import optimize
from .shapes import B, concrete, is_batched, normalize
from .tensor import LazyTensor

HostFn = Callable[..., Any]


@dataclass(frozen=True)
class GraphStage:
    """A segment compiled as one graph; reads and writes the environment by its IO names."""

    graph: Graph


@dataclass(frozen=True)
class HostStage:
    """A Python step on host arrays. It must keep rows independent and return one row per row."""

    name: str
    fn: HostFn
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, TensorType], ...]


Stage = GraphStage | HostStage


@dataclass(frozen=True)
class Program(Signature):
    inputs: tuple[Node, ...]
    stages: tuple[Stage, ...]
    outputs: tuple[tuple[str, str], ...]  # (output name, environment name)

    @property
    def graphs(self) -> tuple[Graph, ...]:
        return tuple(s.graph for s in self.stages if isinstance(s, GraphStage))

    @property
    def host_steps(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages if isinstance(s, HostStage))

    def output_types(self) -> dict[str, TensorType]:
        """Each output's type (shape with the batch axis ``B`` first, dtype), by output name:
        what the compiled program returns for it (the reference interpreter computes in
        float64)."""
        env: dict[str, TensorType] = {n.attr("name"): n.type for n in self.inputs}
        for stage in self.stages:
            if isinstance(stage, GraphStage):
                env.update((name, node.type) for name, node in stage.graph.outputs)
            else:
                env.update(stage.outputs)
        return {name: env[source] for name, source in self.outputs}

    def columns_read(self, name: str, *, optimized: bool = False) -> frozenset[int] | None:
        """The columns (axis 1) of input ``name`` that some value of the program depends on,
        where every use of the input picks columns by a static slice or constant indices; None
        where any other use may read them all (a host step, an elementwise op, a loop).
        ``optimized``: of each graph as the executor runs it (:func:`lazy.passes.optimize`),
        where a read that no output needs once simplified (a cast of the whole table whose
        columns a slice of a concatenation drops) is gone."""
        if any(env == name for _, env in self.outputs):
            return None
        read: set[int] = set()
        for stage in self.stages:
            if isinstance(stage, HostStage):
                if name in stage.inputs:
                    return None
                continue
            graph = optimize(stage.graph) if optimized else stage.graph
            for node in graph.order:
                for operand in node.inputs:
                    if operand.op is not Op.INPUT or operand.attr("name") != name:
                        continue
                    picked = _picked_columns(node, operand)
                    if picked is None:
                        return None
                    read.update(picked)
            if any(n.op is Op.INPUT and n.attr("name") == name for n in graph.output_nodes):
                return None
        return frozenset(read)


def _picked_columns(node: Node, operand: Node) -> range | list[int] | None:
    """The columns of ``operand`` (B, F) that ``node`` reads, if it picks them statically."""
    if node.op not in (Op.SLICE, Op.TAKE) or len(operand.shape) != 2:
        return None
    if node.inputs[0] is not operand or node.attr("axis") != 1:
        return None
    width = int(operand.shape[1])
    if node.op is Op.SLICE:
        return range(
            *slice(node.attr("start"), node.attr("stop"), node.attr("step")).indices(width)
        )
    if node.op is Op.TAKE and node.inputs[1].op is Op.CONST:
        return [int(i) % width for i in np.asarray(node.inputs[1].attr("value").array).ravel()]
    return None


@dataclass(frozen=True)
class _HostCall:
    name: str
    fn: HostFn
    inputs: tuple[Node, ...]
    outputs: tuple[Node, ...]


class Builder:
    """Records a traced computation: inputs, parameters, ops and host steps."""

    def __init__(self) -> None:
        self._inputs: list[Node] = []
        self._params: dict[str, np.ndarray] = {}
        self._hosts: list[_HostCall] = []

    def input(self, name: str, shape: Sequence[int] = (), dtype: Any = "float32") -> LazyTensor:
        """A batched input; ``shape`` is one row's shape (the batch axis B is prepended)."""
        if any(n.attr("name") == name for n in self._inputs):
            raise GraphError(f"input {name!r} is already defined")
        node = Node.make(Op.INPUT, name=name, shape=(B, *shape), dtype=dt.canonical(dtype))
        self._inputs.append(node)
        return LazyTensor(node)

    def param(self, value: Any, name: str) -> LazyTensor:
        """A fitted array, passed to the executable as an argument (not baked into code)."""
        array = np.asarray(value)
        array = array.astype(dt.canonical(array.dtype), copy=False)
        if name in self._params and self._params[name] is not array:
            raise GraphError(f"parameter {name!r} is already defined")
        self._params[name] = array
        return LazyTensor(Node.make(Op.PARAM, name=name, shape=array.shape, dtype=array.dtype))

    @property
    def params(self) -> Mapping[str, np.ndarray]:
        """The parameters defined so far, by name (read-only)."""
        return MappingProxyType(self._params)

    def host(
        self,
        fn: HostFn,
        inputs: Sequence[LazyTensor],
        outputs: Sequence[tuple[Sequence[int], Any]],
        name: str,
    ) -> tuple[LazyTensor, ...]:
        """Run ``fn`` on the host between compiled segments.

        ``fn`` gets numpy arrays for ``inputs`` and returns one array per ``outputs`` entry, each
        ``(row shape, dtype)``, with the same number of rows as its inputs.
        """
        if not inputs or not all(t.batched for t in inputs):
            raise GraphError(f"host step {name!r} needs batched lazy inputs")
        k = len(self._hosts)
        out_nodes = tuple(
            Node.make(
                Op.INPUT,
                name=f"host{k}.{name}:{i}",
                shape=(B, *normalize(shape)),
                dtype=dt.canonical(dtype),
            )
            for i, (shape, dtype) in enumerate(outputs)
        )
        self._hosts.append(_HostCall(name, fn, tuple(t.node for t in inputs), out_nodes))
        return tuple(LazyTensor(n) for n in out_nodes)

    def graph(self, outputs: Mapping[str, LazyTensor]) -> Graph:
        """The traced computation as one graph (no host steps allowed)."""
        if self._hosts:
            raise GraphError("this trace has host steps; use build() to get a Program")
        return Graph(self._inputs, {k: v.node for k, v in outputs.items()}, self._params)

    def build(self, outputs: Mapping[str, LazyTensor]) -> Program:
        """Partition the trace into graph segments and host stages."""
        return _partition(
            self._inputs, self._hosts, {k: v.node for k, v in outputs.items()}, self._params
        )


def _partition(
    inputs: Sequence[Node],
    hosts: Sequence[_HostCall],
    outputs: Mapping[str, Node],
    params: Mapping[str, np.ndarray],
) -> Program:
    for name, node in outputs.items():
        if not is_batched(node.shape):
            raise GraphError(f"output {name!r} must be batched, got shape {node.shape}")
    roots = [*outputs.values(), *(n for h in hosts for n in h.inputs)]
    order = topological(roots)
    host_stage = {n: k + 1 for k, h in enumerate(hosts) for n in h.outputs}
    stage: dict[Node, int | None] = {}
    for node in order:
        if node.op is Op.INPUT:
            stage[node] = host_stage.get(node, 0)
        else:
            found = [s for s in (stage[i] for i in node.inputs) if s is not None]
            stage[node] = max(found) if found else None  # None: parameter-only, shared

    last = len(hosts)
    # A value computed in segment s is exported if anything after segment s needs it.
    exported: dict[Node, str] = {}

    def export(node: Node) -> None:
        if node.op is not Op.INPUT and node not in exported:
            exported[node] = f"s{stage[node]}.v{len(exported)}"

    for node in order:
        for i in node.inputs:
            if stage[i] is not None and stage[node] is not None and stage[i] < stage[node]:
                export(i)
    for h in hosts:
        for n in h.inputs:
            export(n)
    for node in outputs.values():
        export(node)

    def env_name(node: Node) -> str:
        return node.attr("name") if node.op is Op.INPUT else exported[node]

    stages: list[Stage] = []
    for s in range(last + 1):
        heads = [(env_name(n), n) for n, _ in exported.items() if stage[n] == s]
        if heads:
            stages.append(GraphStage(_segment(s, heads, stage, env_name, inputs, params)))
        if s < last:
            h = hosts[s]
            stages.append(
                HostStage(
                    h.name,
                    h.fn,
                    tuple(env_name(n) for n in h.inputs),
                    tuple((n.attr("name"), n.type) for n in h.outputs),
                )
            )
    return Program(
        tuple(inputs), tuple(stages), tuple((k, env_name(n)) for k, n in outputs.items())
    )


def _segment(
    s: int,
    heads: list[tuple[str, Node]],
    stage: Mapping[Node, int | None],
    env_name: Callable[[Node], str],
    inputs: Sequence[Node],
    params: Mapping[str, np.ndarray],
) -> Graph:
    rebuilt: dict[Node, Node] = {}
    for node in topological(n for _, n in heads):
        st = stage[node]
        if st is None or node.op is Op.INPUT:
            rebuilt[node] = node
        elif st < s:
            rebuilt[node] = Node.make(
                Op.INPUT, name=env_name(node), shape=node.shape, dtype=node.dtype
            )
        else:
            rebuilt[node] = node.with_inputs([rebuilt[i] for i in node.inputs])
    outs = [(name, rebuilt[n]) for name, n in heads]
    seg_inputs = list(inputs) if s == 0 else []
    declared = set(seg_inputs)
    for node in topological(n for _, n in outs):
        if node.op is Op.INPUT and node not in declared:
            seg_inputs.append(node)
            declared.add(node)
    return Graph(seg_inputs, outs, params)


GraphRunner = Callable[[Mapping[str, Any]], Mapping[str, np.ndarray]]


def run_stages(
    program: Program, stages: Sequence[GraphRunner | HostStage], inputs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Run a program: each graph stage by its runner, each host stage on numpy arrays."""
    env: dict[str, Any] = {name: inputs[name] for name in program.input_names if name in inputs}
    missing = [n for n in program.input_names if n not in env]
    if missing:
        raise InputError(f"missing inputs {missing}; expected {list(program.input_names)}")
    rows = len(np.asarray(env[program.input_names[0]])) if program.input_names else 0
    for stage in stages:
        if isinstance(stage, HostStage):
            results = stage.fn(*(np.asarray(env[name]) for name in stage.inputs))
            results = results if isinstance(results, (tuple, list)) else (results,)
            if len(results) != len(stage.outputs):
                raise InputError(
                    f"host step {stage.name!r} returned {len(results)} values, "
                    f"declared {len(stage.outputs)}"
                )
            for (name, t), value in zip(stage.outputs, results, strict=True):
                array = np.asarray(value, dtype=t.dtype)
                if array.shape != concrete(t.shape, rows):
                    raise InputError(
                        f"host step {stage.name!r} returned shape {array.shape} for {name!r}, "
                        f"declared {concrete(t.shape, rows)}"
                    )
                env[name] = array
        else:
            env.update(stage(env))
    return {name: env[ref] for name, ref in program.outputs}
