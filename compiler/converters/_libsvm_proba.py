"""libsvm's probability estimates (``SVC`` / ``NuSVC`` with ``probability=True``), step for step.

``svm_predict_probability`` turns each one-vs-one decision value ``d`` of the class pair (i, j)
into ``r_ij = clip(1 / (1 + exp(d * A + B)), 1e-7, 1 - 1e-7)`` (Platt scaling, A and B fitted per
pair), ``r_ji = 1 - r_ij``, then couples them with ``multiclass_probability`` (Wu, Lin & Weng 2004,
method 2): starting from ``p = 1/k``, at most ``max(100, k)`` sweeps of coordinate updates of
``p'Qp``, stopping *before* a sweep once ``max_t |(Qp)_t - p'Qp| < 0.005 / k``. Two classes take
the same path: libsvm never returns the Platt probability itself.

On the device the sweeps are one LOOP of at most ``max(100, k)`` trips. Its carry is ``p`` plus a
per-row "stopped" column: a row that met the stopping test keeps its ``p`` from then on, which is
exactly libsvm's early exit, row by row, so rows stay independent; the LOOP's ``stop_column`` lets
a backend end once every row of a call has stopped (binary problems: after a few sweeps). Every sweep repeats libsvm's arithmetic
in its order (sums over classes run j = 0, 1, …), so the float64 graph agrees with libsvm to
rounding. In float32 a row whose stopping test lands within rounding of the tolerance may stop one
sweep earlier or later than libsvm: that row then differs by about the size of one sweep's update.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import lazy as lz

from ..context import Context

_MIN_PROB = 1e-7  # libsvm's clip of the pairwise probabilities


def _pairs(k: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(k) for j in range(i + 1, k)]


def pairwise_probabilities(decision: lz.LazyTensor, est: Any, ctx: Context) -> lz.LazyTensor:
    """(B, n_pairs) ``r_ij`` of libsvm's pairs (i < j) from its decision values (libsvm's sign)."""
    f = decision * ctx.param(np.asarray(est._probA), "probA") + ctx.param(
        np.asarray(est._probB), "probB"
    )
    # sigmoid(-f) is libsvm's sigmoid_predict, including its branch on the sign of f for accuracy
    return lz.minimum(lz.maximum(lz.sigmoid(-f), _MIN_PROB), 1.0 - _MIN_PROB)


def _q_matrix(r: lz.LazyTensor, k: int, ctx: Context) -> lz.LazyTensor:
    """libsvm's (B, k, k) ``Q``: ``Q_tt = Σ_{j≠t} r_jt²`` (j ascending), ``Q_tj = -r_jt r_tj``."""
    pairs = _pairs(k)
    n = len(pairs)
    index = {pair: p for p, pair in enumerate(pairs)}
    both = lz.concat([r, 1.0 - r], axis=1)  # r_ij at column p, r_ji at column n + p

    def column(j: int, t: int) -> int:  # where r_jt lives in ``both``
        return index[(j, t)] if j < t else n + index[(t, j)]

    terms = [column(j, t) for t in range(k) for j in range(k) if j != t]
    picked = lz.take(both, ctx.param(np.asarray(terms, np.int32), "coupling_terms"), axis=1)
    picked = lz.reshape(picked, (lz.B, k, k - 1))
    diagonal = lz.sum(picked * picked, axis=2)  # (B, k)
    off = -(r * (1.0 - r))  # Q_ij = Q_ji = -r_ji r_ij
    cells = [n + t if t == j else index[(min(t, j), max(t, j))] for t in range(k) for j in range(k)]
    q = lz.take(
        lz.concat([off, diagonal], axis=1),
        ctx.param(np.asarray(cells, np.int32), "coupling_cells"),
        axis=1,
    )
    return lz.reshape(q, (lz.B, k, k))


def _sweep(k: int, eps: float) -> Any:
    """The LOOP body: one iteration of libsvm's ``multiclass_probability``."""

    def body(i: lz.LazyTensor, carry: lz.LazyTensor, q: lz.LazyTensor) -> lz.LazyTensor:
        start, stopped = carry[:, :k], carry[:, k:] != 0.0
        # the stopping test, on Qp and p'Qp recomputed from scratch as libsvm does
        qp = lz.sum(q * lz.expand_dims(start, 1), axis=2)
        pqp = lz.sum(start * qp, axis=1, keepdims=True)
        stop = stopped | (lz.max(abs(qp - pqp), axis=1, keepdims=True) < eps)
        p = start
        for t in range(k):
            qp_t, q_row = qp[:, t : t + 1], q[:, t, :]
            q_tt = q_row[:, t : t + 1]
            diff = (-qp_t + pqp) / q_tt
            p = p + diff * lz.const(np.eye(k, dtype=p.dtype)[t])  # p[t] += diff
            pqp = (pqp + diff * (diff * q_tt + 2.0 * qp_t)) / (1.0 + diff) / (1.0 + diff)
            qp = (qp + diff * q_row) / (1.0 + diff)
            p = p / (1.0 + diff)
        return lz.concat([lz.where(stop, start, p), lz.cast(stop, p.dtype)], axis=1)

    return body


def couple(r: lz.LazyTensor, k: int, ctx: Context) -> lz.LazyTensor:
    """(B, k) class probabilities from the (B, n_pairs) pairwise ones, as libsvm couples them."""
    q = _q_matrix(r, k, ctx)
    start = np.append(np.full(k, 1.0 / k), 0.0).astype(ctx.dtype)  # p = 1/k, not stopped
    carry = lz.broadcast_to(ctx.const(start), (lz.B, k + 1))
    out = lz.fori_loop(max(100, k), _sweep(k, 0.005 / k), carry, q, stop_column=k)
    return out[:, :k]


def predict_proba(decision: lz.LazyTensor, est: Any, ctx: Context) -> lz.LazyTensor:
    """``est.predict_proba`` from libsvm's (B, n_pairs) one-vs-one decision values."""
    k = len(est.classes_)
    return couple(pairwise_probabilities(decision, est, ctx), k, ctx)
