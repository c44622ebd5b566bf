"""What ``tree_strategy="auto"`` picks: a cost model fitted to ``bench/tree_strategies.py``.

Estimated ns per row on XLA:CPU (one thread, 10k-row batches), from the ensemble's padded shape:
T trees, depth D, I splits and L leaves per tree (the maxima: padding costs like real nodes).

- traversal: 15·T·D — one dependent gather chain per level.
- bitvector: 500 + 1.2·T·I, one mask word only (L ≤ 32): several words cost ~10× more per term.
- hybrid: 500 + 1.9·T·min(I, 31) + 15·T·(D − 5), for D > 5 (shallower, it is the bitvector).
- gemm: 150 + 0.35·T·I·L·(1 + T/25) — per-tree batched matmuls scale worse than linearly in T.
- perfect: never cheaper than traversal; not a candidate.

Measured (2-core machine, 1 thread, RF and GB at depth 2–8 × 10/100 trees): bit-vectors win for
many shallow trees (100 trees of depth ≤ 4: 2–4.7× over traversal) and for trees with few leaves
but long paths (HistGradientBoosting, 31 leaves); GEMM for a few trees of depth ≤ 3; the hybrid
gains ~5–15 % over traversal for 100 trees of depth 6–8; traversal otherwise. Batches of 100 rank
the strategies the same way; single rows are dominated by per-call overhead, where they tie. So
the choice is per model, for large buckets — one graph serves every bucket.
"""

from __future__ import annotations

from .model import Ensemble

WORD_BITS = 32
HYBRID_TOP_SPLITS = 31  # the hybrid's dense top: 5 levels


def shape(ensemble: Ensemble) -> tuple[int, int, int, int]:
    """(trees, depth, splits per tree, leaves per tree), the last two padded to the maximum."""
    splits = max(int((~t.is_leaf).sum()) for t in ensemble.trees)
    return len(ensemble.trees), ensemble.max_depth, splits, ensemble.max_leaves


def costs(ensemble: Ensemble) -> dict[str, float]:
    """Estimated ns per row of each candidate strategy for ``auto``."""
    t, d, i, leaves = shape(ensemble)
    out = {
        "traversal": 15.0 * t * d,
        "gemm": 150.0 + 0.35 * t * i * leaves * (1.0 + t / 25.0),
    }
    if leaves <= WORD_BITS:
        out["bitvector"] = 500.0 + 1.2 * t * i
    if d > 5:
        out["hybrid"] = 500.0 + 1.9 * t * min(i, HYBRID_TOP_SPLITS) + 15.0 * t * (d - 5)
    return out
