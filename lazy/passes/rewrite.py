"""Pattern → replacement rewriting over hash-consed graphs.

Rules are data: a :class:`Pattern` to match at a node and a function that builds the replacement
(or declines with ``None``). :func:`rewrite` walks the graph bottom-up, rebuilding each node on its
rewritten operands and applying rules at it until none fires, so rules see already-simplified
operands. New parameter values a replacement needs (folded constants) go through the context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..graph import Graph
from ..node import Node, depends_on_input
from ..ops import Op

_MAX_REWRITES_PER_NODE = 32


@dataclass(frozen=True)
class Pattern:
    """Matches a node by op (``None``: any), operand patterns, and a predicate; ``bind`` names it."""

    op: Op | frozenset[Op] | None = None
    inputs: tuple[Pattern, ...] | None = None
    bind: str | None = None
    where: Callable[[Node, RewriteContext], bool] | None = None

    def match(self, node: Node, ctx: RewriteContext) -> dict[str, Node] | None:
        ops = self.op if isinstance(self.op, frozenset) else {self.op}
        if self.op is not None and node.op not in ops:
            return None
        if self.inputs is not None and len(self.inputs) != len(node.inputs):
            return None
        if self.where is not None and not self.where(node, ctx):
            return None
        bound: dict[str, Node] = {self.bind: node} if self.bind else {}
        for pattern, child in zip(self.inputs or (), node.inputs, strict=False):
            sub = pattern.match(child, ctx)
            if sub is None:
                return None
            bound.update(sub)
        return bound


Rewrite = Callable[[dict[str, Node], "RewriteContext"], Node | None]


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: Pattern
    rewrite: Rewrite


@dataclass
class RewriteContext:
    """Parameter values (existing and new) and which nodes depend on graph inputs."""

    params: dict[str, np.ndarray]
    fired: dict[str, int] = field(default_factory=dict)
    _input_dependent: dict[Node, bool] = field(default_factory=dict)

    def depends_on_input(self, node: Node) -> bool:
        known = self._input_dependent.get(node)
        if known is None:
            from ..node import topological

            self._input_dependent.update(depends_on_input(topological([node])))
            known = self._input_dependent[node]
        return known

    def param_only(self, node: Node) -> bool:
        """Computable from parameters and constants alone (no input, no batch axis)."""
        return not node.batched and not self.depends_on_input(node)

    def value(self, node: Node) -> np.ndarray:
        """The value of a parameter-only node, computed by the float64 interpreter."""
        from ..interpreter import evaluate

        if node.op is Op.PARAM:
            return self.params[node.attr("name")]
        if node.op is Op.CONST:
            return node.attr("value").array
        return evaluate(Graph([], {"v": node}, self.params), {})["v"]

    def new_param(self, value: np.ndarray, like: Node, stem: str, sources: Sequence[Node]) -> Node:
        """A PARAM holding ``value`` (cast to ``like``'s dtype), named from its sources' structure
        so that a retrained model with the same structure gets the same name (and executables).

        ``sources`` must determine ``value`` given the parameter values (they may contain inputs):
        two different values must never share a name."""
        from ..digest import graph_digest
        from ..node import topological

        inputs = [n for n in topological(sources) if n.op is Op.INPUT]
        outputs = {f"s{i}": s for i, s in enumerate(sources)}
        sig = graph_digest(Graph(inputs, outputs, self.params))
        name = f"{stem}.{sig[:16]}"
        # astype(order="C"), not np.ascontiguousarray: that one turns a 0-d value into shape (1,).
        array = np.asarray(value).astype(like.dtype, order="C")
        self.params[name] = array
        return Node.make(Op.PARAM, name=name, shape=array.shape, dtype=array.dtype)


def rewrite(graph: Graph, rules: Sequence[Rule]) -> tuple[Graph, dict[str, int]]:
    """Apply ``rules`` bottom-up to a fixpoint; returns the new graph and how often each fired."""
    ctx = RewriteContext(dict(graph.params))
    mapped: dict[Node, Node] = {}
    for node in graph.order:
        new = node.with_inputs([mapped[i] for i in node.inputs])
        for _ in range(_MAX_REWRITES_PER_NODE):
            replacement = _apply_first(new, rules, ctx)
            if replacement is None or replacement is new:
                break
            new = replacement
        mapped[node] = new
    outputs = [(name, mapped[node]) for name, node in graph.outputs]
    return Graph(graph.inputs, outputs, ctx.params), ctx.fired


def _apply_first(node: Node, rules: Sequence[Rule], ctx: RewriteContext) -> Node | None:
    for rule in rules:
        bound = rule.pattern.match(node, ctx)
        if bound is None:
            continue
        replacement = rule.rewrite(bound, ctx)
        if replacement is not None and replacement is not node:
            if replacement.type != node.type:
                raise AssertionError(f"rule {rule.name} changed {node.type} to {replacement.type}")
            ctx.fired[rule.name] = ctx.fired.get(rule.name, 0) + 1
            return replacement
    return None
