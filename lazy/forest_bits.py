"""FOREST_SUM by bit-vectors on the host: batches of rows through forests of small trees.

The walk (:func:`lazy.forest.native`) follows one path per (row, tree): a few loads and a
branch per level, and the branch goes either way, so the CPU mispredicts about half of them.
For a batch, comparing *every* split of a tree against a block of rows costs less where trees
are small: a split's test is a compare, a select and an AND over contiguous rows, which vector
units run 8-16 rows at a time with no branch at all. This is QuickScorer's evaluation (the same
as the compiler's ``bitvector`` strategy, :mod:`compiler.trees.quickscorer`): number a tree's
leaves left to right; a split whose test sends the row right rules out its left subtree's
leaves; the exit leaf is the lowest leaf nothing rules out, the lowest set bit of the AND of
the false splits' masks.

Tables are derived from FOREST_SUM's own node tables, so the op's meaning is untouched: a node
reached after ``depth`` steps counts as a leaf there (where the walk stops), the NaN direction
picks which copy of a feature a split compares (the row as is, NaN as +inf, or isnan as 0/1 —
as :mod:`compiler.trees.splits` widens features), and trees are summed in the walk's order, so
the result is bit-identical. Trees of up to 64 leaves qualify (two 32-bit mask words; a split's
left subtree is one entry per word it covers); larger ones keep the walk.

XGBoost 100 trees of depth 6 (50 features), 10k rows, one thread: 2.9 ms against the walk's
~40 ms and XGBoost's own predict at 11 ms.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import native as _native
from .forest import check_tables

WORD_BITS = 32
MAX_WORDS = 2
ALL_ONES = np.uint32(0xFFFFFFFF)
#: Entries of a (tree, word) group are evaluated four at a time: one pass over the block's mask
#: words per four splits (unrolled in the kernel; groups are padded with entries that keep all).
UNROLL = 4
#: Rows per block: the block's feature columns and mask words stay in L1/L2 while every tree
#: reads them (1024 measured best of 256-2048).
BLOCK_ROWS = 1024
#: Copies of a feature a split may compare (see the module docstring).
RAW, NAN_AS_INF, ISNAN = 0, 1, 2


@dataclass(frozen=True)
class BitTables:
    """A forest as bit-vector entries. Entry ``e`` of tree ``t``'s word-``w`` group (entries
    ``starts[t * words + w]`` to ``starts[t * words + w + 1]``) compares block column
    ``column[e]`` with ``threshold[e]`` and, where greater, ANDs ``mask[e]`` into word ``w``.
    Block column ``c`` is copy ``sources[c, 1]`` of feature ``sources[c, 0]``. Tree ``t``'s
    leaf ``j`` holds ``leaf_value[:, t * words * 32 + j]``."""

    sources: np.ndarray  # (C, 2) int64
    column: np.ndarray  # (E,) int64
    threshold: np.ndarray  # (E,) the features' dtype
    mask: np.ndarray  # (E,) uint32
    starts: np.ndarray  # (T * words + 1,) int64
    leaf_value: np.ndarray  # (K, T * words * 32) the values' dtype
    words: int


def _tree_leaves(
    root: int, left: np.ndarray, depth: int, limit: int
) -> tuple[list[int], list[tuple[int, int, int]]] | None:
    """Leaves (node ids, left to right) and splits (node, first leaf of its left subtree, first
    of its right) of the tree at ``root``, cut at ``depth``; None past ``limit`` leaves."""
    leaves: list[int] = []
    splits: list[tuple[int, int, int]] = []
    stack: list[tuple[int, int, int]] = [(root, 0, -1)]  # (node, level, split to close or -1)
    while stack:
        node, level, close = stack.pop()
        if close >= 0:  # the split's right subtree starts here
            n, lo, _ = splits[close]
            splits[close] = (n, lo, len(leaves))
            continue
        if left[node] == node or level == depth:
            leaves.append(node)
            if len(leaves) > limit:
                return None
            continue
        splits.append((node, len(leaves), -1))
        following = int(left[node])
        stack += [(following + 1, level + 1, -1), (-1, 0, len(splits) - 1)]
        stack.append((following, level + 1, -1))
    return leaves, splits


def build(
    x_width: int,
    feature: np.ndarray,
    threshold: np.ndarray,
    nan_right: np.ndarray,
    left: np.ndarray,
    value: np.ndarray,
    *,
    trees: int,
    depth: int,
) -> BitTables | None:
    """The bit tables of FOREST_SUM's node tables, or None where they do not qualify (a tree of
    more than 64 leaves, or tables the walk would reject: it raises the error itself)."""
    try:
        check_tables(np.empty((0, x_width)), feature, left, trees)
    except IndexError:
        return None
    walks = []
    for t in range(trees):
        walk = _tree_leaves(t, left, depth, MAX_WORDS * WORD_BITS)
        if walk is None:
            return None
        walks.append(walk)
    words = max(1, -(-max(len(leaves) for leaves, _ in walks) // WORD_BITS))
    slots = words * WORD_BITS
    sources: dict[tuple[int, int], int] = {}
    column: list[int] = []
    cut: list[float] = []
    mask: list[int] = []
    starts = [0]
    leaf_value = np.zeros((value.shape[1], trees * slots), value.dtype)
    for t, (leaves, splits) in enumerate(walks):
        leaf_value[:, t * slots : t * slots + len(leaves)] = value[leaves].T
        by_word: list[list[tuple[int, float, int]]] = [[] for _ in range(words)]
        for node, lo, mid in splits:
            c, th = _compare(int(feature[node]), float(threshold[node]), bool(nan_right[node]))
            source = sources.setdefault(c, len(sources))
            for w in range(lo // WORD_BITS, (mid - 1) // WORD_BITS + 1):
                first, last = max(lo, w * WORD_BITS), min(mid, (w + 1) * WORD_BITS)
                cleared = ((1 << (last - first)) - 1) << (first - w * WORD_BITS)
                by_word[w].append((source, th, 0xFFFFFFFF & ~cleared))
        for entries in by_word:
            entries += [(0, 0.0, 0xFFFFFFFF)] * (-len(entries) % UNROLL)
            for source, th, m in entries:
                column.append(source)
                cut.append(th)
                mask.append(m)
            starts.append(len(column))
    return BitTables(
        sources=np.array(list(sources) or np.empty((0, 2)), np.int64).reshape(-1, 2),
        column=np.array(column, np.int64),
        threshold=np.array(cut, threshold.dtype),
        mask=np.array(mask, np.uint32),
        starts=np.array(starts, np.int64),
        leaf_value=leaf_value,
        words=words,
    )


def _compare(feature: int, threshold: float, nan_right: bool) -> tuple[tuple[int, int], float]:
    """(feature, copy) and threshold such that ``copy > threshold`` is the walk's "go right"."""
    if not nan_right:
        return (feature, RAW), threshold  # NaN > t is false: left
    if threshold < np.inf:  # (NaN thresholds fail this too: only NaN goes right of them)
        return (feature, NAN_AS_INF), threshold
    return (feature, ISNAN), 0.5


