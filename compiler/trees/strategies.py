"""Strategies that turn an :class:`Ensemble` into lazy IR: (B, F) features → (B, K) leaf sums.

- ``traversal``: all trees at once, one level per iteration of a loop — gather each row's node
  (column, threshold, children) by node id, compare, step to a child. Nodes are renumbered
  level by level across all trees so a node's children are adjacent (``right == left + 1``)
  and leaves loop to themselves, so a step is ``left[node] + go_right``.
- ``perfect``: the same walk over trees padded to perfect trees of the ensemble's depth, numbered
  level by level, so a node's children follow from its number (no child table to gather). Memory
  grows as 2**depth.
- ``gemm`` (Hummingbird's): evaluate every split at once, then find each tree's reached leaf with
  a matrix product against the leaves' path signs; suits shallow trees.
- ``bitvector`` (:mod:`.quickscorer`) and ``hybrid`` (:mod:`.hybrid`): QuickScorer bit-vectors
  a tree per iteration, and bit-vectors for the top levels with traversal below. ``auto`` asks
  :mod:`.cost`.

Level loops are ``lz.fori_loop``s: an unrolled loop makes XLA recompute index chains (~2× slower)
and compile depth copies of the step. Splits compare one column of the widened features
(:mod:`.splits`), which folds in the NaN direction.

Exactness: decisions compare the source's precision. scikit-learn's ``tree_`` compares
``float32(x) <= t`` (t float64), which equals ``float32(x) <= t32`` with ``t32`` the largest
float32 not above t; HistGradientBoosting compares float64, exact in a float64 graph and, in a
float32 graph, exact for every float32 input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from .cost import costs, levels
from .model import Ensemble, float32_floor
from .splits import compare_dtype, split_columns

STRATEGIES = ("auto", "gemm", "traversal", "perfect", "bitvector", "hybrid", "treewise")

#: auto considers GEMM up to this many padded (tree, split, leaf) matrix entries.
GEMM_AUTO_ENTRIES = 1 << 16
#: explicit requests beyond these sizes are refused (the tables would not fit sensibly).
GEMM_MAX_ENTRIES = 1 << 24
PERFECT_MAX_LEAVES = 1 << 22
#: bit-vectors: leaves per tree (one mask word; more words made XLA's compile time explode).
BITVECTOR_MAX_LEAVES = 32


@dataclass(frozen=True)
class _Decision:
    """The features and thresholds in the precision the source compares in."""

    x: lz.LazyTensor
    dtype: str

    def thresholds(self, t: np.ndarray) -> np.ndarray:
        return float32_floor(t) if self.dtype == "float32" else np.asarray(t, np.float64)


def _decision(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> _Decision:
    dtype = compare_dtype(ensemble, x, ctx)
    return _Decision(x if x.dtype == dtype else lz.cast(x, dtype), dtype)


def _go_right(v: lz.LazyTensor, t: lz.LazyTensor, nan_right: lz.LazyTensor | None) -> lz.LazyTensor:
    """``x > t``, with NaN going right where ``nan_right`` (NaN compares false: left otherwise)."""
    right = v > t
    return right if nan_right is None else right | (lz.isnan(v) & nan_right)


def _constant(
    total: np.ndarray, x: lz.LazyTensor, ctx: Context, dtype: str | None = None
) -> lz.LazyTensor:
    """Trees without splits: the same (B, K) sum for every row (in ``dtype``, default the
    graph's)."""
    row = ctx.param(total.reshape(1, -1), "leaf_sum", dtype=dtype)
    # Tied to the input so the head is batched like every other: (B, 1) condition × (1, K).
    return lz.where(lz.isnan(x[:, :1]), row, row)


def _stumps(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """An ensemble of single-leaf trees: its root sum for every row."""
    return _constant(ensemble.root_sum(), x, ctx, ensemble.sum_dtype(ctx.dtype))


def _stack_outputs(columns: list[lz.LazyTensor]) -> lz.LazyTensor:
    """(B,) per output → (B, K)."""
    columns = [lz.reshape(c, (lz.B, 1)) for c in columns]
    return columns[0] if len(columns) == 1 else lz.concat(columns, axis=1)


def _leaf_sum(
    ensemble: Ensemble, value: np.ndarray, node: lz.LazyTensor, ctx: Context
) -> lz.LazyTensor:
    """(B, K): the sum over trees of ``value[node]`` for (B, T) node ids, one output at a time.

    A (B, T, K) gather and a sum over T leave K as the innermost axis, which XLA:CPU does not
    vectorize (10× slower for K = 2); one (B, T) gather and sum per output vectorize over T.
    An ``in_order`` ensemble adds the trees' values one after another (a loop over T).
    """
    dtype = ensemble.sum_dtype(ctx.dtype)
    columns = []
    for k in range(value.shape[1]):
        table = ctx.param(value[:, k], f"leaf_value_{k}", dtype=dtype)
        if not ensemble.in_order:
            columns.append(lz.sum(lz.take(table, node, axis=0), axis=1))
            continue
        zeros = lz.cast(node[:, 0] * 0, dtype)  # (B,) +0, batched like the rows
        columns.append(lz.fori_loop(int(node.shape[1]), _add_tree, zeros, node, table))
    return _stack_outputs(columns)


def _add_tree(
    i: lz.LazyTensor, acc: lz.LazyTensor, node: lz.LazyTensor, value: lz.LazyTensor
) -> lz.LazyTensor:
    """Loop body of an in-order sum: tree ``i``'s reached leaf value added to (B,) ``acc``."""
    return acc + lz.take(value, lz.take(node, i, axis=1), axis=0)


# --- traversal ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Linked:
    """All trees' nodes in one level-major numbering with adjacent children: the roots are
    ``0..T-1``, then every tree's level-1 nodes, and so on; a leaf is its own left child."""

    roots: np.ndarray  # (T,) the root's id
    feature: np.ndarray  # (N,)
    threshold: np.ndarray  # (N,) +inf at leaves
    nan_right: np.ndarray  # (N,) False at leaves
    left: np.ndarray  # (N,) a leaf's own id
    value: np.ndarray  # (N, K)


def _node_tables(
    ensemble: Ensemble,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Empty per-node tables for a renumbering of every node of ``ensemble``: split column,
    threshold (inf: never right), NaN-goes-right, left child id, leaf value (N, K)."""
    n = ensemble.n_nodes
    return (
        np.zeros(n, np.int64),
        np.full(n, np.inf),
        np.zeros(n, bool),
        np.zeros(n, np.int64),
        np.zeros((n, ensemble.n_outputs)),
    )


def _linked(ensemble: Ensemble) -> _Linked:
    # Level-major rather than tree by tree: a loop step of the walk (every tree at one level)
    # then reads one contiguous band of the tables instead of a node in each tree's block.
    feature, threshold, nan_right, left, value = _node_tables(ensemble)
    level = [(tree, 0) for tree in ensemble.trees]  # (tree, source node) in id order
    first = 0  # the id of level[0]
    while level:
        following = []
        nxt = first + len(level)  # the next level's ids follow in the order of `following`
        for i, (tree, node) in enumerate(level, start=first):
            if tree.is_leaf[node]:
                left[i] = i
                value[i] = tree.value[node]
                continue
            left[i] = nxt
            nxt += 2
            feature[i] = tree.feature[node]
            threshold[i] = tree.threshold[node]
            nan_right[i] = not tree.missing_left[node]
            following += [(tree, int(tree.left[node])), (tree, int(tree.right[node]))]
        first += len(level)
        level = following
    roots = np.arange(len(ensemble.trees))
    return _Linked(roots, feature, threshold, nan_right, left, value)


def _step(
    i: lz.LazyTensor,
    node: lz.LazyTensor,
    x: lz.LazyTensor,
    column: lz.LazyTensor,
    threshold: lz.LazyTensor,
    left: lz.LazyTensor,
) -> lz.LazyTensor:
    """One level for every (row, tree): (B, T) node ids to their children's."""
    v = lz.take_along(x, lz.take(column, node, axis=0), axis=1)
    return lz.take(left, node, axis=0) + lz.cast(v > lz.take(threshold, node, axis=0), "int32")


def traversal(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    depth = ensemble.max_depth
    if depth == 0:
        return _stumps(ensemble, x, ctx)
    if ensemble.has_categorical:
        from .categorical import categorical_traversal  # it builds on this module's helpers

        return categorical_traversal(ensemble, x, ctx)
    cols = split_columns(ensemble, x, ctx)
    g = _linked(ensemble)
    column, threshold = cols.encode(g.feature, g.threshold, g.nan_right)

    # Level 0: every row is at the roots, so the root's split is a column gather, not per row.
    r = g.roots
    v = lz.take(cols.x, ctx.param(column[r], "root_feature"), axis=1)
    t = ctx.param(threshold[r], "root_threshold", dtype=cols.dtype)
    node = ctx.param(g.left[r], "root_left") + lz.cast(v > t, "int32")  # (B, T)
    if depth > 1:
        tables = (
            ctx.param(column, "feature"),
            ctx.param(threshold, "threshold", dtype=cols.dtype),
            ctx.param(g.left, "left"),
        )
        node = lz.fori_loop(depth - 1, _step, node, cols.x, *tables)
    return _leaf_sum(ensemble, g.value, node, ctx)


# --- perfect-tree traversal ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Perfect:
    """Trees padded to depth D, numbered level-major: node (level l, tree t, position p) is
    ``T * (2**l - 1) + t * 2**l + p``, so its children are ``2 * node + T + {0, 1}``. Split
    tables (T * (2**D - 1),); leaf values (T * 2**D, K) at ``t * 2**D + p``."""

    feature: np.ndarray
    threshold: np.ndarray
    nan_right: np.ndarray
    value: np.ndarray


def _perfect_tables(ensemble: Ensemble) -> _Perfect:
    depth, n_trees, k = ensemble.max_depth, len(ensemble.trees), ensemble.n_outputs
    n_splits = n_trees * ((1 << depth) - 1)
    feature = np.zeros(n_splits, np.int64)
    threshold = np.full(n_splits, np.inf)
    nan_right = np.zeros(n_splits, bool)
    value = np.zeros((n_trees << depth, k))
    for ti, tree in enumerate(ensemble.trees):
        stack = [(0, 0, 0)]  # (node, level, position)
        while stack:
            node, lvl, pos = stack.pop()
            if tree.is_leaf[node]:
                # A shallow leaf passes always-left splits (+inf, NaN left) down to the last
                # level, where it lands on its leftmost descendant.
                value[(ti << depth) + (pos << (depth - lvl))] = tree.value[node]
                continue
            i = n_trees * ((1 << lvl) - 1) + (ti << lvl) + pos
            feature[i] = tree.feature[node]
            threshold[i] = tree.threshold[node]
            nan_right[i] = not tree.missing_left[node]
            stack += [
                (int(tree.left[node]), lvl + 1, 2 * pos),
                (int(tree.right[node]), lvl + 1, 2 * pos + 1),
            ]
    return _Perfect(feature, threshold, nan_right, value)


def _perfect_step(
    n_trees: int,
    i: lz.LazyTensor,
    node: lz.LazyTensor,
    x: lz.LazyTensor,
    column: lz.LazyTensor,
    threshold: lz.LazyTensor,
) -> lz.LazyTensor:
    """One level for every (row, tree) of the level-major numbering: no child table."""
    v = lz.take_along(x, lz.take(column, node, axis=0), axis=1)
    go_right = lz.cast(v > lz.take(threshold, node, axis=0), "int32")
    return node * 2 + n_trees + go_right


def perfect(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    depth, n_trees = ensemble.max_depth, len(ensemble.trees)
    if depth == 0:
        return _stumps(ensemble, x, ctx)
    cols = split_columns(ensemble, x, ctx)
    p = _perfect_tables(ensemble)
    column, threshold = cols.encode(p.feature, p.threshold, p.nan_right)
    # Level 0 (the first T nodes): a column gather; its children start the loop.
    v = lz.take(cols.x, ctx.param(column[:n_trees], "root_feature"), axis=1)
    t = ctx.param(threshold[:n_trees], "root_threshold", dtype=cols.dtype)
    first = np.arange(n_trees) * 2 + n_trees
    node = ctx.param(first, "root_children") + lz.cast(v > t, "int32")  # (B, T)
    if depth > 1:
        step = partial(_perfect_step, n_trees)
        tables = (ctx.param(column, "feature"), ctx.param(threshold, "threshold", dtype=cols.dtype))
        node = lz.fori_loop(depth - 1, step, node, cols.x, *tables)
    leaf = node - n_trees * ((1 << depth) - 1)
    return _leaf_sum(ensemble, p.value, leaf, ctx)


# --- GEMM ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Gemm:
    """Per tree (padded to I splits and L leaves): split features/thresholds (T*I,), path signs
    (T, I, L) (+1: the leaf is under the split's left child, -1: right), left-ancestor counts
    (T*L,) (-1 for padding, never matched) and leaf values (T*L, K)."""

    feature: np.ndarray
    threshold: np.ndarray
    nan_right: np.ndarray
    signs: np.ndarray
    lefts: np.ndarray
    value: np.ndarray


def _gemm_shape(ensemble: Ensemble) -> tuple[int, int, int]:
    splits = max(int((~t.is_leaf).sum()) for t in ensemble.trees)
    return len(ensemble.trees), splits, ensemble.max_leaves


def _gemm_tables(ensemble: Ensemble) -> _Gemm:
    n_trees, n_splits, n_leaves = _gemm_shape(ensemble)
    k = ensemble.n_outputs
    feature = np.zeros((n_trees, n_splits), np.int64)
    threshold = np.full((n_trees, n_splits), np.inf)
    nan_right = np.zeros((n_trees, n_splits), bool)
    signs = np.zeros((n_trees, n_splits, n_leaves))
    lefts = np.full((n_trees, n_leaves), -1.0)
    value = np.zeros((n_trees, n_leaves, k))
    for ti, tree in enumerate(ensemble.trees):
        split_ids: dict[int, int] = {}
        leaf_count = 0
        stack: list[tuple[int, list[tuple[int, float]]]] = [(0, [])]
        while stack:
            node, path = stack.pop()
            if tree.is_leaf[node]:
                for s, sign in path:
                    signs[ti, s, leaf_count] = sign
                lefts[ti, leaf_count] = sum(1 for _, sign in path if sign > 0)
                value[ti, leaf_count] = tree.value[node]
                leaf_count += 1
                continue
            s = split_ids.setdefault(node, len(split_ids))
            feature[ti, s] = tree.feature[node]
            threshold[ti, s] = tree.threshold[node]
            nan_right[ti, s] = not tree.missing_left[node]
            stack += [(int(tree.right[node]), [*path, (s, -1.0)])]
            stack += [(int(tree.left[node]), [*path, (s, 1.0)])]
    return _Gemm(
        feature.ravel(),
        threshold.ravel(),
        nan_right.ravel(),
        signs,
        lefts.ravel(),
        value.reshape(-1, k),
    )


def gemm(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    n_trees, n_splits, n_leaves = _gemm_shape(ensemble)
    if n_splits == 0:
        return _stumps(ensemble, x, ctx)
    dec = _decision(ensemble, x, ctx)
    g = _gemm_tables(ensemble)
    # A column gather, not X @ one-hot: 0 * NaN would spread a missing value to every split.
    v = lz.take(dec.x, ctx.param(g.feature, "feature"), axis=1)  # (B, T*I)
    t = ctx.param(dec.thresholds(g.threshold), "threshold", dtype=dec.dtype)
    nr = ctx.param(g.nan_right, "nan_right", dtype="bool") if g.nan_right.any() else None
    go_left = lz.cast(~_go_right(v, t, nr), ctx.dtype)
    # (B, T, 1, I) @ (T, I, L): per tree, +1 for each satisfied left turn, -1 for each right
    # split that went left; only the reached leaf scores its count of left turns.
    score = lz.reshape(go_left, (lz.B, n_trees, 1, n_splits)) @ ctx.param(g.signs, "path_signs")
    score = lz.reshape(score, (lz.B, n_trees * n_leaves))
    reached = lz.cast(score == ctx.param(g.lefts, "left_turns"), ctx.dtype)
    return reached @ ctx.param(g.value, "leaf_value")


# --- choosing -----------------------------------------------------------------------------------

# These build on this module's helpers, which are defined by the time the imports run.
from .host import host_leaf_sum  # noqa: E402
from .hybrid import hybrid  # noqa: E402
from .quickscorer import bitvector  # noqa: E402
from .treewise import treewise  # noqa: E402

Strategy = Callable[[Ensemble, lz.LazyTensor, Context], lz.LazyTensor]
IMPLEMENTED: dict[str, Strategy] = {
    "traversal": traversal,
    "perfect": perfect,
    "gemm": gemm,
    "bitvector": bitvector,
    "hybrid": hybrid,
    "treewise": treewise,
}


def choose(ensemble: Ensemble, requested: str) -> str:
    """The strategy to use for ``requested`` (``auto``: the cheapest by :mod:`.cost`'s model)."""
    if ensemble.has_categorical:  # categorical splits: only traversal evaluates them
        return "traversal"
    n_trees, n_splits, n_leaves = _gemm_shape(ensemble)
    entries = n_trees * n_splits * n_leaves
    if requested == "auto":
        estimates = costs(ensemble)
        if entries > GEMM_AUTO_ENTRIES or ensemble.in_order:
            estimates.pop("gemm")
        if n_leaves > BITVECTOR_MAX_LEAVES:
            estimates.pop("bitvector", None)
        return min(estimates, key=estimates.__getitem__)
    if requested not in IMPLEMENTED:
        raise UnsupportedError(
            f"tree_strategy={requested!r} is not implemented; supported: {['auto', *IMPLEMENTED]}"
        )
    if requested == "gemm" and ensemble.in_order:
        raise UnsupportedError(
            "tree_strategy='gemm' sums the leaves in a matrix product, this ensemble's source "
            "sums them one tree after another in float32; use another strategy"
        )
    if requested == "gemm" and entries > GEMM_MAX_ENTRIES:
        raise UnsupportedError(
            f"tree_strategy='gemm' needs {entries} path-matrix entries (limit {GEMM_MAX_ENTRIES}); "
            "use 'traversal'"
        )
    if requested == "bitvector" and n_leaves > BITVECTOR_MAX_LEAVES:
        raise UnsupportedError(
            f"tree_strategy='bitvector' evaluates trees of up to {BITVECTOR_MAX_LEAVES} leaves "
            f"(one mask word), this ensemble has trees of {n_leaves}; use 'hybrid' (bit-vectors "
            "for the top 5 levels) or 'traversal'"
        )
    if requested == "perfect" and len(ensemble.trees) << ensemble.max_depth > PERFECT_MAX_LEAVES:
        raise UnsupportedError(
            f"tree_strategy='perfect' pads to depth {ensemble.max_depth} "
            f"({len(ensemble.trees)} × 2**{ensemble.max_depth} leaves, limit "
            f"{PERFECT_MAX_LEAVES}); use 'traversal'"
        )
    return requested


def leaf_sum(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """(B, K): the sum over trees of the leaf vector each row reaches, by the options' strategy.

    Under ``auto`` the value has a second formulation for the host (:mod:`.host`), which the
    executor runs where it times faster than the device (the smallest buckets), unless nothing
    would run it (``host_rows=0`` on a device backend); an explicit strategy is that strategy
    everywhere."""
    name = choose(ensemble, ctx.options.tree_strategy)
    # Only where something runs it: host placement is on, or the numpy backend runs every bucket.
    runs_host = ctx.options.host_rows > 0 or ctx.options.backend == "numpy"
    host = (
        runs_host
        and ctx.options.tree_strategy == "auto"
        and ensemble.max_depth > 0
        and not ensemble.has_categorical
    )
    ctx.note(
        f"trees: {name}{' (host: native kernels)' if host else ''} ({len(ensemble.trees)} trees, "
        f"depth {ensemble.max_depth}, {ensemble.n_nodes} nodes, up to {ensemble.max_leaves} "
        f"leaves per tree, {levels(ensemble)} levels in all)"
    )
    device = IMPLEMENTED[name](ensemble, x, ctx)
    if host:
        device = lz.variant(device, host_leaf_sum(ensemble, x, ctx))
    return device if device.dtype == ctx.dtype else lz.cast(device, ctx.dtype)
