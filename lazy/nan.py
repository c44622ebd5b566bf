"""Which input columns a NaN provably reaches an output from, whatever the other values are.

A host that must refuse rows with a missing value usually scans the whole input for NaN before
running the graph: one more pass over memory the graph is about to read anyway. When every NaN
of a rejected column is certain to surface as a NaN in the output row it came from, the host may
run first and scan only the (much smaller) output, going back to the input only when the output
has a NaN (to name the row, or to find a false alarm such as ``inf - inf``).

The analysis is conservative: it follows only ops whose IEEE semantics turn a NaN operand into a
NaN result for *every* value of the other operands (``nan * 0``, ``nan + inf``, ``exp(nan)``,
a sum or dot product with a NaN term). Ops that can drop a NaN stop it: comparisons, WHERE, ISNAN,
MAXIMUM/MINIMUM and MAX/MIN (their NaN handling differs between backends and flags), POW
(``pow(nan, 0) == 1``), gathers, SLICE (may cut the NaN's element away), casts to integers, LOOP.
A VARIANT passes on what both of its formulations do.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import dtypes as dt
from .errors import GraphError
from .graph import Graph
from .node import Node
from .ops import Op
from .shapes import is_batched, static_size

#: NaN in any operand element → NaN in the result elements it feeds, whatever the other operands.
_ELEMENTWISE = frozenset(
    {
        Op.NEG,
        Op.ABS,
        Op.EXP,
        Op.LOG,
        Op.LOG1P,
        Op.EXPM1,
        Op.SQRT,
        Op.TANH,
        Op.SIGMOID,
        Op.ERF,
        Op.FLOOR,
        Op.ADD,
        Op.SUB,
        Op.MUL,
        Op.DIV,
        Op.REMAINDER,
        Op.CAST,  # to a float dtype only: non-float results are dropped below
    }
)
#: A NaN element → NaN in some element of the same row (sums, dot products, exp-normalisation).
_REDUCING = frozenset({Op.MATMUL, Op.SUM, Op.SOFTMAX})
#: The elements of a row, rearranged or repeated within the row, none dropped.
_LAYOUT = frozenset({Op.RESHAPE, Op.BROADCAST, Op.TRANSPOSE, Op.CONCAT})
_PROPAGATING = _ELEMENTWISE | _REDUCING | _LAYOUT


def nan_reaching_columns(graph: Graph, input_name: str) -> dict[str, frozenset[int]]:
    """Per output of ``graph``: the columns ``c`` of the 2-D input ``input_name`` (rows × columns)
    such that a NaN at ``[r, c]`` makes some element of the output's row ``r`` NaN, whatever the
    rest of the input holds. Outputs without such columns map to an empty set."""
    source = next((n for n in graph.inputs if n.attr("name") == input_name), None)
    if source is None:
        raise GraphError(f"graph has no input {input_name!r}; it has {list(graph.input_names)}")
    if len(source.shape) != 2 or not is_batched(source.shape):
        raise GraphError(f"input {input_name!r} must be rows × columns, got {source.shape}")
    columns: dict[Node, frozenset[int]] = {}
    for node in graph.order:
        columns[node] = _reaching(node, source, columns)
    return {name: columns.get(node, frozenset()) for name, node in graph.outputs}


def _reaching(node: Node, source: Node, known: Mapping[Node, frozenset[int]]) -> frozenset[int]:
    if node is source:
        return frozenset(range(static_size(node.shape))) if node.dtype in dt.FLOATS else frozenset()
    if node.op is Op.VARIANT:  # either formulation may run: only what both surface is certain
        device, host = (known.get(operand, frozenset()) for operand in node.inputs)
        return device & host
    if (
        node.op not in _PROPAGATING
        or node.dtype not in dt.FLOATS
        or not is_batched(node.shape)
        or static_size(node.shape) == 0  # a row without elements holds no NaN
    ):
        return frozenset()
    found: frozenset[int] = frozenset()
    for operand in node.inputs:
        found |= known.get(operand, frozenset())
    return found
