"""The native replay of stacked steps is numpy's replay bit for bit: every kind of step, in
float64 and float32 tables, on NaN, infinities, signed zeros, huge and tiny values, and a row
count that is not a whole number of blocks."""

from __future__ import annotations

import numpy as np
import pytest

from compiler import replay_kernel
from compiler.features import Arithmetic, Clip, Fill
from lazy import native

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="numba is not installed")

STEPS = {
    "standard": lambda c: (Fill(c[0]), Arithmetic(np.subtract, c[1]), Arithmetic(np.divide, c[2])),
    "standard-in-dtype": lambda c: (
        Fill(c[0]),
        Arithmetic(np.subtract, c[1], True),
        Arithmetic(np.divide, c[2], True),
    ),
    "minmax-clip": lambda c: (
        Arithmetic(np.multiply, c[2]),
        Arithmetic(np.add, c[1]),
        Clip(-0.25, 1.0),
    ),
    "fill-only": lambda c: (Fill(c[0]),),
    "in-dtype-product": lambda c: (
        Arithmetic(np.multiply, c[2], True),
        Arithmetic(np.add, c[1], True),
    ),
}


def _table(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 50.0, (rows, 5)).round(rng.integers(0, 4))
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, -1e-300, 5e-324, 3.4e38, 1e-45]
    x[: len(special), 1] = special
    x[rng.random((rows, 5)) < 0.1] = np.nan
    x[:, 3] = rng.integers(0, 3, rows)  # a repeated integer column
    return x


def _numpy(x: np.ndarray, sources: np.ndarray, steps: list[tuple], float32_table: bool):
    dtype = np.float32 if float32_table else np.float64
    out = []
    for source, column_steps in zip(sources, steps, strict=True):
        v = x[:, source].astype(dtype)
        for step in column_steps:
            v = step(v)
        out.append(v.astype(np.float32))
    return np.stack(out)


@pytest.mark.parametrize("float32_table", [False, True], ids=["float64", "float32"])
@pytest.mark.parametrize("kind", sorted(STEPS))
def test_the_native_replay_is_numpys_bit_for_bit(kind: str, float32_table: bool) -> None:
    rows = 3 * replay_kernel.BLOCK + 17
    x = _table(rows, 0)
    if float32_table:  # the values a float32 table holds, exact in float64
        with np.errstate(over="ignore"):
            x = x.astype(np.float32).astype(np.float64)
    sources = np.array([1, 0, 3, 4, 1], np.int64)
    rng = np.random.default_rng(1)
    constants = [(rng.normal(0, 9), rng.normal(0, 30), rng.uniform(1e-3, 40)) for _ in sources]
    constants[0] = (0.0, 1e-7, 3e-9)  # tiny scales: huge quotients
    steps = [STEPS[kind](c) for c in constants]
    codes = replay_kernel.opcodes(steps[0])
    params = np.zeros((len(steps[0]), len(sources), 2))
    for j, column in enumerate(steps):
        for s, step in enumerate(column):
            params[s, j, : len(step.params)] = step.params
    with np.errstate(all="ignore"):
        want = _numpy(x, sources, steps, float32_table)
    # Written into columns of a wider output (a block with other groups), the rest untouched.
    got = np.full((rows, len(sources) + 2), 7.0, np.float32)
    columns = np.array([5, 0, 2, 3, 1], np.int64)
    replay_kernel.replay(x, sources, codes, params, float32_table, got, columns)
    assert got[:, columns].T.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert (got[:, [4, 6]] == 7.0).all()
    # The same columns as rows of a (F, B) matrix (a table that arrived column by column).
    apart = np.full_like(got, 7.0)
    by_rows = np.ascontiguousarray(x.T)
    replay_kernel.replay(
        by_rows, sources, codes, params, float32_table, apart, columns, by_rows=True
    )
    assert apart.view(np.uint32).tolist() == got.view(np.uint32).tolist()


def test_unknown_steps_have_no_opcodes() -> None:
    assert replay_kernel.opcodes([Arithmetic(np.power, 2.0)]) is None
    assert replay_kernel.opcodes([object()]) is None


def test_the_built_kernel_serves_every_table_a_client_can_send() -> None:
    """``build`` (run as the server starts) leaves no kernel for a request to compile: a table
    that is read-only (backed by a client's bytes), Fortran-ordered or a strided view replays on
    the kernels it built, to the same values."""
    replay_kernel.build()
    kernel = replay_kernel._built()
    built = set(kernel.signatures)
    table = _table(300, 7)
    read_only = table.copy()
    read_only.flags.writeable = False
    wide = np.repeat(table, 2, axis=1)
    steps = STEPS["standard"]((0.5, 1.5, 2.5))
    codes = replay_kernel.opcodes(steps)
    params = np.array([[[s.params[0] if s.params else 0.0, 0.0]] for s in steps])
    expected = np.empty((300, 1), np.float32)
    replay_kernel.replay(table, np.array([2]), codes, params, False, expected, np.array([0]))
    for variant, column in ((read_only, 2), (np.asfortranarray(table), 2), (wide[:, ::2], 2)):
        out = np.empty((300, 1), np.float32)
        replay_kernel.replay(variant, np.array([column]), codes, params, False, out, np.array([0]))
        np.testing.assert_array_equal(out, expected)
    assert set(kernel.signatures) == built, "a table compiled a replay kernel build() does not"
