"""What the walking strategies share: comparisons in the source's precision, and every tree's
nodes in one level-major numbering with adjacent children, walked one level per step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import lazy as lz

from ..context import Context
from ..float32_inputs import float32_floor
from .model import Ensemble
from .splits import compare_dtype


@dataclass(frozen=True)
class Decision:
    """The features and thresholds in the precision the source compares in."""

    x: lz.LazyTensor
    dtype: str

    def thresholds(self, t: np.ndarray) -> np.ndarray:
        return float32_floor(t) if self.dtype == "float32" else np.asarray(t, np.float64)


def decision(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> Decision:
    dtype = compare_dtype(ensemble, x, ctx)
    return Decision(x if x.dtype == dtype else lz.cast(x, dtype), dtype)


def go_right(v: lz.LazyTensor, t: lz.LazyTensor, nan_right: lz.LazyTensor | None) -> lz.LazyTensor:
    """``x > t``, with NaN going right where ``nan_right`` (NaN compares false: left otherwise)."""
    right = v > t
    return right if nan_right is None else right | (lz.isnan(v) & nan_right)


@dataclass(frozen=True)
class Linked:
    """All trees' nodes in one level-major numbering with adjacent children: the roots are
    ``0..T-1``, then every tree's level-1 nodes, and so on; a leaf is its own left child."""

    roots: np.ndarray  # (T,) the root's id
    feature: np.ndarray  # (N,)
    threshold: np.ndarray  # (N,) +inf at leaves
    nan_right: np.ndarray  # (N,) False at leaves
    left: np.ndarray  # (N,) a leaf's own id
    value: np.ndarray  # (N, K)


def empty_node_tables(
    ensemble: Ensemble,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Empty per-node tables for a renumbering of every node of ``ensemble``: split column,
    threshold (inf: never right), NaN-goes-right, left child id, leaf value (N, K)."""
    n = ensemble.n_nodes
    return (
        np.zeros(n, np.int64),
        np.full(n, np.inf),
        np.zeros(n, bool),
        np.zeros(n, np.int64),
        np.zeros((n, ensemble.n_outputs)),
    )


def linked(ensemble: Ensemble) -> Linked:
    # Level-major rather than tree by tree: a loop step of the walk (every tree at one level)
    # then reads one contiguous band of the tables instead of a node in each tree's block.
    feature, threshold, nan_right, left, value = empty_node_tables(ensemble)
    level = [(tree, 0) for tree in ensemble.trees]  # (tree, source node) in id order
    first = 0  # the id of level[0]
    while level:
        following = []
        nxt = first + len(level)  # the next level's ids follow in the order of `following`
        for i, (tree, node) in enumerate(level, start=first):
            if tree.is_leaf[node]:
                left[i] = i
                value[i] = tree.value[node]
                continue
            left[i] = nxt
            nxt += 2
            feature[i] = tree.feature[node]
            threshold[i] = tree.threshold[node]
            nan_right[i] = not tree.missing_left[node]
            following += [(tree, int(tree.left[node])), (tree, int(tree.right[node]))]
        first += len(level)
        level = following
    roots = np.arange(len(ensemble.trees))
    return Linked(roots, feature, threshold, nan_right, left, value)


def step(
    i: lz.LazyTensor,
    node: lz.LazyTensor,
    x: lz.LazyTensor,
    column: lz.LazyTensor,
    threshold: lz.LazyTensor,
    left: lz.LazyTensor,
) -> lz.LazyTensor:
    """One level for every (row, tree): (B, T) node ids to their children's."""
    v = lz.take_along(x, lz.take(column, node, axis=0), axis=1)
    return lz.take(left, node, axis=0) + lz.cast(v > lz.take(threshold, node, axis=0), "int32")
