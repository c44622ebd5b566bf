"""Gaussian mixtures (plain and variational): per-component weighted log densities, then
``predict`` (first argmax), ``predict_proba`` (softmax) and ``score_samples`` (logsumexp)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import digamma
from sklearn.mixture import BayesianGaussianMixture, GaussianMixture
from sklearn.mixture._gaussian_mixture import _compute_log_det_cholesky

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..precision import Precision
from ..registry import register, unsupported_param
from ._kernels import differences


def _mahalanobis(est: Any, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """(B, K) squared distances ``|(x - mu_k) @ L_k|²``, L the precision Cholesky factors.

    Differences come first: sklearn's expanded diag / spherical forms cancel badly in float32.
    In float64 they are harmless and are scikit-learn's own arithmetic, whose products read the
    (B, F) rows once instead of K broadcast copies that recompute the steps before them.
    """
    if ctx.dtype == "float64":
        return _expanded_mahalanobis(est, x, ctx)
    kind = est.covariance_type
    chol = np.asarray(est.precisions_cholesky_, np.float64)
    k, f = np.asarray(est.means_).shape
    d = differences(x, ctx.param(est.means_, "means_"))  # (B, K, F)
    if kind == "full":  # L_k (K, F, F): one row-vector product per component
        y = lz.reshape(
            lz.reshape(d, (lz.B, k, 1, f)) @ ctx.param(chol, "precisions_cholesky_"), (lz.B, k, f)
        )
    elif kind == "tied":  # L (F, F)
        y = d @ ctx.param(chol, "precisions_cholesky_")
    elif kind == "diag":  # (K, F)
        y = d * ctx.param(chol, "precisions_cholesky_")
    elif kind == "spherical":  # (K,)
        y = d * ctx.param(chol[:, None], "precisions_cholesky_")
    else:
        raise unsupported_param(est, "covariance_type", kind, "full, tied, diag, spherical")
    return lz.sum(y * y, axis=2)


def _expanded_mahalanobis(est: Any, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """:func:`_mahalanobis` as ``sklearn.mixture._gaussian_mixture._estimate_log_gaussian_prob``
    computes it (for float64 graphs)."""
    kind = est.covariance_type
    chol = np.asarray(est.precisions_cholesky_, np.float64)
    means = np.asarray(est.means_, np.float64)
    k, f = means.shape
    if kind == "full":  # y_k = x @ L_k - mu_k @ L_k, every component in one product
        weights = chol.transpose(1, 0, 2).reshape(f, k * f)
        shift = np.einsum("kf,kfg->kg", means, chol).reshape(k * f)
        y = x @ ctx.param(weights, "precisions_cholesky_") - ctx.param(shift, "means_cholesky")
        y = lz.reshape(y, (lz.B, k, f))
    elif kind == "tied":
        y = lz.expand_dims(x @ ctx.param(chol, "precisions_cholesky_"), 1) - ctx.param(
            means @ chol, "means_cholesky"
        )
    elif kind == "diag":
        precisions = chol**2
        return (
            ctx.param(np.sum(means**2 * precisions, axis=1), "means_norm")
            - x @ ctx.param(2.0 * (means * precisions).T, "means_precisions")
            + (x * x) @ ctx.param(precisions.T, "precisions")
        )
    elif kind == "spherical":
        precisions = chol**2
        return (
            ctx.param(np.sum(means**2, axis=1) * precisions, "means_norm")
            - x @ ctx.param(2.0 * means.T * precisions, "means_precisions")
            + lz.sum(x * x, axis=1, keepdims=True) * ctx.param(precisions, "precisions")
        )
    else:
        raise unsupported_param(est, "covariance_type", kind, "full, tied, diag, spherical")
    return lz.sum(y * y, axis=2)


def _log_gaussian_offset(est: Any) -> np.ndarray:
    """The per-component constant of ``_estimate_log_gaussian_prob``: -F/2 log 2π + log det L."""
    f = np.asarray(est.means_).shape[1]
    log_det = _compute_log_det_cholesky(est.precisions_cholesky_, est.covariance_type, f)
    return -0.5 * f * math.log(2 * math.pi) + np.asarray(log_det, np.float64)


def _bayesian_offset(est: Any) -> np.ndarray:
    """The constant ``BayesianGaussianMixture._estimate_log_prob`` adds to the Gaussian term."""
    f = np.asarray(est.means_).shape[1]
    dof = np.asarray(est.degrees_of_freedom_, np.float64)
    log_lambda = f * np.log(2.0) + np.sum(digamma(0.5 * (dof - np.arange(f)[:, None])), 0)
    return -0.5 * f * np.log(dof) + 0.5 * (log_lambda - f / np.asarray(est.mean_precision_))


def _heads(est: Any, features: Features, ctx: Context, offset: np.ndarray) -> Heads:
    weighted = _mahalanobis(est, features.values, ctx) * -0.5 + ctx.param(offset, "log_offset")
    return Heads(
        {
            "predict": lz.argmax(weighted, axis=1),
            "predict_proba": lz.softmax(weighted, axis=1),
            "score_samples": lz.logsumexp(weighted, axis=1),
        }
    )


_LIMITS = "covariance types full, tied, diag, spherical"
#: A log density multiplies its input's rounding by the precision factors (large along the
#: components' narrow directions): the features feeding it are float64 too.
_PRECISION = Precision(
    "its log densities scale the rounding of their features by the precision matrices' "
    "factors, large along a component's narrow directions"
)


@register(
    GaussianMixture,
    methods=("predict", "predict_proba", "score_samples"),
    limits=_LIMITS,
    precision=_PRECISION,
)
def gaussian_mixture(est: Any, features: Features, ctx: Context) -> Heads:
    offset = _log_gaussian_offset(est) + np.log(np.asarray(est.weights_, np.float64))
    return _heads(est, features, ctx, offset)


@register(
    BayesianGaussianMixture,
    methods=("predict", "predict_proba", "score_samples"),
    limits=_LIMITS + "; both weight concentration priors",
    precision=_PRECISION,
)
def bayesian_gaussian_mixture(est: Any, features: Features, ctx: Context) -> Heads:
    log_weights = np.asarray(est._estimate_log_weights(), np.float64)  # fitted values only
    offset = _log_gaussian_offset(est) + _bayesian_offset(est) + log_weights
    return _heads(est, features, ctx, offset)
