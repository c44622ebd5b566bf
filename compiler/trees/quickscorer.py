"""The ``bitvector`` strategy (QuickScorer): every split compared at once, leaves found by bit
arithmetic instead of pointer chasing.

Number each tree's leaves left to right. A split whose test is false (the row goes right) rules
out the leaves of its left subtree; the row's exit leaf is the leftmost leaf no false split rules
out — it is never ruled out (every false split on its path has it in its right subtree, and the
others do not contain it), and any leaf left of it is under the left child of a path split that
went right. So per tree: AND the bitmasks of the false splits (all ones for the true ones), and
the exit leaf is the lowest set bit. Masks are uint32 words, leaf ``32 w + b`` at bit ``b`` of
word ``w``; trees of up to 32 leaves need one word. The strategy takes those only (more words
multiplied the loop body, and XLA's compile time grew faster still);
deeper trees use the hybrid, whose top is one word.

The evaluation is a loop over trees, one per iteration (several per iteration measured slower:
longer chains spill registers). A tree's body is a chain of elementwise ops over the batch: read
one feature column per split, compare, AND the mask words, count trailing zeros, then pick the
leaf's value by a tree of selects on the leaf number's bits. No gather touches per-row data, so
XLA:CPU vectorizes the whole chain across rows (the JAX lowering reads the columns from a
transposed copy of the features: contiguous rows). A gather for the leaf value would pull the
chain into a scalar gather loop; the selects keep it out.

A float64 sum (leaf values the source adds in float64, as LightGBM does) is not carried through
that chain: a float64 carry and selects among the 32-bit mask arithmetic halve the vector width
of the whole chain. Instead the loop writes each tree's exit leaf into a (B, T) int32 table
(:func:`exit_leaves`), and a second loop adds the trees' values in order
(:func:`.leaves.in_order_sum`), a gather and an add per tree.

The same tables, cut at a depth, give the top of the ``hybrid`` strategy (:mod:`.hybrid`): there
the "leaves" are the nodes at the cut depth (and real leaves above it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import lazy as lz
from lazy.node_tables import ALL_ONES, WORD_BITS, Children, leaf_order

from ..context import Context
from .leaves import constant, in_order_sum, no_leaves, stack_outputs, stumps
from .model import Ensemble, Tree
from .splits import SplitColumns, split_columns


@dataclass(frozen=True)
class BitTables:
    """Per tree (padded to I splits and L leaves, W = ceil(L / 32) words): split features,
    thresholds and NaN directions (T*I,), the masks of the leaves that stay reachable when a split
    is false (T, I, W) (padding: all ones), and each leaf's path from the root (T*L entries,
    ``None`` for padding) as its left/right turns."""

    feature: np.ndarray
    threshold: np.ndarray
    nan_right: np.ndarray
    masks: np.ndarray
    paths: list[tuple[int, tuple[bool, ...]] | None]  # (source node, turns: True = right)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(trees, splits per tree, leaves per tree), padded."""
        n_trees, n_splits, _ = self.masks.shape
        return n_trees, n_splits, len(self.paths) // n_trees


def _children(tree: Tree) -> Children:
    def children(node: int) -> tuple[int, int] | None:
        return None if tree.is_leaf[node] else (int(tree.left[node]), int(tree.right[node]))

    return children


