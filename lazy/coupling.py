"""COUPLE: libsvm's ``multiclass_probability``, class probabilities from pairwise ones.

``lz.couple(r, classes=k)`` reads, per row, the ``k(k-1)/2`` pairwise probabilities ``r_ij``
(i < j, in the order (0,1), (0,2), ..., (1,2), ...; ``r_ji = 1 - r_ij``) and returns the ``k``
class probabilities libsvm's ``svm_predict_probability`` does (Wu, Lin & Weng 2004, method 2):
``Q_tt = Σ_{j≠t} r_jt²``, ``Q_tj = -r_jt r_tj``; ``p = 1/k``; at most ``max(100, k)`` sweeps,
each starting with the stopping test ``max_t |(Qp)_t - p'Qp| < 0.005 / k`` (Qp and p'Qp
recomputed from scratch), then updating ``p_t`` for t = 0, 1, ... as libsvm does. Rows are
independent: a row that met the test keeps its ``p``.

Three forms of one meaning:

- :func:`q_matrix` and :func:`sweep` are the vectorized steps in plain array arithmetic, shared
  by every array library (numpy, jax.numpy, torch): :func:`solve` loops them with an early exit
  once every row has stopped (the interpreter, the torch backend, the numpy backend without
  numba); the JAX backend runs the same sweep in a ``while_loop``.
- :func:`native` is the numba kernel the numpy backend runs: row by row, libsvm's loops as
  written (sums in its order), in one cheap call, where the vectorized sweeps cost tens of numpy
  calls each.

Vectorized sums over classes may round differently from libsvm's sequential ones; in float32 a
row whose stopping test lands within rounding of the tolerance may then stop one sweep apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from . import native as _native
from .errors import BackendError

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


@dataclass(frozen=True)
class Tables:
    """Constant (k, k) index tables that lay the pairwise columns out as libsvm's matrices.

    ``column[j, t]`` is the column of ``r`` holding pair (min, max) of (j, t); ``direct[j, t]``
    whether ``r_jt`` is that column (j < t) or one minus it; ``eye`` the identity (bool) and
    ``unit`` its rows in the values' dtype (adding ``d * unit[t]`` adds ``d`` to column t)."""

    column: np.ndarray
    direct: np.ndarray
    eye: np.ndarray
    unit: np.ndarray

    def converted(self, convert: Callable[[np.ndarray], Any]) -> Tables:
        """The same tables as another array library's arrays."""
        return Tables(*(convert(getattr(self, f.name)) for f in fields(self)))


@functools.cache
def _tables(classes: int, dtype: str) -> Tables:
    column = np.zeros((classes, classes), np.int32)
    p = 0
    for i in range(classes):
        for j in range(i + 1, classes):
            column[i, j] = column[j, i] = p
            p += 1
    direct = np.triu(np.ones((classes, classes), bool), 1)
    eye = np.eye(classes, dtype=bool)
    return Tables(column, direct, eye, np.eye(classes, dtype=dtype))


def tables(classes: int, dtype: Any) -> Tables:
    """The index tables of ``classes`` classes, ``unit`` in ``dtype`` (cached; read-only)."""
    return _tables(classes, np.dtype(dtype).name)


Where = Callable[[Any, Any, Any], Any]


def q_matrix(r: Any, t: Tables, where: Where) -> Any:
    """(B, k, k) ``Q`` from (B, n_pairs) ``r``, in ``r``'s array library (``where`` its select,
    the tables converted to it)."""
    picked = r[:, t.column]  # (B, j, t): the column of pair {j, t}
    rjt = where(t.direct, picked, 1.0 - picked)  # r_jt (the diagonal is unused)
    squares = where(t.eye, 0.0, rjt * rjt)
    diagonal = squares.sum(1)  # Q_tt = Σ_{j≠t} r_jt², by t
    return where(t.eye, diagonal[:, None, :], -(rjt.swapaxes(1, 2) * rjt))


def sweep(p: Any, stopped: Any, q: Any, t: Tables, eps: float, where: Where) -> tuple[Any, Any]:
    """One of libsvm's iterations on every row: the stopping test, then the coordinate updates.

    ``p`` (B, k); ``stopped`` (B, 1) bool. Returns the next ``(p, stopped)``: rows that had
    stopped or stop now keep their ``p``."""
    qp = (q * p[:, None, :]).sum(-1)  # (B, k)
    pqp = (p * qp).sum(-1)[:, None]  # (B, 1)
    error = abs(qp[:, :1] - pqp)
    for c in range(1, p.shape[1]):  # libsvm's running max (a NaN never raises it)
        e = abs(qp[:, c : c + 1] - pqp)
        error = where(e > error, e, error)
    stop = stopped | (error < eps)
    start = p
    for c in range(p.shape[1]):
        qp_c, q_row = qp[:, c : c + 1], q[:, c, :]
        q_cc = q_row[:, c : c + 1]
        diff = (-qp_c + pqp) / q_cc
        p = p + diff * t.unit[c]
        pqp = (pqp + diff * (diff * q_cc + 2.0 * qp_c)) / (1.0 + diff) / (1.0 + diff)
        qp = (qp + diff * q_row) / (1.0 + diff)
        p = p / (1.0 + diff)
    return where(stop, start, p), stop


def solve(r: Any, classes: int, where: Where, convert: Callable[[np.ndarray], Any]) -> Any:
    """COUPLE of ``r`` (B, n_pairs) by the vectorized sweeps in ``r``'s array library (``where``
    its select, ``convert`` its array of a numpy one), sweeping until every row has stopped."""
    dtype = _numpy_dtype(r)
    t = tables(classes, dtype).converted(convert)
    q = q_matrix(r, t, where)
    p = convert(np.full((r.shape[0], classes), 1.0 / classes, dtype))
    stopped = convert(np.zeros((r.shape[0], 1), bool))
    for _ in range(max_sweeps(classes)):
        if bool(stopped.all()):
            break
        p, stopped = sweep(p, stopped, q, t, tolerance(classes), where)
    return p


def _numpy_dtype(r: Any) -> str:
    return str(r.dtype).removeprefix("torch.")


def reference(r: np.ndarray, classes: int) -> np.ndarray:
    """COUPLE in whole-array numpy: (B, k) in ``r``'s dtype."""
    return solve(r, classes, np.where, np.asarray)  # type: ignore[no-any-return]


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
