"""Calls above max_batch: large buckets for cheap graphs, aligned chunks, one result array."""

from __future__ import annotations

import numpy as np

import lazy as lz
from lazy.executor import (
    CALL_BYTES,
    DENSE_CALL_BYTES,
    DENSE_FLOPS_PER_BYTE,
    MAX_LARGE_BUCKETS,
    aligned_start,
    call_rows_for,
    matmul_flops,
    row_bytes,
)


def _x(rows: int, offset_bytes: int = 0, features: int = 6) -> np.ndarray:
    """Rows starting ``offset_bytes`` past a 64-byte boundary."""
    buf = np.empty(rows * features * 4 + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset_bytes
    x = buf[start : start + rows * features * 4].view(np.float32).reshape(rows, features)
    x[...] = np.random.default_rng(rows).standard_normal((rows, features))
    return x


def _wide() -> lz.Graph:
    b = lz.Builder()
    x = b.input("x", (6,))
    w = b.param(np.ones((6, 8192), np.float32), "w")
    return b.graph({"y": lz.tanh(x @ w)})


def test_call_rows_follow_the_bytes_a_row_needs(graph) -> None:
    policy = lz.DTypePolicy.X32
    assert row_bytes(graph, policy) < CALL_BYTES // (64 << MAX_LARGE_BUCKETS)
    assert call_rows_for(graph, policy, 64) == 64 << MAX_LARGE_BUCKETS  # cheap rows: capped
    assert row_bytes(_wide(), policy) >= 2 * 8192 * 4  # the product and its tanh
    assert call_rows_for(_wide(), policy, 64) == 64  # wide rows: max_batch, as before


def _mlp() -> lz.Graph:
    """50 -> 100 -> 100 -> 1, as scikit-learn's MLPClassifier((100, 100)) scores a binary task."""
    rng = np.random.default_rng(0)
    b = lz.Builder()
    h = b.input("x", (50,))
    for fan_in, fan_out in ((50, 100), (100, 100)):
        w = b.param(rng.standard_normal((fan_in, fan_out)).astype(np.float32), f"w{fan_in}")
        h = lz.maximum(h @ w + b.param(np.zeros(fan_out, np.float32), f"b{fan_in}"), 0.0)
    return b.graph({"y": lz.sigmoid(h @ b.param(np.ones((100, 1), np.float32), "w_out"))})


def test_compute_bound_graphs_take_the_dense_budget() -> None:
    policy = lz.DTypePolicy.X32
    mlp = _mlp()
    assert matmul_flops(mlp) == 2 * (50 * 100 + 100 * 100 + 100 * 1)
    assert matmul_flops(mlp) >= DENSE_FLOPS_PER_BYTE * row_bytes(mlp, policy)
    rows = call_rows_for(mlp, policy, 1024, dense_calls=True)
    assert rows * row_bytes(mlp, policy) <= DENSE_CALL_BYTES < 2 * rows * row_bytes(mlp, policy)
    assert rows > CALL_BYTES // row_bytes(mlp, policy)  # more than the memory-bound budget
    assert call_rows_for(mlp, policy, 1024, dense_calls=False) == 1024
    assert lz.get_backend("jax").dense_calls and not lz.get_backend("torch").dense_calls
    # A loop's products count once per trip.
    b = lz.Builder()
    x, w = b.input("x", (4,)), b.param(np.eye(4, dtype=np.float32), "w")
    looped = b.graph({"y": lz.fori_loop(3, lambda i, h, w: h @ w, x, w)})
    assert matmul_flops(looped) == 3 * 2 * 4 * 4
    # A wide product of 6 features does 1.5 FLOPs per byte it keeps: memory-bound.
    assert matmul_flops(_wide()) < DENSE_FLOPS_PER_BYTE * row_bytes(_wide(), policy)


def test_a_large_call_runs_fewer_chunks_with_the_same_results(graph, cache) -> None:
    large = lz.compile(graph, lz.Options(max_batch=8), cache).graphs[0]
    small = lz.compile(graph, lz.Options(max_batch=8, call_rows=8), cache).graphs[0]
    assert large.buckets.call_rows == 8 << MAX_LARGE_BUCKETS
    x = _x(1000)
    got, want = large({"x": x}), small({"x": x})
    assert small.stats.chunks == 125
    assert large.stats.chunks == 10  # 7 x 128, then 64 + 32 + 8 (aligned: no prefix chunk)
    assert large.stats.padded_rows == 0
    np.testing.assert_allclose(got["proba"], want["proba"], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got["label"], want["label"])


def test_unaligned_rows_run_aligned_chunks_after_a_short_prefix(graph, cache) -> None:
    compiled = lz.compile(graph, lz.Options(max_batch=8), cache).graphs[0]
    aligned, shifted = _x(1000), _x(1000, offset_bytes=16)
    shifted[...] = aligned
    assert aligned_start([aligned], 8) == 0
    assert aligned_start([shifted], 8) == 2  # 16 + 2 rows x 24 bytes = 64
    assert aligned_start([shifted[:, :5]], 8) == 0  # not contiguous: the backend copies it
    # Rows 0-1 ride with the padded tail: 998 = 7 x 128 + 64 + 32 + 6, the 6 with them in 8.
    before = compiled.stats.chunks
    got = compiled({"x": shifted})
    assert compiled.stats.chunks - before == 10
    want = compiled({"x": aligned})
    np.testing.assert_allclose(got["proba"], want["proba"], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got["label"], want["label"])
    # A tail that fills its bucket exactly is not padded: the two rows run on their own.
    aligned, shifted = _x(1002), _x(1002, offset_bytes=16)
    shifted[...] = aligned
    before = compiled.stats.chunks
    got = compiled({"x": shifted})  # 2, then 7 x 128 + 64 + 32 + 8
    assert compiled.stats.chunks - before == 11
    want = compiled({"x": aligned})
    np.testing.assert_allclose(got["proba"], want["proba"], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got["label"], want["label"])


def test_large_calls_compile_nothing_after_warmup(graph, cache) -> None:
    compiled = lz.compile(graph, lz.Options(max_batch=8), cache).graphs[0]
    warmed = dict(compiled.compiles)
    assert set(warmed) == {"warmup"}
    x = _x(3000, offset_bytes=8)
    for rows in (9, 100, 129, 1000, 2999):
        out = compiled({"x": x[:rows]})
        ref = lz.evaluate(compiled.source, {"x": x[:rows]})
        np.testing.assert_allclose(out["proba"], ref["proba"], rtol=1e-5, atol=1e-6)
    assert compiled.compiles == warmed


def test_executable_covers_large_buckets(graph, cache) -> None:
    compiled = lz.compile(graph, lz.Options(max_batch=8), cache).graphs[0]
    assert compiled.executable(100) is compiled.executable(128)
    assert compiled.executable(9) is not compiled.executable(8)