def bit_tables(ensemble: Ensemble, cut: int | None = None) -> BitTables:
    walks = [leaf_order(0, _children(tree), cut) for tree in ensemble.trees]
    n_trees = len(walks)
    n_splits = max(1, max(len(s) for _, s in walks))
    n_leaves = max(len(leaves) for leaves, _ in walks)
    words = -(-n_leaves // WORD_BITS)
    feature = np.zeros((n_trees, n_splits), np.int64)
    threshold = np.full((n_trees, n_splits), np.inf)
    nan_right = np.zeros((n_trees, n_splits), bool)
    keep = np.ones((n_trees, n_splits, words * WORD_BITS), bool)
    paths: list[tuple[int, tuple[bool, ...]] | None] = []
    for ti, ((leaves, splits), tree) in enumerate(zip(walks, ensemble.trees, strict=True)):
        for si, (node, _, lo, mid) in enumerate(splits):
            feature[ti, si] = tree.feature[node]
            threshold[ti, si] = tree.threshold[node]
            nan_right[ti, si] = not tree.missing_left[node]
            keep[ti, si, lo:mid] = False
        paths += [*leaves, *[None] * (n_leaves - len(leaves))]
    # Bit b of word w is leaf 32 w + b: pack little-endian bits into little-endian words.
    masks = np.packbits(keep, axis=-1, bitorder="little").view("<u4").astype(np.uint32)
    return BitTables(feature.ravel(), threshold.ravel(), nan_right.ravel(), masks, paths)


def split_tables(
    tables: BitTables, cols: SplitColumns, ctx: Context, prefix: str
) -> tuple[lz.LazyTensor, lz.LazyTensor, lz.LazyTensor]:
    """(T*I,) columns, thresholds and mask words as parameters (trees of one mask word)."""
    if tables.masks.shape[2] != 1:
        raise ValueError(f"bit-vector loops take trees of up to {WORD_BITS} leaves")
    column, threshold = cols.encode(tables.feature, tables.threshold, tables.nan_right)
    return (
        ctx.param(column, f"{prefix}_column"),
        ctx.param(threshold, f"{prefix}_threshold", dtype=cols.dtype),
        ctx.param(tables.masks.ravel(), f"{prefix}_mask", dtype="uint32"),
    )


def exit_leaf(
    tree: lz.LazyTensor,
    x: lz.LazyTensor,
    column: lz.LazyTensor,
    threshold: lz.LazyTensor,
    masks: lz.LazyTensor,
    n_splits: int,
) -> lz.LazyTensor:
    """Inside a loop body: (B,) int32, tree ``tree``'s exit leaf (numbered within the tree) for
    every row of ``x``, from :func:`split_tables`' tables of one mask word per split."""
    reachable = None
    for s in range(n_splits):
        k = tree * n_splits + s
        false = lz.take(x, lz.take(column, k), axis=1) > lz.take(threshold, k)
        term = lz.where(false, lz.take(masks, k), ALL_ONES)
        reachable = term if reachable is None else reachable & term
    return lz.ctz(reachable)


#: A tree's step in a loop over trees: (trip, carry, tree number, the tree's exit leaf for
#: every row, the loop's own extra invariants) to the next carry.
Step = Callable[..., lz.LazyTensor]


def over_trees(
    step: Step,
    init: lz.LazyTensor,
    trees: lz.LazyTensor,
    count: int,
    cols: SplitColumns,
    splits: tuple[lz.LazyTensor, lz.LazyTensor, lz.LazyTensor],
    n_splits: int,
    extra: tuple[lz.LazyTensor, ...] = (),
) -> lz.LazyTensor:
    """A loop over the ``count`` trees ``trees`` (a parameter) names, each trip finding every
    row's exit leaf in its tree (:func:`exit_leaf`) and handing it to ``step`` with the carry;
    ``extra``: more invariants ``step`` reads. ``splits``: :func:`split_tables`' tables."""

    def body(
        i: lz.LazyTensor,
        carry: lz.LazyTensor,
        x: lz.LazyTensor,
        trees: lz.LazyTensor,
        column: lz.LazyTensor,
        threshold: lz.LazyTensor,
        masks: lz.LazyTensor,
        *extra: lz.LazyTensor,
    ) -> lz.LazyTensor:
        tree = lz.take(trees, i)
        leaf = exit_leaf(tree, x, column, threshold, masks, n_splits)
        return step(i, carry, tree, leaf, *extra)

    return lz.fori_loop(count, body, init, cols.x, trees, *splits, *extra)


def exit_leaves(
    trees: lz.LazyTensor,
    count: int,
    cols: SplitColumns,
    splits: tuple[lz.LazyTensor, lz.LazyTensor, lz.LazyTensor],
    n_splits: int,
    n_leaves: int,
    ctx: Context,
) -> lz.LazyTensor:
    """(B, count) int32: the exit leaf of each of the ``count`` trees ``trees`` (a parameter)
    names, for every row, numbered across trees (``tree * n_leaves + leaf``), one column per
    tree: a loop writing one column per tree (an update, not a gather: the chain stays
    vectorized). ``splits``: :func:`split_tables`' tables."""

    def record(
        i: lz.LazyTensor, leaves: lz.LazyTensor, tree: lz.LazyTensor, leaf: lz.LazyTensor
    ) -> lz.LazyTensor:
        return lz.update(leaves, i, leaf + tree * n_leaves, axis=1)

    leaves = no_leaves(cols.x, count, ctx)
    return over_trees(record, leaves, trees, count, cols, splits, n_splits)


def select(index: lz.LazyTensor, entries: list[lz.LazyTensor]) -> lz.LazyTensor:
    """``entries[index]`` per row, for ``0 <= index < len(entries)``: a tree of selects on the
    index's bits (elementwise, unlike a gather, so it stays in XLA's vectorized loop)."""
    layer, bit = entries, 0
    while len(layer) > 1:
        right = (index & (1 << bit)) != 0
        layer = [
            lz.where(right, layer[j + 1], layer[j]) if j + 1 < len(layer) else layer[j]
            for j in range(0, len(layer), 2)
        ]
        bit += 1
    return layer[0]


def bitvector(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    if ensemble.max_depth == 0:
        return stumps(ensemble, x, ctx)
    cols = split_columns(ensemble, x, ctx)
    tables = bit_tables(ensemble)
    n_trees, n_splits, n_leaves = tables.shape
    value = np.zeros((n_trees * n_leaves, ensemble.n_outputs))
    for i, entry in enumerate(tables.paths):
        if entry is not None:
            value[i] = ensemble.trees[i // n_leaves].value[entry[0]]

    def add(
        i: lz.LazyTensor,
        acc: lz.LazyTensor,
        tree: lz.LazyTensor,
        leaf: lz.LazyTensor,
        values: lz.LazyTensor,
    ) -> lz.LazyTensor:
        return acc + select(leaf, [lz.take(values, tree * n_leaves + j) for j in range(n_leaves)])

    # One loop per output, over the trees that contribute to it (boosting: one class's trees),
    # with a (B,) sum: a (B, K) carry puts K innermost, which XLA:CPU does not vectorize (slower
    # than K loops).
    # Trees in order from +0: an ``in_order`` ensemble's sum, in its dtype.
    dtype = ensemble.sum_dtype(ctx.dtype)
    zeros = lz.reshape(constant(np.zeros(1), x, ctx, dtype), (lz.B,))
    splits = split_tables(tables, cols, ctx, "split")
    outputs = []
    for k in range(ensemble.n_outputs):
        trees = np.flatnonzero(np.any(value[:, k].reshape(n_trees, n_leaves) != 0, axis=1))
        if len(trees) == 0:
            outputs.append(zeros)
            continue
        tree_ids = ctx.param(trees, f"trees_{k}")
        values = ctx.param(value[:, k], f"leaf_value_{k}", dtype=dtype)
        if np.dtype(dtype).itemsize == 4:
            outputs.append(
                over_trees(add, zeros, tree_ids, len(trees), cols, splits, n_splits, (values,))
            )
            continue
        # A float64 sum: found first, added in a loop of its own (see the module doc).
        leaves = exit_leaves(tree_ids, len(trees), cols, splits, n_splits, n_leaves, ctx)
        outputs.append(in_order_sum(values, leaves, dtype))
    return stack_outputs(outputs)
