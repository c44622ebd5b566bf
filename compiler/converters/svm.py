"""Kernel support-vector machines (libsvm): SVC, NuSVC, SVR, NuSVR, OneClassSVM.

libsvm's decision for the class pair (i, j) sums the kernel against class i's support vectors
weighted by row j-1 of the dual coefficients, plus class j's weighted by row i, plus the intercept.
That is one (n_SV, n_pairs) weight matrix, so every decision is ``kernel(x, SV) @ W + b``.
``predict_proba`` (``probability=True``) couples those decisions as libsvm does (see
:mod:`._libsvm_proba`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.svm import SVC, SVR, NuSVC, NuSVR, OneClassSVM

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..registry import register, unsupported_param
from . import _libsvm_proba
from ._split_sum import bounded_matmul

_KERNELS = "'linear', 'poly', 'rbf', 'sigmoid'"


def kernel(est: Any, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """libsvm's kernel between the rows of ``x`` and the support vectors: (B, n_SV)."""
    if not isinstance(est.kernel, str) or est.kernel not in ("linear", "poly", "rbf", "sigmoid"):
        raise unsupported_param(est, "kernel", est.kernel, _KERNELS)
    sv = np.asarray(est.support_vectors_, dtype=np.float64)
    dot = x @ ctx.param(sv.T, "support_vectors_T")
    gamma = float(est._gamma)
    if est.kernel == "linear":
        return dot
    if est.kernel == "poly":
        base = dot * gamma + float(est.coef0)
        out = base
        for _ in range(int(est.degree) - 1):  # libsvm's powi: an integer power by products
            out = out * base
        return out if int(est.degree) >= 1 else base * 0.0 + 1.0
    if est.kernel == "sigmoid":
        return lz.tanh(dot * gamma + float(est.coef0))
    # rbf: |x - sv|^2 = |x|^2 - 2 x.sv + |sv|^2, clamped at 0 against cancellation
    sq = lz.sum(x * x, axis=1, keepdims=True) - 2.0 * dot + ctx.param((sv**2).sum(1), "sv_sq")
    return lz.exp(lz.maximum(sq, 0.0) * -gamma)


def weighted_kernel(
    est: Any, x: lz.LazyTensor, weights: np.ndarray, ctx: Context, name: str
) -> lz.LazyTensor:
    """``kernel(x, SV) @ weights``: (B, m) dual sums, accurate where their terms cancel.

    A linear kernel folds into one ``x @ (SV.T @ weights)`` on the host (float64, no sum over
    support vectors on the device at all); the bounded kernels (rbf, sigmoid: |K| <= 1) sum
    through :func:`._split_sum.bounded_matmul`; poly, unbounded, sums plainly.
    """
    weights = np.asarray(weights, np.float64)
    if est.kernel == "linear":
        sv = np.asarray(est.support_vectors_, dtype=np.float64)
        return x @ ctx.param(sv.T @ weights, name)
    k = kernel(est, x, ctx)
    if est.kernel in ("rbf", "sigmoid"):
        return bounded_matmul(k, weights, ctx, name)
    return k @ ctx.param(weights, name)


