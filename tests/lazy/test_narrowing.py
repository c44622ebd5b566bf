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
    assert narrow is not None and narrow.targets == {lz.HOST, lz.DEVICE}  # no VARIANT: alike
    (stage,) = narrow.program.stages
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


def _compare_graph(t: np.ndarray, host_only: bool) -> lz.Graph:
    """``x <= t``; with ``host_only``, its device formulation a subtraction's sign instead
    (the same answers, nothing to narrow there)."""
    b = lz.Builder()
    x = b.input("x", (len(t),), "float64")
    bound = b.param(t, "t")
    decided = lz.LazyTensor(lz.Node.make(Op.LE, [x.node, bound.node]))
    if host_only:
        sign = lz.LazyTensor(lz.Node.make(Op.LE, [(x - bound).node, lz.const(0.0, "float64").node]))
        decided = lz.variant(sign, decided)
    return b.graph({"y": decided})


@pytest.mark.parametrize("host_only", [False, True])
def test_each_formulation_runs_the_narrowed_program_where_it_narrows(host_only: bool) -> None:
    t = _thresholds(8)
    t = t[np.abs(t) <= MAX] if host_only else t  # x - t stays finite: the sign is the test
    graph = _compare_graph(t, host_only)
    options = lz.Options(backend="jax", dtype_policy=lz.DTypePolicy.X64, max_batch=64)
    compiled = lz.compile(_program(graph), options, narrow_input="x")
    assert compiled.narrows == "x" and compiled.formulations == (lz.DEVICE, lz.HOST)
    main, narrow = compiled.graphs
    # Host plans alone where only they narrow; its buckets placed where the main graph's are.
    assert narrow.formulations == ((lz.HOST,) if host_only else (lz.DEVICE, lz.HOST))
    placed = [p.runs_on for p in narrow.placements.values()]
    if host_only:
        assert placed and set(placed) == {lz.HOST}
    else:
        assert placed == [p.runs_on for p in main.placements.values()]
    x32 = _values(t, len(t) * 40).reshape(40, len(t))
    want = lz.evaluate(graph, {"x": x32.astype(np.float64)})["y"]
    on_device = main if host_only else narrow
    for formulation, ran in ((lz.DEVICE, on_device), (lz.HOST, narrow)):
        with compiled.pinned(formulation):
            calls = ran.stats.calls
            np.testing.assert_array_equal(compiled({"x": x32})["y"], want)
            assert ran.stats.calls == calls + 1, formulation


def _loop_graph(t: np.ndarray, features: int, fill: float, extra_use: bool = False) -> lz.Graph:
    """A forest-like device formulation: NaN read as ``fill`` beside the raw columns, then a
    loop over "trees" comparing one column with one threshold each and counting the rights;
    ``extra_use``: the body also adds the threshold to the count (not only compared)."""
    b = lz.Builder()
    x = b.input("x", (features,), "float64")
    wide = lz.concat([x, lz.where(lz.isnan(x), lz.const(fill, "float64"), x)], axis=1)
    columns = b.param(RNG.integers(0, 2 * features, len(t)).astype(np.int32), "columns")
    bounds = b.param(t, "bounds")

    def body(i, carry, table, column, bound):  # type: ignore[no-untyped-def]
        value = lz.take(table, lz.take(column, i, axis=0), axis=1)
        right = lz.cast(value > lz.take(bound, i, axis=0), "float64")
        if extra_use:
            right = right + lz.take(bound, i, axis=0) * 0.0
        return carry + right

    zeros = lz.cast(lz.isnan(lz.reshape(x[:, :1], (lz.B,))), "float64") * 0.0  # (B,) of 0
    count = lz.fori_loop(len(t), body, zeros, wide, columns, bounds)
    return b.graph({"y": count})


@pytest.mark.parametrize(("fill", "narrows"), [(np.inf, True), (0.1, False)])
def test_a_loop_comparing_a_widened_table_with_thresholds_narrows_as_a_whole(
    fill: float, narrows: bool
) -> None:
    """The NaN copy's fill must be a float32 value for the table to narrow (0.1 is not: the
    select widens, and the loop keeps comparing float64)."""
    t = _thresholds(40)
    graph = _loop_graph(t, 5, fill)
    narrow = lz.narrowed(_program(graph), "x")
    assert (narrow is not None) == narrows
    x32 = _values(t, 5 * 400).reshape(400, 5)
    want = lz.evaluate(graph, {"x": x32.astype(np.float64)})["y"]
    if narrow is not None:
        (stage,) = narrow.program.stages
        (loop,) = [n for n in stage.graph.order if n.op is Op.LOOP]
        assert loop.inputs[1].dtype == "float32" and loop.inputs[3].dtype == "float32"
        np.testing.assert_array_equal(lz.evaluate(stage.graph, {"x": x32})["y"], want)
    options = lz.Options(backend="jax", dtype_policy=lz.DTypePolicy.X64, max_batch=512)
    compiled = lz.compile(_program(graph), options, narrow_input="x")
    for formulation in compiled.formulations:
        with compiled.pinned(formulation):
            np.testing.assert_array_equal(compiled({"x": x32})["y"], want)


def test_a_loop_that_reads_its_thresholds_otherwise_is_not_narrowed() -> None:
    t = _thresholds(10)
    assert lz.narrowed(_program(_loop_graph(t, 3, np.inf, extra_use=True)), "x") is None
