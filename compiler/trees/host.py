"""Tree ensembles as the host runs them: one FOREST_SUM over the node tables.

The device strategies (:mod:`.strategies`) loop over trees or levels inside one executable,
where a loop step costs little but a call has a fixed cost. On the host, ``lz.forest_sum`` is a
native loop over rows, trees and levels (:mod:`lazy.forest`), faster at one row than ONNX
Runtime's whole call; batches of 16 rows or more go through bit-vectors and a compacted walk
(:mod:`lazy.forest_bits`), faster than the device strategies on large batches too. The executor
times the host against the device on every bucket it may win (``lazy.executor``, host
placement) and keeps the faster, so a one-row request never pays the device's fixed cost.

The tables are the traversal strategy's level-major ones (children adjacent, leaves looping to
themselves); the walk reads the rows as given, so NaN handling is the op's ``nan_right`` flag
rather than the widened feature blocks the tensor strategies compare against.
"""

from __future__ import annotations

import numpy as np

import lazy as lz

from ..context import Context
from .linked import linked
from .model import Ensemble
from .splits import compare_dtype, thresholds_in


def host_leaf_sum(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """(B, K): the sum over trees of the leaf vector each row reaches, as one FOREST_SUM (for an
    ensemble without categorical splits)."""
    dtype = compare_dtype(ensemble, x, ctx)
    x = x if x.dtype == dtype else lz.cast(x, dtype)
    g = linked(ensemble)
    # Where no NaN reaches the splits (imputed or encoded features), every missing direction is
    # as good as "left": the batch kernel then compares one copy of each feature, not two.
    nan_right = g.nan_right if ctx.may_be_nan(x) else np.zeros_like(g.nan_right)
    return lz.forest_sum(
        x,
        ctx.param(g.feature, "host_feature"),
        ctx.param(thresholds_in(dtype, g.threshold), "host_threshold", dtype=dtype),
        ctx.param(nan_right, "host_nan_right", dtype="bool"),
        ctx.param(g.left, "host_left"),
        # FOREST_SUM adds the trees in order, in the values' dtype.
        ctx.param(np.asarray(g.value), "host_leaf_value", dtype=ensemble.sum_dtype(ctx.dtype)),
        trees=len(g.roots),
        depth=ensemble.max_depth,
    )
