"""A float64 input fed float32 values: the narrowing rules and the narrowed program decide every
value as the widened one does (lazy.narrowing, lazy.passes.rules)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import lazy as lz
from lazy import Op
from lazy.dtypes import round_down, round_up
from lazy.passes import COMPARE_OF_WIDENED, FOREST_OF_WIDENED, rewrite
from tests.lazy.forest_tables import forest_tables

RNG = np.random.default_rng(20261207)
F32 = np.float32
TINY = np.finfo(F32).tiny
MAX = np.finfo(F32).max
#: Declared dtypes kept: the float64 program must compare float64.
HOST = lz.Options(backend="numpy", dtype_policy=lz.DTypePolicy.X64)


def _thresholds(n: int) -> np.ndarray:
    """float64 thresholds where float32 rounding matters: float32 values, one float64 step off
    them either way, midpoints between float32 neighbours, past float32's range, subnormal."""
    base = RNG.normal(0, 3, n).astype(F32).astype(np.float64)
    up = np.nextafter(base.astype(F32), F32(np.inf)).astype(np.float64)
    kinds = RNG.integers(0, 6, n)
    return np.select(
        [kinds == 0, kinds == 1, kinds == 2, kinds == 3, kinds == 4],
        [base, np.nextafter(base, np.inf), np.nextafter(base, -np.inf), (base + up) / 2,
         np.where(base > 0, 1e39, -1e39)],
        5e-42 * np.sign(base),
    )  # fmt: skip


def _values(thresholds: np.ndarray, n: int) -> np.ndarray:
    """float32 values on and beside every threshold's float32 neighbours, and specials."""
    t = thresholds[np.abs(thresholds) <= MAX]
    near = np.concatenate([round_down(t, "float32"), round_up(t, "float32"), t.astype(F32)])
    near = np.concatenate([near, np.nextafter(near, F32(np.inf)), np.nextafter(near, -near)])
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, TINY / 4, -TINY / 4, MAX, -MAX], F32)
    pool = np.concatenate([near, special])
    return RNG.choice(pool, n).astype(F32)


def test_round_down_and_up_bracket_each_value_by_the_nearest_float32() -> None:
    t = _thresholds(2000)
    below, above = round_down(t, "float32"), round_up(t, "float32")
    assert below.dtype == above.dtype == F32
    finite = np.abs(t) <= MAX
    assert np.all(below.astype(np.float64) <= t) and np.all(above.astype(np.float64) >= t)
    # No float32 lies strictly between the bound and the value.
    below, above, t = below[finite], above[finite], t[finite]
    assert np.all(np.nextafter(below, F32(np.inf)).astype(np.float64) > t)
    assert np.all(np.nextafter(above, F32(-np.inf)).astype(np.float64) < t)
    assert np.isnan(round_down(np.nan, "float32")) and np.isnan(round_up(np.nan, "float32"))
    assert round_down(1e39, "float32") == MAX and round_up(-1e39, "float32") == -MAX


def _forest_graph(features: int, trees: int = 20, depth: int = 5) -> lz.Graph:
    feature, _, nan_right, left, value = forest_tables(RNG, trees, depth, features, 2)
    threshold = _thresholds(len(left))
    b = lz.Builder()
    x = b.input("x", (features,), "float64")
    out = lz.forest_sum(
        x,
        b.param(feature.astype(np.int32), "feature"),
        b.param(threshold, "threshold"),
        b.param(nan_right, "nan_right"),
        b.param(left.astype(np.int32), "left"),
        b.param(value, "value"),
        trees=trees,
        depth=depth,
    )
    return b.graph({"y": out})


def _program(graph: lz.Graph) -> lz.Program:
    outputs = tuple((n, n) for n in graph.output_names)
    return lz.Program(graph.inputs, (lz.GraphStage(graph),), outputs)


def test_a_forest_on_a_widened_table_walks_the_narrow_one_with_the_same_paths() -> None:
    graph = _forest_graph(features=6)
    narrow = lz.narrowed(_program(graph), "x")
    assert narrow is not None
    (stage,) = narrow.stages
    (forest,) = [n for n in stage.graph.order if n.op is Op.FOREST_SUM]
    assert forest.inputs[0].op is Op.INPUT and forest.inputs[0].dtype == "float32"
    assert forest.inputs[2].dtype == "float32"  # thresholds rounded down once
    x = _values(graph.params["threshold"], 6 * 3000).reshape(3000, 6)
    want = lz.evaluate(graph, {"x": x.astype(np.float64)})["y"]
    got = lz.evaluate(stage.graph, {"x": x})["y"]
    np.testing.assert_array_equal(got, want)
    # And the numpy backend's native kernels, at every row count they switch at.
    compiled = lz.compile(_program(graph), HOST, narrow_input="x")
    for n in (1, 7, 300, 3000):
        np.testing.assert_array_equal(compiled({"x": x[:n]})["y"], want[:n])
        np.testing.assert_array_equal(compiled({"x": x[:n].astype(np.float64)})["y"], want[:n])


