"""COUPLE: libsvm's ``multiclass_probability``, class probabilities from pairwise ones.

``lz.couple(r, classes=k)`` reads, per row, the ``k(k-1)/2`` pairwise probabilities ``r_ij``
(i < j, in the order (0,1), (0,2), ..., (1,2), ...; ``r_ji = 1 - r_ij``) and returns the ``k``
class probabilities libsvm's ``svm_predict_probability`` does (Wu, Lin & Weng 2004, method 2):
``Q_tt = Σ_{j≠t} r_jt²``, ``Q_tj = -r_jt r_tj``; ``p = 1/k``; at most ``max(100, k)`` sweeps,
each starting with the stopping test ``max_t |(Qp)_t - p'Qp| < 0.005 / k`` (Qp and p'Qp
recomputed from scratch), then updating ``p_t`` for t = 0, 1, ... as libsvm does. Rows are
independent: a row that met the test keeps its ``p``.

Two forms of one meaning, as for a forest's leaf sum:

- :func:`couple_loop`, the sweeps as a LOOP of general ops whose ``stop_column`` ends it once
  every row has stopped. It is what device backends run (through ``lz.variant``), the
  interpreter's reference for the COUPLE op (:func:`loop_graph`), and the numpy backend's
  lowering where numba is missing.
- :func:`native`, the numba kernel the numpy backend runs for COUPLE, a host-only op: row by
  row, libsvm's loops as written (sums in its order), in one call, where the LOOP costs tens of
  numpy calls a sweep.

Sums over classes in the LOOP may round differently from libsvm's sequential ones; in float32 a
row whose stopping test lands within rounding of the tolerance may then stop one sweep apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import native as _native
from .errors import BackendError
from .graph import Graph
from .loop import fori_loop
from .ops import Op
from .program import Builder
from .shapes import B
from .tensor import LazyTensor, _make, broadcast_to, concat, const, reshape, take, where
from .tensor import sum as lz_sum

#: The floor of libsvm's stopping tolerance is ``0.005 / k``; its sweep limit ``max(100, k)``.
TOLERANCE = 0.005
MIN_SWEEPS = 100


def pair_count(classes: int) -> int:
    """How many pairwise probabilities a row of ``classes`` classes has."""
    return classes * (classes - 1) // 2


def max_sweeps(classes: int) -> int:
    return max(MIN_SWEEPS, classes)


def tolerance(classes: int) -> float:
    return TOLERANCE / classes


def couple(r: LazyTensor, *, classes: int) -> LazyTensor:
    """(B, ``classes``): libsvm's class probabilities from each row's pairwise ones, as one
    host-only op (:data:`lazy.HOST_ONLY`). A graph for devices holds it as the host formulation
    of ``lz.variant(couple_loop(r, classes=k), couple(r, classes=k))``."""
    return _make(Op.COUPLE, [r], classes=int(classes))


def _pair_columns(classes: int) -> dict[tuple[int, int], int]:
    pairs = [(i, j) for i in range(classes) for j in range(i + 1, classes)]
    return {pair: p for p, pair in enumerate(pairs)}


def _q_matrix(r: LazyTensor, k: int) -> LazyTensor:
    """libsvm's (B, k, k) ``Q``: ``Q_tt = Σ_{j≠t} r_jt²`` (j ascending), ``Q_tj = -r_jt r_tj``."""
    index = _pair_columns(k)
    n = len(index)
    both = concat([r, 1.0 - r], axis=1)  # r_ij at column p, r_ji at column n + p

    def column(j: int, t: int) -> int:  # where r_jt lives in ``both``
        return index[(j, t)] if j < t else n + index[(t, j)]

    terms = [column(j, t) for t in range(k) for j in range(k) if j != t]
    picked = reshape(take(both, const(np.asarray(terms, np.int32)), axis=1), (B, k, k - 1))
    diagonal = lz_sum(picked * picked, axis=2)  # (B, k)
    off = -(r * (1.0 - r))  # Q_ij = Q_ji = -r_ji r_ij
    cells = [n + t if t == j else index[(min(t, j), max(t, j))] for t in range(k) for j in range(k)]
    q = take(concat([off, diagonal], axis=1), const(np.asarray(cells, np.int32)), axis=1)
    return reshape(q, (B, k, k))


