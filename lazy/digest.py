"""A graph's portable identity: sha256 of a canonical serialization.

The serialization lists nodes in the graph's deterministic topological order with their op, operand
positions, attributes, shape and dtype, then the inputs and the named outputs, under the IR version.
Constants contribute their bytes; parameters only their name, shape and dtype; a LOOP's body is
serialized the same way, nested in the LOOP node's attributes. Nothing depends on
``hash()``, ``id()`` or the process, so two processes (whatever ``PYTHONHASHSEED``) agree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from .graph import Graph
from .node import Node
from .ops import ConstValue, GraphAttr
from .shapes import BatchDim

#: Bump when the meaning of a serialized graph changes (op semantics, encoding).
IR_VERSION = 2  # 2: LOOP gained stop_column


def _encode(value: Any) -> Any:
    """Tagged JSON encoding: distinct values never share an encoding."""
    if isinstance(value, BatchDim):
        return ["B"]
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, int):
        return ["i", value]
    if isinstance(value, str):
        return ["s", value]
    if value is None:
        return ["n"]
    if isinstance(value, tuple):
        return ["t", [_encode(v) for v in value]]
    if isinstance(value, ConstValue):
        a = value.array
        return ["c", a.dtype.name, list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()]
    if isinstance(value, GraphAttr):
        return ["g", value.document()]
    raise TypeError(f"cannot serialize attribute {value!r}")


def document(
    order: Sequence[Node], inputs: Sequence[Node], outputs: Sequence[tuple[str, Node]]
) -> dict[str, Any]:
    """The JSON-able serialization of a (sub-)graph given in deterministic topological order."""
    index = {node: i for i, node in enumerate(order)}
    return {
        "nodes": [
            [
                node.op.value,
                [index[i] for i in node.inputs],
                [[k, _encode(v)] for k, v in node.attrs],
                _encode(node.shape),
                node.dtype,
            ]
            for node in order
        ],
        # Every input's type: an input the outputs do not use is still an executable argument.
        "inputs": [[n.attr("name"), _encode(n.shape), n.dtype] for n in inputs],
        "outputs": [[name, index[node]] for name, node in outputs],
    }


def canonical_form(graph: Graph) -> bytes:
    doc = {"ir": IR_VERSION, **document(graph.order, graph.inputs, graph.outputs)}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def graph_digest(graph: Graph) -> str:
    return hashlib.sha256(canonical_form(graph)).hexdigest()
