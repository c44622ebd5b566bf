"""The numpy backend's own guarantees, beyond per-op parity (``test_parity.py`` runs every op on it):
generated straight-line code, lowered dtypes kept, no views of the caller's arrays returned, and
float errors silent, as on a device."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import lazy as lz
from tests.lazy.conftest import scaler_logreg


def _compile(graph: lz.Graph, bucket: int) -> tuple[lz.backends.Executable, tuple[np.ndarray, ...]]:
    backend = lz.get_backend("numpy")
    exe, _ = backend.compile(graph, bucket, lz.DTypePolicy.X32)
    return exe, backend.prepare_params(graph.param_values(), lz.DTypePolicy.X32)


def test_a_graph_runs_as_one_generated_function_of_its_inputs_and_params() -> None:
    graph = scaler_logreg()
    exe, params = _compile(graph, 4)
    assert exe.source.startswith("def plan(") and "for " not in exe.source  # straight-line
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    proba, label = exe([x], params)
    want = lz.evaluate(graph, {"x": x})
    assert proba.dtype == np.float32 and label.dtype == np.int32
    np.testing.assert_allclose(proba, want["proba"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(label, want["label"])


def test_results_keep_the_lowered_dtype_where_numpy_would_promote() -> None:
    b = lz.Builder()
    x = b.input("x", (3,), "float64")  # X32 lowers float64 to float32, int64 to int32
    counts = lz.sum(lz.cast(x > 0.0, "int64"), axis=1)
    scaled = x * lz.const(np.array([2.0, 3.0, 4.0]))
    exe, params = _compile(b.graph({"n": counts, "s": scaled}), 2)
    n, s = exe([np.array([[1, -1, 2], [0, 0, 0]], np.float32)], params)
    assert n.dtype == np.int32 and s.dtype == np.float32
    np.testing.assert_array_equal(n, [2, 0])


def test_outputs_never_alias_the_callers_rows() -> None:
    b = lz.Builder()
    x = b.input("x", (2, 3))
    exe, params = _compile(b.graph({"flat": lz.reshape(x, (lz.B, 6)), "same": x}), 2)
    rows = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    flat, same = exe([rows], params)
    rows[:] = -1.0  # the caller reuses its buffer
    np.testing.assert_array_equal(flat, np.arange(12).reshape(2, 6))
    np.testing.assert_array_equal(same, np.arange(12).reshape(2, 2, 3))


def test_float_errors_give_ieee_values_without_warnings() -> None:
    b = lz.Builder()
    x = b.input("x", (2,))
    exe, params = _compile(b.graph({"log": lz.log(x), "inv": 1.0 / x, "exp": lz.exp(x * 100.0)}), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log, inv, exp = exe([np.array([[0.0, -1.0]], np.float32)], params)
    assert log[0, 0] == -np.inf and np.isnan(log[0, 1])
    assert inv[0, 0] == np.inf and exp[0, 0] == 1.0


def test_loops_run_as_python_loops_over_the_bodys_own_function() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    out = lz.fori_loop(4, lambda i, carry, step: carry + step, x, x)  # x + 4x
    exe, params = _compile(b.graph({"y": out}), 2)
    x0 = np.ones((2, 3), np.float32)
    (y,) = exe([x0], params)
    np.testing.assert_array_equal(y, 5 * x0)


def test_leaves_are_arguments_not_kernels() -> None:
    from lazy.backends.numpy_backend import RULES

    node = scaler_logreg().inputs[0]
    with pytest.raises(lz.BackendError, match="leaf"):
        RULES[lz.Op.INPUT](node, None)  # type: ignore[arg-type]


def test_signed_integers_are_index_type_inside_and_lowered_at_the_edges() -> None:
    b = lz.Builder()
    codes = b.input("codes", (), "int32")
    table = b.param(np.array([[10, 11], [20, 21], [30, 31]], np.int64), "table")
    picked = lz.take(table, codes, axis=0)  # (B, 2)
    exe, params = _compile(b.graph({"picked": picked, "codes": codes + 1}), 2)
    assert all(p.dtype == np.intp for p in params)
    assert "a0 = a0.astype('int64')" in exe.source  # widened once, on entry
    out, shifted = exe([np.array([2, 0], np.int32)], params)
    assert out.dtype == np.int32 and shifted.dtype == np.int32  # the lowered dtype, returned
    np.testing.assert_array_equal(out, [[30, 31], [10, 11]])
    np.testing.assert_array_equal(shifted, [3, 1])


def test_ctz_counts_in_the_lowered_width_not_the_widened_one() -> None:
    b = lz.Builder()
    x = b.input("x", (), "int32")
    exe, params = _compile(b.graph({"n": lz.ctz(x)}), 4)
    (n,) = exe([np.array([0, 1, 8, -(2**31)], np.int32)], params)
    np.testing.assert_array_equal(n, [32, 0, 3, 31])


@pytest.mark.parametrize("rows", [1, 3])
def test_row_wise_gathers_are_one_flat_gather(rows: int) -> None:
    b = lz.Builder()
    data = b.input("data", (5,))
    idx = b.input("idx", (4,), "int32")
    graph = b.graph({"y": lz.take_along(data, idx, axis=1)})
    exe, params = _compile(graph, rows)
    rng = np.random.default_rng(rows)
    d = rng.standard_normal((rows, 5)).astype(np.float32)
    i = rng.integers(0, 5, (rows, 4)).astype(np.int32)
    (y,) = exe([d, i], params)
    np.testing.assert_array_equal(y, np.take_along_axis(d, i, axis=1))


def test_elementwise_steps_reuse_dead_buffers_but_never_the_callers_or_a_live_view() -> None:
    b = lz.Builder()
    x = b.input("x", (4,))
    w = b.param(np.full(4, 2.0, np.float32), "w")
    h = x * w  # a fresh buffer, dead after the next step: reused
    flat = lz.reshape(h + 1.0, (lz.B, 2, 2))  # a view of h + 1, read again below
    y = lz.exp(h + 1.0)  # h + 1 is live through its view: not reused
    graph = b.graph({"y": y, "flat": flat})
    exe, params = _compile(graph, 3)
    assert "out=a0" not in exe.source and "out=p0" not in exe.source
    assert exe.source.count("out=") >= 1
    rows = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    before = rows.copy()
    got_y, got_flat = exe([rows], params)
    np.testing.assert_array_equal(rows, before)
    np.testing.assert_array_equal(params[0], np.full(4, 2.0, np.float32))
    want = lz.evaluate(graph, {"x": rows})
    np.testing.assert_allclose(got_y, want["y"], rtol=1e-6)
    np.testing.assert_allclose(got_flat, want["flat"], rtol=1e-6)


def test_a_plan_runs_fewer_rows_than_its_bucket_unpadded() -> None:
    b = lz.Builder()
    x = b.input("x", (6,))
    idx = b.input("idx", (2,), "int32")
    w = b.param(np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32), "w")
    cube = lz.reshape(x @ w, (lz.B, 2, 2))  # rows stay rows, as many as the call has
    wide = lz.broadcast_to(lz.reshape(lz.sum(x, axis=1), (lz.B, 1)), (lz.B, 3))
    looped = lz.fori_loop(2, lambda i, h, d: h + d, x, x)
    picked = lz.take_along(x, idx, axis=1)
    graph = b.graph({"cube": cube, "wide": wide, "looped": looped, "picked": picked})
    exe, params = _compile(graph, 8)
    assert exe.any_rows
    rng = np.random.default_rng(2)
    for rows in (1, 5, 8):
        feed = {
            "x": rng.standard_normal((rows, 6)).astype(np.float32),
            "idx": rng.integers(0, 6, (rows, 2)).astype(np.int32),
        }
        got = dict(zip(graph.output_names, exe([feed["x"], feed["idx"]], params), strict=True))
        want = lz.evaluate(graph, feed)
        for name, value in want.items():
            assert got[name].shape == value.shape, (rows, name)
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_plan_that_broadcasts_a_parameter_to_rows_keeps_its_bucket() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    bias = b.param(np.arange(3, dtype=np.float32), "bias")
    graph = b.graph({"y": x + lz.broadcast_to(bias, (lz.B, 3))})  # that many rows are baked in
    exe, _ = _compile(graph, 8)
    assert not exe.any_rows


def test_host_routed_calls_are_not_padded(cache) -> None:
    graph = scaler_logreg()
    compiled = lz.compile(graph, lz.Options(backend="numpy", max_batch=8), cache).graphs[0]
    x = np.random.default_rng(3).standard_normal((5, 6)).astype(np.float32)
    got = compiled({"x": x})
    assert compiled.stats.padded_rows == 0
    want = lz.evaluate(graph, {"x": x})
    np.testing.assert_allclose(got["proba"], want["proba"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["label"], want["label"])
