"""Whole-graph verification.

Every node's type is re-derived from its operands with the op's spec (the rule that also runs when a
node is built) and compared with the type it carries. The specs reject any op that combines rows of
the batch (:class:`RowMixingError`), so a graph that verifies computes each output row from the same
input row only: padding a batch with extra rows, or splitting it, cannot change real rows' results.
"""

from __future__ import annotations

from .errors import GraphError, ShapeError
from .graph import Graph
from .ops import SPECS


def verify(graph: Graph) -> Graph:
    """Raise :class:`ShapeError` / :class:`RowMixingError` / :class:`GraphError`; else return it."""
    for node in graph.order:
        spec = SPECS[node.op]
        try:
            spec.check_arity(len(node.inputs))
            inferred = spec.infer([i.type for i in node.inputs], dict(node.attrs))
        except ShapeError as exc:
            raise type(exc)(f"{node!r}: {exc}") from None
        if inferred != node.type:
            raise GraphError(f"{node!r} declares {node.type} but its operands give {inferred}")
    for name, node in graph.outputs:
        if not node.batched:
            raise GraphError(f"output {name!r} has no batch dimension: {node.shape}")
    return graph
