"""What ``tree_strategy="auto"`` picks: a cost model fitted to ``bench/tree_strategies.py``.

Estimated ns per row on XLA:CPU (one thread, 10k-row batches), from the ensemble's padded shape:
T trees, depth D, I splits and L leaves per tree (the maxima: padding costs like real nodes),
and ΣD, the sum of the trees' own depths. Each strategy's cost is linear in the work its design
does, with coefficients fitted by ``bench/fit_tree_costs.py`` (non-negative least squares on the
relative error) to ``bench/tree_strategies.py --preset grid``: RF and GB of depth 2–10 and
unlimited × 10/100 trees, HistGB, LightGBM and XGBoost. The fitting data and the fit's regret
(how much slower its pick is than the fastest strategy) are in ``docs/tree-costs.json`` and
``docs/design-figures.md``.

- traversal: one level of every tree per loop step: T·D dependent gathers per row.
- bitvector: one mask word per tree (L ≤ 32): a dense, vectorized pass over T·I splits.
- hybrid: for D > 5 (shallower, it is the bitvector): the dense top five levels, T·min(I, 31)
  splits, then T·(D − 5) traversal steps.
- treewise: one tree at a time, each to its own depth: ΣD steps.

Batches of 100 rank the strategies nearly the same; single rows are dominated by per-call
overhead, where all tie. So the choice is per model: one graph serves every bucket.
"""

from __future__ import annotations

import numpy as np

from lazy import native
from lazy.node_tables import TOP_LEVELS, WORD_BITS

from .model import Ensemble

HYBRID_TOP_SPLITS = (1 << TOP_LEVELS) - 1


def shape(ensemble: Ensemble) -> tuple[int, int, int, int]:
    """(trees, depth, splits per tree, leaves per tree), the last two padded to the maximum."""
    splits = max(int((~t.is_leaf).sum()) for t in ensemble.trees)
    return len(ensemble.trees), ensemble.max_depth, splits, ensemble.max_leaves


def levels(ensemble: Ensemble) -> int:
    """ΣD: the sum over trees of each tree's own depth (the treewise strategy's steps per row)."""
    return sum(t.max_depth for t in ensemble.trees)


#: Float32 split codes pay where the host's batch kernel compares each encoded value at least
#: this many times per row: encoding one float64 value costs about what this many float32
#: compares save over float64 ones (docs/exactness.md, *Float32 split codes*).
SPLIT_CODES_MIN_COMPARES = 80
#: Trees of up to this many leaves are compared whole by the batch kernel's bit-vectors; larger
#: ones their top levels, then walked (lazy/forest_bits.py).
WHOLE_TREE_LEAVES = 2 * WORD_BITS


def compares_per_row(ensemble: Ensemble, features: frozenset[int]) -> float:
    """About how many compares of ``features`` the host's batch kernel makes per row: every
    split of a tree it evaluates whole, else its top splits and a walk below, each tree's share
    on ``features`` in proportion to its splits on them."""
    total = 0.0
    for tree in ensemble.trees:
        split = ~tree.is_leaf
        splits = int(split.sum())
        if not splits:
            continue
        on = int(np.isin(tree.feature[split], list(features)).sum())
        whole = int(tree.is_leaf.sum()) <= WHOLE_TREE_LEAVES
        compares = splits if whole else HYBRID_TOP_SPLITS + max(tree.max_depth - TOP_LEVELS, 0)
        total += compares * on / splits
    return total


def split_codes_pay(ensemble: Ensemble, features: frozenset[int], columns: int) -> bool:
    """Whether ``ensemble``'s splits on ``features`` should read their ``columns`` raw columns
    as float32 split codes (``CompileOptions.split_codes`` None): where the kernel compares each
    encoded value at least :data:`SPLIT_CODES_MIN_COMPARES` times per row."""
    return (
        columns > 0 and compares_per_row(ensemble, features) >= SPLIT_CODES_MIN_COMPARES * columns
    )


#: Where the host replays the features (:mod:`compiler.replayed_columns`) with the native
#: kernel (:mod:`compiler.replay_kernel`), replaying pays from this many compares per row of
#: each replayed feature: a replayed value costs about what this many float32 compares save
#: over the folded float64 ones (docs/exactness.md, *Replayed features*). numpy's replay costs
#: what encoding does (:data:`SPLIT_CODES_MIN_COMPARES`).
REPLAY_MIN_COMPARES = 16


def replay_pays(ensemble: Ensemble, features: frozenset[int]) -> bool:
    """Whether a float32-comparing ``ensemble`` should read ``features`` replayed by the host
    rather than have their splits folded onto the raw float64 columns."""
    per_feature = REPLAY_MIN_COMPARES if native.AVAILABLE else SPLIT_CODES_MIN_COMPARES
    count = len(features)
    return count > 0 and compares_per_row(ensemble, features) >= per_feature * count


def costs(ensemble: Ensemble) -> dict[str, float]:
    """Estimated ns per row of each candidate strategy for ``auto``."""
    t, d, i, leaves = shape(ensemble)
    out = {
        "traversal": 55.1 + 1.55 * t * d,
        "treewise": 37.7 + 1.53 * levels(ensemble),
    }
    if leaves <= WORD_BITS:
        out["bitvector"] = 34.5 + 0.104 * t * i
    if d > TOP_LEVELS:
        top = min(i, HYBRID_TOP_SPLITS)
        out["hybrid"] = 63.6 + 0.133 * t * top + 1.68 * t * (d - TOP_LEVELS)
    return out
