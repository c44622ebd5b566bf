"""A graph's portable identity: sha256 of a canonical serialization.

The serialization lists nodes in the graph's deterministic topological order with their op, operand
positions, attributes, shape and dtype, then the inputs and the named outputs, under the IR version.
Constants contribute their bytes; parameters only their name, shape and dtype. Nothing depends on
``hash()``, ``id()`` or the process, so two processes (whatever ``PYTHONHASHSEED``) agree.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .graph import Graph
from .ops import ConstValue
from .shapes import BatchDim

#: Bump when the meaning of a serialized graph changes (op semantics, encoding).
IR_VERSION = 1


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
    raise TypeError(f"cannot serialize attribute {value!r}")


def canonical_form(graph: Graph) -> bytes:
    index = {node: i for i, node in enumerate(graph.order)}
    doc = {
        "ir": IR_VERSION,
        "nodes": [
            [
                node.op.value,
                [index[i] for i in node.inputs],
                [[k, _encode(v)] for k, v in node.attrs],
                _encode(node.shape),
                node.dtype,
            ]
            for node in graph.order
        ],
        # Every input's type: an input the outputs do not use is still an executable argument.
        "inputs": [[n.attr("name"), _encode(n.shape), n.dtype] for n in graph.inputs],
        "outputs": [[name, index[node]] for name, node in graph.outputs],
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def graph_digest(graph: Graph) -> str:
    return hashlib.sha256(canonical_form(graph)).hexdigest()
