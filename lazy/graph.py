"""A graph: named inputs, named outputs, and the values of its parameters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np

from .errors import GraphError
from .node import Node, topological
from .ops import Op
from .shapes import is_batched


class Signature:
    """Named batched inputs and named outputs: what graphs and programs share."""

    inputs: tuple[Node, ...]
    outputs: tuple[tuple[str, Any], ...]

    @cached_property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n.attr("name") for n in self.inputs)

    @cached_property
    def output_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.outputs)


class Graph(Signature):
    """An immutable function from batched inputs to named outputs.

    ``params`` binds every PARAM node by name. The graph's structure (and so its digest and its
    compiled executables) does not depend on parameter *values*: a retrained model with the same
    structure reuses its executables.
    """

    def __init__(
        self,
        inputs: Sequence[Node],
        outputs: Mapping[str, Node] | Sequence[tuple[str, Node]],
        params: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        pairs = tuple(outputs.items() if isinstance(outputs, Mapping) else outputs)
        if not pairs:
            raise GraphError("a graph needs at least one output")
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise GraphError(f"duplicate output names in {names}")
        self.inputs: tuple[Node, ...] = tuple(inputs)
        self.outputs: tuple[tuple[str, Node], ...] = pairs
        self._check_inputs()
        self.params: Mapping[str, np.ndarray] = MappingProxyType(self._bind(params or {}))

    def _check_inputs(self) -> None:
        names = []
        for node in self.inputs:
            if node.op is not Op.INPUT:
                raise GraphError(f"graph inputs must be INPUT nodes, got {node!r}")
            if not is_batched(node.shape):
                raise GraphError(f"input {node.attr('name')!r} must be batched (shape (B, ...))")
            names.append(node.attr("name"))
        if len(set(names)) != len(names):
            raise GraphError(f"duplicate input names in {names}")
        declared = set(self.inputs)
        for node in self.order:
            if node.op is Op.INPUT and node not in declared:
                raise GraphError(f"input {node.attr('name')!r} is used but not a graph input")

    def _bind(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        bound: dict[str, np.ndarray] = {}
        for node in self.param_nodes:
            name = node.attr("name")
            if name in bound:
                raise GraphError(f"two parameters are named {name!r}")
            if name not in values:
                raise GraphError(f"parameter {name!r} has no value")
            value = np.asarray(values[name])
            if value.shape != node.shape or value.dtype.name != node.dtype:
                raise GraphError(
                    f"parameter {name!r} is declared {node.dtype}{list(node.shape)} "
                    f"but bound to {value.dtype.name}{list(value.shape)}"
                )
            if value.flags.writeable:
                value = value.copy()
                value.flags.writeable = False
            bound[name] = value
        return bound

    @cached_property
    def order(self) -> list[Node]:
        """Every node the outputs depend on, operands first (deterministic)."""
        return topological([node for _, node in self.outputs])

    @cached_property
    def param_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.order if n.op is Op.PARAM)

    @property
    def output_nodes(self) -> tuple[Node, ...]:
        return tuple(node for _, node in self.outputs)

    def param_values(self) -> tuple[np.ndarray, ...]:
        """Parameter values in :attr:`param_nodes` order (the executables' argument order)."""
        return tuple(self.params[n.attr("name")] for n in self.param_nodes)

    def replace(
        self,
        outputs: Sequence[tuple[str, Node]] | None = None,
        params: Mapping[str, np.ndarray] | None = None,
    ) -> Graph:
        """A new graph with other outputs and/or extra parameter values (used by passes)."""
        merged = dict(self.params)
        merged.update(params or {})
        return Graph(self.inputs, outputs if outputs is not None else self.outputs, merged)

    @cached_property
    def digest(self) -> str:
        from .digest import graph_digest

        return graph_digest(self)

    def __repr__(self) -> str:
        ins = ", ".join(f"{n.attr('name')}: {n.dtype}{list(n.shape)}" for n in self.inputs)
        outs = ", ".join(f"{k}: {n.dtype}{list(n.shape)}" for k, n in self.outputs)
        return f"Graph(({ins}) -> ({outs}), {len(self.order)} nodes)"
