"""k-nearest neighbours, brute force on the device against the training set (a parameter).

Distances are (B, n_train) computed from per-feature differences (exact zeros for training
points, which distance weighting depends on). The k nearest are taken by k rounds of "first
minimum, then mask it out", so equal distances are taken in training-set order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestCentroid

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..registry import register, unsupported_param

_METRICS = (
    "euclidean / l2, manhattan / cityblock / l1, chebyshev / infinity, minkowski (any p), "
    "seuclidean (metric_params V), mahalanobis (metric_params VI or V)"
)
_LIMITS = (
    f"metrics {_METRICS}; weights 'uniform' / 'distance'; brute force, (B, n_train, n_features) "
    "work per batch. Neighbours at exactly equal distances are taken in training order, as "
    "scikit-learn's brute force does for one neighbour; of a tie across the k-th place its trees, "
    "heaps (by thread layout) and np.argpartition (mahalanobis, float32 rows) may keep others"
)


def _reduced_distance(est: Any, x: lz.LazyTensor, ctx: Context) -> tuple[lz.LazyTensor, Any]:
    """A monotone transform of the distance (B, n_train), and the map back to the distance."""
    metric = est.effective_metric_
    params = dict(est.effective_metric_params_ or {})
    p = params.pop("p", None)
    if params.get("w", "absent") is None:
        params.pop("w")  # minkowski's default: unweighted
    weighting = _metric_matrix(est, metric, params)  # seuclidean / mahalanobis
    if not isinstance(metric, str) or params:
        raise unsupported_param(est, "metric", est.metric, f"{_METRICS}, without other params")
    diff = lz.expand_dims(x, 1) - ctx.param(est._fit_X, "_fit_X")  # (B, n_train, F)
    if metric == "seuclidean":  # DistanceMetric's SEuclidean: sum(d**2 / V), then its sqrt
        return lz.sum(diff * diff / ctx.param(weighting, "V"), axis=2), lz.sqrt
    if metric == "mahalanobis":  # d' VI d as DistanceMetric sums it: sum_i (VI d)_i d_i
        vi_d = diff @ ctx.param(weighting.T, "VI_T")  # (B, n_train, F)
        return lz.sum(vi_d * diff, axis=2), lz.sqrt
    if metric == "minkowski" and p in (1, 2, math.inf):
        metric = {1: "manhattan", 2: "euclidean", math.inf: "chebyshev"}[p]
    if metric in ("euclidean", "l2"):
        return lz.sum(diff * diff, axis=2), lz.sqrt
    if metric in ("manhattan", "cityblock", "l1"):
        return lz.sum(abs(diff), axis=2), lambda d: d
    if metric in ("chebyshev", "infinity"):
        return lz.max(abs(diff), axis=2), lambda d: d
    if metric == "minkowski" and p is not None and p > 0:
        return lz.sum(abs(diff) ** float(p), axis=2), lambda d: d ** (1.0 / float(p))
    raise unsupported_param(est, "metric", metric, _METRICS)


def _metric_matrix(est: Any, metric: Any, params: dict[str, Any]) -> Any:
    """seuclidean's variances V / mahalanobis' VI, taken out of ``params`` (float64, checked
    against the training width); None for other metrics. Without them scipy estimates them from
    each call's rows, which no compiled model can match: refused."""
    if metric not in ("seuclidean", "mahalanobis"):
        return None
    width = int(est._fit_X.shape[1])
    if metric == "seuclidean":
        if "V" not in params:
            raise unsupported_param(est, "metric", metric, "seuclidean with metric_params V")
        v = np.asarray(params.pop("V"), dtype=np.float64)
        if v.shape != (width,):
            raise UnsupportedError(f"seuclidean V has shape {v.shape}, expected ({width},)")
        return v
    if "VI" in params:
        vi = np.asarray(params.pop("VI"), dtype=np.float64)
        params.pop("V", None)  # DistanceMetric ignores V when VI is given
    elif "V" in params:
        vi = np.linalg.inv(np.asarray(params.pop("V"), dtype=np.float64))  # as DistanceMetric
    else:
        raise unsupported_param(est, "metric", metric, "mahalanobis with metric_params VI or V")
    if vi.shape != (width, width):
        raise UnsupportedError(f"mahalanobis VI has shape {vi.shape}, expected {(width, width)}")
    return vi


def nearest(est: Any, x: lz.LazyTensor, ctx: Context) -> list[tuple[lz.LazyTensor, lz.LazyTensor]]:
    """The k nearest training rows, nearest first: [(index (B,) int32, distance (B,))]."""
    k, n = int(est.n_neighbors), int(est.n_samples_fit_)
    if k > n:
        raise UnsupportedError(
            f"{type(est).__name__}(n_neighbors={k}) exceeds its {n} training samples"
        )
    if est.weights not in ("uniform", "distance"):
        raise unsupported_param(est, "weights", est.weights, "'uniform', 'distance'")
    reduced, to_distance = _reduced_distance(est, x, ctx)
    position = ctx.param(np.arange(n, dtype=np.int32), "train_index", dtype="int32")
    out = []
    for _ in range(k):
        index = lz.argmax(-reduced, axis=1)  # the first (lowest-index) minimum
        out.append((index, to_distance(lz.min(reduced, axis=1))))
        taken = lz.expand_dims(index, 1) == position
        reduced = lz.where(taken, math.inf, reduced)
    return out


