"""Structural checks on decision-tree node arrays read from untrusted files.

scikit-learn's Cython, LightGBM and XGBoost all walk trees by following stored child indices
without bounds checks: a crafted file with an index out of range crashes the process (or reads
foreign memory) the first time the model predicts, and a cycle never terminates. These checks
make every walk from the root finite and in bounds before any such code runs.
"""

from __future__ import annotations

import numpy as np

from .limits import ArtifactError


def check_node_links(left: np.ndarray, right: np.ndarray, is_leaf: np.ndarray, where: str) -> None:
    """Every walk from node 0 stays in ``[0, n)`` and visits each node at most once.

    ``left`` / ``right`` hold the children of each of the ``n`` nodes (ignored for leaves).
    Children in range, no node referenced twice and the root never referenced make the part of
    the graph reachable from the root a tree, whatever the node order.
    """
    n = len(is_leaf)
    if n == 0:
        raise ArtifactError(f"{where}: the tree has no nodes")
    if len(left) != n or len(right) != n:
        raise ArtifactError(
            f"{where}: child arrays have {len(left)} / {len(right)} entries for {n} nodes"
        )
    internal = ~np.asarray(is_leaf, dtype=bool)
    children = np.concatenate(
        [np.asarray(left, dtype=np.int64)[internal], np.asarray(right, dtype=np.int64)[internal]]
    )
    bad = (children < 0) | (children >= n)
    if bad.any():
        raise ArtifactError(
            f"{where}: child index {int(children[bad][0])} is out of range for {n} nodes"
        )
    references = np.bincount(children, minlength=n)
    if references[0] or (references > 1).any():
        node = 0 if references[0] else int(np.argmax(references > 1))
        raise ArtifactError(f"{where}: node {node} is reached twice; the nodes do not form a tree")


def check_feature_indices(features: np.ndarray, n_features: int, where: str) -> None:
    """Split features (of internal nodes only) index an input of ``n_features`` columns."""
    features = np.asarray(features, dtype=np.int64)
    bad = (features < 0) | (features >= n_features)
    if bad.any():
        raise ArtifactError(
            f"{where}: split feature {int(features[bad][0])} is out of range for "
            f"{n_features} input features"
        )
