"""FOREST_SHAP's host kernel (lazy.treeshap): the native kernel is the reference, and corrupt
tables (a model is untrusted input) raise instead of reading outside the arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import lazy as lz
from lazy import native, treeshap


def _tables(seed: int = 0) -> dict[str, np.ndarray]:
    """Nine leaves of 0 to 5 elements over 4 features, two tests each on 6 columns."""
    rng = np.random.default_rng(seed)
    count = rng.integers(0, 6, 9)
    elements = int(count.sum())
    nodes, weights = np.full((9, 3), 0.5), np.zeros((9, 3))
    for leaf, m in enumerate(count):
        t, w = np.polynomial.legendre.leggauss(max(1, -(-int(m) // 2)))
        nodes[leaf, : len(t)], weights[leaf, : len(t)] = (t + 1) / 2, w / 2
    return {
        "column": rng.integers(0, 6, (elements, 2)).astype(np.int32),
        "threshold": rng.choice([-0.5, 0.0, 0.5], (elements, 2)),
        "right": rng.random((elements, 2)) < 0.5,
        "player": rng.integers(0, 4, elements).astype(np.int32),
        "zero": rng.uniform(0.0, 1.0, elements),  # a zero fraction of 0 included
        "offsets": np.concatenate([[0], np.cumsum(count)]).astype(np.int32),
        "value": rng.normal(size=(9, 3)),
        "nodes": nodes,
        "weights": weights,
    }


def _rows(n: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    x = rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0], (n, 6))
    x[rng.random((n, 6)) < 0.1] = np.nan
    return x


@pytest.mark.skipif(not native.AVAILABLE, reason="numba is not installed")
@pytest.mark.parametrize("rows", [1, 63, 64, 65, 300])  # around the kernel's row blocks
def test_the_native_kernel_is_the_reference(rows: int) -> None:
    tables, x = _tables(), _rows(rows)
    want = treeshap.reference(x, **tables, players=4)
    got = treeshap.native(4)(x, *tables.values())
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert got.shape == (rows, 4, 3) and got.dtype == np.float64


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"column": lambda c: c + 6}, "test column outside"),
        ({"player": lambda p: p - 1}, "outside the features explained"),
        ({"offsets": lambda o: o[::-1].copy()}, "not ascending"),
        ({"offsets": lambda o: o[:-1]}, "disagree in length"),
    ],
)
def test_corrupt_tables_raise(change: dict[str, Any], message: str) -> None:
    tables, x = _tables(), _rows(5)
    ((name, corrupt),) = change.items()
    tables[name] = corrupt(tables[name])
    with pytest.raises(lz.BackendError, match=message):
        treeshap.reference(x, **tables, players=4)
    if native.AVAILABLE:
        with pytest.raises(lz.BackendError, match=message):
            treeshap.native(4)(x, *tables.values())
