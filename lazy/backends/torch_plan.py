"""Eager torch programs: a graph flattened once into slot-addressed steps, loops split by iteration.

Running a graph node by node through a rule table re-derives, on every call, what never changes:
constants, static shapes, which value each operand is. :class:`Plan` does that work once per
executable: every node becomes one step ``(fn, operand slots, result slot, slots freed after)``
over a preallocated value list, constants are materialized once, and values are dropped after
their last use.

A LOOP's body is partitioned by what its nodes depend on (:class:`LoopStep`):

* *invariant* nodes (neither the index nor the carry) run once per loop call;
* *varying* nodes (the index but not the carry) run once per chunk of iterations, batched over a
  leading iteration axis, when the backend has a batching rule for them (``batcher``): a forest's
  per-tree work becomes a few ops on ``(trees, rows)`` tensors instead of ``trees`` × ops;
* *sequential* nodes (the carry, or a varying operand without a batching rule) run per iteration
  on that iteration's slice of the varying values, in order.

Every node computes exactly what the per-iteration interpretation computes (batching rules are
elementwise or gathers, which do not mix iterations), and a fold over the carry stays a
left-to-right fold, so results are bit-identical to running the body ``trip_count`` times.

When the body's output is ``UPDATE(carry, idx, value)``, the carry has no other reader, and
``idx`` and ``value`` do not depend on the carry (a "map" filling a table one slot per
iteration), a chunk of iterations is written with one scatter (last write wins on repeated
slots). Otherwise such an UPDATE writes the carry in place: the loop owns a copy of its initial
carry and nothing else reads it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..node import Node
from ..ops import Op
from .base import Lowering, Rule

#: A batching rule for one node, given which operands carry the leading iteration axis: a rule
#: over those physical operands, or None where the op cannot be batched that way.
Batcher = Callable[[Node, tuple[bool, ...], Lowering], Rule | None]
#: ``scatter(carry, axis, idx, values)``: write ``values[k]`` at ``idx[k]`` along ``axis`` of
#: ``carry`` in place (indices distinct and in bounds).
Scatter = Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor], None]
#: ``assign(carry, axis, idx, value)``: ``carry.select(axis, idx) = value`` in place.
Assign = Callable[[torch.Tensor, int, int, torch.Tensor], None]

#: Elements of the largest batched value of one chunk of iterations: bounds the memory a loop
#: split by iteration holds (16 MiB of float32 per value).
CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class RuleSet:
    """What a plan needs from a backend: its rule table and the loop-specific lowerings."""

    rules: Mapping[Op, Rule]
    batcher: Batcher
    scatter: Scatter
    assign: Assign
    #: ``specialise(rule, node, lowering)``: an equivalent rule for the node's static operand
    #: types (e.g. without a per-call dtype dispatch).
    specialise: Callable[[Rule, Node, Lowering], Rule]


class Kind(enum.Enum):
    """Where a loop body's node runs (see the module docstring)."""

    INVARIANT = "invariant"
    VARYING = "varying"
    SEQUENTIAL = "sequential"


Step = tuple[Callable[[list[Any]], Any], tuple[int, ...], int, tuple[int, ...]]


def _bind(rule: Rule, node: Node, low: Lowering) -> Callable[[list[Any]], Any]:
    return lambda a: rule(node, a, low)


