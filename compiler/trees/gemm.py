"""``gemm`` (Hummingbird's): every split at once, then each tree's leaf by a matrix product."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import lazy as lz

from ..context import Context
from .leaves import stumps
from .linked import decision, go_right
from .model import Ensemble


@dataclass(frozen=True)
class _Gemm:
    """Per tree (padded to I splits and L leaves): split features/thresholds (T*I,), path signs
    (T, I, L) (+1: the leaf is under the split's left child, -1: right), left-ancestor counts
    (T*L,) (-1 for padding, never matched) and leaf values (T*L, K)."""

    feature: np.ndarray
    threshold: np.ndarray
    nan_right: np.ndarray
    signs: np.ndarray
    lefts: np.ndarray
    value: np.ndarray


def gemm_shape(ensemble: Ensemble) -> tuple[int, int, int]:
    splits = max(int((~t.is_leaf).sum()) for t in ensemble.trees)
    return len(ensemble.trees), splits, ensemble.max_leaves


def _gemm_tables(ensemble: Ensemble) -> _Gemm:
    n_trees, n_splits, n_leaves = gemm_shape(ensemble)
    k = ensemble.n_outputs
    feature = np.zeros((n_trees, n_splits), np.int64)
    threshold = np.full((n_trees, n_splits), np.inf)
    nan_right = np.zeros((n_trees, n_splits), bool)
    signs = np.zeros((n_trees, n_splits, n_leaves))
    lefts = np.full((n_trees, n_leaves), -1.0)
    value = np.zeros((n_trees, n_leaves, k))
    for ti, tree in enumerate(ensemble.trees):
        split_ids: dict[int, int] = {}
        leaf_count = 0
        stack: list[tuple[int, list[tuple[int, float]]]] = [(0, [])]
        while stack:
            node, path = stack.pop()
            if tree.is_leaf[node]:
                for s, sign in path:
                    signs[ti, s, leaf_count] = sign
                lefts[ti, leaf_count] = sum(1 for _, sign in path if sign > 0)
                value[ti, leaf_count] = tree.value[node]
                leaf_count += 1
                continue
            s = split_ids.setdefault(node, len(split_ids))
            feature[ti, s] = tree.feature[node]
            threshold[ti, s] = tree.threshold[node]
            nan_right[ti, s] = not tree.missing_left[node]
            stack += [(int(tree.right[node]), [*path, (s, -1.0)])]
            stack += [(int(tree.left[node]), [*path, (s, 1.0)])]
    return _Gemm(
        feature.ravel(),
        threshold.ravel(),
        nan_right.ravel(),
        signs,
        lefts.ravel(),
        value.reshape(-1, k),
    )


def gemm(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    n_trees, n_splits, n_leaves = gemm_shape(ensemble)
    if n_splits == 0:
        return stumps(ensemble, x, ctx)
    dec = decision(ensemble, x, ctx)
    g = _gemm_tables(ensemble)
    # A column gather, not X @ one-hot: 0 * NaN would spread a missing value to every split.
    v = lz.take(dec.x, ctx.param(g.feature, "feature"), axis=1)  # (B, T*I)
    t = ctx.param(dec.thresholds(g.threshold), "threshold", dtype=dec.dtype)
    nr = ctx.param(g.nan_right, "nan_right", dtype="bool") if g.nan_right.any() else None
    go_left = lz.cast(~go_right(v, t, nr), ctx.dtype)
    # (B, T, 1, I) @ (T, I, L): per tree, +1 for each satisfied left turn, -1 for each right
    # split that went left; only the reached leaf scores its count of left turns.
    score = lz.reshape(go_left, (lz.B, n_trees, 1, n_splits)) @ ctx.param(g.signs, "path_signs")
    score = lz.reshape(score, (lz.B, n_trees * n_leaves))
    reached = lz.cast(score == ctx.param(g.lefts, "left_turns"), ctx.dtype)
    return reached @ ctx.param(g.value, "leaf_value")
