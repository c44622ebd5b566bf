"""What ``tree_strategy="auto"`` picks: a cost model fitted to ``bench/tree_strategies.py``.

Estimated ns per row on XLA:CPU (one thread, 10k-row batches), from the ensemble's padded shape:
T trees, depth D, I splits and L leaves per tree (the maxima: padding costs like real nodes).
Fitted by ``bench/fit_tree_costs.py`` (non-negative least squares on the relative error) to
``bench/tree_strategies.py --preset grid``: RF and GB of depth 2–10 and unlimited × 10/100
trees, HistGB, LightGBM and XGBoost.

- traversal: 40 + 4.0·T·D — one level of every tree per loop step, four gathers per (row, tree).
- perfect: 27 + 3.9·T·D — the same without the child table; its tables grow as T·2**D, so it
  is a candidate only while they stay small (``PERFECT_AUTO_LEAVES``).
- bitvector: 83 + 0.19·T·I, one mask word only (L ≤ 32): a dense, vectorized pass per tree.
- hybrid: 171 + 0.24·T·min(I, 31) + 4.5·T·(D − 5), for D > 5 (shallower, it is the bitvector):
  the dense top five levels, then traversal steps.
- gemm: 361 + 0.135·T·I·L — path matrices; never the cheapest on the grid but for tiny models.
- treewise: 90 + 3.7·ΣD, ΣD the sum of the trees' own depths — one tree at a time, each to its own
  depth (fitted to RF 100 × depth 8, 10 and unlimited at 10k rows, in the 2k-row blocks the JAX
  lowering gives tree walks; the other terms predate those blocks, which sped the lockstep
  walks up, so the term is set between their fits: it loses to the hybrid at depth ≤ 10 as
  measured, and wins for unlimited depth; the intercept, a loop per depth group, leaves tiny
  models to the bit-vectors).

Measured picture: bit-vectors win wherever trees have at most 32 leaves (boosting with 31
leaves: HistGB and LightGBM; shallow forests), by far over traversal; the hybrid wins for deeper
trees, by less as depth grows; traversal and perfect traversal tie for a few deep trees.
Batches of 100 rank the strategies nearly the same; single rows are dominated by per-call
overhead, where all tie. So the choice is per model — one graph serves every bucket (figures:
docs/design-figures.md).

The bit-vector and hybrid-top terms predate the JAX lowering's padded column layout (see
``lazy/backends/jax_backend.py``, ``_column_major``), which cut their per-split cost for
features read from a 1024-row bucket. They already won wherever they apply, so no pick changed
on the benchmark models; a refit would lower 0.19 and 0.24.
"""

from __future__ import annotations

from .model import Ensemble

WORD_BITS = 32
HYBRID_TOP_LEVELS = 5  # the hybrid's dense top
HYBRID_TOP_SPLITS = (1 << HYBRID_TOP_LEVELS) - 1
#: ``auto`` considers perfect traversal while its tables hold at most this many leaves.
PERFECT_AUTO_LEAVES = 1 << 17


def shape(ensemble: Ensemble) -> tuple[int, int, int, int]:
    """(trees, depth, splits per tree, leaves per tree), the last two padded to the maximum."""
    splits = max(int((~t.is_leaf).sum()) for t in ensemble.trees)
    return len(ensemble.trees), ensemble.max_depth, splits, ensemble.max_leaves


def levels(ensemble: Ensemble) -> int:
    """ΣD: the sum over trees of each tree's own depth (the treewise strategy's steps per row)."""
    return sum(t.max_depth for t in ensemble.trees)


def costs(ensemble: Ensemble) -> dict[str, float]:
    """Estimated ns per row of each candidate strategy for ``auto``."""
    t, d, i, leaves = shape(ensemble)
    out = {
        "traversal": 40.0 + 4.0 * t * d,
        "gemm": 361.0 + 0.135 * t * i * leaves,
        "treewise": 90.0 + 3.7 * levels(ensemble),
    }
    if t << d <= PERFECT_AUTO_LEAVES:
        out["perfect"] = 27.0 + 3.9 * t * d
    if leaves <= WORD_BITS:
        out["bitvector"] = 83.0 + 0.19 * t * i
    if d > HYBRID_TOP_LEVELS:
        top = min(i, HYBRID_TOP_SPLITS)
        out["hybrid"] = 171.0 + 0.24 * t * top + 4.5 * t * (d - HYBRID_TOP_LEVELS)
    return out