@pytest.mark.parametrize("op", [Op.GT, Op.GE, Op.LT, Op.LE])
@pytest.mark.parametrize("swapped", [False, True])
def test_a_comparison_of_a_widened_value_compares_the_narrow_one(op: Op, swapped: bool) -> None:
    t = _thresholds(64)
    b = lz.Builder()
    x = b.input("x", (64,), "float32")
    wide, bound = lz.cast(x, "float64"), b.param(t, "t")
    operands = [bound.node, wide.node] if swapped else [wide.node, bound.node]
    before = b.graph({"y": lz.LazyTensor(lz.Node.make(op, operands))})
    after, fired = rewrite(before, [COMPARE_OF_WIDENED])
    assert fired == {"compare-of-widened": 1}
    counts = Counter(n.op for n in after.order)
    assert counts[Op.CAST] == 0
    values = _values(t, 64 * 500).reshape(500, 64)
    np.testing.assert_array_equal(
        lz.evaluate(after, {"x": values})["y"], lz.evaluate(before, {"x": values})["y"]
    )


def test_narrowing_leaves_lossy_and_input_dependent_comparisons_alone() -> None:
    b = lz.Builder()
    x = b.input("x", (3,), "float64")
    y = b.input("y", (3,), "float32")
    lossy = lz.Node.make(Op.GT, [lz.cast(x, "float32").node, b.param(np.ones(3, F32), "a").node])
    batched = lz.Node.make(Op.GT, [lz.cast(y, "float64").node, x.node])
    graph = b.graph({"a": lz.LazyTensor(lossy), "b": lz.LazyTensor(batched)})
    assert rewrite(graph, [COMPARE_OF_WIDENED, FOREST_OF_WIDENED])[1] == {}


def test_nothing_to_narrow_gives_no_program() -> None:
    b = lz.Builder()
    x = b.input("x", (3,), "float64")
    graph = b.graph({"y": lz.exp(x)})  # arithmetic, no decision: the widened value is read
    assert lz.narrowed(_program(graph), "x") is None
    assert lz.narrowed(_program(_forest_graph(3)), "missing") is None


def test_a_compiled_program_runs_its_narrowed_graphs_for_float32_input_and_plans_them() -> None:
    graph = _forest_graph(features=4)
    options = HOST
    compiled = lz.compile(_program(graph), options, narrow_input="x")
    assert compiled.narrows == "x" and len(compiled.graphs) == 2
    x = _values(graph.params["threshold"], 4 * 200).reshape(200, 4)
    before = [g.stats.calls for g in compiled.graphs]
    compiled({"x": x})
    compiled.run_one({"x": x}, "y")
    after = [g.stats.calls for g in compiled.graphs]
    assert after[0] == before[0] and after[1] == before[1] + 2  # both ran the narrowed graph
    compiled({"x": x.astype(np.float64)})
    assert compiled.graphs[0].stats.calls == before[0] + 1
    # The plan holds both programs' graphs, and a compile that follows it places both.
    plan = compiled.plan
    assert plan is not None and len(plan.graphs) == 2
    again = lz.compile(_program(graph), options, plan=plan, narrow_input="x")
    assert again.plan_refused is None and again.plan == plan
    # A plan made without the narrowed program is refused by count, and warm-up places anew.
    older = lz.compile(
        _program(graph), options, plan=lz.ExecutionPlan(plan.graphs[:1]), narrow_input="x"
    )
    assert older.plan_refused is not None and "1 graphs" in older.plan_refused


def test_calls_the_backend_runs_read_float32_widened_and_host_calls_the_narrowed_program() -> None:
    t = _thresholds(8)
    b = lz.Builder()
    x = b.input("x", (8,), "float64")
    graph = b.graph({"y": lz.LazyTensor(lz.Node.make(Op.LE, [x.node, b.param(t, "t").node]))})
    options = lz.Options(backend="jax", dtype_policy=lz.DTypePolicy.X64, max_batch=64)
    compiled = lz.compile(_program(graph), options, narrow_input="x")
    assert compiled.narrows == "x" and compiled.formulations == (lz.DEVICE, lz.HOST)
    main, narrow = compiled.graphs
    x32 = _values(t, 8 * 40).reshape(40, 8)
    want = lz.evaluate(graph, {"x": x32.astype(np.float64)})["y"]
    for formulation, ran in ((lz.DEVICE, main), (lz.HOST, narrow)):
        with compiled.pinned(formulation):
            calls = ran.stats.calls
            np.testing.assert_array_equal(compiled({"x": x32})["y"], want)
            assert ran.stats.calls == calls + 1, formulation
