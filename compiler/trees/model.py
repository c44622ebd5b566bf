"""A normalized tree ensemble, independent of the library that fitted it.

Every tree is a binary tree of ``x[feature] <= threshold`` splits whose leaves hold a vector of K
values; the ensemble's output is the sum over trees of the reached leaves' vectors. Converters fold
everything model-specific (averaging, learning rates, per-class trees, path lengths) into those
leaf vectors, so one set of strategies serves every tree model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np


@dataclass(frozen=True, eq=False)
class Tree:
    """One tree in flat arrays indexed by node id (the root is node 0).

    At a leaf ``left == right == -1``; its feature, threshold and missing direction are unused.
    A NaN feature value goes left iff ``missing_left``; otherwise ``x <= threshold`` goes left.

    Categorical splits (optional): at a node with ``is_categorical``, the feature holds an integer
    category code c and goes left iff ``category_left[node, c]``; NaN, and a code outside the
    table, is missing (left iff ``missing_left``). Only the traversal strategy evaluates them.

    ``cover`` (optional): each node's share of the training data as the source records it
    (sample weight, count or hessian sum), which path-dependent TreeSHAP weighs the branches a
    row does not take by (:mod:`.shap`).
    """

    feature: np.ndarray  # (n,) int64
    threshold: np.ndarray  # (n,) float64, the source's own value
    left: np.ndarray  # (n,) int64
    right: np.ndarray  # (n,) int64
    missing_left: np.ndarray  # (n,) bool
    value: np.ndarray  # (n, K) float64; read at leaves only
    is_categorical: np.ndarray | None = None  # (n,) bool
    category_left: np.ndarray | None = None  # (n, C) bool
    cover: np.ndarray | None = None  # (n,) float64

    def __post_init__(self) -> None:
        n = len(self.feature)
        if self.cover is not None and len(self.cover) != n:
            raise ValueError("tree arrays disagree in length: cover")
        for name in ("threshold", "left", "right", "missing_left"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"tree arrays disagree in length: {name}")
        if self.value.ndim != 2 or len(self.value) != n:
            raise ValueError(f"tree values must be (n_nodes, K), got {self.value.shape}")
        if (self.is_categorical is None) != (self.category_left is None):
            raise ValueError("categorical splits need both is_categorical and category_left")
        if self.category_left is not None and (
            len(self.is_categorical) != n  # type: ignore[arg-type]
            or self.category_left.ndim != 2
            or len(self.category_left) != n
        ):
            raise ValueError("categorical split tables must be (n_nodes,) and (n_nodes, C)")

    @property
    def has_categorical(self) -> bool:
        return self.is_categorical is not None and bool(self.is_categorical[~self.is_leaf].any())

    @property
    def n_nodes(self) -> int:
        return len(self.feature)

    @cached_property
    def is_leaf(self) -> np.ndarray:
        return self.left < 0

    @cached_property
    def depths(self) -> np.ndarray:
        """Depth of every node (the root has depth 0)."""
        depth = np.zeros(self.n_nodes, np.int64)
        for node in self.preorder:
            if not self.is_leaf[node]:
                depth[self.left[node]] = depth[self.right[node]] = depth[node] + 1
        return depth

    @cached_property
    def preorder(self) -> list[int]:
        order, stack = [], [0]
        while stack:
            node = stack.pop()
            order.append(node)
            if not self.is_leaf[node]:
                stack += [int(self.right[node]), int(self.left[node])]
        return order

    @property
    def max_depth(self) -> int:
        return int(self.depths[self.preorder].max())


@dataclass(frozen=True, eq=False)
class Ensemble:
    """Trees whose reached leaf vectors are summed.

    ``float32_inputs``: the source compares ``float32(x)`` with its thresholds (scikit-learn's
    ``tree_`` models); otherwise it compares the float64 value (HistGradientBoosting).

    ``in_order``: the source sums the reached leaf values one tree after another from +0
    (LightGBM, in float64; XGBoost, whose base margin is then a first, single-leaf tree), and
    every strategy sums them so, so that each sum is the source's bit for bit; otherwise the
    order is the strategy's. ``sums_in``: the dtype the sums take whatever the graph's
    (XGBoost sums in float32; a float32 graph's forest whose ``predict`` decides on
    scikit-learn's float64 sums, in float64); None: the graph's (:attr:`sum_dtype`).
    """

    trees: tuple[Tree, ...]
    n_features: int
    float32_inputs: bool
    in_order: bool = False
    sums_in: str | None = None
    #: The source's own feature behind each feature the splits read (None: each is its own).
    #: LightGBM and XGBoost read derived columns (zero-as-missing copies, category membership)
    #: that the source explains as the feature they derive from (:mod:`.shap`).
    players: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.trees:
            raise ValueError("an ensemble needs at least one tree")
        widths = {t.value.shape[1] for t in self.trees}
        if len(widths) != 1:
            raise ValueError(f"trees disagree in output width: {sorted(widths)}")
        if self.players is not None and len(self.players) != self.n_features:
            raise ValueError(f"{len(self.players)} players for {self.n_features} features")

    def player(self, feature: int) -> int:
        """The source's feature behind split feature ``feature``."""
        return feature if self.players is None else self.players[feature]

    @property
    def n_outputs(self) -> int:
        return int(self.trees[0].value.shape[1])

    @property
    def summing(self) -> dict[str, Any]:
        """How the source sums (``in_order``, ``sums_in``): for an ensemble of other trees
        read from the same source."""
        return {"in_order": self.in_order, "sums_in": self.sums_in}

    def sum_dtype(self, graph_dtype: str) -> str:
        """The dtype leaf values are summed in, in a graph of ``graph_dtype``."""
        return self.sums_in or graph_dtype

    def root_sum(self) -> np.ndarray:
        """(K,): the sum of every tree's root value (the whole answer where no tree splits),
        summed as the source sums."""
        if not self.in_order:
            return np.sum([t.value[0] for t in self.trees], axis=0)
        dtype = np.dtype(self.sums_in or np.float64)
        total = np.zeros(self.n_outputs, dtype)
        for tree in self.trees:
            total = total + tree.value[0].astype(dtype)
        return total.astype(np.float64)

    def sums_exactly(self, dtype: str) -> bool:
        """Whether every sum of one reached leaf value per tree is exact in ``dtype``, in any
        order (:func:`leaf_sums_exact`)."""
        return leaf_sums_exact([t.value[t.is_leaf] for t in self.trees], dtype)

    @cached_property
    def max_depth(self) -> int:
        return max(t.max_depth for t in self.trees)

    @cached_property
    def max_leaves(self) -> int:
        return max(int(t.is_leaf.sum()) for t in self.trees)

    @cached_property
    def n_nodes(self) -> int:
        return sum(t.n_nodes for t in self.trees)

    @cached_property
    def has_categorical(self) -> bool:
        """Whether any split is categorical (only the traversal strategy evaluates those)."""
        return any(t.has_categorical for t in self.trees)

    @cached_property
    def n_categories(self) -> int:
        """The width of the widest category table (0 without categorical splits)."""
        return max(
            (t.category_left.shape[1] for t in self.trees if t.category_left is not None),
            default=0,
        )


def leaf_sums_exact(leaves: Sequence[np.ndarray], dtype: str) -> bool:
    """Whether every sum of one leaf value per tree (``leaves[t]``: tree t's leaf values) is
    exact in ``dtype`` in any order, and so the same as the source's: every value a multiple
    of one power of two ``2**e``, and the trees' largest magnitudes summed at most
    ``2**(e + p)`` (p: the dtype's significand bits). Vote counts (pure leaves) and halves
    qualify; thirds do not."""
    magnitudes = [np.abs(np.asarray(v, np.float64)).ravel() for v in leaves]
    values = np.concatenate(magnitudes or [np.zeros(0)])
    if not np.all(np.isfinite(values)):
        return False
    values = values[values != 0]
    if not values.size:
        return True
    significand, exponent = np.frexp(values)
    digits = (significand * 2.0**53).astype(np.int64)  # exact: 53 significant bits
    lowest_bit = np.frexp((digits & -digits).astype(np.float64))[1] - 1
    unit = int(np.min(exponent - 53 + lowest_bit))  # every value is a multiple of 2**unit
    bound = sum(float(np.max(m, initial=0.0)) for m in magnitudes)
    return bound <= 2.0 ** (unit + np.finfo(dtype).nmant + 1)


def single_leaf(value: np.ndarray) -> Tree:
    """A tree of one leaf holding ``value`` (K,): a constant the source adds as it adds a tree (a
    boosted model's init, first in an ``in_order`` ensemble)."""
    return Tree(
        feature=np.zeros(1, np.int64),
        threshold=np.full(1, np.inf),
        left=np.full(1, -1, np.int64),
        right=np.full(1, -1, np.int64),
        missing_left=np.ones(1, bool),
        value=np.asarray(value, np.float64).reshape(1, -1),
        cover=np.ones(1),
    )


def from_sklearn_tree(tree: Any, value: np.ndarray, feature_map: np.ndarray | None = None) -> Tree:
    """A scikit-learn ``tree_`` (``sklearn.tree._tree.Tree``) with leaf vectors ``value``.

    ``feature_map`` maps the tree's feature indices to input columns (bagging on feature subsets).
    """
    left = np.asarray(tree.children_left, np.int64)
    leaf = left < 0
    feature = np.where(leaf, 0, np.asarray(tree.feature, np.int64))
    if feature_map is not None:
        feature = np.where(leaf, 0, np.asarray(feature_map, np.int64)[feature])
    return Tree(
        feature=feature,
        threshold=np.where(leaf, np.inf, np.asarray(tree.threshold, np.float64)),
        left=np.where(leaf, -1, left),
        right=np.where(leaf, -1, np.asarray(tree.children_right, np.int64)),
        missing_left=np.where(leaf, True, np.asarray(tree.missing_go_to_left, bool)),
        value=np.asarray(value, np.float64).reshape(len(left), -1),
        cover=np.asarray(tree.weighted_n_node_samples, np.float64),
    )


def from_hist_predictor(
    nodes: np.ndarray,
    k: int,
    n_outputs: int,
    left_cat_bitsets: np.ndarray | None = None,
    n_categories: int = 0,
) -> Tree:
    """A HistGradientBoosting ``TreePredictor.nodes`` array; its leaf values go to output ``k``.

    ``left_cat_bitsets``: the predictor's ``raw_left_cat_bitsets`` ((splits, 8) uint32, bit c of
    row ``bitset_idx``: category code c goes left), read for codes ``0..n_categories - 1``.
    """
    leaf = np.asarray(nodes["is_leaf"], bool)
    value = np.zeros((len(nodes), n_outputs))
    value[:, k] = np.where(leaf, nodes["value"], 0.0)
    is_categorical = category_left = None
    if left_cat_bitsets is not None and n_categories > 0:
        is_categorical = np.asarray(nodes["is_categorical"], bool) & ~leaf
        codes = np.arange(n_categories)
        words = np.asarray(left_cat_bitsets, np.uint64)[:, codes // 32]  # (splits, C)
        bits = ((words >> (codes % 32).astype(np.uint64)) & np.uint64(1)).astype(bool)
        category_left = np.zeros((len(nodes), n_categories), bool)
        rows = np.flatnonzero(is_categorical)
        category_left[rows] = bits[np.asarray(nodes["bitset_idx"], np.int64)[rows]]
    return Tree(
        feature=np.where(leaf, 0, nodes["feature_idx"].astype(np.int64)),
        threshold=np.where(leaf, np.inf, nodes["num_threshold"].astype(np.float64)),
        left=np.where(leaf, -1, nodes["left"].astype(np.int64)),
        right=np.where(leaf, -1, nodes["right"].astype(np.int64)),
        missing_left=np.where(leaf, True, nodes["missing_go_to_left"].astype(bool)),
        value=value,
        is_categorical=is_categorical,
        category_left=category_left,
        cover=np.asarray(nodes["count"], np.float64),
    )
