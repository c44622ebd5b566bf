"""Programs: compiled segments with host steps between them, against the reference interpreter."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import lazy as lz
from lazy.ops import TensorType

MAX_BATCH = 8
# Exact in float32, so that the host step sees the same keys from the interpreter and from JAX.
SCALE = np.array([2.0, 0.5, 1.0], np.float32)
LOOKUP = {-3: 0.5, -1: -1.0, 0: 2.0, 2: 0.25, 5: -4.0}


def lookup(scaled: np.ndarray) -> np.ndarray:
    """Host step: a Python dict lookup per element (not expressible as IR), one row per row."""
    vec = np.vectorize(lambda v: LOOKUP.get(int(np.floor(v)), 0.0), otypes=[np.float64])
    return vec(scaled[:, :2])


def rows(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Multiples of 1/8 away from integers after scaling: floor() agrees in float32 and float64.
    return (rng.integers(-16, 16, (n, 3)) + 0.375).astype(np.float32)


def build(
    host_fn: Callable[..., Any] = lookup,
    host_outputs: tuple[tuple[tuple[int, ...], str], ...] = (((2,), "float32"),),
    extra_outputs: bool = True,
) -> lz.Program:
    rng = np.random.default_rng(7)
    b = lz.Builder()
    x = b.input("x", (3,))
    log_scale = b.param(np.log(SCALE).astype(np.float32), "log_scale")
    w = b.param(rng.standard_normal((5, 4)).astype(np.float32), "w")
    bias = b.param(rng.standard_normal(4).astype(np.float32), "bias")
    shared = lz.exp(log_scale)  # parameter-only, used by both segments
    with lz.scope("scale"):
        scaled = x * shared
    (h,) = b.host(host_fn, [scaled], host_outputs, name="lookup")
    with lz.scope("model"):
        features = lz.concat([scaled - shared, h * shared[:2]], axis=1)
        proba = lz.softmax(features @ w + bias)
    outputs = {"proba": proba}
    if extra_outputs:
        outputs |= {"looked_up": h, "scaled": scaled}
    return b.build(outputs)


@pytest.fixture(scope="module")
def program() -> lz.Program:
    return build()


@pytest.fixture(scope="module")
def compiled(program: lz.Program) -> lz.CompiledProgram:
    options = lz.Options(max_batch=MAX_BATCH, call_rows=MAX_BATCH)  # chunks of MAX_BATCH rows
    return lz.compile(program, options, cache=lz.ExecutableCache())


def assert_matches(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=1e-6, err_msg=name)


# --- structure ----------------------------------------------------------------------------------


def test_program_has_two_graph_stages_around_one_host_stage(program: lz.Program) -> None:
    kinds = [type(s).__name__ for s in program.stages]
    assert kinds == ["GraphStage", "HostStage", "GraphStage"]
    assert len(program.graphs) == 2
    assert program.host_steps == ("lookup",)
    assert program.input_names == ("x",)
    assert program.output_names == ("proba", "looked_up", "scaled")
    host = program.stages[1]
    assert isinstance(host, lz.HostStage)
    assert host.fn is lookup
    first, second = program.graphs
    # Values cross the barrier by name: the scaled value into the host step, then into segment 2.
    (scaled_name,) = host.inputs
    assert scaled_name in first.output_names
    assert dict(program.outputs)["scaled"] == scaled_name
    ((host_name, _),) = host.outputs
    assert host_name in second.input_names
    assert set(second.input_names) <= {*first.output_names, host_name}
    for graph in program.graphs:
        lz.verify(graph)


def test_parameter_only_subgraphs_are_shared_by_both_segments(program: lz.Program) -> None:
    first, second = program.graphs
    exp_nodes = [[n for n in g.order if n.op is lz.Op.EXP] for g in (first, second)]
    assert len(exp_nodes[0]) == 1
    assert exp_nodes[0] == exp_nodes[1]  # the very same node, computed in each segment
    assert "log_scale" in first.params and "log_scale" in second.params
    np.testing.assert_array_equal(first.params["log_scale"], second.params["log_scale"])


# --- results ------------------------------------------------------------------------------------


def test_interpreter_runs_the_host_step(program: lz.Program) -> None:
    xs = rows(5)
    out = lz.run_program(program, {"x": xs})
    scaled = xs.astype(np.float64) * SCALE
    np.testing.assert_allclose(out["scaled"], scaled, rtol=1e-6)
    np.testing.assert_array_equal(out["looked_up"], lookup(scaled))
    assert out["looked_up"].dtype == np.float32  # the declared dtype of the host result
    np.testing.assert_allclose(out["proba"].sum(axis=1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("batch", [1, 3, 5, 8, 13, 20])
def test_compiled_program_matches_the_interpreter(
    program: lz.Program, compiled: lz.CompiledProgram, batch: int
) -> None:
    xs = rows(batch, seed=batch)
    want = lz.run_program(program, {"x": xs})
    assert compiled.ready
    before = sum(sum(g.compiles.values()) for g in compiled.graphs)

    got = compiled({"x": xs})

    assert_matches(got, want)
    assert sum(sum(g.compiles.values()) for g in compiled.graphs) == before  # no compile


def test_compiled_program_pads_and_chunks(compiled: lz.CompiledProgram) -> None:
    assert [len(g.buckets) for g in compiled.graphs] == [4, 4]  # 1, 2, 4, 8
    assert all(set(g.compiles) == {"warmup"} for g in compiled.graphs)
    stats = [g.stats for g in compiled.graphs]
    padded = [s.padded_rows for s in stats]
    chunks = [s.chunks for s in stats]

    compiled({"x": rows(19)})  # 8 + 8 + 3 rows: three chunks, the last one in the 4-row bucket

    assert [s.chunks for s in stats] == [c + 3 for c in chunks]
    # Padded to 4 on the device; a host plan takes the 3 rows as they are.
    on_host = [
        g.placements.get(4) is not None and g.placements[4].runs_on == "host"
        for g in compiled.graphs
    ]
    assert [s.padded_rows for s in stats] == [
        p + (0 if h else 1) for p, h in zip(padded, on_host, strict=True)
    ]


def test_an_output_that_is_only_a_host_result() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    (h,) = b.host(lookup, [x * 2.0], [((2,), "float32")], name="lookup")
    program = b.build({"h": h})
    assert [type(s).__name__ for s in program.stages] == ["GraphStage", "HostStage"]
    assert program.outputs == (("h", h.node.attr("name")),)

    xs = rows(6)
    want = lz.run_program(program, {"x": xs})
    np.testing.assert_array_equal(want["h"], lookup(xs.astype(np.float64) * 2.0))
    compiled = lz.compile(program, lz.Options(max_batch=MAX_BATCH), lz.ExecutableCache())
    assert_matches(compiled({"x": xs}), want)


def test_a_host_step_straight_on_an_input() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    (h,) = b.host(lambda a: a[:, :2] * 4.0, [x], [((2,), "float32")], name="times4")
    program = b.build({"y": h + 1.0})
    assert [type(s).__name__ for s in program.stages] == ["HostStage", "GraphStage"]
    (graph,) = program.graphs
    assert graph.input_names == (h.node.attr("name"),)

    xs = rows(3)
    want = lz.run_program(program, {"x": xs})
    np.testing.assert_array_equal(want["y"], xs[:, :2] * 4.0 + 1.0)
    compiled = lz.compile(program, lz.Options(max_batch=MAX_BATCH), lz.ExecutableCache())
    assert_matches(compiled({"x": xs}), want)


def test_work_that_does_not_need_the_host_result_runs_before_the_barrier() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    codes = b.input("codes", (), "int32")
    (h,) = b.host(lambda a: a[:, :2] * 4.0, [x], [((2,), "float32")], name="times4")
    table = b.param(np.arange(10, dtype=np.float32).reshape(5, 2), "table")
    program = b.build({"y": h + lz.take(table, codes)})
    assert [type(s).__name__ for s in program.stages] == ["GraphStage", "HostStage", "GraphStage"]
    first, second = program.graphs
    assert any(n.op is lz.Op.TAKE for n in first.order)
    assert not any(n.op is lz.Op.TAKE for n in second.order)

    inputs = {"x": rows(5), "codes": np.array([0, 4, 2, 2, 1], np.int32)}
    want = lz.run_program(program, inputs)
    np.testing.assert_array_equal(
        want["y"], inputs["x"][:, :2] * 4.0 + np.arange(10).reshape(5, 2)[inputs["codes"]]
    )
    compiled = lz.compile(program, lz.Options(max_batch=MAX_BATCH), lz.ExecutableCache())
    assert_matches(compiled(inputs), want)


# --- host steps that break their contract -------------------------------------------------------

BAD_HOSTS: dict[str, tuple[Callable[..., Any], str]] = {
    "too-few-rows": (lambda s: lookup(s)[:-1], "returned shape"),
    "too-many-rows": (lambda s: np.concatenate([lookup(s), lookup(s)]), "returned shape"),
    "wrong-row-shape": (lambda s: lookup(s)[:, :1], "returned shape"),
    "wrong-rank": (lambda s: lookup(s)[:, :, None], "returned shape"),
    "two-values-for-one": (lambda s: (lookup(s), lookup(s)), "returned 2 values"),
}


@pytest.fixture(params=list(BAD_HOSTS), ids=list(BAD_HOSTS))
def bad_program(request: pytest.FixtureRequest) -> Iterator[tuple[lz.Program, str]]:
    fn, match = BAD_HOSTS[request.param]
    yield build(host_fn=fn, extra_outputs=False), match


def test_a_misbehaving_host_step_raises_input_error_in_the_interpreter(
    bad_program: tuple[lz.Program, str],
) -> None:
    program, match = bad_program
    with pytest.raises(lz.InputError, match=rf"host step 'lookup' {match}"):
        lz.run_program(program, {"x": rows(4)})


def test_a_misbehaving_host_step_raises_input_error_when_compiled(
    bad_program: tuple[lz.Program, str],
) -> None:
    program, match = bad_program
    compiled = lz.compile(
        program, lz.Options(max_batch=MAX_BATCH), lz.ExecutableCache(), warmup=False
    )
    with pytest.raises(lz.InputError, match=rf"host step 'lookup' {match}"):
        compiled({"x": rows(4)})


def test_missing_program_inputs_raise_input_error(program: lz.Program) -> None:
    with pytest.raises(lz.InputError, match="missing inputs"):
        lz.run_program(program, {"y": rows(2)})


def test_host_steps_need_batched_lazy_inputs() -> None:
    b = lz.Builder()
    b.input("x", (3,))
    p = b.param(np.ones(3, np.float32), "p")
    with pytest.raises(lz.GraphError, match="batched lazy inputs"):
        b.host(lookup, [p], [((2,), "float32")], name="bad")
    with pytest.raises(lz.GraphError, match="batched lazy inputs"):
        b.host(lookup, [], [((2,), "float32")], name="bad")


def test_a_trace_with_host_steps_is_not_a_graph() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    (h,) = b.host(lookup, [x], [((2,), "float32")], name="lookup")
    with pytest.raises(lz.GraphError, match="build"):
        b.graph({"h": h})


# -- which input columns a program reads --------------------------------------------------------
def _picking(pick: Callable[[lz.LazyTensor], lz.LazyTensor]) -> lz.Program:
    b = lz.Builder()
    x = b.input("x", (6,))
    return b.build({"y": pick(x)})


def test_columns_read_through_static_slices_and_constant_gathers() -> None:
    program = _picking(
        lambda x: lz.concat(
            [
                lz.slice_axis(x, 1, 1, 3),
                lz.take(x, lz.const(np.asarray([5, -1], np.int32)), axis=1),
            ],
            axis=1,
        )
    )
    assert program.columns_read("x") == frozenset({1, 2, 5})


@pytest.mark.parametrize(
    "pick",
    [
        lambda x: x * 2.0,  # every column
        lambda x: lz.sum(x, axis=1),
        lambda x: x,  # the input itself is an output
    ],
    ids=["elementwise", "reduction", "identity"],
)
def test_any_other_use_reads_every_column(pick: Callable[[lz.LazyTensor], lz.LazyTensor]) -> None:
    assert _picking(pick).columns_read("x") is None


def test_reads_the_optimizer_removes_are_not_reads_of_the_optimized_program() -> None:
    """A cast of the whole table, concatenated with another input and sliced back to that
    input's columns only, reads every column as traced and none once simplified."""
    b = lz.Builder()
    x = b.input("x", (4,))
    other = b.input("other", (2,))
    joined = lz.concat([lz.cast(x, "float32"), other], axis=1)
    program = b.build({"y": lz.slice_axis(joined, 1, 4, 6) * 2.0})
    assert program.columns_read("x") is None
    assert program.columns_read("x", optimized=True) == frozenset()
    assert program.columns_read("other", optimized=True) is None  # read whole, elementwise


def test_a_host_step_on_the_input_reads_every_column() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    (out,) = b.host(lambda v: v.copy(), [x], [((3,), "float32")], "copy")
    program = b.build({"y": lz.slice_axis(out, 1, 0, 1)})
    assert program.columns_read("x") is None


def test_output_types_are_what_the_compiled_program_returns(
    program: lz.Program, compiled: lz.CompiledProgram
) -> None:
    types = program.output_types()
    assert types == {
        "proba": TensorType((lz.B, 4), "float32"),
        "looked_up": TensorType((lz.B, 2), "float32"),  # a host step's declared type
        "scaled": TensorType((lz.B, 3), "float32"),
    }
    got = compiled({"x": rows(5)})
    for name, (shape, dtype) in types.items():
        assert got[name].shape == (5, *shape[1:]) and got[name].dtype == dtype, name
