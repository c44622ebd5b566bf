"""``perfect``: the walk over trees padded to the ensemble's depth, children by arithmetic."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

import lazy as lz

from ..context import Context
from .leaves import node_leaf_sum, stumps
from .model import Ensemble
from .splits import split_columns


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
        return stumps(ensemble, x, ctx)
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
    return node_leaf_sum(ensemble, p.value, leaf, ctx)