def _pair_weights(est: Any) -> np.ndarray:
    """(n_SV, n_pairs) weights of libsvm's one-vs-one decisions, in its (i < j) pair order."""
    coef = np.asarray(est._dual_coef_)
    start = np.concatenate([[0], np.cumsum(est._n_support)])
    n = len(start) - 1
    weights = np.zeros((coef.shape[1], n * (n - 1) // 2))
    p = 0
    for i in range(n):
        for j in range(i + 1, n):
            weights[start[i] : start[i + 1], p] = coef[j - 1, start[i] : start[i + 1]]
            weights[start[j] : start[j + 1], p] = coef[i, start[j] : start[j + 1]]
            p += 1
    return weights


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def _votes(raw: lz.LazyTensor, n: int, ctx: Context, *, strict: bool) -> lz.LazyTensor:
    """Vote counts (B, n): pair (i, j) votes i when its decision is > 0 (libsvm's predict;
    ``strict``) or >= 0 (scikit-learn's ovr decision), else j."""
    first = np.zeros((len(_pairs(n)), n))
    second = np.zeros_like(first)
    for p, (i, j) in enumerate(_pairs(n)):
        first[p, i] = 1.0
        second[p, j] = 1.0
    wins = lz.cast(raw > 0.0 if strict else raw >= 0.0, raw.dtype)
    return wins @ ctx.const(first - second) + ctx.const(second.sum(0))


def _dual(est: Any, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """(B,) ``kernel(x, SV) @ dual_coef + intercept`` of a one-output libsvm model."""
    coef = np.reshape(est._dual_coef_, (-1, 1))
    out = weighted_kernel(est, x, coef, ctx, "dual_coef_")
    out = out + ctx.param(np.ravel(est._intercept_), "intercept_")
    return lz.reshape(out, (lz.B,))


def _ovr(raw: lz.LazyTensor, votes: lz.LazyTensor, n: int, ctx: Context) -> lz.LazyTensor:
    """``sklearn.utils.multiclass._ovr_decision_function(raw < 0, -raw, n)``."""
    signs = np.zeros((len(_pairs(n)), n))
    for p, (i, j) in enumerate(_pairs(n)):
        signs[p, i] = 1.0  # sum_of_confidences[i] -= -raw
        signs[p, j] = -1.0
    confidence = raw @ ctx.const(signs)
    return votes + confidence / (3.0 * (abs(confidence) + 1.0))


def _fitted_with_probability(est: Any) -> bool:
    """Whether ``est.predict_proba`` works: fitted with probability=True (scikit-learn 1.9
    deprecates the parameter, whose default is then the string 'deprecated')."""
    return est.probability not in ("deprecated", False) and np.size(est._probA) > 0


@register(
    SVC,
    NuSVC,
    methods=("predict", "decision_function", "predict_proba"),
    limits=f"kernels {_KERNELS}; decision_function_shape 'ovr' / 'ovo'; break_ties; "
    "predict_proba with probability=True (libsvm's pairwise coupling, iterated row by row; "
    "in float32 a row whose stopping test falls within rounding of libsvm's tolerance can stop "
    "one iteration apart from libsvm)",
)
def svc(est: Any, features: Features, ctx: Context) -> Heads:
    n = len(est.classes_)
    if est.break_ties and est.decision_function_shape == "ovo":  # scikit-learn cannot predict
        raise unsupported_param(est, "break_ties", True, "False with decision_function_shape='ovo'")
    raw = weighted_kernel(est, features.values, _pair_weights(est), ctx, "pair_weights")
    raw = raw + ctx.param(np.asarray(est._intercept_), "intercept_")
    proba: dict[str, lz.LazyTensor] = {}
    if _fitted_with_probability(est):
        proba["predict_proba"] = _libsvm_proba.predict_proba(raw, est, ctx)
    if n == 2:
        raw = lz.reshape(raw, (lz.B,))
        # libsvm predicts class 0 when its decision is > 0; scikit-learn flips the sign
        return Heads(
            {"decision_function": -raw, "predict": lz.cast(raw <= 0.0, "int32"), **proba},
            classes=est.classes_,
        )
    ovr = _ovr(raw, _votes(raw, n, ctx, strict=False), n, ctx)
    decision = ovr if est.decision_function_shape == "ovr" else raw
    if est.break_ties and est.decision_function_shape == "ovr":
        predict = lz.argmax(ovr, axis=1)
    else:
        # libsvm: the first class with the most votes
        predict = lz.argmax(_votes(raw, n, ctx, strict=True), axis=1)
    return Heads({"decision_function": decision, "predict": predict, **proba}, classes=est.classes_)


@register(SVR, NuSVR, methods=("predict",), limits=f"kernels {_KERNELS}")
def svr(est: Any, features: Features, ctx: Context) -> Heads:
    return Heads({"predict": _dual(est, features.values, ctx)})


@register(
    OneClassSVM,
    methods=("predict", "decision_function", "score_samples"),
    limits=f"kernels {_KERNELS}",
)
def one_class_svm(est: Any, features: Features, ctx: Context) -> Heads:
    decision = _dual(est, features.values, ctx)
    score = decision + ctx.param(np.ravel(est.offset_), "offset_")[0]
    predict = lz.where(decision > 0.0, lz.const(np.int32(1)), lz.const(np.int32(-1)))
    return Heads({"decision_function": decision, "score_samples": score, "predict": predict})
