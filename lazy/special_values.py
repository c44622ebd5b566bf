"""Which IEEE special values a node may hold: NaN, an infinity, a zero.

A consumer that treats NaN specially (tree splits send it down a learned side, which costs the
tree strategies a second, NaN-aware copy of every feature column) can skip that work where no
NaN can reach it — a forest behind an imputer, a one-hot encoder, a scaler.

The analysis is conservative: every fact is "may hold", and an op it has no rule for may hold
anything. It tracks infinities and zeros only as far as they make NaN: ``inf - inf``,
``0 * inf``, ``0 / 0`` and ``inf / inf``. Arithmetic on floats may always overflow to an
infinity or underflow to zero, so any float ADD/SUB/MUL/DIV result may be either. Parameter and
constant values are read, judged in float32 as well (what the x32 dtype policy runs: 1e300
becomes inf, 1e-50 becomes 0). Integer and boolean values hold none of the three that matter
(their zeros never meet an infinity without a cast, which the rules see).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from . import dtypes as dt
from .node import Node
from .ops import Op


@dataclass(frozen=True)
class Special:
    """What ``node`` may hold: NaN, ±inf, ±0."""

    nan: bool
    inf: bool
    zero: bool

    def __or__(self, other: Special) -> Special:
        return Special(self.nan | other.nan, self.inf | other.inf, self.zero | other.zero)


ANY = Special(nan=True, inf=True, zero=True)
#: Integers and booleans: as far as NaN is concerned, nothing special.
ORDINARY = Special(nan=False, inf=False, zero=True)

_F32 = np.finfo(np.float32)


def of_values(values: np.ndarray) -> Special:
    """The special values an array holds, judged in its own dtype and in float32."""
    values = np.asarray(values)
    if values.dtype.kind != "f":
        return ORDINARY
    magnitude = np.abs(values)
    return Special(
        nan=bool(np.isnan(values).any()),
        inf=bool((magnitude > _F32.max).any()),  # inf itself, or what float32 rounds to it
        zero=bool((magnitude < _F32.tiny).any()),  # 0, or what float32 flushes toward it
    )


def _arith(op: Op, a: Special, b: Special) -> Special:
    if op in (Op.ADD, Op.SUB):
        nan = a.inf and b.inf
    elif op is Op.MUL:
        nan = (a.inf and b.zero) or (a.zero and b.inf)
    else:  # DIV
        nan = (a.inf and b.inf) or (a.zero and b.zero)
    return Special(nan=a.nan or b.nan or nan, inf=True, zero=True)


def _bounded(a: Special) -> Special:
    """tanh, sigmoid, erf: finite for every non-NaN operand."""
    return Special(nan=a.nan, inf=False, zero=True)


#: Rules by op for a float result, from the operands' facts (the node for its attributes).
_RULES: dict[Op, Callable[[Node, list[Special]], Special]] = {
    Op.NEG: lambda n, s: s[0],
    Op.ABS: lambda n, s: s[0],
    Op.FLOOR: lambda n, s: Special(s[0].nan, s[0].inf, True),
    Op.EXP: lambda n, s: Special(s[0].nan, True, True),
    Op.EXPM1: lambda n, s: Special(s[0].nan, True, True),
    Op.TANH: lambda n, s: _bounded(s[0]),
    Op.SIGMOID: lambda n, s: _bounded(s[0]),
    Op.ERF: lambda n, s: _bounded(s[0]),
    Op.ADD: lambda n, s: _arith(Op.ADD, *s),
    Op.SUB: lambda n, s: _arith(Op.SUB, *s),
    Op.MUL: lambda n, s: _arith(Op.MUL, *s),
    Op.DIV: lambda n, s: _arith(Op.DIV, *s),
    # NaN for inf % y and x % 0; x % ±inf is x, or the infinity itself where their signs differ.
    Op.REMAINDER: lambda n, s: Special(
        s[0].nan or s[1].nan or s[0].inf or s[1].zero, s[1].inf, True
    ),
    Op.MAXIMUM: lambda n, s: s[0] | s[1],
    Op.MINIMUM: lambda n, s: s[0] | s[1],
    Op.WHERE: lambda n, s: _where(n, s),
    Op.TAKE: lambda n, s: s[0],
    Op.TAKE_ALONG: lambda n, s: s[0],
    Op.UPDATE: lambda n, s: s[0] | s[2],
    Op.MAX: lambda n, s: s[0],
    Op.MIN: lambda n, s: s[0],
    Op.SUM: lambda n, s: Special(s[0].nan or s[0].inf, True, True),
    Op.CONCAT: lambda n, s: _union(s),
    Op.SLICE: lambda n, s: s[0],
    Op.RESHAPE: lambda n, s: s[0],
    Op.BROADCAST: lambda n, s: s[0],
    Op.TRANSPOSE: lambda n, s: s[0],
    Op.VARIANT: lambda n, s: s[0] | s[1],
}


def _where(node: Node, facts: list[Special]) -> Special:
    """``where(c, a, b)``; where c is ``isnan(b)`` (or ``not(isnan(a))``) the branch that c
    tests is taken only where it is not NaN: an imputer's ``where(isnan(x), fill, x)``."""
    condition, a, b = node.inputs
    _, fact_a, fact_b = facts
    if condition.op is Op.ISNAN and condition.inputs[0] is b:
        fact_b = Special(nan=False, inf=fact_b.inf, zero=fact_b.zero)
    elif (
        condition.op is Op.NOT
        and condition.inputs[0].op is Op.ISNAN
        and condition.inputs[0].inputs[0] is a
    ):
        fact_a = Special(nan=False, inf=fact_a.inf, zero=fact_a.zero)
    return fact_a | fact_b


