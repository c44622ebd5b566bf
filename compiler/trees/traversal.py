"""``traversal``: all trees at once, one level per loop iteration over the linked numbering."""

from __future__ import annotations

import lazy as lz

from ..context import Context
from .categorical import categorical_traversal
from .leaves import node_leaf_sum, stumps
from .linked import linked, step
from .model import Ensemble
from .splits import split_columns


def traversal(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    depth = ensemble.max_depth
    if depth == 0:
        return stumps(ensemble, x, ctx)
    if ensemble.has_categorical:
        return categorical_traversal(ensemble, x, ctx)
    cols = split_columns(ensemble, x, ctx)
    g = linked(ensemble)
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
        node = lz.fori_loop(depth - 1, step, node, cols.x, *tables)
    return node_leaf_sum(ensemble, g.value, node, ctx)
