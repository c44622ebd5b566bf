"""Each tree strategy against a numpy walk of the same normalized ensemble.

Random ensembles (mixed depths, single-leaf trees, both missing-value directions, thresholds that
are and are not float32 values) on rows that hit the thresholds exactly, their float32 neighbours,
NaN and infinities.
"""

from __future__ import annotations

import numpy as np
import pytest

import compiler
import lazy as lz
from compiler.context import Context
from compiler.errors import UnsupportedError
from compiler.schema import Column, InputSchema
from compiler.trees import Ensemble, Tree, choose, float32_floor, leaf_sum
from compiler.trees.cost import costs
from compiler.trees.quickscorer import bit_tables
from compiler.trees.strategies import IMPLEMENTED
from compiler.trees.treewise import treewise_tables

N_FEATURES = 5


def random_tree(rng: np.random.Generator, depth: int, k: int, grid: np.ndarray) -> Tree:
    feature, threshold, left, right, missing, value = [], [], [], [], [], []

    def grow(d: int) -> int:
        i = len(feature)
        feature.append(0)
        threshold.append(np.inf)
        left.append(-1)
        right.append(-1)
        missing.append(True)
        value.append(rng.standard_normal(k))
        if d < depth and (d == 0 or rng.random() < 0.8):
            feature[i] = int(rng.integers(N_FEATURES))
            threshold[i] = float(rng.choice(grid))
            missing[i] = bool(rng.random() < 0.5)
            left[i] = grow(d + 1)
            right[i] = grow(d + 1)
        return i

    grow(0)
    return Tree(
        np.array(feature),
        np.array(threshold),
        np.array(left),
        np.array(right),
        np.array(missing),
        np.array(value),
    )


