"""One-comparison splits (compiler/trees/splits.py) and the loop structure of the strategies.

The widened features fold the NaN direction into the column a split reads; the edge that needs
the third block is a NaN-right split at threshold +inf, where NaN must go right and a real +inf
left. Every strategy is checked on such trees, on every backend, against a numpy walk.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sklearn.ensemble import RandomForestClassifier
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from test_strategies import N_FEATURES, STRATEGIES, ensemble, reference, rows, run

import compiler
import lazy as lz
from compiler.context import Context
from compiler.schema import Column, InputSchema
from compiler.trees import Ensemble, Tree, leaf_sum
from compiler.trees.splits import SplitColumns, split_columns


def infinite_split_tree(k: int, threshold: float, missing_left: bool) -> Tree:
    """x0 <= threshold ? (x1 <= 0 ? a : b) : c, with the root's NaN direction given."""
    return Tree(
        feature=np.array([0, 1, 0, 0, 0]),
        threshold=np.array([threshold, 0.0, np.inf, np.inf, np.inf]),
        left=np.array([1, 3, -1, -1, -1]),
        right=np.array([2, 4, -1, -1, -1]),
        missing_left=np.array([missing_left, False, True, True, True]),
        value=np.arange(5 * k, dtype=np.float64).reshape(5, k),
    )


def edge_ensemble(f32: bool) -> Ensemble:
    base, _ = ensemble(11, 4, n_trees=3, f32=f32)
    edges = [
        infinite_split_tree(2, t, missing_left)
        for t in (np.inf, -np.inf, 1e39, -1e39)
        for missing_left in (True, False)
    ]
    return Ensemble((*base.trees, *edges), N_FEATURES, float32_inputs=f32)


def edge_rows() -> np.ndarray:
    big = float(np.finfo(np.float32).max)  # float32 values only: the interpreter runs float64
    values = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0, -1.0, big, -big])
    x = np.stack(np.meshgrid(values, values), axis=-1).reshape(-1, 2)
    rest = np.random.default_rng(0).standard_normal((len(x), N_FEATURES - 2))
    return np.concatenate([x, rest], axis=1)


def columns_for(ens: Ensemble, dtype: str = "float32", imputed: bool = False) -> SplitColumns:
    builder = lz.Builder()
    x = builder.input("x", (N_FEATURES,), dtype)
    if imputed:
        x = lz.where(lz.isnan(x), builder.param(np.zeros(N_FEATURES, dtype), "fill"), x)
    schema = InputSchema(tuple(Column(f"x{i}") for i in range(N_FEATURES)), named=False)
    ctx = Context(builder, compiler.CompileOptions(dtype=dtype), schema)
    return split_columns(ens, x, ctx)


def test_encode_picks_the_block_by_nan_direction() -> None:
    cols = columns_for(ensemble(0, 3)[0])
    column, threshold = cols.encode(
        np.array([1, 2, 3, 4]),
        np.array([0.5, 0.5, np.inf, np.inf]),
        np.array([False, True, True, False]),
    )
    np.testing.assert_array_equal(column, [1, 2 + N_FEATURES, 3 + 2 * N_FEATURES, 4])
    np.testing.assert_array_equal(threshold, [0.5, 0.5, 0.5, np.inf])
    assert threshold.dtype == np.float32


def test_the_isnan_block_only_when_a_nan_right_split_sits_at_infinity() -> None:
    plain, _ = ensemble(0, 3)
    assert columns_for(plain).x.shape[1] == 2 * N_FEATURES
    nan_left = Ensemble((infinite_split_tree(2, np.inf, True),), N_FEATURES, True)
    assert columns_for(nan_left).x.shape[1] == 2 * N_FEATURES
    nan_right = Ensemble((infinite_split_tree(2, np.inf, False),), N_FEATURES, True)
    assert columns_for(nan_right).x.shape[1] == 3 * N_FEATURES
    # 1e39 rounds down to the largest float32: finite, so block 1 still tells NaN apart
    huge = Ensemble((infinite_split_tree(2, 1e39, False),), N_FEATURES, True)
    assert columns_for(huge).x.shape[1] == 2 * N_FEATURES


