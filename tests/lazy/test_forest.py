"""FOREST_SUM's host implementations (``lazy.forest``): the native kernel against the whole-array
reference, bounds checks on corrupt tables, and the numpy backend's fallback without numba.
numba is a dependency of the project, so the native kernel is tested, never skipped."""

from __future__ import annotations

import numpy as np
import pytest

import lazy as lz
from lazy import forest, native
from tests.lazy.forest_tables import forest_tables


def _rows(rng: np.random.Generator, n: int, features: int, dtype: str) -> np.ndarray:
    # Values tie with the tables' thresholds; a fifth are NaN.
    x = rng.choice(np.array([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0, np.nan]), (n, features))
    return x.astype(dtype)


def _tables(seed: int, dtype: str, trees: int = 7, depth: int = 5) -> tuple[np.ndarray, ...]:
    feature, threshold, nan_right, left, _ = forest_tables(
        np.random.default_rng(seed), trees, depth, 6, 1
    )
    # Small integer leaf values: every sum is exact, so any order of summing agrees and equal
    # outputs mean equal leaves reached.
    value = np.random.default_rng(seed).integers(-50, 50, (len(left), 3)).astype(dtype)
    return feature, threshold.astype(dtype), nan_right, left, value


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [1, 37])
@pytest.mark.parametrize("depth", [0, 3, 5, 12])
def test_native_walk_reaches_the_reference_leaves(dtype: str, n: int, depth: int) -> None:
    for seed in range(4):
        tables = _tables(seed, dtype)
        x = _rows(np.random.default_rng(seed + 10), n, 6, dtype)
        want = forest.reference(x, *tables, trees=7, depth=depth)
        got = forest.native(7, depth)(x, *tables)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, want)


def test_native_walk_reads_strided_rows() -> None:
    tables = _tables(3, "float32")
    x = _rows(np.random.default_rng(3), 40, 12, "float32")[::2, ::2]  # a non-contiguous view
    want = forest.reference(x, *tables, trees=7, depth=5)
    np.testing.assert_array_equal(forest.native(7, 5)(x, *tables), want)


def _corrupt(what: str) -> tuple[np.ndarray, ...]:
    feature, threshold, nan_right, left, value = _tables(1, "float32")
    inner = np.flatnonzero(left != np.arange(len(left)))
    if what == "feature":
        feature = feature.copy()
        feature[inner[0]] = 6  # one past the last column (inner[0] is a root)
    elif what == "child":
        left = left.copy()
        left[inner[0]] = len(left) - 1  # its right child would be node N
    else:
        left = left.copy()
        left[inner[0]] = -3
    return feature, threshold, nan_right, left, value


@pytest.mark.parametrize("what", ["feature", "child", "negative child"])
def test_corrupt_tables_raise_instead_of_reading_outside(what: str) -> None:
    x = np.full((4, 6), 5.0, np.float32)  # above every threshold: the walks start at the roots
    tables = _corrupt(what)
    with pytest.raises(IndexError, match="outside"):
        forest.reference(x, *tables, trees=7, depth=5)
    with pytest.raises(lz.BackendError, match="outside"):
        forest.native(7, 5)(x, *tables)


def _graph(tables: tuple[np.ndarray, ...], depth: int) -> lz.Graph:
    b = lz.Builder()
    x = b.input("x", (6,))
    names = ("feature", "threshold", "nan_right", "left", "value")
    params = [b.param(t, name) for t, name in zip(tables, names, strict=True)]
    return b.graph({"y": lz.forest_sum(x, *params, trees=7, depth=depth)})


def test_numpy_backend_walks_in_numpy_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph(_tables(2, "float32"), 5)
    x = _rows(np.random.default_rng(2), 9, 6, "float32")
    want = lz.evaluate(graph, {"x": x})["y"]

    def no_native(trees: int, depth: int) -> None:
        raise AssertionError("the native kernel was used without numba")

    monkeypatch.setattr(native, "AVAILABLE", False)
    monkeypatch.setattr(forest, "native", no_native)
    options = lz.Options(backend="numpy", max_batch=16, host_rows=0)
    got = lz.compile(graph, options, warmup=False)({"x": x})["y"]
    np.testing.assert_array_equal(got, want)
