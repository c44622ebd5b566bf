"""Tree ensembles as the host runs them: loop-free formulations for the numpy backend.

The device strategies (:mod:`.strategies`) loop over trees or levels inside one executable, where a
loop step costs little. On the host every numpy call costs ~0.5–1 µs whatever its size, so a
100-tree loop of ~10 calls a trip is ~1 ms; what counts there is the number of calls. The
executor times this formulation against the device on the smallest buckets (``lazy.executor``,
host placement) and keeps the faster, so a one-row request never pays a device call's fixed cost
(~20 µs on XLA:CPU) plus a loop's trips.

Both formulations step every tree one level per call, all trees together, over the level-major
node tables of the traversal strategy (children adjacent, leaves looping to themselves), and end
with one gather of the reached leaves' (B, T, K) values and a sum over trees:

- ``lookup``: compare every node's split at once, (B, N), and turn it into each node's next
  node; then a level is a single gather of that table. The up-front work grows with the node
  count N, so it suits trees with few nodes per level of depth (boosting, 31 leaves: 16 levels,
  6100 nodes for 100 trees).
- ``walk``: per level, gather each tree's node record (column, threshold, child) and the row's
  feature, compare, step: seven calls a level, work proportional to T only (deep forests).

:func:`choose_host` picks by call counts and node count (see :data:`LOOKUP_NODES_PER_LEVEL`).
"""

from __future__ import annotations

import numpy as np

import lazy as lz

from ..context import Context
from .model import Ensemble
from .splits import split_columns
from .strategies import _linked

#: ``lookup`` is chosen while the nodes number at most this many per level of depth. Measured on
#: one row, one thread, numpy 2.4 (µs, lookup / walk): GradientBoosting 100 × depth 3 (1500 nodes)
#: 14 / 13, XGBoost 100 × depth 6 (7096) 22 / 16, LightGBM and HistGB 100 × 31 leaves (6100 nodes,
#: depth 16) 23–26 / 48–50, RandomForest 100 × depth 8 (31632) 83 / 34, unlimited depth (158k
#: nodes, depth 32) 396 / 116: a lookup level costs ~2.8 µs less than a walk level, and its table
#: ~3 ns a node.
LOOKUP_NODES_PER_LEVEL = 900


def choose_host(ensemble: Ensemble) -> str:
    """The host formulation for ``ensemble``: ``lookup`` or ``walk``."""
    return "lookup" if ensemble.n_nodes <= LOOKUP_NODES_PER_LEVEL * ensemble.max_depth else "walk"


def host_leaf_sum(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context, name: str) -> lz.LazyTensor:
    """(B, K): the sum over trees of the leaf vector each row reaches, by formulation ``name``
    (for an ensemble of depth ≥ 1 without categorical splits)."""
    cols = split_columns(ensemble, x, ctx)
    g = _linked(ensemble)
    column, threshold = cols.encode(g.feature, g.threshold, g.nan_right)
    n_trees, depth = len(g.roots), ensemble.max_depth
    if name == "lookup":
        # Every node's next node, per row: its left child plus one if the row goes right (a leaf:
        # itself, +inf never compared greater). The roots are nodes 0..T-1.
        v = lz.take(cols.x, ctx.param(column, "host_feature"), axis=1)  # (B, N)
        went_right = v > ctx.param(threshold, "host_threshold", dtype=cols.dtype)
        following = ctx.param(g.left, "host_left") + lz.cast(went_right, "int32")
        node = lz.slice_axis(following, 1, 0, n_trees)  # (B, T): level 1
        for _ in range(depth - 1):
            node = lz.take_along(following, node, axis=1)
    elif name == "walk":
        root = g.roots
        v = lz.take(cols.x, ctx.param(column[root], "host_root_feature"), axis=1)
        t = ctx.param(threshold[root], "host_root_threshold", dtype=cols.dtype)
        node = ctx.param(g.left[root], "host_root_left") + lz.cast(v > t, "int32")  # (B, T)
        feature = ctx.param(column, "host_feature")
        split = ctx.param(threshold, "host_threshold", dtype=cols.dtype)
        left = ctx.param(g.left, "host_left")
        for _ in range(depth - 1):
            v = lz.take_along(cols.x, lz.take(feature, node, axis=0), axis=1)
            node = lz.take(left, node, axis=0) + lz.cast(v > lz.take(split, node, axis=0), "int32")
    else:
        raise ValueError(f"unknown host formulation {name!r}; expected 'lookup' or 'walk'")
    values = ctx.param(np.asarray(g.value), "host_leaf_value")  # (N, K)
    return lz.sum(lz.take(values, node, axis=0), axis=1)  # (B, T, K) → (B, K)
