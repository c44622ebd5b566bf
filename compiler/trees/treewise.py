"""The ``treewise`` strategy: one tree at a time, every row walking it to that tree's own depth.

The lockstep strategies (traversal, hybrid) step every (row, tree) pair together for the
ensemble's maximum depth. For deep forests (unlimited depth: trees of 16–25 levels) that pays
twice: every tree is walked as deep as the deepest one, and a step's (B, T) node ids spread
over all trees' tables, so each gather of a node's split misses the caches. Here the outer loop
runs over trees and the inner loop walks all rows of the block through one tree, with a (B,)
state:

- a tree's node tables (a few thousand entries) stay in L1 while every row of the block reads
  them — nodes are numbered tree by tree, breadth first, children adjacent
  (``right == left + 1``), leaves looping to themselves;
- trees are grouped by depth and each group is one loop whose inner walk has that depth, so
  no tree takes more steps than its own deepest leaf (a random forest's mean tree depth is
  ~80 % of its maximum).

The root's split is a column read (every row is at the root); a step gathers the node's column,
threshold and left child and the row's feature value. Leaf vectors are accumulated per tree into
a (B, K) carry; for an ``in_order`` ensemble (the source's sum, one tree after another) each
group's loop instead writes the leaves its trees reach into their columns of a (B, T) table,
and a loop over the table adds them in the source's order. Splits compare one column of the
widened features (:mod:`.splits`), as in the traversal strategy, so decisions are exactly the
source's.

On deep forests a step's time is its loads (XLA:CPU emits scalar loads, clamping every gather
index even when promised in bounds); a loop iteration's own overhead is small against a block,
and cold caches cost nothing measurable (``bench/tree_strategies.py --flush-mb 64``). Tried and
slower: node records packed in one row (column, left, threshold: three loads from one cache
line), two trees per loop iteration, two levels per iteration; a (K, B) leaf sum and narrower
rows changed nothing. What is left is the lockstep itself: rows reach a leaf well before their
tree's depth, but every row takes its tree's depth in steps, and stopping a block once all its
rows sit at leaves would save little — a per-row loop is beyond what the IR expresses (figures:
docs/design-figures.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

import lazy as lz

from ..context import Context
from .leaves import constant, in_order_sum, no_leaves, stack_outputs, stumps
from .linked import empty_node_tables
from .model import Ensemble
from .splits import SplitColumns, split_columns


@dataclass(frozen=True)
class TreewiseTables:
    """Nodes numbered tree by tree (trees in ``order``), breadth first within a tree, so a
    split's children are ``left`` and ``left + 1``; a leaf is its own left child and has
    threshold +inf (nothing goes right of it). ``groups``: (depth, first, count) runs of
    ``order`` whose trees share a depth, shallowest first."""

    order: np.ndarray  # (T,) tree indices, by depth
    roots: np.ndarray  # (T,) root id of ``order[i]``
    groups: tuple[tuple[int, int, int], ...]
    feature: np.ndarray  # (N,)
    threshold: np.ndarray  # (N,)
    nan_right: np.ndarray  # (N,)
    left: np.ndarray  # (N,)
    value: np.ndarray  # (N, K)


def treewise_tables(ensemble: Ensemble) -> TreewiseTables:
    depths = np.array([t.max_depth for t in ensemble.trees])
    order = np.argsort(depths, kind="stable")
    feature, threshold, nan_right, left, value = empty_node_tables(ensemble)
    roots = np.zeros(len(order), np.int64)
    first = 0
    for i, ti in enumerate(order):
        tree = ensemble.trees[ti]
        roots[i] = first
        queue = [0]  # source nodes in breadth-first order; ids follow queue positions
        for pos, node in enumerate(queue):
            k = first + pos
            if tree.is_leaf[node]:
                left[k] = k
                value[k] = tree.value[node]
                continue
            left[k] = first + len(queue)
            queue += [int(tree.left[node]), int(tree.right[node])]
            feature[k] = tree.feature[node]
            threshold[k] = tree.threshold[node]
            nan_right[k] = not tree.missing_left[node]
        first += len(queue)
    groups = []
    for d in np.unique(depths):
        members = np.flatnonzero(depths[order] == d)
        groups.append((int(d), int(members[0]), len(members)))
    return TreewiseTables(order, roots, tuple(groups), feature, threshold, nan_right, left, value)


def _gather_step(
    i: lz.LazyTensor,
    node: lz.LazyTensor,
    x: lz.LazyTensor,
    column: lz.LazyTensor,
    threshold: lz.LazyTensor,
    left: lz.LazyTensor,
) -> lz.LazyTensor:
    """One level of one tree for every row: (B,) node ids to their children's."""
    idx = lz.reshape(lz.take(column, node, axis=0), (lz.B, 1))
    v = lz.reshape(lz.take_along(x, idx, axis=1), (lz.B,))
    return lz.take(left, node, axis=0) + lz.cast(v > lz.take(threshold, node, axis=0), "int32")