def _union(facts: list[Special]) -> Special:
    out = Special(nan=False, inf=False, zero=False)
    for fact in facts:
        out = out | fact
    return out


def _cast(source: Node, fact: Special) -> Special:
    if source.dtype in dt.FLOATS:  # float to float: float64 may overflow float32
        return Special(fact.nan, True, True)
    return ORDINARY  # integers and booleans convert to finite floats


def special_values(
    node: Node, params: Mapping[str, np.ndarray], inputs: Mapping[str, Special] | None = None
) -> Special:
    """What ``node`` may hold, with PARAM nodes' values from ``params`` (by name; a parameter
    not found there may hold anything) and what the caller guarantees of INPUT nodes in
    ``inputs`` (by name; an input not found there may hold anything)."""
    facts = inputs or {}
    known: dict[Node, Special] = {}
    stack = [node]
    while stack:  # iterative post-order: graphs can be deeper than Python's recursion limit
        current = stack[-1]
        if current in known:
            stack.pop()
            continue
        pending = [i for i in current.inputs if i not in known]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        known[current] = _fact(current, [known[i] for i in current.inputs], params, facts)
    return known[node]


def _fact(
    node: Node,
    operands: list[Special],
    params: Mapping[str, np.ndarray],
    inputs: Mapping[str, Special],
) -> Special:
    if node.dtype not in dt.FLOATS:
        return ORDINARY
    if node.op is Op.INPUT:
        return inputs.get(node.attr("name"), ANY)
    if node.op is Op.CONST:
        return of_values(node.attr("value").array)
    if node.op is Op.PARAM:
        value = params.get(node.attr("name"))
        return ANY if value is None else of_values(value)
    if node.op is Op.CAST:
        return _cast(node.inputs[0], operands[0])
    rule = _RULES.get(node.op)
    return ANY if rule is None else rule(node, operands)


def may_be_nan(
    node: Node, params: Mapping[str, np.ndarray], inputs: Mapping[str, Special] | None = None
) -> bool:
    """Whether ``node`` may hold a NaN (False only where none can reach it)."""
    return special_values(node, params, inputs).nan
