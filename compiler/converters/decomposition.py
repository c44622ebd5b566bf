"""Matrix decompositions and projections: PCA family, FastICA, KernelPCA, PLS.

The linear ones are affine maps: centring, projection and whitening are folded on the host
(float64) into one ``x @ W + b``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.cross_decomposition import PLSRegression
from sklearn.decomposition import PCA, FastICA, IncrementalPCA, KernelPCA, TruncatedSVD

import lazy as lz

from ..blocks import affine
from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..precision import TOLERANCE, Precision
from ..registry import register
from ._kernels import kernel, kernel_bound


def _projection(x: lz.LazyTensor, components: Any, mean: Any, scale: Any, ctx: Context):
    """``((x - mean) @ components.T) / scale`` as one affine map."""
    components = np.asarray(components, np.float64)
    scale = np.ones(len(components)) if scale is None else np.asarray(scale, np.float64)
    coef = components / scale[:, None]
    intercept = 0.0 if mean is None else -(np.asarray(mean, np.float64) @ coef.T)
    return affine(x, coef, intercept, ctx)


@register(PCA, IncrementalPCA, methods=("transform",), limits="whiten")
def pca(est: Any, features: Features, ctx: Context) -> Heads:
    scale = None
    if est.whiten:
        # as _BasePCA: tiny variances are clipped to eps so whitening stays finite
        scale = np.sqrt(np.asarray(est.explained_variance_, np.float64))
        scale[scale < np.finfo(scale.dtype).eps] = np.finfo(scale.dtype).eps
    return Heads(
        {"transform": _projection(features.values, est.components_, est.mean_, scale, ctx)}
    )


@register(TruncatedSVD, methods=("transform",))
def truncated_svd(est: Any, features: Features, ctx: Context) -> Heads:
    return Heads({"transform": _projection(features.values, est.components_, None, None, ctx)})


@register(FastICA, methods=("transform",), limits="every whiten option")
def fast_ica(est: Any, features: Features, ctx: Context) -> Heads:
    mean = est.mean_ if est.whiten else None
    return Heads({"transform": _projection(features.values, est.components_, mean, None, ctx)})


#: float32 is kept where the estimated float32 error is at most this share of the tolerance (the
#: estimate is rough, so the margin is wide).
_KERNEL_PCA_FLOAT32_SHARE = 0.05


def _kernel_pca_amplifies(est: Any) -> bool:
    """Whether float32 rounding of the kernel row, amplified by the smallest kept eigenvalue,
    may reach the tolerance: component j is ``k_centred @ v_j / sqrt(lambda_j)``, whose error is
    about ``eps * |k| * sqrt(n) / sqrt(lambda_j)``, while the outputs are about
    ``sqrt(lambda_max)`` (a saturated sigmoid kernel leaves its information in tiny eigenvalues)."""
    if callable(est.kernel) or est.kernel == "precomputed":
        return False  # refused by the converter
    eigenvalues = np.asarray(est.eigenvalues_, np.float64)
    kept = eigenvalues[eigenvalues > 0]
    if not kept.size:
        return False
    points = np.asarray(est.X_fit_, np.float64)
    bound = kernel_bound(est.kernel, points, float(est.gamma_), est.degree, est.coef0)
    error = np.finfo(np.float32).eps * bound * np.sqrt(len(points)) / np.sqrt(kept.min())
    tolerance = TOLERANCE * max(1.0, float(np.sqrt(kept.max())))
    return bool(error > _KERNEL_PCA_FLOAT32_SHARE * tolerance)


@register(
    KernelPCA,
    methods=("transform",),
    limits="kernels linear, poly, rbf, sigmoid, cosine (not precomputed or callable)",
    precision=Precision(
        "its components divide the centred kernel row by the square roots of the eigenvalues, "
        "which multiplies the kernel's float32 rounding where one is small",
        when="where a kept eigenvalue is small against the kernel's size (a saturated sigmoid "
        "kernel, many components)",
        applies=_kernel_pca_amplifies,
    ),
)
def kernel_pca(est: Any, features: Features, ctx: Context) -> Heads:
    if callable(est.kernel) or est.kernel == "precomputed":
        raise UnsupportedError(
            f"{ctx.path}: KernelPCA(kernel={est.kernel!r}) is not supported; supported: linear, "
            "poly, rbf, sigmoid, cosine"
        )
    k = kernel(
        est.kernel, features.values, est.X_fit_, ctx, float(est.gamma_), est.degree, est.coef0
    )
    # KernelCenterer.transform: remove the training column means, the row mean, add the total
    centerer = est._centerer
    n = len(centerer.K_fit_rows_)
    k = (
        k
        - ctx.param(centerer.K_fit_rows_, "K_fit_rows_")
        - lz.sum(k, axis=1, keepdims=True) / float(n)
        + float(centerer.K_fit_all_)
    )
    eigenvalues = np.asarray(est.eigenvalues_, np.float64)
    alphas = np.zeros_like(est.eigenvectors_, dtype=np.float64)
    nonzero = np.flatnonzero(eigenvalues)
    alphas[:, nonzero] = est.eigenvectors_[:, nonzero] / np.sqrt(eigenvalues[nonzero])
    return Heads({"transform": k @ ctx.param(alphas, "scaled_alphas")})


@register(PLSRegression, methods=("predict", "transform"))
def pls_regression(est: Any, features: Features, ctx: Context) -> Heads:
    x = features.values
    predict = affine(x - ctx.param(est._x_mean, "x_mean"), est.coef_, est.intercept_, ctx)
    if est._predict_1d:
        predict = lz.reshape(predict, (lz.B,))
    # (x - x_mean) / x_std @ x_rotations_: the scaling folds into the rotation
    coef = np.asarray(est.x_rotations_, np.float64).T / np.asarray(est._x_std, np.float64)
    transform = affine(x, coef, -(coef @ np.asarray(est._x_mean, np.float64)), ctx)
    return Heads({"predict": predict, "transform": transform})
