"""The ``hybrid`` strategy: the top levels of every tree evaluated densely, the rest traversed.

The top ``TOP_LEVELS`` levels are a bit-vector evaluation (:mod:`.quickscorer`) of the trees cut
at that depth: every top split is compared at once and the AND of the false splits' masks names
the node reached at the cut (or a leaf above it). From there the walk continues one level per
step over the traversal strategy's breadth-first tables, where leaves loop to themselves, so
rows that stopped early just stay put. A dense comparison costs far less than a dependent gather,
so deep forests gain from replacing their first levels; beyond 5 levels (32 top nodes, one mask
word) the dense work outgrows the steps it saves.
"""

from __future__ import annotations

import numpy as np

import lazy as lz

from ..context import Context
from .model import Ensemble
from .quickscorer import bit_tables, exit_leaves, tree_offsets
from .strategies import _constant, _decision, _go_right, _linked, _root_values

TOP_LEVELS = 5


def hybrid(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    depth = ensemble.max_depth
    if depth == 0:
        return _constant(_root_values(ensemble), x, ctx)
    dec = _decision(ensemble, x, ctx)
    cut = min(depth, TOP_LEVELS)
    top = bit_tables(ensemble, cut)
    g = _linked(ensemble)

    # Each top "leaf" as a node of the breadth-first tables: follow its turns from the root
    # (children are adjacent there: right = left + 1).
    n_leaves = top.shape[2]
    start = np.zeros(len(top.paths), np.int64)
    for i, entry in enumerate(top.paths):
        node = g.roots[i // n_leaves]
        for right in entry[1] if entry is not None else ():
            node = g.left[node] + int(right)
        start[i] = node
    leaf = exit_leaves(top, dec, ctx) + tree_offsets(top, ctx, "top_offset")
    node = lz.take(ctx.param(start, "top_node"), leaf, axis=0)  # (B, T)

    if depth > cut:
        feature = ctx.param(g.feature, "feature")
        threshold = ctx.param(dec.thresholds(g.threshold), "threshold", dtype=dec.dtype)
        has_nan_right = bool(g.nan_right.any())
        nan_right = ctx.param(g.nan_right, "nan_right", dtype="bool") if has_nan_right else None
        left = ctx.param(g.left, "left")
        for _ in range(depth - cut):
            v = lz.take_along(dec.x, lz.take(feature, node, axis=0), axis=1)
            nr = lz.take(nan_right, node, axis=0) if nan_right is not None else None
            go_right = _go_right(v, lz.take(threshold, node, axis=0), nr)
            node = lz.take(left, node, axis=0) + lz.cast(go_right, "int32")
    return lz.sum(lz.take(ctx.param(g.value, "leaf_value"), node, axis=0), axis=1)
