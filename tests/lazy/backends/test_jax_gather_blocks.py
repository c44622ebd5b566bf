"""Graphs that gather from batched rows inside a loop (tree walks) take row blocks sized so the
gathered rows fit ``GATHER_BLOCK_BYTES``; other graphs keep the backend's ``row_block``. Results
match the interpreter whatever the blocking."""

from __future__ import annotations

import numpy as np

import lazy as lz
from lazy.backends.jax_backend import GATHER_BLOCK_BYTES, JaxBackend, gather_row_block
from lazy.dtypes import DTypePolicy

WIDTH = 512  # float32 columns: 2 KiB rows, so a block of GATHER_BLOCK_BYTES holds 128 → 256 rows


def walk(nested: bool) -> lz.Program:
    """A per-row pointer walk over the columns of ``x``: ``j = next[j] + (x[j] > 0)``."""
    b = lz.Builder()
    x = b.input("x", (WIDTH,))
    nxt = b.param((np.arange(WIDTH) * 7 % (WIDTH - 1)).astype(np.int32), "next")

    def step(i: lz.LazyTensor, j: lz.LazyTensor, x: lz.LazyTensor, nxt: lz.LazyTensor):
        v = lz.reshape(lz.take_along(x, lz.reshape(j, (lz.B, 1)), axis=1), (lz.B,))
        return lz.take(nxt, j, axis=0) + lz.cast(v > 0.0, "int32")

    start = lz.cast(lz.reshape(x[:, :1], (lz.B,)) > 0.0, "int32")
    if nested:
        j = lz.fori_loop(2, lambda k, j, x, nxt: lz.fori_loop(3, step, j, x, nxt), start, x, nxt)
    else:
        j = lz.fori_loop(6, step, start, x, nxt)
    return b.build({"j": j})


def only_graph(prog: lz.Program) -> lz.Graph:
    (graph,) = prog.graphs
    return graph


def test_loops_that_gather_from_rows_take_smaller_blocks() -> None:
    rows = max(256, GATHER_BLOCK_BYTES // (WIDTH * 4))
    for nested in (False, True):
        graph = only_graph(walk(nested))
        assert gather_row_block(graph, DTypePolicy.X32, 16384) == rows
        assert gather_row_block(graph, DTypePolicy.X32, 100) == 100  # never above row_block
    b = lz.Builder()
    x = b.input("x", (WIDTH,))
    plain = only_graph(b.build({"y": lz.fori_loop(3, lambda i, acc: acc * 0.5, x)}))
    assert gather_row_block(plain, DTypePolicy.X32, 16384) == 16384


def test_gather_blocks_match_the_interpreter() -> None:
    prog = walk(nested=True)
    options = lz.Options(backend=JaxBackend(), max_batch=700)
    compiled = lz.compile(prog, options, cache=lz.ExecutableCache(), warmup=False)
    x = np.random.default_rng(0).standard_normal((700, WIDTH)).astype(np.float32)
    np.testing.assert_array_equal(compiled({"x": x})["j"], lz.run_program(prog, {"x": x})["j"])
