"""FOREST_SUM on the host: the op's meaning in numpy, and the native kernel the numpy backend runs.

``lz.forest_sum`` walks node tables: tree ``t`` starts at node ``t``; at node ``n`` a walk stays
put if ``left[n] == n`` (a leaf), else it reads ``v = x[row, feature[n]]`` and moves to
``left[n] + 1`` if ``v > threshold[n]`` or (``v`` is NaN and ``nan_right[n]``), to ``left[n]``
otherwise; after at most ``depth`` steps the reached nodes' ``value`` rows are summed over trees,
one tree after another from +0 in ``value``'s dtype (the order some sources sum in: XGBoost).

:func:`reference` states that in whole-array numpy: the interpreter's rule, and the numpy
backend's where numba is missing. Vectorized, it pays a few numpy calls per level, more at one
row than ONNX Runtime's whole walk of a 100-tree model. :func:`native` is the same walk compiled
by numba: row by row, tree by tree, stopping at a leaf, with no per-level Python at all.

Tables come from the model, which the service treats as untrusted input: the native kernel checks
every index it follows before reading through it (a predictable branch, no measurable cost), so
a corrupt table raises instead of reading outside the arrays; the reference checks up front.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from . import forest_bits
from . import native as _native
from .errors import BackendError
from .node_tables import check_tables

#: Rows from which a batch goes through :mod:`lazy.forest_bits`: from here on its batch kernel
#: beats the row-by-row walk (docs/design-figures.md).
BIT_ROWS = 16

Walk = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], Any]


def reference(
    x: np.ndarray,
    feature: np.ndarray,
    threshold: np.ndarray,
    nan_right: np.ndarray,
    left: np.ndarray,
    value: np.ndarray,
    *,
    trees: int,
    depth: int,
) -> np.ndarray:
    """FOREST_SUM of ``x`` (B, F) in whole-array numpy: (B, K) in ``value``'s dtype."""
    check_tables(x, feature, left, trees)
    rows = np.arange(x.shape[0])[:, None]
    node = np.broadcast_to(np.arange(trees, dtype=left.dtype), (x.shape[0], trees))
    for _ in range(depth):
        following = left[node]
        v = x[rows, feature[node]]
        right = (v > threshold[node]) | (np.isnan(v) & nan_right[node])
        node = np.where(following == node, node, following + right)
    total = np.zeros((x.shape[0], value.shape[1]), value.dtype)
    for t in range(trees):  # in tree order, as the op states (not numpy's pairwise sum)
        total += value[node[:, t]]
    return total


def native(trees: int, depth: int) -> Walk:
    """FOREST_SUM of given ``trees`` and ``depth`` by the compiled kernels: a function of the six
    operands returning (B, K) in ``value``'s dtype. Needs :data:`lazy.native.AVAILABLE`.

    Batches of at least :data:`BIT_ROWS` rows go through the batch kernel (:mod:`lazy.forest_bits`:
    bit-vectors, then a compacted walk; the same sums), unless the tables do not suit it; the
    rest are walked row by row."""
    kernel = _kernel()

    def walk(*operands: np.ndarray) -> np.ndarray:
        # Rows writable and in C order, whatever view the graph hands over: numba compiles a
        # kernel per layout and per read-only flag, and each compile takes seconds on a cold
        # cache (:mod:`lazy.warm` builds the few that remain before a model needs them).
        x = operands[0]
        if not (x.flags.c_contiguous and x.flags.writeable):
            x = np.array(x, order="C")
            operands = (x, *operands[1:])
        _, feature, _, _, left, value = operands
        if x.shape[0] >= BIT_ROWS:
            tables = forest_bits.CACHE.tables(operands, trees, depth)
            if tables is not None:
                return forest_bits.evaluate(x, tables)
        out = np.zeros((x.shape[0], value.shape[1]), value.dtype)
        bad = kernel(*operands, trees, depth, out)
        if bad:
            try:
                check_tables(x, feature, left, trees)
            except IndexError as exc:
                raise BackendError(str(exc)) from None
            raise BackendError("FOREST_SUM node tables out of bounds")
        return out

    return walk


@functools.cache
def _kernel() -> Callable[..., int]:
    def walk(x, feature, threshold, nan_right, left, value, trees, depth, out):  # type: ignore[no-untyped-def]
        n_features, n_nodes, width = x.shape[1], left.shape[0], value.shape[1]
        # Indices are unsigned once checked: numba then skips its negative-index fix-up per load.
        for b in range(x.shape[0]):
            for t in range(trees):
                node = np.uint64(t)
                for _ in range(depth):
                    following = left[node]
                    if following == node:
                        break
                    column = feature[node]
                    if column < 0 or column >= n_features or following < 0:
                        return 1
                    if following >= n_nodes - 1:
                        return 1
                    v = x[b, np.uint64(column)]
                    if v > threshold[node] or (v != v and nan_right[node]):
                        following += 1
                    node = np.uint64(following)
                for j in range(width):
                    out[b, j] += value[node, j]
        return 0

    return _native.compile_kernel(walk)