def test_features_no_nan_reaches_need_one_block() -> None:
    cols = columns_for(edge_ensemble(True), imputed=True)
    assert not cols.nan_blocks and cols.x.shape[1] == N_FEATURES
    column, threshold = cols.encode(np.array([1, 2]), np.array([0.5, np.inf]), np.array([1, 1]))
    np.testing.assert_array_equal(column, [1, 2])  # the NaN direction no longer picks a block
    np.testing.assert_array_equal(threshold, [0.5, np.inf])


def imputed_forest() -> tuple[Any, np.ndarray]:
    """Impute + scale + a forest (whose splits still carry NaN directions: scikit-learn gives
    every split one), and rows with NaN (scikit-learn refuses infinities, and scaled extremes
    overflow to them)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((400, N_FEATURES)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    x[rng.random(x.shape) < 0.2] = np.nan
    forest = RandomForestClassifier(8, max_depth=7, max_leaf_nodes=24, random_state=0)
    model = make_pipeline(SimpleImputer(), StandardScaler(), forest).fit(x, y)
    test = np.concatenate([x[:200], np.full((1, N_FEATURES), np.nan, np.float32)])
    return model, test


@pytest.mark.parametrize("strategy", ["auto", *STRATEGIES])
def test_a_forest_behind_an_imputer_is_exact(strategy: str) -> None:
    model, x = imputed_forest()
    compiled = compiler.compile(
        model, sample=x[:4], options=compiler.CompileOptions(tree_strategy=strategy)
    )
    np.testing.assert_allclose(compiled.predict_proba(x), model.predict_proba(x), atol=1e-6)
    (graph,) = compiled.traced.program.graphs
    # The imputer and the scaler fold into the thresholds (compiler.trees.folding): the splits
    # read the raw float64 columns, and nothing computes the scaled features (the one division
    # left is the forest's mean of its two classes' sums).
    assert not any(
        n.op in (lz.Op.SUB, lz.Op.DIV) and n.dtype.startswith("float") and n.shape[1] != 2
        for n in graph.order
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("backend", ["jax", "torch", "interpreter"])
@pytest.mark.parametrize("f32", [True, False])
def test_infinite_thresholds_and_missing_values(strategy: str, backend: str, f32: bool) -> None:
    ens = edge_ensemble(f32)
    x = np.concatenate([edge_rows(), rows(np.random.default_rng(5), ensemble(11, 4)[1], 40)])
    got = run(ens, x, strategy, backend, "float32")
    np.testing.assert_allclose(got, reference(ens, x), rtol=1e-5, atol=1e-5)


def graph_size(ens: Ensemble, strategy: str) -> int:
    builder = lz.Builder()
    x = builder.input("x", (N_FEATURES,), "float32")
    schema = InputSchema(tuple(Column(f"x{i}") for i in range(N_FEATURES)), named=False)
    options = compiler.CompileOptions(tree_strategy=strategy)
    program = builder.build({"out": leaf_sum(ens, x, Context(builder, options, schema))})
    (graph,) = program.graphs
    return len(graph.order)


@pytest.mark.parametrize("strategy", ["traversal", "bitvector", "hybrid"])
def test_levels_and_trees_are_loops_not_unrolled(strategy: str) -> None:
    # The outer graph does not grow with the depth (levels) or the tree count (trees): both are
    # LOOP iterations. (Bodies grow with splits per tree, which is the point of bit-vectors.)
    depth = 5 if strategy == "bitvector" else 7  # bit-vectors: up to 32 leaves
    shallow, deep = ensemble(1, depth, n_trees=3)[0], ensemble(1, depth, n_trees=12)[0]
    assert graph_size(shallow, strategy) == graph_size(deep, strategy)
    if strategy == "traversal":
        assert graph_size(ensemble(2, 3)[0], strategy) == graph_size(ensemble(2, 9)[0], strategy)
