"""Strategies that turn an :class:`Ensemble` into lazy IR: (B, F) features → (B, K) leaf sums.

- ``traversal``: all trees at once, one level per step — gather each row's node (feature,
  threshold, children) by node id, compare, step to a child; unrolled ``max_depth`` times (the IR
  has no loops). Nodes are renumbered breadth-first so a node's children are adjacent
  (``right == left + 1``) and leaves loop to themselves, so a step is ``left[node] + go_right``.
- ``perfect``: the same walk over trees padded to perfect trees of the ensemble's depth; a node is
  found from (level, position) arithmetic instead of child pointers. Memory grows as 2**depth.
- ``gemm`` (Hummingbird's): evaluate every split at once, then find each tree's reached leaf with
  a matrix product against the leaves' path signs; suits shallow trees.
- ``bitvector`` (:mod:`.quickscorer`) and ``hybrid`` (:mod:`.hybrid`): QuickScorer bit-vectors,
  and bit-vectors for the top levels with traversal below. ``auto`` asks :mod:`.cost`.

Exactness: decisions compare the source's precision. scikit-learn's ``tree_`` compares
``float32(x) <= t`` (t float64), which equals ``float32(x) <= t32`` with ``t32`` the largest
float32 not above t; HistGradientBoosting compares float64, exact in a float64 graph and, in a
float32 graph, exact for every float32 input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from .cost import costs
from .model import Ensemble, float32_floor

STRATEGIES = ("auto", "gemm", "traversal", "perfect", "bitvector", "hybrid")

#: auto considers GEMM up to this many padded (tree, split, leaf) matrix entries.
GEMM_AUTO_ENTRIES = 1 << 16
#: explicit requests beyond these sizes are refused (the tables would not fit sensibly).
GEMM_MAX_ENTRIES = 1 << 24
PERFECT_MAX_LEAVES = 1 << 22
BITVECTOR_MAX_TERMS = 1 << 16


@dataclass(frozen=True)
class _Decision:
    """The features and thresholds in the precision the source compares in."""

    x: lz.LazyTensor
    dtype: str

    def thresholds(self, t: np.ndarray) -> np.ndarray:
        return float32_floor(t) if self.dtype == "float32" else np.asarray(t, np.float64)


def _decision(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> _Decision:
    dtype = "float32" if ensemble.float32_inputs or ctx.dtype == "float32" else "float64"
    return _Decision(x if x.dtype == dtype else lz.cast(x, dtype), dtype)


def _go_right(v: lz.LazyTensor, t: lz.LazyTensor, nan_right: lz.LazyTensor | None) -> lz.LazyTensor:
    """``x > t``, with NaN going right where ``nan_right`` (NaN compares false: left otherwise)."""
    right = v > t
    return right if nan_right is None else right | (lz.isnan(v) & nan_right)


def _constant(total: np.ndarray, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """Trees without splits: the same (B, K) sum for every row."""
    row = ctx.param(total.reshape(1, -1), "leaf_sum")
    # Tied to the input so the head is batched like every other: (B, 1) condition × (1, K).
    return lz.where(lz.isnan(x[:, :1]), row, row)


def _root_values(ensemble: Ensemble) -> np.ndarray:
    return np.sum([t.value[0] for t in ensemble.trees], axis=0)


# --- traversal ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Linked:
    """All trees' nodes in one breadth-first numbering with adjacent children."""

    roots: np.ndarray  # (T,) the root's id
    feature: np.ndarray  # (N,)
    threshold: np.ndarray  # (N,) +inf at leaves
    nan_right: np.ndarray  # (N,) False at leaves
    left: np.ndarray  # (N,) a leaf's own id
    value: np.ndarray  # (N, K)


def _linked(ensemble: Ensemble) -> _Linked:
    n = ensemble.n_nodes
    feature = np.zeros(n, np.int64)
    threshold = np.full(n, np.inf)
    nan_right = np.zeros(n, bool)
    left = np.zeros(n, np.int64)
    value = np.zeros((n, ensemble.n_outputs))
    roots = []
    base = 0
    for tree in ensemble.trees:
        ids = np.empty(tree.n_nodes, np.int64)
        ids[0], nxt, queue = base, base + 1, [0]
        roots.append(base)
        for node in queue:  # breadth-first: the list grows while we walk it
            i = ids[node]
            if tree.is_leaf[node]:
                left[i] = i
                value[i] = tree.value[node]
                continue
            ids[tree.left[node]], ids[tree.right[node]] = nxt, nxt + 1
            left[i] = nxt
            nxt += 2
            feature[i] = tree.feature[node]
            threshold[i] = tree.threshold[node]
            nan_right[i] = not tree.missing_left[node]
            queue += [int(tree.left[node]), int(tree.right[node])]
        base += tree.n_nodes
    return _Linked(np.asarray(roots), feature, threshold, nan_right, left, value)


