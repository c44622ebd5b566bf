"""Whole-graph verification.

Every node's type is re-derived from its operands with the op's spec (the rule that also runs when a
node is built) and compared with the type it carries. The specs reject any op that combines rows of
the batch (:class:`RowMixingError`), so a graph that verifies computes each output row from the same
input row only: padding a batch with extra rows, or splitting it, cannot change real rows' results.
"""

from __future__ import annotations

from .errors import GraphError
from .graph import Graph
from .ops import recheck


def verify(graph: Graph) -> Graph:
    """Raise :class:`ShapeError` / :class:`RowMixingError` / :class:`GraphError`; else return it.

    A LOOP's rule re-checks its body the same way, so loop bodies are verified too (nested)."""
    recheck(graph.order)
    for name, node in graph.outputs:
        if not node.batched:
            raise GraphError(f"output {name!r} has no batch dimension: {node.shape}")
    return graph