class _Steps:
    """Slot allocation and step lists for the nodes of one plan (a graph, or a loop body)."""

    def __init__(self, low: Lowering, ruleset: RuleSet) -> None:
        self.low = low
        self.ruleset = ruleset
        self.slot: dict[Node | _SliceOf, int] = {}
        self.constants: dict[int, Any] = {}

    def slot_of(self, node: Node | _SliceOf) -> int:
        if node not in self.slot:
            self.slot[node] = len(self.slot)
        return self.slot[node]

    def step(self, node: Node, rule: Rule | None = None) -> Callable[[list[Any]], Any]:
        """The function computing ``node`` from its operands' values: ``rule`` if given, else the
        backend's rule for the op (a LOOP: compiled into a :class:`LoopStep`)."""
        if rule is not None:
            return _bind(rule, node, self.low)
        if node.op is Op.LOOP:
            return LoopStep(node, self.low, self.ruleset)
        rule = self.ruleset.specialise(self.ruleset.rules[node.op], node, self.low)
        return _bind(rule, node, self.low)

    def emit(
        self, nodes: Sequence[Node], keep: set[Node], rules: Mapping[Node, Rule]
    ) -> list[Step]:
        """Steps for ``nodes`` (in order). A value one of them computes is freed after its last
        reader among them unless it is in ``keep`` (read after these steps)."""
        produced = set(nodes)
        last: dict[Node, int] = {}
        for k, node in enumerate(nodes):
            for operand in node.inputs:
                if operand in produced and operand not in keep:
                    last[operand] = k
        dead: list[list[int]] = [[] for _ in nodes]
        for node, k in last.items():
            dead[k].append(self.slot_of(node))
        steps = []
        for k, node in enumerate(nodes):
            fn = self.step(node, rules.get(node))
            args = tuple(self.slot_of(i) for i in node.inputs)
            steps.append((fn, args, self.slot_of(node), tuple(dead[k])))
        return steps

    def constant(self, node: Node) -> None:
        self.constants[self.slot_of(node)] = self.ruleset.rules[Op.CONST](node, [], self.low)

    def template(self) -> list[Any]:
        env: list[Any] = [None] * len(self.slot)
        for slot, value in self.constants.items():
            env[slot] = value
        return env


def run_steps(steps: Sequence[Step], env: list[Any]) -> None:
    for fn, args, out, dead in steps:
        env[out] = fn([env[i] for i in args])
        for i in dead:
            env[i] = None


class Plan:
    """``order`` (operands first) compiled for one lowering: leaves in, ``outputs`` out.

    ``leaves`` are the INPUT / PARAM nodes fed per call, in the order :meth:`__call__` takes them.
    """

    def __init__(
        self,
        order: Sequence[Node],
        leaves: Sequence[Node],
        outputs: Sequence[Node],
        low: Lowering,
        ruleset: RuleSet,
    ) -> None:
        steps = _Steps(low, ruleset)
        self._leaf_slots = tuple(steps.slot_of(n) for n in leaves)
        fed = set(leaves)
        work = []
        for node in order:
            if node.op is Op.CONST:
                steps.constant(node)
            elif node not in fed:
                work.append(node)
        self._steps = steps.emit(work, set(outputs), {})
        self._out_slots = tuple(steps.slot_of(n) for n in outputs)
        # A constant output would hand the plan's own tensor to the caller: copy it.
        self._copy_out = tuple(n.op is Op.CONST for n in outputs)
        self._template = steps.template()

    def __call__(self, leaves: Sequence[Any]) -> list[Any]:
        env = self._template.copy()
        for slot, value in zip(self._leaf_slots, leaves, strict=True):
            env[slot] = value
        run_steps(self._steps, env)
        return [
            env[s].clone() if copy else env[s]
            for s, copy in zip(self._out_slots, self._copy_out, strict=True)
        ]


def classify(
    order: Sequence[Node], index: Node, carry: Node, batcher: Batcher, low: Lowering
) -> dict[Node, tuple[Kind, Rule | None]]:
    """Each body node's :class:`Kind`, and its batching rule if it is VARYING."""
    kinds: dict[Node, tuple[Kind, Rule | None]] = {}
    for node in order:
        if node is carry:
            kinds[node] = (Kind.SEQUENTIAL, None)
        elif node is index:
            kinds[node] = (Kind.VARYING, None)
        elif not node.inputs:
            kinds[node] = (Kind.INVARIANT, None)
        else:
            operand = [kinds[i][0] for i in node.inputs]
            if Kind.SEQUENTIAL in operand:
                kinds[node] = (Kind.SEQUENTIAL, None)
            elif Kind.VARYING not in operand:
                kinds[node] = (Kind.INVARIANT, None)
            else:
                rule = batcher(node, tuple(k is Kind.VARYING for k in operand), low)
                kinds[node] = (Kind.VARYING, rule) if rule else (Kind.SEQUENTIAL, None)
    return kinds


