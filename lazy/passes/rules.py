"""The rewrite rules, as data. Each has before/after tests in tests/lazy/passes/."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import FLOATS, round_down, round_up
from ..node import Node, is_leaf
from ..ops import SPECS, Op
from .rewrite import Pattern, RewriteContext, Rule

# --- casts --------------------------------------------------------------------------------------

#: dtype → dtypes that represent every one of its values exactly.
_LOSSLESS: dict[str, frozenset[str]] = {
    "bool": frozenset({"int32", "int64", "uint32", "uint64", "float32", "float64"}),
    "int32": frozenset({"int64", "float64"}),
    "uint32": frozenset({"int64", "uint64", "float64"}),
    "float32": frozenset({"float64"}),
    "int64": frozenset(),
    "uint64": frozenset(),
    "float64": frozenset(),
}


def _identity_cast(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    cast, x = b["cast"], b["x"]
    return x if cast.dtype == x.dtype else None


def _cast_chain(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    outer, inner, x = b["outer"], b["inner"], b["x"]
    if inner.dtype not in _LOSSLESS[x.dtype]:
        return None  # the inner cast rounds or truncates: it is part of the meaning
    return x if outer.dtype == x.dtype else Node.make(Op.CAST, [x], dtype=outer.dtype)


IDENTITY_CAST = Rule(
    "identity-cast", Pattern(Op.CAST, (Pattern(bind="x"),), bind="cast"), _identity_cast
)
CAST_CHAIN = Rule(
    "cast-chain",
    Pattern(Op.CAST, (Pattern(Op.CAST, (Pattern(bind="x"),), bind="inner"),), bind="outer"),
    _cast_chain,
)

# --- constant folding ---------------------------------------------------------------------------


def _foldable(node: Node, ctx: RewriteContext) -> bool:
    return not is_leaf(node) and ctx.param_only(node)


def _fold(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    node = b["node"]
    value = ctx.value(node)
    return ctx.new_param(value, node, "folded", [node])


FOLD_CONSTANTS = Rule("fold-constants", Pattern(where=_foldable, bind="node"), _fold)

# --- affine folding -----------------------------------------------------------------------------

_AFFINE_OPS = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV})


def _row_vector(node: Node, ctx: RewriteContext, k: int) -> bool:
    """A parameter-only value that broadcasts along the last axis of a (B, k) operand."""
    return ctx.param_only(node) and node.shape in ((), (k,), (1, k))


def _peel_affine(lhs: Node, ctx: RewriteContext) -> tuple[Node, np.ndarray, np.ndarray] | None:
    """Write ``lhs`` as ``u * a + c`` with row vectors a, c; None if it is not affine in u."""
    k = lhs.shape[-1]
    a, c = np.ones(k), np.zeros(k)
    u = lhs
    while u.op in _AFFINE_OPS:
        x, y = u.inputs
        if x.batched and _row_vector(y, ctx, k) and x.shape == u.shape:
            v, p, p_first = x, y, False
        elif (
            y.batched
            and _row_vector(x, ctx, k)
            and y.shape == u.shape
            and u.op in (Op.ADD, Op.SUB, Op.MUL)
        ):
            v, p, p_first = y, x, True
        else:
            break
        pv = np.broadcast_to(ctx.value(p).astype(np.float64).reshape(-1), (k,))
        if u.op is Op.ADD:
            c = c + a * pv
        elif u.op is Op.SUB and not p_first:
            c = c - a * pv
        elif u.op is Op.SUB:
            c, a = c + a * pv, -a
        elif u.op is Op.MUL:
            a = a * pv
        else:  # DIV by a vector
            a = a / pv
        u = v
    return None if u is lhs else (u, a, c)


def _is_affine_matmul(node: Node, ctx: RewriteContext) -> bool:
    lhs, w = node.inputs
    return (
        len(lhs.shape) == 2
        and lhs.batched
        and len(w.shape) == 2
        and ctx.param_only(w)
        and lhs.op in _AFFINE_OPS
    )


def _affine_matmul(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    node = b["mm"]
    lhs, w = node.inputs
    peeled = _peel_affine(lhs, ctx)
    if peeled is None:
        return None
    u, a, c = peeled
    wv = ctx.value(w).astype(np.float64)
    # Named after the whole matmul: a and c depend on the ops of the chain, not only its operands.
    weight = ctx.new_param(a[:, None] * wv, w, "affine.w", [node])
    bias = ctx.new_param(c @ wv, w, "affine.b", [node])
    return Node.make(Op.ADD, [Node.make(Op.MATMUL, [u, weight]), bias])


AFFINE_MATMUL = Rule(
    "affine-matmul", Pattern(Op.MATMUL, where=_is_affine_matmul, bind="mm"), _affine_matmul
)


def _bias_chain(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    outer, u, p, q = b["outer"], b["u"], b["p"], b["q"]
    if np.dtype(outer.dtype).kind != "f":
        return None  # integers: float64 would round a sum past 2**53
    if ctx.param_only(u) or not (ctx.param_only(p) and ctx.param_only(q)):
        return None
    total = ctx.value(p).astype(np.float64) + ctx.value(q).astype(np.float64)
    node = Node.make(Op.ADD, [u, ctx.new_param(total, q, "bias", [outer])])
    return node if node.type == outer.type else None  # the sum must not widen u's shape


#: ``(u + p) + q`` with parameter-only p and q → ``u + (p + q)``, the sum made once in float64:
#: a folded scaler's bias followed by a model's intercept (one numpy call fewer per row on the
#: host, where every call has a fixed cost; one rounding fewer in float32).
BIAS_CHAIN = Rule(
    "bias-chain",
    Pattern(
        Op.ADD,
        (Pattern(Op.ADD, (Pattern(bind="u"), Pattern(bind="p"))), Pattern(bind="q")),
        bind="outer",
    ),
    _bias_chain,
)

# --- layout -------------------------------------------------------------------------------------

_UNARY = frozenset(op for op, spec in SPECS.items() if spec.kind == "unary")


def _reshape_chain(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    outer, x = b["outer"], b["x"]
    return x if outer.shape == x.shape else Node.make(Op.RESHAPE, [x], shape=outer.attr("shape"))


def _reshape_round_trip(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    outer, unary, x = b["outer"], b["unary"], b["x"]
    return Node.make(unary.op, [x], **dict(unary.attrs)) if outer.shape == x.shape else None


#: A reshape of a reshape is one reshape (none, where it restores the shape).
RESHAPE_CHAIN = Rule(
    "reshape-chain",
    Pattern(Op.RESHAPE, (Pattern(Op.RESHAPE, (Pattern(bind="x"),)),), bind="outer"),
    _reshape_chain,
)
#: An elementwise op between a reshape and its inverse runs on the original shape: a binary
#: classifier's (B, 1) score → (B,) → sigmoid → (B, 1) of ``[1 - p, p]`` is one sigmoid.
RESHAPE_ROUND_TRIP = Rule(
    "reshape-round-trip",
    Pattern(
        Op.RESHAPE,
        (Pattern(_UNARY, (Pattern(Op.RESHAPE, (Pattern(bind="x"),)),), bind="unary"),),
        bind="outer",
    ),
    _reshape_round_trip,
)

# --- slices ---------------------------------------------------------------------------------------


def _slice_of_concat(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    piece, joined = b["slice"], b["concat"]
    axis = piece.attr("axis") % len(piece.shape)
    if joined.attr("axis") % len(joined.shape) != axis or piece.attr("step") != 1:
        return None
    widths = [part.shape[axis] for part in joined.inputs]
    if not all(isinstance(w, int) for w in widths):
        return None
    start, stop, _ = slice(piece.attr("start"), piece.attr("stop")).indices(sum(widths))
    parts, offset = [], 0
    for part, width in zip(joined.inputs, widths, strict=True):
        lo, hi = max(start, offset), min(stop, offset + width)
        if lo < hi:
            whole = (lo, hi) == (offset, offset + width)
            parts.append(
                part
                if whole
                else Node.make(
                    Op.SLICE, [part], axis=axis, start=lo - offset, stop=hi - offset, step=1
                )
            )
        offset += width
    if not parts or len(parts) == len(joined.inputs):
        return None  # an empty slice, or one touching every part: nothing is left out
    return parts[0] if len(parts) == 1 else Node.make(Op.CONCAT, parts, axis=axis)


#: A slice of a concatenation along the same axis reads only the parts it covers, so the others
#: can be pruned: a tree that reads raw columns and a ColumnTransformer's one-hot block no longer
#: computes the scaled block it skipped (XLA simplifies this itself; the host plan does not).
SLICE_OF_CONCAT = Rule(
    "slice-of-concat",
    Pattern(Op.SLICE, (Pattern(Op.CONCAT, bind="concat"),), bind="slice"),
    _slice_of_concat,
)

# --- narrowing: decisions on an exactly widened value --------------------------------------


def _widened(node: Node, ctx: RewriteContext) -> bool:
    """A float cast to a wider float: exact, so a comparison of it with a parameter-only value
    decides as that value rounded to the narrow dtype, compared with the operand."""
    return node.inputs[0].dtype in FLOATS and node.dtype in _LOSSLESS[node.inputs[0].dtype]


def _forest_of_widened(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    forest, narrow = b["forest"], b["x"]
    _, feature, threshold, nan_right, left, value = forest.inputs
    if not ctx.param_only(threshold):
        return None
    # A split sends v right where v > t: for v of the narrow dtype, where v > round_down(t).
    below = round_down(ctx.value(threshold), narrow.dtype)
    t = ctx.new_param(below, narrow, f"{narrow.dtype}_below", [threshold])
    inputs = [narrow, feature, t, nan_right, left, value]
    return Node.make(Op.FOREST_SUM, inputs, **dict(forest.attrs))


#: A forest walked on a widened table walks the narrow table against thresholds rounded down:
#: the same paths for every value (the narrow kernel moves half the bytes; :mod:`lazy.narrowing`).
FOREST_OF_WIDENED = Rule(
    "forest-of-widened",
    Pattern(
        Op.FOREST_SUM,
        (Pattern(Op.CAST, (Pattern(bind="x"),), where=_widened), *[Pattern()] * 5),
        bind="forest",
    ),
    _forest_of_widened,
)

#: ``v > t`` and ``v <= t`` hold for a narrow ``v`` as they do against ``t`` rounded down;
#: ``v < t`` and ``v >= t`` as against ``t`` rounded up. With the operands swapped, mirrored.
_ROUNDING = {Op.GT: round_down, Op.LE: round_down, Op.LT: round_up, Op.GE: round_up}
_MIRROR = {Op.GT: Op.LT, Op.LT: Op.GT, Op.GE: Op.LE, Op.LE: Op.GE}


def _compare_of_widened(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    compare = b["compare"]
    lhs, rhs = compare.inputs
    op = compare.op
    if rhs.op is Op.CAST and not (lhs.op is Op.CAST and _widened(lhs, ctx)):
        lhs, rhs, op = rhs, lhs, _MIRROR[op]  # the widened value on the left
    if lhs.op is not Op.CAST or not _widened(lhs, ctx) or not ctx.param_only(rhs):
        return None
    narrow = lhs.inputs[0]
    bound = _ROUNDING[op](ctx.value(rhs), narrow.dtype)
    name = f"{narrow.dtype}_{_ROUNDING[op].__name__}"
    return Node.make(op, [narrow, ctx.new_param(bound, narrow, name, [rhs])], **dict(compare.attrs))


COMPARE_OF_WIDENED = Rule(
    "compare-of-widened",
    Pattern(frozenset(_ROUNDING), bind="compare"),
    _compare_of_widened,
)


def _loop_of_widened(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    """A LOOP whose invariant is a widened table that its body only compares, column by column
    (``TAKE`` along axis 1), with elements of other invariants that are parameter-only outside
    and compared with nothing else (a forest's thresholds): the narrow table, compared with
    those parameters rounded to its dtype once (:data:`_ROUNDING`), each in its one direction."""
    loop = b["loop"]
    body = loop.attr("body")
    operands = loop.inputs  # (init, *invariants): body input ``k + 1`` stands for operand ``k``
    users = _users(body.order)
    for j in range(1, len(operands)):
        table = operands[j]
        if table.op is not Op.CAST or not _widened(table, ctx):
            continue
        rounding = _compared_bounds(body, j, operands, users, ctx)
        if not rounding:
            continue
        narrow = table.inputs[0]
        new_operands = list(operands)
        new_operands[j] = narrow
        stand_ins = {body.inputs[j + 1]: narrow.dtype}
        for k, direction in rounding.items():
            value = direction(ctx.value(operands[k]), narrow.dtype)
            name = f"{narrow.dtype}_{direction.__name__}"
            new_operands[k] = ctx.new_param(value, narrow, name, [operands[k]])
            stand_ins[body.inputs[k + 1]] = narrow.dtype
        return Node.make(
            Op.LOOP, new_operands, **{**dict(loop.attrs), "body": _retyped(body, stand_ins)}
        )
    return None


def _users(order: list[Node]) -> dict[Node, list[Node]]:
    users: dict[Node, list[Node]] = {n: [] for n in order}
    for node in order:
        for operand in node.inputs:
            users[operand].append(node)
    return users


def _compared_bounds(
    body: Any,
    j: int,
    operands: tuple[Node, ...],
    users: dict[Node, list[Node]],
    ctx: RewriteContext,
) -> dict[int, Any]:
    """For invariant ``j`` of a LOOP: where every use of its body input is a column
    (``TAKE`` on axis 1) compared only with an element (``TAKE``) of some parameter-only
    invariant ``k`` that the body compares with nothing else, the rounding each such ``k``
    needs; empty where any use is otherwise or a ``k`` needs both directions."""
    table = body.inputs[j + 1]
    positions = {node: k - 1 for k, node in enumerate(body.inputs) if k >= 2}
    needed: dict[int, Any] = {}
    compares: set[Node] = set()
    for column in users.get(table, []):
        if column.op is not Op.TAKE or column.inputs[0] is not table or column.attr("axis") != 1:
            return {}
        for compare in users[column]:
            if compare.op not in _ROUNDING:
                return {}
            lhs, rhs = compare.inputs
            op, other = (compare.op, rhs) if lhs is column else (_MIRROR[compare.op], lhs)
            if other is column or other.op is not Op.TAKE or other.inputs[0] not in positions:
                return {}
            k = positions[other.inputs[0]]
            if k == j or not ctx.param_only(operands[k]):
                return {}
            if needed.setdefault(k, _ROUNDING[op]) is not _ROUNDING[op]:
                return {}
            compares.add(compare)
    # Each bound is read only by TAKEs whose every user is one of those comparisons.
    for k in needed:
        for element in users[body.inputs[k + 1]]:
            if element.op is not Op.TAKE or element.inputs[0] is not body.inputs[k + 1]:
                return {}
            if not all(user in compares for user in users[element]):
                return {}
    return needed


def _retyped(body: Any, dtypes: dict[Node, str]) -> Any:
    """``body`` with the given inputs of another dtype (same names and shapes), every node
    rebuilt on them (types re-inferred)."""
    from ..loop import LoopBody

    mapped: dict[Node, Node] = {
        node: Node.make(Op.INPUT, name=node.attr("name"), shape=node.shape, dtype=dtype)
        for node, dtype in dtypes.items()
    }
    for node in body.order:
        if node not in mapped:
            mapped[node] = node.with_inputs([mapped[i] for i in node.inputs])
    return LoopBody([mapped.get(n, n) for n in body.inputs], mapped[body.output])


LOOP_OF_WIDENED = Rule("loop-of-widened", Pattern(Op.LOOP, bind="loop"), _loop_of_widened)

#: The rules that move a decision onto the narrow operand of a widening cast.
NARROWING_RULES: tuple[Rule, ...] = (FOREST_OF_WIDENED, COMPARE_OF_WIDENED, LOOP_OF_WIDENED)


# Widening casts moved past the ops that do not change values (a layout, a NaN test, a select
# of an exactly representable constant), so that decisions find them: used by lazy.narrowing.


def _past_layout(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    node = b["node"]
    cast, rest = node.inputs[0], node.inputs[1:]
    if cast.op is not Op.CAST or not _widened(cast, ctx) or any(r.batched for r in rest):
        return None
    return Node.make(Op.CAST, [node.with_inputs([cast.inputs[0], *rest])], dtype=cast.dtype)


def _isnan_of_widened(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    cast = b["cast"]
    return Node.make(Op.ISNAN, [cast.inputs[0]]) if _widened(cast, ctx) else None


def _concat_of_widened(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    node = b["node"]
    parts = node.inputs
    if not all(p.op is Op.CAST and _widened(p, ctx) for p in parts):
        return None
    if len({p.inputs[0].dtype for p in parts}) != 1:
        return None
    narrow = Node.make(Op.CONCAT, [p.inputs[0] for p in parts], **dict(node.attrs))
    return Node.make(Op.CAST, [narrow], dtype=node.dtype)


def _where_of_widened(b: dict[str, Node], ctx: RewriteContext) -> Node | None:
    node = b["node"]
    mask, *values = node.inputs
    casts = [v for v in values if v.op is Op.CAST and _widened(v, ctx)]
    if not casts:
        return None
    dtype = casts[0].inputs[0].dtype
    narrowed = []
    for v in values:
        if v.op is Op.CAST and _widened(v, ctx) and v.inputs[0].dtype == dtype:
            narrowed.append(v.inputs[0])
        elif ctx.param_only(v) and not v.batched:
            value = np.asarray(ctx.value(v))
            with np.errstate(over="ignore", invalid="ignore"):
                exact = value.astype(dtype)
            if not np.array_equal(exact.astype(value.dtype), value, equal_nan=True):
                return None  # a constant the narrow dtype cannot hold: the select widens
            narrowed.append(ctx.new_param(exact, casts[0].inputs[0], f"{dtype}_exact", [v]))
        else:
            return None
    return Node.make(Op.CAST, [Node.make(Op.WHERE, [mask, *narrowed])], dtype=node.dtype)


WIDENING_HOISTS: tuple[Rule, ...] = (
    Rule(
        "layout-of-widened",
        Pattern(frozenset({Op.SLICE, Op.RESHAPE, Op.TAKE, Op.TRANSPOSE}), bind="node"),
        _past_layout,
    ),
    Rule(
        "isnan-of-widened", Pattern(Op.ISNAN, (Pattern(Op.CAST, bind="cast"),)), _isnan_of_widened
    ),
    Rule("concat-of-widened", Pattern(Op.CONCAT, bind="node"), _concat_of_widened),
    Rule("where-of-widened", Pattern(Op.WHERE, bind="node"), _where_of_widened),
)

#: The default pipeline: simplify casts, fold parameter-only subgraphs, fold affine maps and
#: bias chains, drop reshape round trips and the parts of concatenations no slice reads.
DEFAULT_RULES: tuple[Rule, ...] = (
    IDENTITY_CAST,
    CAST_CHAIN,
    FOLD_CONSTANTS,
    AFFINE_MATMUL,
    BIAS_CHAIN,
    RESHAPE_CHAIN,
    RESHAPE_ROUND_TRIP,
    SLICE_OF_CONCAT,
    *NARROWING_RULES,
)
