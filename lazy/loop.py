"""Fixed-trip-count loops: :func:`fori_loop` and the closed body sub-graph of a LOOP node.

``fori_loop(n, body, init, *invariants)`` records one LOOP node; ``body(i, carry, *invariants)`` is
traced once into a :class:`LoopBody`. The body is closed: its leaves are its own inputs (the index,
the carry, one per invariant) and constants. Outer values it needs, parameters included, come in as
invariants, so a graph's parameters stay the graph's arguments and passes never look inside a body.

The iteration index is an unbatched int32 scalar (shape ``()``): the body's inputs are not graph
inputs, so they may be unbatched. Body inputs keep the outer operands' types, batch axis included,
so the body's ops are checked for row mixing exactly as outer ops are.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .errors import GraphError, ShapeError
from .node import Node, topological
from .ops import GraphAttr, Op, check_stop_column
from .tensor import LazyTensor, _make, where

#: Nesting depth of the body being traced: it names body inputs, so that an inner body can never
#: mistake an outer body's input (an interned node) for its own.
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("lazy_loop_depth", default=0)

Body = Callable[..., LazyTensor]


class LoopBody(GraphAttr):
    """The body of a LOOP: inputs ``(index, carry, *invariants)`` and one output (the next carry).

    Immutable; equal and hashed by its digest, so the same body traced twice makes one LOOP node.
    """

    __slots__ = ("_document", "digest", "input_names", "inputs", "order", "output")

    inputs: tuple[Node, ...]
    output: Node
    order: list[Node]
    input_names: tuple[str, ...]
    digest: str

    def __init__(self, inputs: Sequence[Node], output: Node) -> None:
        from .digest import document  # digest needs ops and node only: no cycle at call time

        inputs = tuple(inputs)
        order = topological([output])
        _check_closed(inputs, order)
        doc = document(order, inputs, [("next", output)])
        canonical = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        for name, value in (
            ("inputs", inputs),
            ("output", output),
            ("order", order),
            ("input_names", tuple(n.attr("name") for n in inputs)),
            ("_document", doc),
            ("digest", hashlib.sha256(canonical).hexdigest()),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("loop bodies are immutable")

    @property
    def output_nodes(self) -> tuple[Node, ...]:
        """The body's one output, in the shape backends' rule runners expect of a graph."""
        return (self.output,)

    def document(self) -> dict[str, Any]:
        return self._document

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoopBody) and self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"LoopBody({len(self.order)} nodes, {self.digest[:12]})"


def _check_closed(inputs: Sequence[Node], order: Sequence[Node]) -> None:
    if len(inputs) < 2:
        raise GraphError("a loop body takes an index and a carry input, then one per invariant")
    names = []
    for node in inputs:
        if node.op is not Op.INPUT:
            raise GraphError(f"loop body inputs must be INPUT nodes, got {node!r}")
        names.append(node.attr("name"))
    if len(set(names)) != len(names):
        raise GraphError(f"duplicate loop body input names in {names}")
    declared = set(inputs)
    for node in order:
        if node.op is Op.PARAM:
            raise GraphError(
                f"the loop body captures parameter {node.attr('name')!r}; pass it to fori_loop "
                "as an invariant"
            )
        if node.op is Op.INPUT and node not in declared:
            raise GraphError(
                f"the loop body captures {node.attr('name')!r}, which is not one of its inputs; "
                "pass outer values to fori_loop as invariants"
            )


def within(order: Sequence[Node], trips: int = 1) -> Iterator[tuple[Node, int]]:
    """Every node of ``order`` and, recursively, of its LOOP bodies, each with how many times it
    runs per run of ``order`` (a body's nodes once per trip of its loop, at most)."""
    for node in order:
        yield node, trips
        if node.op is Op.LOOP:
            yield from within(node.attr("body").order, trips * node.attr("trip_count"))


def fori_loop(
    trip_count: int,
    body: Body,
    init: LazyTensor,
    *invariants: LazyTensor,
    stop_column: int | None = None,
) -> LazyTensor:
    """``carry = body(i, carry, *invariants)`` for ``i`` in ``range(trip_count)``; returns the carry.

    ``body`` is called once, on lazy stand-ins: ``i`` is an int32 scalar (shape ``()``), ``carry``
    and each invariant have the type of ``init`` and of the matching invariant (batch axis
    included). It must return a value of the carry's shape and dtype, built only from its
    arguments and constants.

    ``stop_column=c`` (a (B, k) carry): a row whose ``carry[:, c]`` is nonzero after a trip keeps
    that carry from then on (the loop wraps the body so), and backends may end the loop once
    every row has stopped: an iterative solver's rows converge in a few of its ``trip_count``
    trips, and the rest need not run. Each row's result is the same either way.
    """
    if (
        isinstance(trip_count, (bool, np.bool_))
        or not isinstance(trip_count, (int, np.integer))
        or trip_count < 0
    ):
        raise ShapeError(f"fori_loop needs a non-negative int trip_count, got {trip_count!r}")
    for k, value in enumerate((init, *invariants)):
        if not isinstance(value, LazyTensor):
            what = "init" if k == 0 else f"invariant {k - 1}"
            raise TypeError(f"fori_loop {what} must be a LazyTensor, got {type(value).__name__}")
    if stop_column is not None:
        check_stop_column(init.node.type, stop_column)
    depth = _depth.get()
    index = Node.make(Op.INPUT, name=f"loop{depth}.i", shape=(), dtype="int32")
    stand_ins = [
        Node.make(Op.INPUT, name=f"loop{depth}.{name}", shape=v.shape, dtype=v.dtype)
        for name, v in [("carry", init), *((f"inv{k}", v) for k, v in enumerate(invariants))]
    ]
    token = _depth.set(depth + 1)
    try:
        out = body(LazyTensor(index), *(LazyTensor(n) for n in stand_ins))
        if stop_column is not None and isinstance(out, LazyTensor):
            carry = LazyTensor(stand_ins[0])
            flagged = carry[:, stop_column : stop_column + 1] != 0
            out = where(flagged, carry, out)  # a stopped row keeps its carry
    finally:
        _depth.reset(token)
    if not isinstance(out, LazyTensor):
        raise TypeError(f"the fori_loop body must return a LazyTensor, got {type(out).__name__}")
    if out.node.type != init.node.type:
        raise ShapeError(
            f"the fori_loop body returns {out.dtype}{list(out.shape)} but the carry is "
            f"{init.dtype}{list(init.shape)}; the body must keep the carry's shape and dtype "
            f"[body output built in {out.where_built()}]"
        )
    loop_body = LoopBody([index, *stand_ins], out.node)
    return _make(
        Op.LOOP,
        [init, *invariants],
        trip_count=trip_count,
        body=loop_body,
        stop_column=stop_column,
    )
