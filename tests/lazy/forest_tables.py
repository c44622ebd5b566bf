"""Random FOREST_SUM node tables, shared by the parity suite and the kernel's own tests."""

from __future__ import annotations

import numpy as np


def forest_tables(
    rng: np.random.Generator, trees: int, depth: int, features: int, k: int
) -> tuple[np.ndarray, ...]:
    """Random level-major node tables for FOREST_SUM: roots 0..trees-1, a node's children
    adjacent; leaves (left[n] == n) keep random thresholds and features, which the walk must
    ignore. Thresholds and features come from a small set, so rows tie with them."""
    left: list[int] = []
    level, count = list(range(trees)), trees
    for d in range(depth + 1):
        following = []
        for node in level:
            if d < depth and rng.random() < 0.75:
                left.append(count)
                following += [count, count + 1]
                count += 2
            else:
                left.append(node)
        level = following
    n = len(left)
    return (
        rng.integers(0, features, n),
        rng.choice(np.array([-1.0, 0.0, 0.5, 1.0]), n),
        rng.random(n) < 0.5,
        np.asarray(left),
        rng.normal(0.0, 1.0, (n, k)),
    )
