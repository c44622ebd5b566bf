"""Tree ensembles: a normalized representation (:mod:`.model`) and the strategies that turn it
into lazy IR (:mod:`.strategies`). Converters extract an :class:`Ensemble` and let a strategy
sum its leaf values."""

from __future__ import annotations

from ..float32_inputs import float32_floor
from .folding import leaf_sum_on
from .model import (
    Ensemble,
    Tree,
    from_hist_predictor,
    from_sklearn_tree,
    leaf_sums_exact,
    single_leaf,
)
from .strategies import STRATEGIES, choose, leaf_sum

__all__ = [
    "STRATEGIES",
    "Ensemble",
    "Tree",
    "choose",
    "float32_floor",
    "from_hist_predictor",
    "from_sklearn_tree",
    "leaf_sum",
    "leaf_sum_on",
    "leaf_sums_exact",
    "single_leaf",
]
