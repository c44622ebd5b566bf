"""Categorical splits in the normalized tree: the traversal walk against a numpy walk, and every
requested strategy falling back to traversal."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_strategies import ensemble, rows, run

from compiler.trees import Ensemble, Tree, choose

N_CATEGORIES = 6


def with_categories(ens: Ensemble, seed: int) -> Ensemble:
    """Every split on feature 0 or 1 made categorical with a random left set."""
    rng = np.random.default_rng(seed)
    trees = []
    for tree in ens.trees:
        categorical = ~tree.is_leaf & (tree.feature < 2)
        left = rng.random((tree.n_nodes, N_CATEGORIES)) < 0.5
        trees.append(dataclasses.replace(tree, is_categorical=categorical, category_left=left))
    return Ensemble(tuple(trees), ens.n_features, ens.float32_inputs)


def category_rows(seed: int, grid: np.ndarray) -> np.ndarray:
    """Codes (and NaN, negative and too-large codes: missing) in columns 0 and 1."""
    rng = np.random.default_rng(seed)
    x = rows(rng, grid)
    codes = np.concatenate([np.arange(N_CATEGORIES), [np.nan, -1.0, N_CATEGORIES, 99.0]])
    x[:, :2] = rng.choice(codes, (len(x), 2))
    return x


def reference(ens: Ensemble, x: np.ndarray) -> np.ndarray:
    xs = x.astype(np.float32).astype(np.float64) if ens.float32_inputs else x
    out = np.zeros((len(x), ens.n_outputs))
    for tree in ens.trees:
        for r, row in enumerate(xs):
            node = 0
            while not tree.is_leaf[node]:
                v = row[tree.feature[node]]
                if tree.is_categorical is not None and tree.is_categorical[node]:
                    known = 0 <= v < N_CATEGORIES  # NaN: False
                    go_left = tree.category_left[node, int(v)] if known else tree.missing_left[node]
                elif np.isnan(v):
                    go_left = tree.missing_left[node]
                else:
                    go_left = v <= tree.threshold[node]
                node = tree.left[node] if go_left else tree.right[node]
            out[r] += tree.value[node]
    return out


@pytest.mark.parametrize("backend", ["jax", "interpreter"])
@pytest.mark.parametrize("depth", [1, 5])
def test_categorical_traversal_matches_reference(backend: str, depth: int) -> None:
    base, grid = ensemble(depth + 40, depth)
    ens = with_categories(base, depth)
    assert ens.has_categorical and not base.has_categorical
    x = category_rows(depth, grid)
    got = run(ens, x, "traversal", backend, "float32")
    np.testing.assert_allclose(got, reference(ens, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", ["auto", "bitvector", "hybrid", "treewise", "traversal"])
def test_categorical_ensembles_always_use_traversal(strategy: str) -> None:
    ens = with_categories(ensemble(3, 3)[0], 3)
    assert choose(ens, strategy) == "traversal"


def test_tree_rejects_half_a_categorical_table() -> None:
    one = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="both"):
        Tree(one, np.ones(1), one - 1, one - 1, np.ones(1, bool), np.ones((1, 1)), one > 0)
