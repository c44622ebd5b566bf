"""A program specialised for narrower values of one of its float inputs.

A graph that must decide exactly as a float64 source takes a float64 input: its tree splits and
comparisons test float64 values. Many clients send float32 tables all the same (a float32 numpy
array, an Arrow or pandas table of float32 columns, an Open Inference Protocol FP32 tensor), and
widening those to float64 is exact, so the answers stay the source's. But then every decision
runs at float64's cost for values that are float32 to begin with.

:func:`narrowed` is the same program taking that input as float32, widened in the graph where
it is read. For a float32 ``v``, ``v > t`` holds iff ``v > round_down(t)`` (the largest float32
at most ``t``), so a comparison or a tree walk reading the widened value is the same decision
on ``v`` itself against its parameters rounded once, at compile time (the narrowing rules of
:mod:`lazy.passes.rules`). What no rule narrows still reads the widened value, exactly as
before; the narrowed program is only worth compiling where some decision narrows.

:class:`lazy.CompiledProgram` compiles both (``narrow_input``) and runs the narrowed one for a
float32 array of that input where the call's formulation narrows: which runs is the caller's
dtype and the placement, and either gives the same answers. The device formulation of a forest
narrows too: its loop over trees compares columns of the widened table with elements of the
thresholds, which :data:`~lazy.passes.rules.LOOP_OF_WIDENED` narrows as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from .graph import Graph
from .node import Node
from .ops import VARIANT_OPERANDS, Op
from .passes import DEFAULT_RULES, NARROWING_RULES, WIDENING_HOISTS, rewrite, specialize
from .program import GraphStage, HostStage, Program, Stage

#: The dtype a float64 input is narrowed to.
NARROW = "float32"
#: What :func:`narrowed` rewrites with: the default passes, and widening casts moved past the
#: ops that keep values (so that the decisions reading them find them).
_RULES = (*DEFAULT_RULES, *WIDENING_HOISTS)


@dataclass(frozen=True)
class Narrowed:
    """A program narrowed for one input, and the targets ("host", "device") whose formulation
    of it narrows some decision (elsewhere it only widens the input itself)."""

    program: Program
    targets: frozenset[str]


def narrowed(program: Program, name: str) -> Narrowed | None:
    """``program`` taking its float64 input ``name`` as float32 arrays, widened exactly where
    read, and every decision on them the narrowing rules move made on float32 values; None
    where no decision narrows (or the input is not float64, or a host step reads it)."""
    declared = next((n for n in program.inputs if n.attr("name") == name), None)
    if declared is None or declared.dtype != "float64":
        return None
    if any(isinstance(s, HostStage) and name in s.inputs for s in program.stages):
        return None
    narrow = Node.make(Op.INPUT, name=name, shape=declared.shape, dtype=NARROW)
    widened = Node.make(Op.CAST, [narrow], dtype=declared.dtype)
    stages: list[Stage] = []
    targets: set[str] = set()
    for stage in program.stages:
        if isinstance(stage, GraphStage) and declared in stage.graph.inputs:
            graph = _substituted(stage.graph, declared, narrow, widened)
            for target in VARIANT_OPERANDS:  # which formulations gain, each as it will run
                fired = rewrite(specialize(graph, target), _RULES)[1]
                if any(fired.get(rule.name) for rule in NARROWING_RULES):
                    targets.add(target)
            stage = GraphStage(rewrite(graph, _RULES)[0])
        stages.append(stage)
    if not targets:
        return None
    inputs = tuple(narrow if n is declared else n for n in program.inputs)
    return Narrowed(Program(inputs, tuple(stages), program.outputs), frozenset(targets))


def _substituted(graph: Graph, declared: Node, narrow: Node, widened: Node) -> Graph:
    """``graph`` reading ``widened`` (of the input ``narrow``) wherever it read ``declared``."""
    mapped: dict[Node, Node] = {declared: widened}
    for node in graph.order:
        if node not in mapped:
            mapped[node] = node.with_inputs([mapped[i] for i in node.inputs])
    inputs = [narrow if n is declared else n for n in graph.inputs]
    return Graph(inputs, [(k, mapped[n]) for k, n in graph.outputs], graph.params)
