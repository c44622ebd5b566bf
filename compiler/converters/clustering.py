"""Centroid clustering: KMeans and MiniBatchKMeans (nearest center; distances to the centers),
MeanShift (nearest center)."""

from __future__ import annotations

from typing import Any

from sklearn.cluster import KMeans, MeanShift, MiniBatchKMeans

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..registry import register
from ._kernels import squared_distances


@register(
    KMeans,
    MiniBatchKMeans,
    methods=("predict", "transform"),
    limits="predict: the nearest center (the first on ties); transform: Euclidean distances",
)
def kmeans(est: Any, features: Features, ctx: Context) -> Heads:
    squared = squared_distances(
        features.values, ctx.param(est.cluster_centers_, "cluster_centers_")
    )
    return Heads({"predict": lz.argmax(-squared, axis=1), "transform": lz.sqrt(squared)})


@register(
    MeanShift,
    methods=("predict",),
    limits="predict: the nearest of cluster_centers_ (the first on ties), whatever cluster_all",
)
def mean_shift(est: Any, features: Features, ctx: Context) -> Heads:
    # scikit-learn: pairwise_distances_argmin(X, cluster_centers_); labels_ of the training rows
    # (cluster_all=False: -1 for orphans) are fitting's, not predict's.
    squared = squared_distances(
        features.values, ctx.param(est.cluster_centers_, "cluster_centers_")
    )
    return Heads({"predict": lz.argmax(-squared, axis=1)})
