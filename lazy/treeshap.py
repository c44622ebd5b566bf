"""FOREST_SHAP on the host: the op's meaning in numpy, and the native kernel the numpy backend
runs.

``lz.forest_shap`` sums path-dependent TreeSHAP contributions leaf by leaf. Leaf ``l`` owns the
path elements ``offsets[l]:offsets[l + 1]`` (one per feature its root path tests); element ``e``
belongs to feature slot ``player[e]``, has zero fraction ``zero[e]``, and passes for a row when
each of its C tests does: ``(x[row, column[e, c]] > threshold[e, c]) == right[e, c]``. Its one
fraction ``o`` is 1 then, else 0. With the leaf's quadrature ``nodes[l]`` and ``weights[l]``
(Gauss-Legendre on [0, 1], zero weights past the nodes it uses), element ``e`` of a leaf with
value ``v`` adds to ``out[row, player[e], k]``::

    v[k] · (o_e - z_e) · Σ_q w_q · Π_{e' ≠ e} (z_e' (1 - t_q) + o_e' t_q)

(:mod:`compiler.trees.shap` derives it). :func:`reference` states that in numpy, a leaf at a
time over all rows; :func:`native` is the same compiled by numba, over blocks of rows with the
rows innermost, so every loop over them is contiguous and vectorizes.

Tables come from the model, which the service treats as untrusted input: both check every index
before reading through it, and raise on a corrupt table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import native as _native
from .errors import BackendError
from .ops import Op
from .tensor import LazyTensor, _make

#: Rows the native kernel handles at once: their per-leaf scratch stays in a core's cache.
BLOCK_ROWS = 64


def forest_shap(
    x: LazyTensor,
    column: LazyTensor,
    threshold: LazyTensor,
    right: LazyTensor,
    player: LazyTensor,
    zero: LazyTensor,
    offsets: LazyTensor,
    value: LazyTensor,
    nodes: LazyTensor,
    weights: LazyTensor,
    *,
    players: int,
) -> LazyTensor:
    """(B, P, K) float64: the TreeSHAP contributions of the leaf tables (see the module doc) to
    each of ``players`` features. Host only (:data:`lazy.HOST_ONLY`): a device graph holds it as
    the host formulation of :func:`lazy.variant`."""
    operands = [x, column, threshold, right, player, zero, offsets, value, nodes, weights]
    return _make(Op.FOREST_SHAP, operands, players=int(players))


def check_tables(
    x: np.ndarray,
    column: np.ndarray,
    player: np.ndarray,
    offsets: np.ndarray,
    value: np.ndarray,
    nodes: np.ndarray,
    players: int,
) -> None:
    """Raise where a table would index outside the arrays it reads or writes."""
    elements = column.shape[0]
    if len(offsets) != value.shape[0] + 1 or len(nodes) != value.shape[0]:
        raise BackendError("FOREST_SHAP leaf tables disagree in length")
    if offsets[0] != 0 or offsets[-1] != elements or np.any(np.diff(offsets) < 0):
        raise BackendError("FOREST_SHAP leaf offsets are not ascending over the elements")
    if column.size and (column.min() < 0 or column.max() >= x.shape[1]):
        raise BackendError("FOREST_SHAP test column outside the features")
    if player.size and (player.min() < 0 or player.max() >= players):
        raise BackendError("FOREST_SHAP element feature outside the features explained")


def _factors(
    zero: np.ndarray, offsets: np.ndarray, nodes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per element and node: its leaf's node t, the factor z (1 - t) for o = 0, and the
    reciprocals of the factor for o = 0 and 1 (0 for a zero factor: its o - z is 0 then)."""
    leaf = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    t = nodes[leaf]  # (E, Q)
    absent = zero[:, None] * (1.0 - t)
    with np.errstate(divide="ignore"):
        inverse_absent = np.where(absent > 0, 1.0 / np.where(absent > 0, absent, 1.0), 0.0)
        present = absent + t
        inverse_present = np.where(present > 0, 1.0 / np.where(present > 0, present, 1.0), 0.0)
    return t, absent, inverse_absent, inverse_present


def reference(
    x: np.ndarray,
    column: np.ndarray,
    threshold: np.ndarray,
    right: np.ndarray,
    player: np.ndarray,
    zero: np.ndarray,
    offsets: np.ndarray,
    value: np.ndarray,
    nodes: np.ndarray,
    weights: np.ndarray,
    *,
    players: int,
) -> np.ndarray:
    """FOREST_SHAP of ``x`` (B, W) in numpy: (B, P, K) float64."""
    check_tables(x, column, player, offsets, value, nodes, players)
    rows, k = x.shape[0], value.shape[1]
    out = np.zeros((rows, players, k))
    t, absent, _, _ = _factors(zero, offsets, nodes)
    passed = np.all((x[:, column] > threshold) == right, axis=2)  # (B, E)
    o = passed.astype(np.float64)
    for leaf in range(value.shape[0]):
        lo, hi = int(offsets[leaf]), int(offsets[leaf + 1])
        if lo == hi:
            continue
        factor = absent[None, lo:hi] + o[:, lo:hi, None] * t[None, lo:hi]  # (B, m, Q)
        for i, e in enumerate(range(lo, hi)):
            others = np.prod(np.delete(factor, i, axis=1), axis=1)  # (B, Q)
            integral = others @ weights[leaf]
            share = (o[:, e] - zero[e]) * integral
            out[:, player[e], :] += share[:, None] * value[leaf][None, :]
    return out


