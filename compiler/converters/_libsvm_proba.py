"""libsvm's probability estimates (``SVC`` / ``NuSVC`` with ``probability=True``), step for step.

``svm_predict_probability`` turns each one-vs-one decision value ``d`` of the class pair (i, j)
into ``r_ij = clip(1 / (1 + exp(d * A + B)), 1e-7, 1 - 1e-7)`` (Platt scaling, A and B fitted per
pair), ``r_ji = 1 - r_ij``, then couples them with ``multiclass_probability`` (Wu, Lin & Weng 2004,
method 2): starting from ``p = 1/k``, at most ``max(100, k)`` sweeps of coordinate updates of
``p'Qp``, stopping *before* a sweep once ``max_t |(Qp)_t - p'Qp| < 0.005 / k``. Two classes take
the same path: libsvm never returns the Platt probability itself.

The coupling has two formulations (:mod:`lazy.coupling`): on the host one ``lz.couple`` op,
libsvm's loop as written, row by row, in a native kernel; on a device ``lz.couple_loop``, a LOOP
of the sweeps that ends once every row has stopped (binary problems: after a few sweeps). Either
agrees with libsvm to rounding in float64; in float32 a row whose stopping test lands within
rounding of the tolerance may stop one sweep earlier or later than libsvm: that row then differs
by about the size of one sweep's update.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import lazy as lz

from ..context import Context

_MIN_PROB = 1e-7  # libsvm's clip of the pairwise probabilities


def pairwise_probabilities(decision: lz.LazyTensor, est: Any, ctx: Context) -> lz.LazyTensor:
    """(B, n_pairs) ``r_ij`` of libsvm's pairs (i < j) from its decision values (libsvm's sign)."""
    f = decision * ctx.param(np.asarray(est._probA), "probA") + ctx.param(
        np.asarray(est._probB), "probB"
    )
    # sigmoid(-f) is libsvm's sigmoid_predict, including its branch on the sign of f for accuracy
    return lz.minimum(lz.maximum(lz.sigmoid(-f), _MIN_PROB), 1.0 - _MIN_PROB)


def predict_proba(decision: lz.LazyTensor, est: Any, ctx: Context) -> lz.LazyTensor:
    """``est.predict_proba`` from libsvm's (B, n_pairs) one-vs-one decision values."""
    r, k = pairwise_probabilities(decision, est, ctx), len(est.classes_)
    return lz.variant(lz.couple_loop(r, classes=k), lz.couple(r, classes=k))
