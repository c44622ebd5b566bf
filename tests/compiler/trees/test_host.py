"""The host formulation of tree ensembles (``compiler.trees.host``, one FOREST_SUM) against a
numpy walk of the same ensemble, on the numpy backend (which runs it natively) and the float64
interpreter; and how ``leaf_sum`` offers it next to the device strategy."""

from __future__ import annotations

import numpy as np
import pytest

import compiler
import lazy as lz
from compiler.context import Context
from compiler.schema import Column, InputSchema
from compiler.trees import Ensemble, leaf_sum
from compiler.trees.host import host_leaf_sum
from tests.compiler.trees.test_strategies import (
    N_FEATURES,
    ensemble,
    leaf_tree,
    reference,
    rows,
    spine_tree,
)


def _context(builder: lz.Builder, dtype: str, strategy: str = "auto", **options: object) -> Context:
    schema = InputSchema(tuple(Column(f"x{i}") for i in range(N_FEATURES)), named=False)
    opts = compiler.CompileOptions(tree_strategy=strategy, dtype=dtype, **options)  # type: ignore[arg-type]
    return Context(builder, opts, schema)


def _run(ens: Ensemble, x: np.ndarray, backend: str, dtype: str) -> np.ndarray:
    builder = lz.Builder()
    xin = builder.input("x", (N_FEATURES,), dtype)
    graph = builder.graph({"out": host_leaf_sum(ens, xin, _context(builder, dtype))})
    if backend == "interpreter":
        return lz.evaluate(graph, {"x": x})["out"]
    policy = lz.DTypePolicy.X64 if dtype == "float64" else lz.DTypePolicy.X32
    options = lz.Options(backend=backend, max_batch=64, host_rows=0, dtype_policy=policy)
    return lz.compile(graph, options, warmup=False)({"x": x.astype(dtype)})["out"]


@pytest.mark.parametrize("backend", ["numpy", "interpreter"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("depth", "f32"), [(1, True), (2, True), (6, True), (4, False)])
def test_formulation_matches_reference(backend: str, dtype: str, depth: int, f32: bool) -> None:
    ens, grid = ensemble(depth, depth, f32=f32)
    x = rows(np.random.default_rng(depth + 200), grid)  # 300 rows: buckets 64 and chunks
    got = _run(ens, x, backend, dtype)
    np.testing.assert_allclose(got, reference(ens, x), rtol=1e-5, atol=1e-5)


def test_trees_of_unequal_depth_stop_at_their_leaves() -> None:
    # A deep chain next to stumps and a single leaf: the shallow ones' leaves loop to themselves.
    ens = Ensemble((spine_tree(7), spine_tree(1), leaf_tree(1)), N_FEATURES, True)
    x = np.random.default_rng(7).standard_normal((9, N_FEATURES))
    x[0] = np.nan
    for rows_ in (x[:1], x):  # one row (a one-row flat gather) and several
        got = _run(ens, rows_, "numpy", "float32")
        np.testing.assert_allclose(got, reference(ens, rows_), rtol=1e-6)


@pytest.mark.parametrize(("strategy", "variant"), [("auto", True), ("hybrid", False)])
def test_auto_offers_the_host_formulation_as_a_variant(strategy: str, variant: bool) -> None:
    ens, grid = ensemble(5, 5)
    builder = lz.Builder()
    xin = builder.input("x", (N_FEATURES,))
    graph = builder.graph({"out": leaf_sum(ens, xin, _context(builder, "float32", strategy))})
    assert (graph.output_nodes[0].op is lz.Op.VARIANT) is variant
    x = rows(np.random.default_rng(5), grid)
    for backend in ("jax", "numpy"):  # each runs its own formulation
        options = lz.Options(backend=backend, max_batch=64, host_rows=0)
        got = lz.compile(graph, options, warmup=False)({"x": x.astype(np.float32)})["out"]
        np.testing.assert_allclose(got, reference(ens, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("options", "variant"),
    [({"host_rows": 0}, False), ({"host_rows": 0, "backend": "numpy"}, True), ({}, True)],
)
def test_no_host_formulation_where_nothing_would_run_it(options: dict, variant: bool) -> None:
    ens, _ = ensemble(5, 5)
    builder = lz.Builder()
    xin = builder.input("x", (N_FEATURES,))
    out = leaf_sum(ens, xin, _context(builder, "float32", "auto", **options))
    assert (out.node.op is lz.Op.VARIANT) is variant
