"""The traversal strategy for ensembles with categorical splits.

The same breadth-first walk as :func:`.traversal.traversal`, one level per loop iteration; at
a node marked categorical the row's feature value is a category code, and the step reads the
node's row of a (nodes × categories) "goes left" table instead of comparing with a threshold.
"""

from __future__ import annotations

import numpy as np

import lazy as lz

from ..context import Context
from .leaves import node_leaf_sum
from .linked import Linked, decision, go_right, linked
from .model import Ensemble


def _category_tables(ensemble: Ensemble, g: Linked) -> tuple[np.ndarray, np.ndarray]:
    """(N,) is-categorical and (N, C) goes-left tables in the level-major numbering of ``g``
    (a node's children there are ``g.left[i]`` and ``g.left[i] + 1``)."""
    n, c = len(g.feature), ensemble.n_categories
    is_categorical, goes_left = np.zeros(n, bool), np.zeros((n, c), bool)
    for tree, root in zip(ensemble.trees, g.roots, strict=True):
        if tree.category_left is None:
            continue
        stack = [(0, int(root))]
        while stack:
            node, i = stack.pop()
            if tree.is_leaf[node]:
                continue
            if tree.is_categorical[node]:  # type: ignore[index]
                is_categorical[i] = True
                goes_left[i, : tree.category_left.shape[1]] = tree.category_left[node]
            stack += [
                (int(tree.left[node]), int(g.left[i])),
                (int(tree.right[node]), int(g.left[i]) + 1),
            ]
    return is_categorical, goes_left


def _categorical_step(
    n_categories: int,
    node: lz.LazyTensor,
    v: lz.LazyTensor,
    nan_right: lz.LazyTensor,
    threshold: lz.LazyTensor,
    left: lz.LazyTensor,
    categorical: lz.LazyTensor,
    table: lz.LazyTensor,
) -> lz.LazyTensor:
    """(B, T) node ids to their children's, given each node's feature value ``v``."""
    nr = lz.take(nan_right, node, axis=0)
    numeric_right = go_right(v, lz.take(threshold, node, axis=0), nr)
    # a code outside [0, C) (NaN included: comparisons are false) is a missing value
    known = (v >= 0.0) & (v < float(n_categories))
    code = lz.cast(lz.where(known, v, 0.0), "int32")
    in_left = lz.take(table, node * n_categories + code, axis=0)
    categorical_right = lz.where(known, ~in_left, nr)
    right = lz.where(lz.take(categorical, node, axis=0), categorical_right, numeric_right)
    return lz.take(left, node, axis=0) + lz.cast(right, "int32")


def categorical_traversal(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    dec = decision(ensemble, x, ctx)
    g = linked(ensemble)
    is_categorical, goes_left = _category_tables(ensemble, g)
    n_categories = goes_left.shape[1]
    tables = (
        ctx.param(g.nan_right, "nan_right", dtype="bool"),
        ctx.param(dec.thresholds(g.threshold), "threshold", dtype=dec.dtype),
        ctx.param(g.left, "left"),
        ctx.param(is_categorical, "is_categorical", dtype="bool"),
        ctx.param(goes_left.reshape(-1), "category_left", dtype="bool"),
    )
    roots = ctx.param(g.roots, "roots")
    v = lz.take(dec.x, ctx.param(g.feature[g.roots], "root_feature"), axis=1)
    node = _categorical_step(n_categories, roots, v, *tables)

    def level(
        i: lz.LazyTensor, node: lz.LazyTensor, x: lz.LazyTensor, feature: lz.LazyTensor, *tables
    ) -> lz.LazyTensor:
        v = lz.take_along(x, lz.take(feature, node, axis=0), axis=1)
        return _categorical_step(n_categories, node, v, *tables)

    if ensemble.max_depth > 1:
        feature = ctx.param(g.feature, "feature")
        node = lz.fori_loop(ensemble.max_depth - 1, level, node, dec.x, feature, *tables)
    return node_leaf_sum(ensemble, g.value, node, ctx)
