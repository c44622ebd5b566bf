"""Graph passes: dead heads, casts, constant and affine folding, decisions on widened values,
parameter inlining, and the choice of one formulation per VARIANT.

Dead code never survives a graph: :attr:`Graph.order` only holds what the outputs need, so dropping
unused heads (:func:`prune`) is dead-code elimination.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import GraphError
from ..graph import Graph
from ..node import Node
from ..ops import VARIANT_OPERANDS, ConstValue, Op
from .rewrite import Pattern, RewriteContext, Rule, rewrite
from .rules import (
    AFFINE_MATMUL,
    BIAS_CHAIN,
    CAST_CHAIN,
    COMPARE_OF_WIDENED,
    DEFAULT_RULES,
    FOLD_CONSTANTS,
    FOREST_OF_WIDENED,
    IDENTITY_CAST,
    LOOP_OF_WIDENED,
    NARROWING_RULES,
    RESHAPE_CHAIN,
    RESHAPE_ROUND_TRIP,
    SLICE_OF_CONCAT,
    WIDENING_HOISTS,
)


def prune(graph: Graph, keep: Sequence[str]) -> Graph:
    """Keep only the named outputs (the rest of their subgraphs disappears with them)."""
    unknown = set(keep) - set(graph.output_names)
    if unknown:
        raise GraphError(f"unknown outputs {sorted(unknown)}; graph has {graph.output_names}")
    return graph.replace(outputs=[(k, n) for k, n in graph.outputs if k in keep])


def optimize(graph: Graph, rules: Sequence[Rule] = DEFAULT_RULES) -> Graph:
    return rewrite(graph, rules)[0]


def specialize(graph: Graph, target: str) -> Graph:
    """``graph`` with every VARIANT replaced by ``target``'s formulation ("device" or "host"):
    the other formulation's nodes and parameters leave with it. A graph without VARIANT is
    returned as is."""
    if target not in VARIANT_OPERANDS:
        raise GraphError(f"unknown target {target!r}; expected one of {sorted(VARIANT_OPERANDS)}")
    if not any(node.op is Op.VARIANT for node in graph.order):
        return graph
    operand = VARIANT_OPERANDS[target]
    rule = Rule(
        f"variant-{target}",
        Pattern(Op.VARIANT, bind="v"),
        lambda bound, ctx: bound["v"].inputs[operand],
    )
    return rewrite(graph, [rule])[0]


def inline_params(graph: Graph, max_elements: int) -> Graph:
    """Bake parameters of at most ``max_elements`` elements into the graph as constants."""
    if max_elements <= 0:
        return graph

    def small(node: Node, ctx: RewriteContext) -> bool:
        return int(ctx.params[node.attr("name")].size) <= max_elements

    rule = Rule(
        "inline-param",
        Pattern(Op.PARAM, where=small, bind="p"),
        lambda b, ctx: Node.make(Op.CONST, value=ConstValue(ctx.params[b["p"].attr("name")])),
    )
    return rewrite(graph, [rule])[0]


__all__ = [
    "AFFINE_MATMUL",
    "BIAS_CHAIN",
    "CAST_CHAIN",
    "COMPARE_OF_WIDENED",
    "DEFAULT_RULES",
    "FOLD_CONSTANTS",
    "FOREST_OF_WIDENED",
    "IDENTITY_CAST",
    "LOOP_OF_WIDENED",
    "NARROWING_RULES",
    "RESHAPE_CHAIN",
    "RESHAPE_ROUND_TRIP",
    "SLICE_OF_CONCAT",
    "VARIANT_OPERANDS",
    "WIDENING_HOISTS",
    "Pattern",
    "Rule",
    "inline_params",
    "optimize",
    "prune",
    "rewrite",
    "specialize",
]