class LoopStep:
    """One LOOP node compiled for one lowering: ``loop([init, *invariants]) -> final carry``."""

    def __init__(self, node: Node, low: Lowering, ruleset: RuleSet) -> None:
        body = node.attr("body")
        self._trips: int = node.attr("trip_count")
        index, carry, *invariants = body.inputs
        kinds = classify(body.order, index, carry, ruleset.batcher, low)
        self._kinds = kinds
        steps = _Steps(low, ruleset)
        self._index, self._carry = steps.slot_of(index), steps.slot_of(carry)
        self._invariant_slots = tuple(steps.slot_of(n) for n in invariants)
        output = body.output
        self._output = steps.slot_of(output)
        self._output_kind = kinds[output][0]

        of = {kind: [n for n in body.order if kinds[n][0] is kind] for kind in Kind}
        inv = [n for n in of[Kind.INVARIANT] if n.op is not Op.INPUT]
        var = [n for n in of[Kind.VARYING] if n is not index]
        seq = [n for n in of[Kind.SEQUENTIAL] if n is not carry]
        for n in inv:
            if n.op is Op.CONST:
                steps.constant(n)
        inv = [n for n in inv if n.op is not Op.CONST]

        readers: dict[Node, int] = {}
        for n in body.order:
            for i in n.inputs:
                readers[i] = readers.get(i, 0) + 1
        # The map-UPDATE form: one scatter per chunk, no per-iteration steps at all.
        self._scatter = (
            output.op is Op.UPDATE
            and output.inputs[0] is carry
            and readers.get(carry, 0) == 1
            and all(kinds[i][0] is not Kind.SEQUENTIAL for i in output.inputs[1:])
        )
        in_place = (
            output.op is Op.UPDATE and output.inputs[0] is carry and readers.get(carry, 0) == 1
        )
        self._owns_carry = in_place
        self._write = ruleset.scatter
        if self._scatter:
            seq = []
            _, idx, value = output.inputs
            self._axis = output.attr("axis") % len(output.shape)
            self._scatter_args = (
                (steps.slot_of(idx), kinds[idx][0] is Kind.VARYING),
                (steps.slot_of(value), kinds[value][0] is Kind.VARYING),
            )

        # Varying values read per iteration (by sequential steps, or as the loop's result) get a
        # second slot holding the current iteration's slice.
        sliced = {i for n in seq for i in n.inputs if kinds[i][0] is Kind.VARYING}
        if self._output_kind is Kind.VARYING:
            sliced.add(output)
        self._slices: tuple[tuple[int, int], ...] = ()
        slice_of: dict[Node, _SliceOf] = {}
        for n in sorted(sliced, key=body.order.index):
            slice_of[n] = _SliceOf(n)
            self._slices += ((steps.slot_of(n), steps.slot_of(slice_of[n])),)

        # Static nodes depend only on the index, constants and parameters (invariants bound to
        # PARAM nodes): the same on every call with the same parameter values, so they are
        # computed once per parameter set and cached (a tree's split columns, thresholds, masks).
        outer = dict(zip(invariants, node.inputs[1:], strict=True))
        static: set[Node] = set()
        for n in body.order:
            if n is carry or kinds[n][0] is Kind.SEQUENTIAL:
                continue
            leaf = n is index or n.op is Op.CONST or (n in outer and outer[n].op is Op.PARAM)
            if leaf or (n.inputs and all(i in static for i in n.inputs)):
                static.add(n)
        self._static_inputs = tuple(steps.slot_of(n) for n in invariants if n in static)
        keep = set(of[Kind.INVARIANT]) | set(of[Kind.VARYING]) | {output}
        self._static_inv = steps.emit([n for n in inv if n in static], keep, {})
        self._inv_steps = steps.emit([n for n in inv if n not in static], keep, {})
        var_rules = {n: rule for n in var if (rule := kinds[n][1]) is not None}
        var_keep = set(sliced) | {output} | static
        if self._scatter:
            var_keep |= {*output.inputs[1:]}
        self._static_var = steps.emit([n for n in var if n in static], var_keep, var_rules)
        self._var_steps = steps.emit([n for n in var if n not in static], var_keep, var_rules)
        self._cache: tuple[tuple[Any, ...], list[Any], list[list[Any]]] | None = None
        seq_rules: dict[Node, Rule] = {}
        if in_place and not self._scatter:
            seq_rules[output] = _assign_rule(ruleset.assign)
        self._seq_steps = self._emit_sequential(steps, seq, slice_of, seq_rules)
        if self._output_kind is Kind.VARYING:
            self._output = steps.slot_of(slice_of[output])

        widest = max((math.prod(low.shape(n)) for n in var), default=1)
        chunk = max(1, min(self._trips, CHUNK_ELEMENTS // max(widest, 1)))
        self._chunks = [
            torch.arange(t0, min(t0 + chunk, self._trips), dtype=torch.int32)
            for t0 in range(0, self._trips, chunk)
        ]
        self._template = steps.template()

    @staticmethod
    def _emit_sequential(
        steps: _Steps,
        seq: list[Node],
        slice_of: Mapping[Node, _SliceOf],
        rules: dict[Node, Rule],
    ) -> list[Step]:
        # Sequential nodes read the per-iteration slice of a varying operand.
        out = []
        for node in seq:
            fn = steps.step(node, rules.get(node))
            args = tuple(steps.slot_of(slice_of.get(i, i)) for i in node.inputs)
            out.append((fn, args, steps.slot_of(node), ()))
        # Values live for one iteration only; no frees needed (overwritten next iteration).
        return out

    def __call__(self, a: list[Any]) -> Any:
        init, *invariants = a
        if self._trips == 0:
            return init
        env = self._template.copy()
        for slot, value in zip(self._invariant_slots, invariants, strict=True):
            env[slot] = value
        carry = init.clone() if (self._owns_carry or self._scatter) else init
        static_inv, static_var = self._static_values(env)
        for (_, _, slot, _), value in zip(self._static_inv, static_inv, strict=True):
            env[slot] = value
        run_steps(self._inv_steps, env)
        var_steps, seq_steps, slices = self._var_steps, self._seq_steps, self._slices
        carry_slot, out_slot = self._carry, self._output
        for chunk, values in zip(self._chunks, static_var, strict=True):
            env[self._index] = chunk
            for (_, _, slot, _), value in zip(self._static_var, values, strict=True):
                env[slot] = value
            run_steps(var_steps, env)
            if self._scatter:
                self._scatter_chunk(env, carry, len(chunk))
                continue
            for t in range(len(chunk)):
                for whole, part in slices:
                    env[part] = env[whole][t]
                env[carry_slot] = carry
                for fn, args, out, _ in seq_steps:
                    env[out] = fn([env[i] for i in args])
                carry = env[out_slot]
        return carry

    def _static_values(self, env: list[Any]) -> tuple[list[Any], list[list[Any]]]:
        """The static nodes' values (invariant, then per chunk) for the parameters in ``env``."""
        key = tuple(env[s] for s in self._static_inputs)
        cached = self._cache  # one read: a concurrent call may replace it, never mutate it
        if cached is not None and all(a is b for a, b in zip(cached[0], key, strict=True)):
            return cached[1], cached[2]
        run_steps(self._static_inv, env)
        inv = [env[out] for _, _, out, _ in self._static_inv]
        per_chunk = []
        for chunk in self._chunks:
            env[self._index] = chunk
            run_steps(self._static_var, env)
            per_chunk.append([env[out] for _, _, out, _ in self._static_var])
        # The key holds the parameter tensors themselves, so their ids cannot be reused.
        self._cache = (key, inv, per_chunk)
        return inv, per_chunk

    def _scatter_chunk(self, env: list[Any], carry: torch.Tensor, n: int) -> None:
        (idx_slot, idx_varies), (value_slot, value_varies) = self._scatter_args
        idx = env[idx_slot] if idx_varies else env[idx_slot].expand(n)
        value = env[value_slot]
        if not value_varies:
            value = value.expand(n, *value.shape)
        positions = idx.tolist()
        if len(set(positions)) != n:  # repeated slots: the last iteration writing one wins
            last = {p: k for k, p in enumerate(positions)}
            keep = torch.tensor(list(last.values()), dtype=torch.int64)
            idx, value = idx[keep], value[keep]
        self._write(carry, self._axis, idx, value.movedim(0, self._axis))

    def kinds(self) -> dict[Node, Kind]:
        """Each body node's :class:`Kind` (for tests and diagnostics)."""
        return {n: k for n, (k, _) in self._kinds.items()}


class _SliceOf:
    """A slot key for the current iteration's slice of a varying body value."""

    __slots__ = ("node",)

    def __init__(self, node: Node) -> None:
        self.node = node


def _assign_rule(assign: Assign) -> Rule:
    def rule(n: Node, a: list[Any], low: Lowering) -> Any:
        x, idx, value = a
        assign(x, n.attr("axis") % x.ndim, int(idx), value)
        return x

    return rule