def traversal(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    depth = ensemble.max_depth
    if depth == 0:
        return _constant(_root_values(ensemble), x, ctx)
    if ensemble.has_categorical:
        from .categorical import categorical_traversal  # it builds on this module's helpers

        return categorical_traversal(ensemble, x, ctx)
    dec = _decision(ensemble, x, ctx)
    g = _linked(ensemble)
    any_nan_right = bool(g.nan_right.any())
    feature = ctx.param(g.feature, "feature")
    threshold = ctx.param(dec.thresholds(g.threshold), "threshold", dtype=dec.dtype)
    nan_right = ctx.param(g.nan_right, "nan_right", dtype="bool") if any_nan_right else None
    left = ctx.param(g.left, "left")

    # Level 0: every row is at the roots, so the root's split is a column gather, not per row.
    r = g.roots
    v = lz.take(dec.x, ctx.param(g.feature[r], "root_feature"), axis=1)
    t = ctx.param(dec.thresholds(g.threshold[r]), "root_threshold", dtype=dec.dtype)
    nr = ctx.param(g.nan_right[r], "root_nan_right", dtype="bool") if any_nan_right else None
    node = ctx.param(g.left[r], "root_left") + lz.cast(_go_right(v, t, nr), "int32")
    for _ in range(depth - 1):
        v = lz.take_along(dec.x, lz.take(feature, node, axis=0), axis=1)
        nr = lz.take(nan_right, node, axis=0) if nan_right is not None else None
        go_right = _go_right(v, lz.take(threshold, node, axis=0), nr)
        node = lz.take(left, node, axis=0) + lz.cast(go_right, "int32")
    leaves = lz.take(ctx.param(g.value, "leaf_value"), node, axis=0)  # (B, T, K)
    return lz.sum(leaves, axis=1)


# --- perfect-tree traversal ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Perfect:
    """Per level l, (T, 2**l) split tables flattened tree-major; (T * 2**D, K) leaf values."""

    feature: list[np.ndarray]
    threshold: list[np.ndarray]
    nan_right: list[np.ndarray]
    value: np.ndarray


def _perfect_tables(ensemble: Ensemble) -> _Perfect:
    depth, n_trees, k = ensemble.max_depth, len(ensemble.trees), ensemble.n_outputs
    feature = [np.zeros((n_trees, 1 << lvl), np.int64) for lvl in range(depth)]
    threshold = [np.full((n_trees, 1 << lvl), np.inf) for lvl in range(depth)]
    nan_right = [np.zeros((n_trees, 1 << lvl), bool) for lvl in range(depth)]
    value = np.zeros((n_trees, 1 << depth, k))
    for ti, tree in enumerate(ensemble.trees):
        stack = [(0, 0, 0)]  # (node, level, position)
        while stack:
            node, lvl, pos = stack.pop()
            if tree.is_leaf[node]:
                # A shallow leaf passes always-left splits (+inf, NaN left) down to the last
                # level, where it lands on its leftmost descendant.
                value[ti, pos << (depth - lvl)] = tree.value[node]
                continue
            feature[lvl][ti, pos] = tree.feature[node]
            threshold[lvl][ti, pos] = tree.threshold[node]
            nan_right[lvl][ti, pos] = not tree.missing_left[node]
            stack += [
                (int(tree.left[node]), lvl + 1, 2 * pos),
                (int(tree.right[node]), lvl + 1, 2 * pos + 1),
            ]
    return _Perfect(
        [f.ravel() for f in feature],
        [t.ravel() for t in threshold],
        [m.ravel() for m in nan_right],
        value.reshape(-1, k),
    )


def perfect(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    depth, n_trees = ensemble.max_depth, len(ensemble.trees)
    if depth == 0:
        return _constant(_root_values(ensemble), x, ctx)
    dec = _decision(ensemble, x, ctx)
    p = _perfect_tables(ensemble)
    any_nan_right = any(m.any() for m in p.nan_right)
    trees = np.arange(n_trees, dtype=np.int64)

    def level(lvl: int, pos: lz.LazyTensor | None) -> lz.LazyTensor:
        t = dec.thresholds(p.threshold[lvl])
        nr = p.nan_right[lvl] if any_nan_right else None
        if pos is None:  # level 0: one node per tree, a column gather
            v = lz.take(dec.x, ctx.param(p.feature[0], "feature_0"), axis=1)
            right = _go_right(
                v,
                ctx.param(t, "threshold_0", dtype=dec.dtype),
                None if nr is None else ctx.param(nr, "nan_right_0", dtype="bool"),
            )
            return lz.cast(right, "int32")
        idx = pos + ctx.param(trees << lvl, f"offset_{lvl}")
        v = lz.take_along(dec.x, lz.take(ctx.param(p.feature[lvl], f"feature_{lvl}"), idx), axis=1)
        thr = lz.take(ctx.param(t, f"threshold_{lvl}", dtype=dec.dtype), idx)
        nan = None if nr is None else lz.take(ctx.param(nr, f"nan_right_{lvl}", dtype="bool"), idx)
        return pos * 2 + lz.cast(_go_right(v, thr, nan), "int32")

    pos = level(0, None)
    for lvl in range(1, depth):
        pos = level(lvl, pos)
    idx = pos + ctx.param(trees << depth, f"offset_{depth}")
    return lz.sum(lz.take(ctx.param(p.value, "leaf_value"), idx, axis=0), axis=1)


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
        return _constant(_root_values(ensemble), x, ctx)
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
from .hybrid import hybrid  # noqa: E402
from .quickscorer import bitvector  # noqa: E402

Strategy = Callable[[Ensemble, lz.LazyTensor, Context], lz.LazyTensor]
IMPLEMENTED: dict[str, Strategy] = {
    "traversal": traversal,
    "perfect": perfect,
    "gemm": gemm,
    "bitvector": bitvector,
    "hybrid": hybrid,
}


def choose(ensemble: Ensemble, requested: str) -> str:
    """The strategy to use for ``requested`` (``auto``: the cheapest by :mod:`.cost`'s model)."""
    if ensemble.has_categorical:  # categorical splits: only traversal evaluates them
        return "traversal"
    n_trees, n_splits, n_leaves = _gemm_shape(ensemble)
    entries = n_trees * n_splits * n_leaves
    terms = n_trees * n_splits * -(-n_leaves // 32)  # per row: mask words ANDed
    if requested == "auto":
        estimates = costs(ensemble)
        if entries > GEMM_AUTO_ENTRIES:
            estimates.pop("gemm")
        if terms > BITVECTOR_MAX_TERMS:
            estimates.pop("bitvector", None)
        return min(estimates, key=estimates.__getitem__)
    if requested not in IMPLEMENTED:
        raise UnsupportedError(
            f"tree_strategy={requested!r} is not implemented; supported: {['auto', *IMPLEMENTED]}"
        )
    if requested == "gemm" and entries > GEMM_MAX_ENTRIES:
        raise UnsupportedError(
            f"tree_strategy='gemm' needs {entries} path-matrix entries (limit {GEMM_MAX_ENTRIES}); "
            "use 'traversal'"
        )
    if requested == "bitvector" and terms > BITVECTOR_MAX_TERMS:
        raise UnsupportedError(
            f"tree_strategy='bitvector' ANDs {terms} mask words per row ({n_trees} trees × "
            f"{n_splits} splits × {-(-n_leaves // 32)} words; limit {BITVECTOR_MAX_TERMS}); "
            "use 'traversal' or 'hybrid'"
        )
    if requested == "perfect" and len(ensemble.trees) << ensemble.max_depth > PERFECT_MAX_LEAVES:
        raise UnsupportedError(
            f"tree_strategy='perfect' pads to depth {ensemble.max_depth} "
            f"({len(ensemble.trees)} × 2**{ensemble.max_depth} leaves, limit "
            f"{PERFECT_MAX_LEAVES}); use 'traversal'"
        )
    return requested


def leaf_sum(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """(B, K): the sum over trees of the leaf vector each row reaches, by the options' strategy."""
    name = choose(ensemble, ctx.options.tree_strategy)
    ctx.note(
        f"trees: {name} ({len(ensemble.trees)} trees, depth {ensemble.max_depth}, "
        f"{ensemble.n_nodes} nodes)"
    )
    return IMPLEMENTED[name](ensemble, x, ctx)
