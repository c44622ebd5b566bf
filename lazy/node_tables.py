"""Tree node tables: the bounds check every walk makes first, and what both bit-vector
evaluations (the host kernel, :mod:`lazy.forest_bits`, and the compiler's ``bitvector`` and
``hybrid`` strategies) share: the mask-word layout and the leaf numbering.

The service treats a model's tables as untrusted input, so every index a walk may follow is
proved in bounds first."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: Leaves per mask word (QuickScorer's bit-vectors: leaf ``32 w + b`` at bit ``b`` of word ``w``).
WORD_BITS = 32
ALL_ONES = (1 << WORD_BITS) - 1
#: Levels evaluated by bit-vectors above a walk: a cut there has at most one word of nodes.
TOP_LEVELS = WORD_BITS.bit_length() - 1


Children = Callable[[int], tuple[int, int] | None]
Leaves = list[tuple[int, tuple[bool, ...]]]
Splits = list[tuple[int, int, int, int]]


def leaf_order(
    root: int, children: Children, cut: int | None = None, limit: int | None = None
) -> tuple[Leaves, Splits] | None:
    """QuickScorer's numbering of the tree at ``root``: its leaves left to right, as (node,
    turns from the root, True = right), and its splits depth first, as (node, level, first leaf
    of its left subtree, first leaf of its right subtree). A split whose test sends a row right
    rules out exactly its left subtree's leaves, so the exit leaf is the lowest one no false
    split rules out. ``children(node)``: (left, right), or None at a leaf; nodes ``cut`` levels
    down count as leaves. None once there are more than ``limit`` leaves."""
    leaves: Leaves = []
    splits: Splits = []
    # Depth first, left before right; a split's range closes when its right subtree is entered
    # (the marker entry naming the split).
    stack: list[tuple[int, tuple[bool, ...], int]] = [(root, (), -1)]
    while stack:
        node, turns, close = stack.pop()
        if close >= 0:
            n, level, lo, _ = splits[close]
            splits[close] = (n, level, lo, len(leaves))
            continue
        pair = children(node) if cut is None or len(turns) < cut else None
        if pair is None:
            leaves.append((node, turns))
            if limit is not None and len(leaves) > limit:
                return None
            continue
        splits.append((node, len(turns), len(leaves), -1))
        stack += [(pair[1], (*turns, True), -1), (-1, (), len(splits) - 1)]
        stack.append((pair[0], (*turns, False), -1))
    return leaves, splits


def check_tables(x: np.ndarray, feature: np.ndarray, left: np.ndarray, trees: int) -> None:
    """Raise IndexError unless every index the walk may follow is in bounds."""
    n = len(left)
    inner = left != np.arange(n)
    if trees > n:
        raise IndexError(f"FOREST_SUM has {trees} trees but {n} nodes")
    if np.any((feature < 0) | (feature >= x.shape[1])):
        raise IndexError(f"FOREST_SUM feature index outside the {x.shape[1]} features")
    if np.any(inner & ((left < 0) | (left >= n - 1))):
        raise IndexError(f"FOREST_SUM child index outside the {n} nodes")
