"""Tree node tables: the bounds check every walk makes first, and the mask-word layout shared by
both bit-vector evaluations (the host kernel, :mod:`lazy.forest_bits`, and the compiler's
``bitvector`` and ``hybrid`` strategies).

The service treats a model's tables as untrusted input, so every index a walk may follow is
proved in bounds first."""

from __future__ import annotations

import numpy as np

#: Leaves per mask word (QuickScorer's bit-vectors: leaf ``32 w + b`` at bit ``b`` of word ``w``).
WORD_BITS = 32
ALL_ONES = (1 << WORD_BITS) - 1
#: Levels evaluated by bit-vectors above a walk: a cut there has at most one word of nodes.
TOP_LEVELS = WORD_BITS.bit_length() - 1


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
