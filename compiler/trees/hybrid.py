"""The ``hybrid`` strategy: the top levels of every tree evaluated densely, the rest traversed.

Two passes. The first is a loop over trees: the top ``TOP_LEVELS`` levels of a tree are a
bit-vector evaluation (:mod:`.quickscorer`) of the tree cut at that depth — every top split is
compared, and the AND of the false splits' masks names the node reached at the cut (or a leaf
above it) — elementwise work that vectorizes across rows; the iteration ends by writing that
"top leaf" into its tree's column of a (B, T) table (an update, not a gather, so the chain stays
vectorized). The second pass maps the top leaves to nodes of the traversal strategy's
level-major tables and walks the remaining levels for all trees at once, one level per loop
iteration; leaves loop to themselves there, so rows that stopped early stay put.

A dense comparison costs far less than a dependent gather, so deep trees gain from replacing
their first levels; beyond 5 levels (32 top nodes, one mask word) the dense work outgrows the
steps it saves. Trees of depth ≤ 5 are all top: the bit-vector strategy.
"""

from __future__ import annotations

import numpy as np

import lazy as lz
from lazy.node_tables import TOP_LEVELS

from ..context import Context
from .leaves import node_leaf_sum, stumps
from .linked import linked, step
from .model import Ensemble
from .quickscorer import bit_tables, bitvector, exit_leaves, split_tables
from .splits import split_columns


def hybrid(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    depth = ensemble.max_depth
    if depth == 0:
        return stumps(ensemble, x, ctx)
    if depth <= TOP_LEVELS:  # nothing to walk below the top: that is the bit-vector strategy
        return bitvector(ensemble, x, ctx)
    cols = split_columns(ensemble, x, ctx)
    top = bit_tables(ensemble, TOP_LEVELS)
    n_trees, n_splits, n_leaves = top.shape
    g = linked(ensemble)

    # Each top "leaf" as a node of the level-major tables: follow its turns from the root
    # (children are adjacent there: right = left + 1). Padding entries are never reached.
    start = np.zeros(len(top.paths), np.int64)
    for i, entry in enumerate(top.paths):
        node = g.roots[i // n_leaves]
        for right in entry[1] if entry is not None else ():
            node = g.left[node] + int(right)
        start[i] = node

    trees = ctx.param(np.arange(n_trees), "top_trees")
    splits = split_tables(top, cols, ctx, "top")
    leaves = exit_leaves(trees, n_trees, cols, splits, n_splits, n_leaves, ctx)
    node = lz.take(ctx.param(start, "top_node"), leaves, axis=0)  # (B, T)
    column, threshold = cols.encode(g.feature, g.threshold, g.nan_right)
    tables = (
        ctx.param(column, "feature"),
        ctx.param(threshold, "threshold", dtype=cols.dtype),
        ctx.param(g.left, "left"),
    )
    node = lz.fori_loop(depth - TOP_LEVELS, step, node, cols.x, *tables)
    return node_leaf_sum(ensemble, g.value, node, ctx)