def evaluate(x: np.ndarray, tables: BitTables) -> np.ndarray:
    """FOREST_SUM of ``x`` (B, F) by ``tables``: (B, K) in the leaf values' dtype."""
    out = np.empty((x.shape[0], tables.leaf_value.shape[0]), tables.leaf_value.dtype)
    _kernel()(
        x,
        tables.sources,
        tables.column,
        tables.threshold,
        tables.mask,
        tables.starts,
        tables.leaf_value,
        tables.words,
        BLOCK_ROWS,
        out,
    )
    return out


class Cached:
    """The bit tables of the node tables last given, rebuilt when other tables arrive (a plan
    runs with the same parameter arrays every call; a strong reference would keep them alive)."""

    def __init__(self, trees: int, depth: int) -> None:
        self._trees, self._depth = trees, depth
        self._entry: tuple[tuple[weakref.ref[np.ndarray], ...], BitTables | None] | None = None

    def tables(self, operands: Sequence[np.ndarray]) -> BitTables | None:
        x, *node_tables = operands
        entry = self._entry  # one read: another thread may replace it meanwhile
        if entry is not None and all(
            ref() is array for ref, array in zip(entry[0], node_tables, strict=True)
        ):
            return entry[1]
        feature, threshold, nan_right, left, value = node_tables
        built = build(
            x.shape[1],
            feature,
            threshold,
            nan_right,
            left,
            value,
            trees=self._trees,
            depth=self._depth,
        )
        self._entry = (tuple(weakref.ref(a) for a in node_tables), built)
        return built


