"""Subnormal inputs on a backend that flushes them (XLA:CPU): found by their bits, and their
rows answered as numpy answers them, the rest of the batch untouched."""

from __future__ import annotations

import numpy as np
import pytest

import lazy as lz
from lazy import subnormals

F32 = np.float32
TINY32 = float(np.finfo(F32).smallest_subnormal)  # 1.4e-45
NORMAL32 = float(np.finfo(F32).smallest_normal)  # 1.2e-38


@pytest.mark.parametrize("numba", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_subnormal_rows_are_found_by_their_bits(dtype, numba, monkeypatch) -> None:
    monkeypatch.setattr(subnormals.native, "AVAILABLE", numba and subnormals.native.AVAILABLE)
    info = np.finfo(dtype)
    largest_subnormal = np.nextafter(info.smallest_normal, dtype(0))
    values = {
        "zero": [0.0, -0.0, 1.0],
        "smallest": [0.0, info.smallest_subnormal, 1.0],
        "negative": [-info.smallest_subnormal, 2.0, 3.0],
        "largest": [largest_subnormal, 0.0, 0.0],
        "normal": [info.smallest_normal, -info.smallest_normal, info.max],
        "special": [np.nan, np.inf, -np.inf],
    }
    rows = np.array(list(values.values()), dtype)
    assert subnormals.subnormal_rows([rows]).tolist() == [1, 2, 3]
    # Rows of rank-3 inputs, several inputs, integer inputs (never subnormal) alongside.
    cube = np.zeros((6, 2, 2), dtype)
    cube[4, 1, 0] = info.smallest_subnormal
    codes = np.arange(6, dtype=np.int32)[:, None]
    found = subnormals.subnormal_rows([rows[[0, 4, 5, 0, 0, 0]], cube, codes])
    assert found.tolist() == [4]
    assert subnormals.subnormal_rows([rows[[0, 4, 5]], codes[:3]]) is None
    assert subnormals.subnormal_rows([np.empty((0, 3), dtype)]) is None


def test_flushing_is_measured_per_backend() -> None:
    assert subnormals.flushes(lz.get_backend("numpy"), lz.DTypePolicy.X32) is False
    jax = lz.get_backend("jax")
    # XLA:CPU sets flush-to-zero; XLA:GPU keeps subnormals unless --xla_gpu_ftz asks.
    assert subnormals.flushes(jax, lz.DTypePolicy.X32) is (jax.device.platform == "cpu")


def _split_at_zero() -> lz.Graph:
    """A stump at 0.0 and a product: the split sees a subnormal's sign, the product its size."""
    b = lz.Builder()
    x = b.input("x", (2,))
    left = x[:, 0] <= b.param(np.zeros((), F32), "threshold")
    side = lz.where(left, b.param(np.ones((), F32), "one"), b.param(np.full((), 2, F32), "two"))
    return b.graph({"side": side, "scaled": x[:, 1] * b.param(np.full((), 1e30, F32), "big")})


def test_rows_holding_a_subnormal_are_answered_as_numpy_answers_them() -> None:
    graph = _split_at_zero()
    device = lz.compile(graph, lz.Options(max_batch=8, call_rows=8, host_rows=0))
    flushes = subnormals.flushes(device.graphs[0].backend, lz.DTypePolicy.X32)
    host = lz.compile(graph, lz.Options(max_batch=8, call_rows=8, backend="numpy"))
    x = np.array(
        [[TINY32, 1.0], [0.0, 2.0], [-TINY32, NORMAL32], [1.0, TINY32], [NORMAL32, -1.0]], F32
    )
    got, want = device({"x": x}), host({"x": x})
    assert got["side"].tolist() == [2, 1, 1, 2, 2] == want["side"].tolist()
    np.testing.assert_array_equal(got["scaled"], want["scaled"])  # 1.4e-45 * 1e30, not 0
    assert device.graphs[0].stats.subnormal_rows == (3 if flushes else 0)
    # The other rows are the device's own answers, bit for bit: as if asked alone.
    alone = device({"x": x[[1, 4]]})
    np.testing.assert_array_equal(got["scaled"][[1, 4]], alone["scaled"])


def test_only_inputs_reaching_a_decision_outside_a_sum_are_checked() -> None:
    b = lz.Builder()
    split = b.input("split", (2,))  # scaled, then compared: checked
    dense = b.input("dense", (3,))  # only through a matmul to an argmax: not checked
    cast = b.input("cast", (1,))  # cast to a boolean: 1e-45 is True, flushed it is False
    scaled = (split - b.param(np.ones(2, F32), "mean")) * b.param(np.ones(2, F32), "scale")
    logits = dense @ b.param(np.ones((3, 2), F32), "w")
    graph = b.graph(
        {
            "side": scaled > 0,
            "label": lz.argmax(logits),
            "code": lz.cast(cast, "bool"),
        }
    )
    assert subnormals.decision_inputs(graph) == {"split", "cast"}


LARGEST_SUB32 = float(np.nextafter(F32(NORMAL32), F32(0)))
COMPARISONS = {
    "gt": lambda a, b: a > b,
    "le": lambda a, b: a <= b,
    "lt": lambda a, b: a < b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


def _compared(compare, t: np.ndarray, param_left: bool) -> lz.Graph:
    """``x`` against the thresholds ``t`` (a (K,) parameter) twice: gathered per column, and
    read as a loop invariant gathered inside the body (as the tree walks read theirs)."""
    b = lz.Builder()
    x = b.input("x", (len(t),))
    param = b.param(t, "t")
    wide = lz.take(param, lz.const(np.arange(len(t), dtype=np.int32)), axis=0)

    def step(i, carry, x, t):
        read, column = lz.take(t, i, axis=0), lz.take(x, i, axis=1)
        hit = compare(read, column) if param_left else compare(column, read)
        return lz.update(carry, i, lz.cast(hit, "float32"), axis=1)

    looped = lz.fori_loop(len(t), step, x * 0.0, x, param)
    direct = compare(wide, x) if param_left else compare(x, wide)
    return b.graph({"direct": lz.cast(direct, "float32"), "looped": looped})


@pytest.mark.parametrize("param_left", [False, True], ids=["x-op-t", "t-op-x"])
@pytest.mark.parametrize("op", sorted(COMPARISONS))
def test_subnormal_thresholds_order_every_input_as_numpy_does(op: str, param_left: bool) -> None:
    """A flushing backend reads a subnormal threshold as zero, and zero lies on its other side:
    the device graph's comparisons read it moved off the subnormals (both signs, the smallest
    and the largest), and every input, the subnormal ones too, is decided as numpy decides."""
    t = np.array([-TINY32, TINY32, -LARGEST_SUB32, LARGEST_SUB32, 0.0, 1.0], F32)
    values = [0.0, -0.0, TINY32, -TINY32, LARGEST_SUB32, -LARGEST_SUB32, NORMAL32, -NORMAL32, 1.0]
    x = np.repeat(np.array(values, F32)[:, None], len(t), axis=1)
    graph = _compared(COMPARISONS[op], t, param_left)
    device = lz.compile(graph, lz.Options(max_batch=16, call_rows=16, host_rows=0))
    host = lz.compile(graph, lz.Options(max_batch=16, call_rows=16, backend="numpy"))
    got, want = device({"x": x}), host({"x": x})
    for head in ("direct", "looped"):
        np.testing.assert_array_equal(got[head], want[head], err_msg=head)
    compiled = device.graphs[0]
    if subnormals.flushes(compiled.backend, lz.DTypePolicy.X32):
        moved = compiled.graph.params["t"]
        assert not np.any((moved != 0) & (np.abs(moved) < NORMAL32))
        assert compiled.host_graph.params["t"].tobytes() == t.tobytes()  # the host's own


def test_parameters_with_other_uses_keep_their_subnormals() -> None:
    """Moved only where every use is a comparison rounding one way: not an arithmetic operand,
    not a threshold compared from both sides."""
    t = np.array([-TINY32, TINY32], F32)
    b = lz.Builder()
    x = b.input("x", (2,))
    shifted = b.param(t, "shifted")
    both_ways = b.param(t, "both_ways")
    alone = b.param(t, "alone")
    graph = b.graph(
        {
            "a": x > shifted,
            "b": x + shifted,
            "c": (x > both_ways) & (x < both_ways),
            "d": (x > alone) | (x <= lz.reshape(alone, (1, 2))),
        }
    )
    jax = lz.get_backend("jax")
    if not subnormals.flushes(jax, lz.DTypePolicy.X32):
        pytest.skip("this backend keeps subnormals: nothing is moved")
    moved = subnormals.for_flushing(graph, jax, lz.DTypePolicy.X32).params
    assert moved["shifted"].tobytes() == moved["both_ways"].tobytes() == t.tobytes()
    assert moved["alone"].tolist() == [-NORMAL32, 0.0]
    # A backend that keeps subnormals (the host) gets the graph as it is.
    assert subnormals.for_flushing(graph, lz.get_backend("numpy"), lz.DTypePolicy.X32) is graph