def _sweep(k: int, eps: float) -> Callable[..., LazyTensor]:
    """The LOOP body: one of libsvm's iterations, the stopping test and then the updates."""

    def body(i: LazyTensor, carry: LazyTensor, q: LazyTensor) -> LazyTensor:
        start = carry[:, :k]
        qp = lz_sum(q * reshape(start, (B, 1, k)), axis=2)  # (B, k)
        pqp = lz_sum(start * qp, axis=1, keepdims=True)  # (B, 1)
        error = abs(qp[:, :1] - pqp)
        for c in range(1, k):  # libsvm's running max (a NaN never raises it)
            e = abs(qp[:, c : c + 1] - pqp)
            error = where(e > error, e, error)
        stop = error < eps
        p = start
        for t in range(k):
            qp_t, q_row = qp[:, t : t + 1], q[:, t, :]
            q_tt = q_row[:, t : t + 1]
            diff = (-qp_t + pqp) / q_tt
            p = p + diff * const(np.eye(k, dtype=p.dtype)[t])  # p[t] += diff
            pqp = (pqp + diff * (diff * q_tt + 2.0 * qp_t)) / (1.0 + diff) / (1.0 + diff)
            qp = (qp + diff * q_row) / (1.0 + diff)
            p = p / (1.0 + diff)
        return concat([where(stop, start, p), stop.astype(p.dtype)], axis=1)

    return body


def couple_loop(r: LazyTensor, *, classes: int) -> LazyTensor:
    """:func:`couple` as a LOOP of general ops: its carry is ``p`` and a "stopped" column, so a
    row that met the stopping test keeps its ``p`` (libsvm's early exit, row by row), and a
    backend may end the loop once every row of a call has stopped (binary problems: after a
    few sweeps)."""
    k = int(classes)
    couple(r, classes=k)  # the op's own checks, with its messages
    start = np.append(np.full(k, 1.0 / k), 0.0).astype(r.dtype)  # p = 1/k, not stopped
    carry = broadcast_to(const(start), (B, k + 1))
    out = fori_loop(max_sweeps(k), _sweep(k, tolerance(k)), carry, _q_matrix(r, k), stop_column=k)
    return out[:, :k]


@functools.cache
def loop_graph(classes: int, dtype: str) -> Graph:
    """:func:`couple_loop` of one (B, n_pairs) input ``r`` in ``dtype``, as the graph ``p``."""
    b = Builder()
    r = b.input("r", (pair_count(classes),), dtype)
    return b.graph({"p": couple_loop(r, classes=classes)})


def native(classes: int) -> Callable[[np.ndarray], np.ndarray]:
    """COUPLE by the compiled kernel (needs :data:`lazy.native.AVAILABLE`): a function of
    ``r`` (B, n_pairs) returning (B, k) in its dtype."""
    kernel = _kernel()
    # The kernel's constants in each float dtype, made once (even a small array costs time to make).
    constants = {
        np.dtype(d): np.array([1.0, 2.0, tolerance(classes), 1.0 / classes], d)
        for d in ("float32", "float64")
    }

    def couple(r: np.ndarray) -> np.ndarray:
        if r.ndim != 2 or r.shape[1] != pair_count(classes):  # the kernel reads what this says
            raise BackendError(f"COUPLE of {classes} classes needs (B, {pair_count(classes)}) rows")
        out = np.empty((r.shape[0], classes), r.dtype)
        work = np.empty((2 * classes + 1, classes), r.dtype)  # R, Q and Qp of one row
        kernel(r, classes, max_sweeps(classes), constants[r.dtype], work, out)
        return out

    return couple


@functools.cache
def _kernel() -> Callable[..., None]:
    # libsvm's multiclass_probability for each row, in its order of operations. Constants come
    # in an array of the values' dtype so that float32 arithmetic stays float32 (a Python float
    # literal would widen it to float64).
    def couple(r, k, sweeps, constants, work, out):  # type: ignore[no-untyped-def]
        one, two, eps, start = constants[0], constants[1], constants[2], constants[3]
        zero = one - one
        big_r, q, qp = work[:k], work[k : 2 * k], work[2 * k]
        for b in range(r.shape[0]):
            pair = 0
            for i in range(k):
                for j in range(i + 1, k):
                    big_r[i, j] = r[b, pair]
                    big_r[j, i] = one - r[b, pair]
                    pair += 1
            p = out[b]
            for t in range(k):
                p[t] = start
                q[t, t] = zero
                for j in range(t):
                    q[t, t] += big_r[j, t] * big_r[j, t]
                    q[t, j] = q[j, t]
                for j in range(t + 1, k):
                    q[t, t] += big_r[j, t] * big_r[j, t]
                    q[t, j] = -big_r[j, t] * big_r[t, j]
            for _ in range(sweeps):
                pqp = zero
                for t in range(k):
                    acc = zero
                    for j in range(k):
                        acc += q[t, j] * p[j]
                    qp[t] = acc
                    pqp += p[t] * acc
                error = abs(qp[0] - pqp)
                for t in range(1, k):
                    e = abs(qp[t] - pqp)
                    if e > error:
                        error = e
                if error < eps:
                    break
                for t in range(k):
                    diff = (-qp[t] + pqp) / q[t, t]
                    p[t] += diff
                    pqp = (
                        (pqp + diff * (diff * q[t, t] + two * qp[t])) / (one + diff) / (one + diff)
                    )
                    for j in range(k):
                        qp[j] = (qp[j] + diff * q[t, j]) / (one + diff)
                        p[j] /= one + diff

    return _native.compile_kernel(couple)
