"""The ``bitvector`` strategy (QuickScorer): every split compared at once, leaves found by bit
arithmetic instead of pointer chasing.

Number each tree's leaves left to right. A split whose test is false (the row goes right) rules
out the leaves of its left subtree; the row's exit leaf is the leftmost leaf no false split rules
out — it is never ruled out (every false split on its path has it in its right subtree, and the
others do not contain it), and any leaf left of it is under the left child of a path split that
went right. So per tree: AND the bitmasks of the false splits (all ones for the true ones), and
the exit leaf is the lowest set bit. Masks are uint32 words, leaf ``32 w + b`` at bit ``b`` of
word ``w``; trees of up to 32 leaves need one word.

The same tables, cut at a depth, give the top of the ``hybrid`` strategy (:mod:`.hybrid`): there
the "leaves" are the nodes at the cut depth (and real leaves above it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import lazy as lz

from ..context import Context
from .model import Ensemble, Tree
from .strategies import _constant, _Decision, _decision, _go_right, _root_values

WORD_BITS = 32


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


def _walk(tree: Tree, cut: int | None) -> tuple[list[tuple[int, int, int]], list[tuple]]:
    """Splits as (node, first leaf of the left subtree, first leaf of the right subtree) and
    leaves as (node, turns) in left-to-right order; nodes at depth ``cut`` count as leaves."""
    splits: list[tuple[int, int, int]] = []
    leaves: list[tuple[int, tuple[bool, ...]]] = []
    stack: list[tuple[int, tuple[bool, ...], int | None]] = [(0, (), None)]
    # Iterative depth-first walk, left before right; a split's range closes when its right
    # subtree is entered (the marker entry with a split index).
    while stack:
        node, turns, close = stack.pop()
        if close is not None:
            node_id, lo, _ = splits[close]
            splits[close] = (node_id, lo, len(leaves))
            continue
        if tree.is_leaf[node] or (cut is not None and len(turns) == cut):
            leaves.append((node, turns))
            continue
        splits.append((node, len(leaves), -1))
        stack.append((int(tree.right[node]), (*turns, True), None))
        stack.append((-1, (), len(splits) - 1))
        stack.append((int(tree.left[node]), (*turns, False), None))
    return splits, leaves


def bit_tables(ensemble: Ensemble, cut: int | None = None) -> BitTables:
    walks = [_walk(tree, cut) for tree in ensemble.trees]
    n_trees = len(walks)
    n_splits = max(1, max(len(s) for s, _ in walks))
    n_leaves = max(len(leaves) for _, leaves in walks)
    words = -(-n_leaves // WORD_BITS)
    feature = np.zeros((n_trees, n_splits), np.int64)
    threshold = np.full((n_trees, n_splits), np.inf)
    nan_right = np.zeros((n_trees, n_splits), bool)
    keep = np.ones((n_trees, n_splits, words * WORD_BITS), bool)
    paths: list[tuple[int, tuple[bool, ...]] | None] = []
    for ti, ((splits, leaves), tree) in enumerate(zip(walks, ensemble.trees, strict=True)):
        for si, (node, lo, mid) in enumerate(splits):
            feature[ti, si] = tree.feature[node]
            threshold[ti, si] = tree.threshold[node]
            nan_right[ti, si] = not tree.missing_left[node]
            keep[ti, si, lo:mid] = False
        paths += [*leaves, *[None] * (n_leaves - len(leaves))]
    # Bit b of word w is leaf 32 w + b: pack little-endian bits into little-endian words.
    masks = np.packbits(keep, axis=-1, bitorder="little").view("<u4").astype(np.uint32)
    return BitTables(feature.ravel(), threshold.ravel(), nan_right.ravel(), masks, paths)


def exit_leaves(tables: BitTables, dec: _Decision, ctx: Context) -> lz.LazyTensor:
    """(B, T) int32: each tree's exit leaf, numbered within the tree."""
    n_trees, n_splits, _ = tables.shape
    words = tables.masks.shape[2]

    # One column gather and one dense comparison for every split of every tree, split-major
    # (I, T): the AND runs across splits with the trees as the contiguous axis, so it vectorizes.
    def split_major(a: np.ndarray) -> np.ndarray:
        return a.reshape(n_trees, n_splits).T.ravel()

    v = lz.take(dec.x, ctx.param(split_major(tables.feature), "split_feature"), axis=1)
    t = ctx.param(dec.thresholds(split_major(tables.threshold)), "split_threshold", dtype=dec.dtype)
    nr = split_major(tables.nan_right)
    nan_right = ctx.param(nr, "split_nan_right", dtype="bool") if nr.any() else None
    false = lz.reshape(_go_right(v, t, nan_right), (lz.B, n_splits, n_trees, 1))
    masks = ctx.param(tables.masks.transpose(1, 0, 2), "split_mask", dtype="uint32")  # (I, T, W)
    reachable = lz.reduce_and(lz.where(false, masks, 0xFFFFFFFF), axis=1)  # (B, T, W)
    if words == 1:
        return lz.reshape(lz.ctz(reachable), (lz.B, n_trees))
    # The first word with a bit set holds the exit leaf (an all-zero word's ctz, 32, would tie
    # with the next word's bit 0, so empty words are pushed past every leaf).
    base = ctx.param(np.arange(words) * WORD_BITS, "word_base")
    leaf = lz.where(reachable == 0, words * WORD_BITS, lz.ctz(reachable) + base)
    return lz.min(leaf, axis=2)


def tree_offsets(tables: BitTables, ctx: Context, name: str) -> lz.LazyTensor:
    """(T,) the first row of each tree's block in a (T*L, ...) leaf table."""
    n_trees, _, n_leaves = tables.shape
    return ctx.param(np.arange(n_trees) * n_leaves, name)


def bitvector(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    if ensemble.max_depth == 0:
        return _constant(_root_values(ensemble), x, ctx)
    dec = _decision(ensemble, x, ctx)
    tables = bit_tables(ensemble)
    k = ensemble.n_outputs
    value = np.zeros((len(tables.paths), k))
    for i, (entry, ti) in enumerate(zip(tables.paths, _tree_index(tables), strict=True)):
        if entry is not None:
            value[i] = ensemble.trees[ti].value[entry[0]]
    # The leaf lookup is a separate pass after the bit arithmetic (a gather fused into the AND
    # reduction keeps XLA:CPU from vectorizing it).
    leaf = exit_leaves(tables, dec, ctx) + tree_offsets(tables, ctx, "leaf_offset")
    return lz.sum(lz.take(ctx.param(value, "leaf_value"), leaf, axis=0), axis=1)


def _tree_index(tables: BitTables) -> np.ndarray:
    n_trees, _, n_leaves = tables.shape
    return np.repeat(np.arange(n_trees), n_leaves)
