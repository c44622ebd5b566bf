"""FOREST_SUM by bit-vectors (``lazy.forest_bits``): the same sums as the walk, bit for bit, on
every edge the walk has — NaN directions, infinite and NaN thresholds, the depth cut, one and
two mask words — and the walk wherever the tables do not qualify."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import lazy as lz
from lazy import forest, forest_bits
from tests.lazy.forest_tables import forest_tables, level_major

THRESHOLDS = np.array([-np.inf, -1.0, 0.0, 0.5, 1.0, np.inf, np.nan])
VALUES = np.array([-np.inf, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, np.inf, np.nan])


def perfect_tables(
    rng: np.random.Generator,
    trees: int,
    depth: int,
    k: int,
    dtype: str,
    extra: int = 0,
    thresholds: np.ndarray = THRESHOLDS,
) -> tuple[np.ndarray, ...]:
    """Level-major tables of ``trees`` perfect trees of ``depth`` (2**depth leaves each), the
    first tree with ``extra`` more leaves (its first leaves split once more)."""
    left = level_major(trees, depth + 2, lambda d, i: d < depth or (d == depth and i < extra))
    n = len(left)
    return (
        rng.integers(0, 5, n),
        rng.choice(thresholds, n).astype(dtype),
        rng.random(n) < 0.5,
        left,
        rng.integers(-50, 50, (n, k)).astype(dtype),  # exact sums: equal means same leaves
    )


def rows(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    return rng.choice(VALUES, (n, 5)).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("depth", "extra", "words"), [(3, 0, 1), (5, 0, 1), (5, 1, 2), (6, 0, 2)])
def test_every_edge_sums_as_the_walk(dtype: str, depth: int, extra: int, words: int) -> None:
    rng = np.random.default_rng(depth + extra)
    tables = perfect_tables(rng, 6, depth, 3, dtype, extra)
    bits = forest_bits.build(5, *tables, trees=6, depth=depth + 1)
    assert bits is not None and bits.words == words
    x = rows(rng, forest_bits.BLOCK_ROWS + 37, dtype)  # a full block and a partial one
    want = forest.reference(x, *tables, trees=6, depth=depth + 1)
    got = forest_bits.evaluate(x, bits)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("depth", [3, 6, 9])
def test_float64_splits_decide_values_one_float64_step_apart(depth: int) -> None:
    """float64 tables compare in float64: exact where float32 compares could not tell the
    values apart (cuts a float64 step apart, rows on and beside them), with cuts reached both
    by the bit-vector tops and by the walk below them."""
    rng = np.random.default_rng(depth)
    base = np.array([0.1, 1 / 3, -2.5, 1e6 + 0.1, 0.0])
    close = np.concatenate([base, np.nextafter(base, np.inf), np.nextafter(base, -np.inf)])
    cuts = np.concatenate([close, [-np.inf, np.inf, np.nan]])
    tables = perfect_tables(rng, 8, depth, 2, "float64", thresholds=cuts)
    bits = forest_bits.build(5, *tables, trees=8, depth=depth + 1)
    assert bits is not None
    around = np.concatenate([close, np.nextafter(close, np.inf), np.nextafter(close, -np.inf)])
    values = np.concatenate([around, [-np.inf, np.inf, np.nan, -0.0]])
    x = rng.choice(values, (2 * forest_bits.BLOCK_ROWS + 5, 5))
    want = forest.reference(x, *tables, trees=8, depth=depth + 1)
    np.testing.assert_array_equal(forest_bits.evaluate(x, bits), want)
    assert not np.array_equal(
        forest.reference(
            x.astype(np.float32).astype(np.float64), *tables, trees=8, depth=depth + 1
        ),
        want,
    )  # what float32 values would have decided


@pytest.mark.parametrize("cut", [1, 2, 4])
def test_a_node_at_the_depth_cut_counts_as_a_leaf(cut: int) -> None:
    rng = np.random.default_rng(cut)
    tables = perfect_tables(rng, 4, 5, 2, "float32")
    x = rows(rng, 300, "float32")
    bits = forest_bits.build(5, *tables, trees=4, depth=cut)
    assert bits is not None and bits.words == 1
    np.testing.assert_array_equal(
        forest_bits.evaluate(x, bits), forest.reference(x, *tables, trees=4, depth=cut)
    )


def test_random_forests_sum_as_the_walk() -> None:
    for seed in range(6):
        rng = np.random.default_rng(seed)
        feature, threshold, nan_right, left, _ = forest_tables(rng, 9, 6, 5, 1)
        value = rng.integers(-50, 50, (len(left), 2)).astype(np.float32)
        tables = (feature, threshold.astype(np.float32), nan_right, left, value)
        x = rows(rng, 500, "float32")
        want = forest.reference(x, *tables, trees=9, depth=6)
        bits = forest_bits.build(5, *tables, trees=9, depth=6)
        assert bits is not None
        np.testing.assert_array_equal(forest_bits.evaluate(x, bits), want)


@pytest.mark.parametrize(("depth", "extra"), [(6, 1), (9, 0), (12, 5)])
def test_larger_trees_walk_below_a_bit_vector_top(depth: int, extra: int) -> None:
    rng = np.random.default_rng(depth)
    tables = perfect_tables(rng, 3, depth, 2, "float32", extra=extra)  # over 64 leaves
    bits = forest_bits.build(5, *tables, trees=3, depth=depth + 1)
    assert bits is not None and bits.words == 1 and bits.deep.all()
    x = rows(rng, forest_bits.BLOCK_ROWS + 11, "float32")
    want = forest.reference(x, *tables, trees=3, depth=depth + 1)
    np.testing.assert_array_equal(forest_bits.evaluate(x, bits), want)
    for cut in (3, 7):  # the depth cut above or below the top's
        bits = forest_bits.build(5, *tables, trees=3, depth=cut)
        want = forest.reference(x, *tables, trees=3, depth=cut)
        np.testing.assert_array_equal(forest_bits.evaluate(x, bits), want)


def test_tables_that_share_subtrees_keep_the_walk() -> None:
    # Both nodes of every pair lead to the next pair: a walk of depth d has 2**d paths, which
    # derived tables would have to spell out. The walk runs them as they are.
    pairs = 12
    left = np.arange(2 * pairs + 1)  # the last pair: leaves
    left[0] = 1
    for p in range(pairs - 1):
        left[2 * p + 1] = left[2 * p + 2] = 2 * p + 3
    rng = np.random.default_rng(5)
    n = len(left)
    tables = (
        rng.integers(0, 5, n),
        rng.choice(THRESHOLDS, n).astype(np.float32),
        rng.random(n) < 0.5,
        left,
        rng.integers(-50, 50, (n, 1)).astype(np.float32),
    )
    assert forest_bits.build(5, *tables, trees=1, depth=pairs + 1) is None
    x = rows(rng, 64, "float32")
    np.testing.assert_array_equal(
        forest.native(1, pairs + 1)(x, *tables),
        forest.reference(x, *tables, trees=1, depth=pairs + 1),
    )


def test_native_scores_batches_by_bits_and_single_rows_by_walking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(1)
    tables = perfect_tables(rng, 5, 4, 1, "float32")
    calls: list[int] = []
    evaluate = forest_bits.evaluate

    def counting(x: np.ndarray, bits: forest_bits.BatchTables) -> np.ndarray:
        calls.append(len(x))
        return evaluate(x, bits)

    monkeypatch.setattr(forest_bits, "evaluate", counting)
    walk = forest.native(5, 4)
    for n in (1, forest.BIT_ROWS - 1, forest.BIT_ROWS, 200):
        x = rows(rng, n, "float32")
        np.testing.assert_array_equal(
            walk(x, *tables), forest.reference(x, *tables, trees=5, depth=4)
        )
    assert calls == [forest.BIT_ROWS, 200]


def test_tables_are_built_once_per_forest() -> None:
    rng = np.random.default_rng(2)
    tables = perfect_tables(rng, 4, 3, 1, "float32")
    cached = forest_bits.Cached()
    x = rows(rng, 20, "float32")
    first = cached.tables((x, *tables), 4, 3)
    assert first is not None and cached.tables((x, *tables), 4, 3) is first
    copies = tuple(t.copy() for t in tables)  # what compiling a plan runs it on: same content
    assert cached.tables((x, *copies), 4, 3) is first
    assert cached.tables((x, *tables), 4, 2) is not first  # another depth: other tables
    other = (tables[0], tables[1] + 1, *tables[2:])  # new thresholds: new tables
    rebuilt = cached.tables((x, *other), 4, 3)
    assert rebuilt is not first
    np.testing.assert_array_equal(
        forest_bits.evaluate(x, rebuilt), forest.reference(x, *other, trees=4, depth=3)
    )


def test_tables_go_with_the_forest() -> None:
    rng = np.random.default_rng(6)
    cached = forest_bits.Cached()
    tables = perfect_tables(rng, 4, 7, 1, "float32")
    x = rows(rng, 20, "float32")
    built = weakref.ref(cached.tables((x, *tables), 4, 8))
    cached.tables((x, *(t.copy() for t in tables)), 4, 8)  # a dry run's copies: gone at once
    assert len(cached) == 1 and built() is not None
    del tables
    gc.collect()
    assert len(cached) == 0
    for _ in range(cached.RECENT):  # other forests push it out of the recently built
        other = perfect_tables(rng, 4, 7, 1, "float32")
        cached.tables((x, *other), 4, 8)
    gc.collect()
    assert built() is None


@pytest.mark.parametrize("depth", [4, 8])  # all top, and a walk below the top
def test_trees_add_only_to_the_outputs_they_hold(depth: int) -> None:
    # Boosting's layout: tree t holds class t % 3 only. Skipping the others is exact, -0.0
    # leaves included (sums start at +0.0); a NaN leaf is held.
    rng = np.random.default_rng(depth)
    feature, threshold, nan_right, left, value = perfect_tables(rng, 6, depth, 3, "float32")
    tree_of = np.full(len(left), -1)
    tree_of[:6] = np.arange(6)
    for n in range(len(left)):  # children inherit their parent's tree
        if left[n] != n:
            tree_of[left[n]] = tree_of[left[n] + 1] = tree_of[n]
    value = np.where(np.arange(3) == (tree_of % 3)[:, None], value, np.float32(-0.0))
    value[np.flatnonzero(tree_of == 4)[-1], 0] = np.nan  # tree 4 holds class 1, and a NaN in 0
    tables = (feature, threshold, nan_right, left, value)
    bits = forest_bits.build(5, *tables, trees=6, depth=depth + 1)
    starts = bits.output_starts.tolist()
    held = [bits.outputs[starts[t] : starts[t + 1]].tolist() for t in range(6)]
    assert held == [[0], [1], [2], [0], [0, 1], [2]]
    x = rows(rng, 300, "float32")
    want = forest.reference(x, *tables, trees=6, depth=depth + 1)
    np.testing.assert_array_equal(forest_bits.evaluate(x, bits), want)


def test_strided_rows() -> None:
    rng = np.random.default_rng(3)
    tables = perfect_tables(rng, 4, 4, 2, "float32")
    x = rows(rng, 400, "float32")
    wide = np.zeros((400, 10), np.float32)
    wide[:, ::2] = x
    view = wide[:, ::2]  # a non-contiguous view
    bits = forest_bits.build(5, *tables, trees=4, depth=4)
    np.testing.assert_array_equal(
        forest_bits.evaluate(view, bits), forest.reference(x, *tables, trees=4, depth=4)
    )


@pytest.mark.parametrize("what", ["feature", "child", "negative child"])
def test_corrupt_tables_do_not_qualify_and_the_walk_raises(what: str) -> None:
    rng = np.random.default_rng(4)
    feature, threshold, nan_right, left, value = perfect_tables(rng, 3, 3, 1, "float32")
    if what == "feature":
        feature = feature.copy()
        feature[0] = 5  # one past the last column
    elif what == "child":
        left = left.copy()
        left[0] = len(left) - 1  # its right child would be node N
    else:
        left = left.copy()
        left[0] = -3
    tables = (feature, threshold, nan_right, left, value)
    assert forest_bits.build(5, *tables, trees=3, depth=3) is None
    x = np.full((100, 5), 5.0, np.float32)
    with pytest.raises(lz.BackendError, match="outside"):
        forest.native(3, 3)(x, *tables)
