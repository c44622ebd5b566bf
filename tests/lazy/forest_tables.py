"""Random FOREST_SUM node tables, shared by the parity suite and the kernel's own tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def forest_tables(
    rng: np.random.Generator, trees: int, depth: int, features: int, k: int
) -> tuple[np.ndarray, ...]:
    """Random level-major node tables for FOREST_SUM: roots 0..trees-1, a node's children
    adjacent; leaves (left[n] == n) keep random thresholds and features, which the walk must
    ignore. Thresholds and features come from a small set, so rows tie with them."""
    left = level_major(trees, depth + 1, lambda d, i: d < depth and rng.random() < 0.75)
    n = len(left)
    return (
        rng.integers(0, features, n),
        rng.choice(np.array([-1.0, 0.0, 0.5, 1.0]), n),
        rng.random(n) < 0.5,
        np.asarray(left),
        rng.normal(0.0, 1.0, (n, k)),
    )


def level_major(trees: int, levels: int, splits: Callable[[int, int], bool]) -> np.ndarray:
    """The left-child table of level-major trees (roots 0..trees-1, children adjacent, a leaf
    its own left child) where node ``i`` of level ``d`` (counted across trees) splits iff
    ``splits(d, i)``, for ``levels`` levels."""
    left: list[int] = []
    level, count = list(range(trees)), trees
    for d in range(levels):
        following = []
        for i, node in enumerate(level):
            if splits(d, i):
                left.append(count)
                following += [count, count + 1]
                count += 2
            else:
                left.append(node)
        level = following
    return np.asarray(left)
