"""The JAX lowering's row blocks: a bucket larger than ``row_block`` rows runs as a loop over
blocks of rows (the last row repeated to fill the last block), with the same results as one
pass — every graph keeps rows apart. Checked against the interpreter on buckets that split
evenly, unevenly and not at all."""

from __future__ import annotations

import numpy as np
import pytest

import lazy as lz
from lazy.backends.jax_backend import ROW_BLOCK, JaxBackend


def program() -> lz.Program:
    """Row-wise work of several kinds: a matmul, a gather by the row's own values, a loop."""
    b = lz.Builder()
    x = b.input("x", (4,))
    codes = b.input("codes", (2,), "int32")
    w = b.param(np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0, "w")
    table = b.param(np.array([1.5, -2.0, 0.25], np.float32), "table")
    h = x @ w + lz.take(table, codes, axis=0)[:, :1]
    picked = lz.take_along(h, codes, axis=1)
    looped = lz.fori_loop(3, lambda i, acc, h: acc * 0.5 + h, h, h)
    return b.build({"h": h, "picked": picked, "looped": looped, "flag": x[:, :2] > 0.0})


@pytest.mark.parametrize("row_block", [1, 3, 8])
def test_blocked_buckets_match_the_interpreter(row_block: int) -> None:
    prog = program()
    options = lz.Options(backend=JaxBackend(row_block=row_block), max_batch=10)
    compiled = lz.compile(prog, options, cache=lz.ExecutableCache(), warmup=False)
    rng = np.random.default_rng(row_block)
    for rows in (1, 3, 4, 7, 8, 10):  # buckets 1, 4, 4, 8, 8, 10
        inputs = {
            "x": rng.standard_normal((rows, 4)).astype(np.float32),
            "codes": rng.integers(0, 3, (rows, 2)).astype(np.int32),
        }
        expected = lz.run_program(prog, inputs)
        got = compiled(inputs)
        for name, want in expected.items():
            assert got[name].shape == want.shape, name
            np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)


def test_the_block_size_is_part_of_the_fingerprint() -> None:
    assert JaxBackend().row_block == ROW_BLOCK
    assert "row_block=3" in JaxBackend(row_block=3).fingerprint()
    assert JaxBackend(row_block=3).fingerprint() != JaxBackend().fingerprint()


def test_a_block_needs_a_row() -> None:
    with pytest.raises(ValueError, match="row_block must be >= 1, got 0"):
        JaxBackend(row_block=0)