@functools.cache
def _kernel() -> Callable[..., None]:
    def evaluate(x, sources, column, threshold, mask, starts, leaf_value, words, block, out):  # type: ignore[no-untyped-def]
        n = x.shape[0]
        n_columns, width = sources.shape[0], leaf_value.shape[0]
        trees = (starts.shape[0] - 1) // words
        slots = words * 32
        one, all_ones = np.uint32(1), np.uint32(0xFFFFFFFF)
        xt = np.empty((max(n_columns, 1), block), x.dtype)
        reach = np.empty((words, block), np.uint32)
        low = np.empty(block, np.float32)  # the lowest set bit, whose exponent is its index
        exponent = low.view(np.int32)
        slot = np.empty(block, np.int64)
        acc = np.empty((width, block), out.dtype)
        for s0 in range(0, n, block):
            m = min(block, n - s0)
            for c in range(n_columns):  # the block's columns, each copy the splits compare
                f, copy, col = sources[c, 0], sources[c, 1], xt[c]
                if copy == 0:
                    for r in range(m):
                        col[r] = x[s0 + r, f]
                elif copy == 1:
                    for r in range(m):
                        v = x[s0 + r, f]
                        col[r] = np.inf if v != v else v
                else:
                    for r in range(m):
                        v = x[s0 + r, f]
                        col[r] = 1.0 if v != v else 0.0
            acc[:, :m] = 0
            for t in range(trees):
                for w in range(words):
                    word = reach[w]
                    word[:m] = all_ones
                    g = t * words + w
                    for e in range(starts[g], starts[g + 1], 4):
                        c0, c1, c2, c3 = (
                            xt[column[e]],
                            xt[column[e + 1]],
                            xt[column[e + 2]],
                            xt[column[e + 3]],
                        )
                        t0, t1, t2, t3 = (
                            threshold[e],
                            threshold[e + 1],
                            threshold[e + 2],
                            threshold[e + 3],
                        )
                        m0, m1, m2, m3 = mask[e], mask[e + 1], mask[e + 2], mask[e + 3]
                        for r in range(m):
                            # a split that sends the row right ANDs its mask; else all ones
                            word[r] &= (
                                (m0 | (np.uint32(c0[r] > t0) - one))
                                & (m1 | (np.uint32(c1[r] > t1) - one))
                                & (m2 | (np.uint32(c2[r] > t2) - one))
                                & (m3 | (np.uint32(c3[r] > t3) - one))
                            )
                first, last = reach[0], reach[words - 1]
                base = t * slots - 127  # 127: float32's exponent bias
                for r in range(m):
                    w0 = first[r]
                    bits = w0 if w0 != 0 else last[r]
                    bits |= np.uint32(bits == 0)  # never 0 (the exit leaf's bit); bounds regardless
                    low[r] = np.float32(bits & (np.uint32(0) - bits))
                    slot[r] = base if w0 != 0 else base + 32 * (words - 1)
                for r in range(m):
                    slot[r] += exponent[r] >> 23
                for k in range(width):
                    values, into = leaf_value[k], acc[k]
                    for r in range(m):
                        into[r] += values[slot[r]]
            for k in range(width):
                for r in range(m):
                    out[s0 + r, k] = acc[k, r]

    return _native.compile_kernel(evaluate)