def _reached_leaf(
    depth: int,
    root: lz.LazyTensor,
    x: lz.LazyTensor,
    column: lz.LazyTensor,
    threshold: lz.LazyTensor,
    left: lz.LazyTensor,
) -> lz.LazyTensor:
    """(B,): the leaf each row reaches in the tree of ``root`` (a scalar), ``depth`` levels down
    (a single-leaf tree: its root, which loops to itself)."""
    # Level 0: every row is at the root, so its split reads one whole column.
    v = lz.take(x, lz.take(column, root), axis=1)  # (B,)
    node = lz.take(left, root) + lz.cast(v > lz.take(threshold, root), "int32")
    if depth > 1:
        node = lz.fori_loop(depth - 1, _gather_step, node, x, column, threshold, left)
    return node


def _walk_tree(
    depth: int,
    j: lz.LazyTensor,
    acc: lz.LazyTensor,
    x: lz.LazyTensor,
    roots: lz.LazyTensor,
    column: lz.LazyTensor,
    threshold: lz.LazyTensor,
    left: lz.LazyTensor,
    value: lz.LazyTensor,
) -> lz.LazyTensor:
    """Loop body over a depth group's trees: add tree ``j``'s reached leaf vector to ``acc``."""
    node = _reached_leaf(depth, lz.take(roots, j), x, column, threshold, left)
    return acc + lz.take(value, node, axis=0)  # (B, K)


def _record_tree(
    depth: int,
    j: lz.LazyTensor,
    leaves: lz.LazyTensor,
    x: lz.LazyTensor,
    roots: lz.LazyTensor,
    slots: lz.LazyTensor,
    column: lz.LazyTensor,
    threshold: lz.LazyTensor,
    left: lz.LazyTensor,
) -> lz.LazyTensor:
    """Loop body over a depth group's trees: tree ``j``'s reached leaf into its column (its
    place in the source's order) of the (B, T) ``leaves``."""
    node = _reached_leaf(depth, lz.take(roots, j), x, column, threshold, left)
    return lz.update(leaves, lz.take(slots, j), node, axis=1)


def treewise(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    if ensemble.max_depth == 0:
        return stumps(ensemble, x, ctx)
    cols = split_columns(ensemble, x, ctx)
    g = treewise_tables(ensemble)
    column, threshold = cols.encode(g.feature, g.threshold, g.nan_right)
    if ensemble.in_order:
        return _in_order(ensemble, g, cols, column, threshold, ctx)
    # Single-leaf trees add a constant: it starts the sum instead of a loop.
    single_leaves = [
        ensemble.trees[t].value[0]
        for depth, first, count in g.groups
        if depth == 0
        for t in g.order[first : first + count]
    ]
    total = np.sum(single_leaves, axis=0) if single_leaves else np.zeros(ensemble.n_outputs)
    dtype = ensemble.sum_dtype(ctx.dtype)
    acc = constant(total, x, ctx, dtype)
    tables = (
        ctx.param(column, "feature"),
        ctx.param(threshold, "threshold", dtype=cols.dtype),
        ctx.param(g.left, "left"),
        ctx.param(g.value, "leaf_value", dtype=dtype),
    )
    for depth, first, count in g.groups:
        if depth == 0:
            continue
        roots = ctx.param(g.roots[first : first + count], f"roots_depth{depth}")
        body = partial(_walk_tree, depth)
        acc = lz.fori_loop(count, body, acc, cols.x, roots, *tables)
    return acc


def _in_order(
    ensemble: Ensemble,
    g: TreewiseTables,
    cols: SplitColumns,
    column: np.ndarray,
    threshold: np.ndarray,
    ctx: Context,
) -> lz.LazyTensor:
    """The source's sum, one tree after another: each depth group's loop writes the leaves its
    trees reach into their columns of a (B, T) table, and the leaf values are added in tree
    order afterwards (each tree still walks its own depth only)."""
    tables = (
        ctx.param(column, "feature"),
        ctx.param(threshold, "threshold", dtype=cols.dtype),
        ctx.param(g.left, "left"),
    )
    leaves = no_leaves(cols.x, len(g.order), ctx)
    for depth, first, count in g.groups:
        roots = ctx.param(g.roots[first : first + count], f"roots_depth{depth}")
        slots = ctx.param(g.order[first : first + count], f"slots_depth{depth}")
        body = partial(_record_tree, depth)
        leaves = lz.fori_loop(count, body, leaves, cols.x, roots, slots, *tables)
    dtype = ensemble.sum_dtype(ctx.dtype)
    return stack_outputs(
        [
            in_order_sum(ctx.param(g.value[:, k], f"leaf_value_{k}", dtype=dtype), leaves, dtype)
            for k in range(ensemble.n_outputs)
        ]
    )
