"""A loop invariant read column by column goes in transposed with its rows padded to an odd
number of cache lines: power-of-two buckets would otherwise start every row a multiple of 4 KB
apart, on the same L1 sets. The padding is invisible: reads see the row's own length."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import lazy as lz
from lazy.backends.jax_backend import LOWERING_REVISION, JaxBackend, _column_major


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("rows", [1, 3, 16, 1000, 1024, 4096])
def test_rows_span_an_odd_number_of_cache_lines(rows: int, dtype: type) -> None:
    x = np.arange(rows * 5).reshape(rows, 5).astype(dtype)
    moved, length = _column_major(jnp.asarray(x), 1)
    assert length == rows
    row_bytes = moved.shape[1] * moved.dtype.itemsize
    assert row_bytes % 64 == 0 and (row_bytes // 64) % 2 == 1
    assert moved.shape[1] - rows < 2 * 64 // moved.dtype.itemsize  # at most two lines added
    np.testing.assert_array_equal(np.asarray(moved)[:, :rows], x.T)


def test_higher_rank_invariants_are_only_moved() -> None:
    x = jnp.zeros((1024, 3, 2), jnp.float32)
    moved, length = _column_major(x, 1)
    assert moved.shape == (3, 1024, 2) and length == 2


@pytest.mark.parametrize("rows", [1024, 1000])
def test_padded_column_reads_match_the_interpreter(rows: int) -> None:
    b = lz.Builder()
    x = b.input("x", (6,))
    cols = b.param(np.array([5, 0, 3, 3, 1, 2], np.int32), "cols")
    acc = lz.take(x, lz.take(cols, lz.const(np.int32(0))), axis=1) * 0.0

    # A comparison per column read, as a bit-vector tree reads its split columns.
    def body(i, acc, x, cols):
        return acc + lz.cast(lz.take(x, lz.take(cols, i), axis=1) > 0.0, "float32")

    out = lz.fori_loop(6, body, acc, x, cols)
    program = b.build({"out": out})
    data = np.random.default_rng(0).standard_normal((rows, 6)).astype(np.float32)
    expected = lz.run_program(program, {"x": data})["out"]
    compiled = lz.compile(program, lz.Options(backend="jax", max_batch=1024), warmup=False)
    np.testing.assert_allclose(compiled({"x": data})["out"], expected, rtol=1e-6)


def test_the_lowering_revision_keys_the_cache() -> None:
    """Executables persisted before the padding (revision 1) are not reused by this lowering."""
    assert LOWERING_REVISION >= 2
    assert f"lowering={LOWERING_REVISION}" in JaxBackend().fingerprint()
