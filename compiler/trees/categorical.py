"""The traversal strategy for ensembles with categorical splits, and their splits as numeric ones
on membership columns (for the explanation's tables).

The same breadth-first walk as :func:`.traversal.traversal`, one level per loop iteration; at
a node marked categorical the row's feature value is a category code, and the step reads the
node's row of a (nodes × categories) "goes left" table instead of comparing with a threshold.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

import lazy as lz

from ..context import Context
from .leaves import node_leaf_sum
from .linked import Linked, decision, go_right, linked
from .model import Ensemble, Tree


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


def as_membership_splits(
    ensemble: Ensemble, folded: Ensemble, x: lz.LazyTensor, ctx: Context
) -> tuple[Ensemble, Ensemble, lz.LazyTensor]:
    """The same trees with every categorical split a numeric one, for the explanation's tables
    (which compare ``v > t``): ``x`` gains one 0/1 column per distinct (column, left set,
    missing direction), 1 where the row goes right (its code is not in the left set, or it is
    missing and missing values go right), split at 0.5. ``ensemble`` (the source's features)
    and ``folded`` (the columns of ``x``) are converted alike; a derived column is its
    feature's player, as LightGBM's and XGBoost's membership columns are."""
    width = int(x.shape[1])
    derived: dict[tuple[int, bytes, bool], int] = {}
    tables: list[np.ndarray] = []
    source_trees: list[Tree] = []
    folded_trees: list[Tree] = []
    for tree, folded_tree in zip(ensemble.trees, folded.trees, strict=True):
        if not tree.has_categorical:
            source_trees.append(replace(tree, is_categorical=None, category_left=None))
            folded_trees.append(replace(folded_tree, is_categorical=None, category_left=None))
            continue
        column = folded_tree.feature.copy()
        threshold = folded_tree.threshold.copy()
        categorical = tree.is_categorical & ~tree.is_leaf  # type: ignore[operator]
        for node in np.flatnonzero(categorical):
            left = np.asarray(tree.category_left[node], bool)  # type: ignore[index]
            key = (int(folded_tree.feature[node]), left.tobytes(), bool(tree.missing_left[node]))
            if key not in derived:
                derived[key] = len(derived)
                # codes 0..C-1, then the missing slot: 1 where the row goes right
                tables.append(np.append(~left, not key[2]).astype(np.float64))
            column[node], threshold[node] = width + derived[key], 0.5
        source_trees.append(replace(tree, is_categorical=None, category_left=None))
        folded_trees.append(
            replace(
                folded_tree,
                feature=column,
                threshold=threshold,
                is_categorical=None,
                category_left=None,
            )
        )
    keys = list(derived)
    parts = [x]
    for (c, _, _), table in zip(keys, tables, strict=True):
        v = x[:, c]
        missing = len(table) - 1
        # a code outside [0, C) (NaN included: comparisons are false) is a missing value
        known = (v >= 0.0) & (v < float(missing))
        code = lz.cast(lz.where(known, v, float(missing)), "int32")
        table_param = ctx.param(table, "membership_table", dtype=x.dtype)
        parts.append(lz.expand_dims(lz.take(table_param, code, axis=0), 1))
    # The tables name each element's player by the source trees' features (unchanged here);
    # the widened matrix's own players only keep their count in step.
    players = None
    if folded.players is not None:
        players = (*folded.players, *(folded.player(c) for c, _, _ in keys))
    source = replace(ensemble, trees=tuple(source_trees))
    widened = replace(
        folded, trees=tuple(folded_trees), n_features=width + len(keys), players=players
    )
    return source, widened, lz.concat(parts, axis=1)