def native(players: int) -> Any:
    """FOREST_SHAP by the compiled kernel (needs :data:`lazy.native.AVAILABLE`): a function of
    the op's ten operands returning (B, P, K) float64."""
    kernel = _kernel()
    # The tables are the graph's parameters, the same arrays on every call: their checks and
    # per-element factors are made once (held with the arrays, so their ids stay theirs).
    prepared: dict[tuple[int, ...], tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]] = {}

    def factors(x: np.ndarray, *tables: np.ndarray) -> tuple[np.ndarray, ...]:
        key = (x.shape[1], *map(id, tables))
        found = prepared.get(key)
        if found is None:
            column, _, _, player, zero, offsets, value, nodes, _ = tables
            check_tables(x, column, player, offsets, value, nodes, players)
            if len(prepared) > 8:
                prepared.clear()
            found = prepared[key] = (tables, _factors(zero, offsets, nodes))
        return found[1]

    def forest_shap(x: np.ndarray, *tables: np.ndarray) -> np.ndarray:
        """The op's operands in :func:`reference`'s order → (B, P, K) float64."""
        column, threshold, right, player, zero, offsets, value, _, weights = tables
        t, absent, inverse_absent, inverse_present = factors(x, *tables)
        out = np.zeros((x.shape[0], players, value.shape[1]))
        kernel(
            np.ascontiguousarray(x), column, threshold, right, player, zero, offsets,
            np.ascontiguousarray(value, np.float64), weights, t, absent, inverse_absent,
            inverse_present, out,
        )  # fmt: skip
        return out

    return forest_shap


_KERNEL: Any = None


def _kernel() -> Any:
    """The native kernel, built on first use (numba caches the build on disk)."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _native.compile_kernel(_run)
    return _KERNEL


def _run(  # type: ignore[no-untyped-def]
    x, column, threshold, right, player, zero, offsets, value, weights, t, absent,
    inverse_absent, inverse_present, out,
):  # fmt: skip
    """Blocks of rows, leaf by leaf: each element's one fraction (its tests), the weighted
    product of every element's factor at each node, and each element's integral without its
    own factor (times the reciprocal that matches its o); rows innermost throughout."""
    rows, features = x.shape
    leaves, k = value.shape
    tests, quadrature = column.shape[1], t.shape[1]
    block = BLOCK_ROWS
    longest = 1
    for leaf in range(leaves):
        longest = max(longest, offsets[leaf + 1] - offsets[leaf])
    xt = np.empty((features, block), x.dtype)
    o = np.empty((longest, block))
    product = np.empty((quadrature, block))
    integral = np.empty(block)
    for r0 in range(0, rows, block):
        n = min(block, rows - r0)
        for f in range(features):
            for r in range(n):
                xt[f, r] = x[r0 + r, f]
        for leaf in range(leaves):
            lo, hi = offsets[leaf], offsets[leaf + 1]
            if lo == hi:
                continue
            for i in range(hi - lo):
                e = lo + i
                for r in range(n):
                    o[i, r] = 1.0
                for c in range(tests):
                    col, limit, want = column[e, c], threshold[e, c], right[e, c]
                    for r in range(n):
                        o[i, r] *= (xt[col, r] > limit) == want
            for q in range(quadrature):
                w = weights[leaf, q]
                for r in range(n):
                    product[q, r] = w
            for i in range(hi - lo):
                e = lo + i
                for q in range(quadrature):
                    a, tq = absent[e, q], t[e, q]
                    for r in range(n):
                        product[q, r] *= a + o[i, r] * tq
            for i in range(hi - lo):
                e = lo + i
                for r in range(n):
                    integral[r] = 0.0
                for q in range(quadrature):
                    ia = inverse_absent[e, q]
                    step = inverse_present[e, q] - ia
                    for r in range(n):
                        integral[r] += product[q, r] * (ia + o[i, r] * step)
                z, p = zero[e], player[e]
                for j in range(k):
                    v = value[leaf, j]
                    if v != 0.0:
                        for r in range(n):
                            out[r0 + r, p, j] += (o[i, r] - z) * integral[r] * v
