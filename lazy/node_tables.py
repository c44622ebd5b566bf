"""FOREST_SUM's node tables checked before a walk follows them: the service treats a model's tables
as untrusted input, so every index a walk may follow is proved in bounds first."""

from __future__ import annotations

import numpy as np


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
