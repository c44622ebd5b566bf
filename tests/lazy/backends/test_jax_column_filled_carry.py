"""A loop whose body only replaces one column of its 2-D carry (the tree strategies' exit-leaf
tables) goes round with the carry transposed, so each trip writes one contiguous row instead of
a strided column. Structural checks on the compiled executable; the values are the parity
suite's (``filling_its_carry_column_by_column``)."""

from __future__ import annotations

import re

import numpy as np

import lazy as lz
from lazy.backends.jax_backend import LOWERING_REVISION, JaxBackend
from lazy.dtypes import DTypePolicy

ROWS, TREES = 64, 7


def _while_carries(body) -> list[str]:
    """The int32 2-D shapes the compiled executable's while loops carry."""
    b = lz.Builder()
    x = b.input("x", (3,))
    init = lz.cast(lz.take(x, lz.const(np.int32(0)), axis=1), "int32")[:, None] * np.zeros(
        (1, TREES), np.int32
    )
    out = lz.fori_loop(TREES, body, init, x)
    graph = b.graph({"out": out})
    exe, _ = JaxBackend().compile(graph, ROWS, DTypePolicy.X32)
    hlo = exe.compiled.as_text()
    return [
        shape
        for line in hlo.splitlines()
        if " while(" in line
        for shape in re.findall(r"s32\[(\d+,\d+)\]", line.split(" while(")[0])
    ]


def _leaf(i, x):
    return lz.cast(lz.take(x, lz.const(np.int32(1)), axis=1) > 0.0, "int32") + i


def test_a_column_filled_carry_goes_round_transposed() -> None:
    def fill(i, leaves, x):
        return lz.update(leaves, i, _leaf(i, x), axis=1)

    assert _while_carries(fill) == [f"{TREES},{ROWS}"]


def test_a_carry_the_body_also_reads_keeps_its_layout() -> None:
    def fill_reading(i, leaves, x):
        return lz.update(leaves, i, _leaf(i, x) + leaves[:, 0], axis=1)

    assert _while_carries(fill_reading) == [f"{ROWS},{TREES}"]


def test_the_lowering_revision_keys_the_cache() -> None:
    """Executables persisted before the transposed carries (revision 2) are not reused."""
    assert LOWERING_REVISION >= 3
    assert f"lowering={LOWERING_REVISION}" in JaxBackend().fingerprint()