def _weights(est: Any, neighbours: list[tuple[lz.LazyTensor, lz.LazyTensor]]) -> list[Any]:
    """``neighbors._base._get_weights``: 1/d, or 1 for exact matches when a row has any."""
    if est.weights == "uniform":
        return [None] * len(neighbours)
    exact = neighbours[0][1] == 0.0  # the nearest is at distance 0
    return [lz.where(exact, lz.cast(d == 0.0, d.dtype), 1.0 / d) for _, d in neighbours]


def _weighted_sum(table: lz.LazyTensor, neighbours: list, weights: list) -> lz.LazyTensor:
    total = None
    for (index, _), w in zip(neighbours, weights, strict=True):
        rows = lz.take(table, index, axis=0)  # (B, m)
        term = rows if w is None else rows * lz.expand_dims(w, 1)
        total = term if total is None else total + term
    return total


@register(KNeighborsClassifier, methods=("predict", "predict_proba"), limits=_LIMITS)
def k_neighbors_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    if est.outputs_2d_:
        raise UnsupportedError("KNeighborsClassifier with multi-output targets is not supported")
    neighbours = nearest(est, features.values, ctx)
    onehot = np.eye(len(est.classes_))[np.asarray(est._y)]
    votes = _weighted_sum(ctx.param(onehot, "y_onehot"), neighbours, _weights(est, neighbours))
    proba = votes / lz.sum(votes, axis=1, keepdims=True)
    return Heads(
        {"predict": lz.argmax(votes, axis=1), "predict_proba": proba}, classes=est.classes_
    )


@register(KNeighborsRegressor, methods=("predict",), limits=_LIMITS)
def k_neighbors_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    neighbours = nearest(est, features.values, ctx)
    y = np.asarray(est._y, dtype=np.float64)
    table = ctx.param(y.reshape(len(y), -1), "_y")
    weights = _weights(est, neighbours)
    total = _weighted_sum(table, neighbours, weights)
    if weights[0] is None:
        pred = total / float(len(neighbours))
    else:
        denom = weights[0]
        for w in weights[1:]:
            denom = denom + w
        pred = total / lz.expand_dims(denom, 1)
    return Heads({"predict": lz.reshape(pred, (lz.B,)) if y.ndim == 1 else pred})


def _centroid_distance(x: lz.LazyTensor, centroids: np.ndarray, metric: str, ctx: Context):
    """(B, n_classes) euclidean or manhattan distance to each centroid, from differences."""
    diff = lz.expand_dims(x, 1) - ctx.param(centroids, "centroids")
    if metric == "euclidean":
        return lz.sqrt(lz.sum(diff * diff, axis=2))
    return lz.sum(abs(diff), axis=2)


@register(
    NearestCentroid,
    methods=("predict", "predict_proba", "decision_function"),
    limits="metrics 'euclidean' / 'manhattan'; priors uniform, empirical or given",
)
def nearest_centroid(est: Any, features: Features, ctx: Context) -> Heads:
    if est.metric not in ("euclidean", "manhattan"):
        raise unsupported_param(est, "metric", est.metric, "'euclidean', 'manhattan'")
    x, centroids = features.values, np.asarray(est.centroids_, dtype=np.float64)
    # the discriminant of ESL eq. 18.2: distances after dividing by the within-class std
    scale = np.asarray(est.within_class_std_dev_, dtype=np.float64)
    scale = np.where(scale != 0, scale, 1.0)
    distance = _centroid_distance(
        x / ctx.param(scale, "within_class_std_dev_"), centroids / scale, est.metric, ctx
    )
    with np.errstate(divide="ignore"):
        log_prior = 2.0 * np.log(np.asarray(est.class_prior_, dtype=np.float64))
    scores = ctx.param(log_prior, "log_prior") - distance * distance
    if np.isclose(est.class_prior_, 1 / len(est.classes_)).all():
        # scikit-learn then predicts the nearest raw centroid (first minimum)
        predict = lz.argmax(-_centroid_distance(x, centroids, est.metric, ctx), axis=1)
    else:
        predict = lz.argmax(scores, axis=1)
    decision = scores[:, 1] - scores[:, 0] if len(est.classes_) == 2 else scores
    heads = {
        "predict": predict,
        "decision_function": decision,
        "predict_proba": lz.softmax(scores, axis=1),
    }
    return Heads(heads, classes=est.classes_)