def spine_tree(depth: int) -> Tree:
    """A tree of ``depth`` splits in a chain (each right child splits again): deep but small."""
    n = 2 * depth + 1
    split = np.arange(n) % 2 == 0
    split[-1] = False
    ids = np.arange(n)
    return Tree(
        np.where(split, ids // 2 % N_FEATURES, 0),
        np.where(split, 0.0, np.inf),
        np.where(split, ids + 1, -1),
        np.where(split, ids + 2, -1),
        np.ones(n, bool),
        np.ones((n, 1)),
    )


def leaf_tree(k: int) -> Tree:
    one = np.zeros(1, np.int64)
    return Tree(one, np.full(1, np.inf), one - 1, one - 1, np.ones(1, bool), np.full((1, k), 0.25))


def thresholds(rng: np.random.Generator, n: int) -> np.ndarray:
    """Half float32 values, half float64 values strictly between two float32 values."""
    t32 = rng.standard_normal(n).astype(np.float32).astype(np.float64)
    up = np.nextafter(t32.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    between = t32 + (up - t32) * rng.uniform(0.1, 0.9, n)
    return np.concatenate([t32, between])


def rows(rng: np.random.Generator, grid: np.ndarray, n: int = 300) -> np.ndarray:
    """float32-representable rows: threshold values, their float32 neighbours, NaN, ±inf."""
    g32 = float32_floor(grid)
    special = np.concatenate(
        [
            g32,
            np.nextafter(g32, np.float32(np.inf)),
            np.nextafter(g32, np.float32(-np.inf)),
            [np.nan, np.inf, -np.inf],
        ]
    ).astype(np.float32)
    x = rng.standard_normal((n, N_FEATURES)).astype(np.float32)
    mask = rng.random(x.shape) < 0.5
    x[mask] = rng.choice(special, mask.sum())
    return x.astype(np.float64)


def reference(ensemble: Ensemble, x: np.ndarray) -> np.ndarray:
    """The source's walk: float32(x) <= t (float64 t), or float64 x <= t; NaN by its direction."""
    xs = x.astype(np.float32).astype(np.float64) if ensemble.float32_inputs else x
    out = np.zeros((len(x), ensemble.n_outputs))
    for tree in ensemble.trees:
        for r, row in enumerate(xs):
            node = 0
            while not tree.is_leaf[node]:
                v = row[tree.feature[node]]
                go_left = tree.missing_left[node] if np.isnan(v) else v <= tree.threshold[node]
                node = tree.left[node] if go_left else tree.right[node]
            out[r] += tree.value[node]
    return out


def ensemble(seed: int, depth: int, n_trees: int = 6, k: int = 2, f32: bool = True) -> Ensemble:
    rng = np.random.default_rng(seed)
    grid = thresholds(rng, 8)
    trees = [random_tree(rng, depth, k, grid) for _ in range(n_trees)]
    return Ensemble((*trees, leaf_tree(k)), N_FEATURES, float32_inputs=f32), grid


def run(ens: Ensemble, x: np.ndarray, strategy: str, backend: str, dtype: str) -> np.ndarray:
    options = compiler.CompileOptions(tree_strategy=strategy, dtype=dtype, backend=backend)
    builder = lz.Builder()
    xin = builder.input("x", (N_FEATURES,), dtype)
    schema = InputSchema(tuple(Column(f"x{i}") for i in range(N_FEATURES)), named=False)
    ctx = Context(builder, options, schema)
    program = builder.build({"out": leaf_sum(ens, xin, ctx)})
    if backend == "interpreter":
        return lz.run_program(program, {"x": x})["out"]
    compiled = lz.compile(program, options.lazy_options(), warmup=False)
    return compiled({"x": x.astype(dtype)})["out"]


STRATEGIES = tuple(IMPLEMENTED)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("backend", ["jax", "interpreter"])
@pytest.mark.parametrize(("depth", "f32"), [(2, True), (6, True), (4, False)])
def test_strategy_matches_reference(strategy: str, backend: str, depth: int, f32: bool) -> None:
    ens, grid = ensemble(depth, depth, f32=f32)
    x = rows(np.random.default_rng(depth + 100), grid)
    if strategy == "bitvector" and ens.max_leaves > 32:  # one mask word per tree only
        with pytest.raises(UnsupportedError, match="up to 32 leaves"):
            run(ens, x, strategy, backend, "float32")
        return
    expected = reference(ens, x)
    got = run(ens, x, strategy, backend, "float32")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["jax", "torch", "interpreter"])
def test_the_hybrid_cut_on_deep_trees(backend: str) -> None:
    # Depth 8: trees of up to 151 leaves; the hybrid's top is 5 levels of bit-vectors (one mask
    # word), it walks 3 levels below its cut, and some leaves sit above the cut.
    ens, grid = ensemble(8, 8)
    assert ens.max_leaves > 4 * 32
    x = rows(np.random.default_rng(108), grid)
    got = run(ens, x, "hybrid", backend, "float32")
    np.testing.assert_allclose(got, reference(ens, x), rtol=1e-5, atol=1e-5)
    with pytest.raises(UnsupportedError, match="use 'hybrid'"):
        choose(ens, "bitvector")


def test_the_cost_model_knows_the_hybrid_top() -> None:
    # ≤ 32 leaves: bit-vectors; a depth-5 cut: the hybrid (from depth 6)
    small, deep = ensemble(0, 4, 100)[0], ensemble(0, 9, 100)[0]
    assert "bitvector" in costs(small) and "hybrid" not in costs(small)
    assert "hybrid" in costs(deep) and "bitvector" not in costs(deep)


def test_bit_masks_rule_out_the_left_subtree() -> None:
    # root: x0 <= 1 ? leaf 0 : (x1 <= 2 ? leaf 1 : leaf 2); a false split keeps its right leaves.
    tree = Tree(
        np.array([0, 0, 1, 0, 0]),
        np.array([1.0, np.inf, 2.0, np.inf, np.inf]),
        np.array([1, -1, 3, -1, -1]),
        np.array([2, -1, 4, -1, -1]),
        np.ones(5, bool),
        np.zeros((5, 1)),
    )
    tables = bit_tables(Ensemble((tree,), 2, True))
    assert tables.shape == (1, 2, 3)
    np.testing.assert_array_equal(tables.masks[0, :, 0], [0xFFFFFFFE, 0xFFFFFFFD])
    assert [p[0] for p in tables.paths] == [1, 3, 4]
    cut = bit_tables(Ensemble((tree,), 2, True), cut=1)
    assert [p for p in cut.paths] == [(1, (False,)), (2, (True,))]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_float64_graph_compares_float64_where_the_source_does(strategy: str) -> None:
    # HistGradientBoosting compares float64 values: a float64 graph keeps them unrounded (the
    # float64 interpreter shows it; jax without x64 would lower the graph to float32).
    ens, grid = ensemble(3, 4, f32=False)
    offsets = np.array([[-1e-12], [0.0], [1e-12]])
    x = np.concatenate([grid[None, :N_FEATURES] + offsets, grid[None, -N_FEATURES:] + offsets])
    got = run(ens, x, strategy, "interpreter", "float64")
    np.testing.assert_allclose(got, reference(ens, x), rtol=1e-12)


def test_single_leaf_trees_are_constant() -> None:
    ens = Ensemble((leaf_tree(3), leaf_tree(3)), N_FEATURES, True)
    x = np.random.default_rng(0).standard_normal((4, N_FEATURES))
    for strategy in STRATEGIES:
        np.testing.assert_allclose(run(ens, x, strategy, "jax", "float32"), np.full((4, 3), 0.5))


def test_float32_floor() -> None:
    t = np.array([0.1, 1.0, -0.1, 1e39, -1e39, np.inf, -np.inf, 2.0**-149 / 3])
    t32 = float32_floor(t)
    assert t32.dtype == np.float32
    assert np.all(t32.astype(np.float64) <= t)
    with np.errstate(over="ignore"):
        above = np.nextafter(t32, np.float32(np.inf)).astype(np.float64)
    assert np.all((above > t) | np.isinf(t32))


def test_auto_and_unsupported_strategies() -> None:
    # The cost model's regimes (compiler/trees/cost.py): bit-vectors for trees of up to 32
    # leaves, the hybrid for many deeper trees, tree by tree for a few deep ones and for many
    # very deep ones.
    picks = {
        (n_trees, depth): choose(ensemble(0, depth, n_trees)[0], "auto")
        for n_trees, depth in [(10, 2), (100, 3), (100, 8), (10, 8), (10, 14)]
    }
    picks[100, 40] = choose(Ensemble((spine_tree(40),) * 100, N_FEATURES, True), "auto")
    assert picks == {
        (10, 2): "bitvector",
        (100, 3): "bitvector",
        (100, 8): "hybrid",
        (10, 8): "treewise",
        (10, 14): "treewise",
        (100, 40): "treewise",
    }
    shallow, _ = ensemble(0, 3)
    with pytest.raises(UnsupportedError, match="tree_strategy"):
        choose(shallow, "nonsense")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_reproduces_fitted_models(strategy: str) -> None:
    """Strategies agree with scikit-learn through the converters (the interpreter: no compile);
    the compile report names the strategy."""
    from sklearn.datasets import make_classification
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier

    x, y = make_classification(120, N_FEATURES, random_state=0)
    x[::9, 1] = np.nan
    x = x.astype(np.float32).astype(np.float64)
    forest = RandomForestClassifier(n_estimators=4, max_depth=5, random_state=0).fit(x, y)
    boosted = GradientBoostingClassifier(n_estimators=4, max_depth=3, random_state=0)
    boosted.fit(np.nan_to_num(x), y)
    options = compiler.CompileOptions(tree_strategy=strategy, backend="interpreter")
    for est, data in ((forest, x), (boosted, np.nan_to_num(x))):
        model = compiler.compile(est, options=options)
        assert model.report.steps[0].detail.startswith(f"trees: {strategy} ")
        np.testing.assert_allclose(model.predict_proba(data), est.predict_proba(data), atol=1e-6)
        np.testing.assert_array_equal(model.predict(data), est.predict(data))


def test_unimplemented_strategy_is_refused_at_compile() -> None:
    from sklearn.tree import DecisionTreeRegressor

    x = np.random.default_rng(0).standard_normal((50, N_FEATURES))
    est = DecisionTreeRegressor(max_depth=2).fit(x, x[:, 0])
    options = compiler.CompileOptions(tree_strategy="nonsense", backend="interpreter")
    with pytest.raises(compiler.UnsupportedError, match="nonsense"):
        compiler.compile(est, options=options)


def test_treewise_numbers_each_tree_breadth_first_and_groups_by_depth() -> None:
    ens, _ = ensemble(5, 7, n_trees=8)
    g = treewise_tables(ens)
    depths = [ens.trees[t].max_depth for t in g.order]
    assert depths == sorted(depths)
    assert [d for d, _, _ in g.groups] == sorted(set(depths))
    assert sum(count for _, _, count in g.groups) == len(ens.trees)
    for d, first, count in g.groups:
        assert all(ens.trees[t].max_depth == d for t in g.order[first : first + count])
    # Each tree's block: children adjacent and inside the block, leaves their own left child.
    ends = [*g.roots[1:], len(g.left)]
    for root, end in zip(g.roots, ends, strict=True):
        ids = np.arange(root, end)
        leaf = g.left[ids] == ids
        assert np.all(g.threshold[ids[leaf]] == np.inf)
        assert np.all((g.left[ids[~leaf]] > ids[~leaf]) & (g.left[ids[~leaf]] + 1 < end))


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_treewise_on_trees_of_many_depths(backend: str) -> None:
    # Depth 9 with 80 % branching: trees of several depths (several loops), a single leaf.
    ens, grid = ensemble(9, 9, n_trees=10)
    assert len(treewise_tables(ens).groups) > 2
    x = rows(np.random.default_rng(109), grid)
    got = run(ens, x, "treewise", backend, "float32")
    np.testing.assert_allclose(got, reference(ens, x), rtol=1e-5, atol=1e-5)


def test_every_strategy_can_be_asked_for_by_name() -> None:
    """CompileOptions (and the service's model options, which reuse its type) accept exactly
    the strategies the compiler implements, plus auto."""
    from typing import get_args

    from compiler.options import TreeStrategy
    from compiler.trees import STRATEGIES as NAMES

    assert set(get_args(TreeStrategy)) == set(NAMES) == {"auto", *STRATEGIES}
