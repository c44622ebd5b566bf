"""Path-dependent TreeSHAP as tensor operations: exact per-feature contributions of a tree
ensemble's raw output, which sum to it with the expected value.

For a tree, each leaf's root path tests some features, one *element* per distinct feature
(repeated splits on a feature merge). For a row, an element has a one fraction ``o`` (1 where
the row passes every test of the feature on the path, else 0) and a zero fraction ``z`` (the
product of the path's cover ratios at those tests: the share of training data that takes the
path's side). TreeSHAP (Lundberg et al., path-dependent) gives feature ``f`` of a leaf with
value ``v`` and ``m`` elements::

    v · (o_f - z_f) · Σ_k k! (m-1-k)! / m! · e_k({(o_j, z_j) : j ≠ f})

where ``e_k`` sums over the k-subsets S of the other elements of ``Π_S o_j · Π_rest z_j``. The
weights are the Beta integrals ``∫₀¹ t^k (1-t)^(m-1-k) dt``, so the sum is
``∫₀¹ Π_{j≠f} (z_j (1-t) + o_j t) dt``: a polynomial of degree m - 1, which Gauss-Legendre
quadrature on ``ceil(m / 2)`` nodes integrates exactly. Per row, leaf and node ``t_q``, the
product over every element is computed once and each element's own factor taken back out by a
reciprocal that depends only on whether ``o`` is 0 or 1 (both precomputed), so the whole sum is
elementwise arithmetic, a product over elements and sums: no recursion, no per-row branch. It
vectorizes across rows on a CPU and is the same graph on an accelerator.

The decisions are the compiled model's own: each test is a split of the folded ensemble
(:mod:`.folding`) compared on :func:`~.splits.split_columns`' widened features, exactly as the
prediction strategies compare it, so a contribution's one fractions are the source's decisions.
The tests of an element on one widened column merge into at most a bound on each side.

Two formulations of that arithmetic, one VARIANT (warm-up times them per bucket): the device
graph loops over trees, one per trip (every tree's tables at once would not fit), over
(rows, leaves, path elements) arrays padded with elements that change nothing (``o = z = 1``),
each element's contribution summed onto its feature by a one-hot product; the host runs
FOREST_SHAP (:mod:`lazy.treeshap`), a native kernel over the same tables unpadded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from .categorical import as_membership_splits
from .leaves import constant
from .model import Ensemble, Tree
from .splits import SplitColumns, split_columns


@dataclass(frozen=True)
class PathTables:
    """Every tree's leaves (padded to L) and each leaf's path elements (padded to M): the
    element's feature (its position among the P features some split reads), its zero fraction
    (1 for padding), its tests (C per element) — a column of the widened features, a threshold,
    and whether the row must go right of it — and the leaf values. The padding test, column 0
    not right of +inf, always passes, so a padding element has ``o = z = 1`` and changes
    nothing."""

    players: np.ndarray  # (P,) int64: the source features, ascending
    player: np.ndarray  # (T, L, M) int64: each element's position in ``players``
    zero: np.ndarray  # (T, L, M) float64
    column: np.ndarray  # (T, L, M, C) int64
    threshold: np.ndarray  # (T, L, M, C) float64 in the widened features' dtype
    right: np.ndarray  # (T, L, M, C) bool
    value: np.ndarray  # (T, L, K) float64
    #: The expected value (K,): each tree's leaves weighed by their covers.
    expected: np.ndarray
    #: Each leaf's elements (T, L) (0 for padding leaves and single-leaf trees).
    count: np.ndarray


def _paths(tree: Tree) -> list[tuple[int, list[tuple[int, bool]]]]:
    """Each leaf and its path from the root: (node, went right) per split."""
    out, stack = [], [(0, [])]
    while stack:
        node, path = stack.pop()
        if tree.is_leaf[node]:
            out.append((node, path))
            continue
        stack.append((int(tree.right[node]), [*path, (node, True)]))
        stack.append((int(tree.left[node]), [*path, (node, False)]))
    return out


def _covers(tree: Tree, where: str) -> np.ndarray:
    if tree.cover is None:
        raise UnsupportedError(
            f"{where}: the model records no node covers (training counts or hessian sums), "
            "which path-dependent TreeSHAP weighs untaken branches by"
        )
    return tree.cover


#: One element of a path: its feature's position, zero fraction, and tests
#: ((column, went right) → the binding threshold).
_Element = tuple[int, float, dict[tuple[int, bool], float]]


def _elements(
    tree: Tree,
    path: list[tuple[int, bool]],
    cover: np.ndarray,
    column: np.ndarray,
    threshold: np.ndarray,
    slot: dict[int, int],
    ensemble: Ensemble,
) -> list[_Element]:
    """A leaf's path merged by feature: the product of its cover ratios, and on each widened
    column the binding test each way (``v > t`` for every right turn holds iff it holds for
    the largest t; ``not v > t`` for every left turn iff for the least)."""
    merged: dict[int, tuple[float, dict[tuple[int, bool], float]]] = {}
    for node, right in path:
        p = slot[ensemble.player(int(tree.feature[node]))]
        zero, tests = merged.get(p, (1.0, {}))
        child = tree.right[node] if right else tree.left[node]
        zero *= cover[child] / cover[node] if cover[node] > 0 else 0.0
        key, t = (int(column[node]), right), float(threshold[node])
        tests[key] = max(tests.get(key, t), t) if right else min(tests.get(key, t), t)
        merged[p] = (zero, tests)
    return [(p, zero, tests) for p, (zero, tests) in merged.items()]


def path_tables(ensemble: Ensemble, folded: Ensemble, cols: SplitColumns, where: str) -> PathTables:
    """The tables of ``ensemble`` (the source's trees and features), tested as ``folded`` (the
    same nodes, split as the compiled model decides them) on ``cols``."""
    if ensemble.has_categorical:
        raise ValueError("categorical splits: make them membership splits first")
    trees = ensemble.trees
    players = sorted({ensemble.player(int(f)) for t in trees for f in t.feature[~t.is_leaf]}) or [0]
    slot = {p: i for i, p in enumerate(players)}
    leaves: list[list[tuple[int, list[_Element]]]] = []
    expected = np.zeros(ensemble.n_outputs)
    for tree, folded_tree in zip(trees, folded.trees, strict=True):
        splits = ~folded_tree.is_leaf
        column, threshold = cols.encode(
            np.where(splits, folded_tree.feature, 0),
            np.where(splits, folded_tree.threshold, np.inf),
            ~folded_tree.missing_left,
        )
        paths = _paths(tree)
        cover = _covers(tree, where) if len(paths) > 1 else np.ones(tree.n_nodes)
        for leaf, _ in paths:
            expected += tree.value[leaf] * (cover[leaf] / cover[0] if cover[0] > 0 else 0.0)
        leaves.append(
            [
                (leaf, _elements(tree, path, cover, column, threshold, slot, ensemble))
                for leaf, path in paths
            ]
        )
    n_leaves = max(map(len, leaves))
    depth = max((len(e) for tree in leaves for _, e in tree), default=0) or 1
    widest = max((len(t) for tree in leaves for _, e in tree for _, _, t in e), default=1)
    grid = (len(trees), n_leaves, depth)
    player = np.zeros(grid, np.int64)
    zero = np.ones(grid)
    column = np.zeros((*grid, widest), np.int64)
    threshold = np.full((*grid, widest), np.inf)
    right = np.zeros((*grid, widest), bool)
    value = np.zeros((len(trees), n_leaves, ensemble.n_outputs))
    count = np.zeros((len(trees), n_leaves), np.int64)
    for ti, (tree, tree_leaves) in enumerate(zip(trees, leaves, strict=True)):
        for li, (leaf, elements) in enumerate(tree_leaves):
            value[ti, li], count[ti, li] = tree.value[leaf], len(elements)
            for mi, (p, z, tests) in enumerate(elements):
                player[ti, li, mi], zero[ti, li, mi] = p, z
                for ci, ((col, went_right), t) in enumerate(tests.items()):
                    column[ti, li, mi, ci] = col
                    threshold[ti, li, mi, ci] = t
                    right[ti, li, mi, ci] = went_right
    return PathTables(
        np.asarray(players, np.int64),
        player,
        zero,
        column,
        threshold,
        right,
        value,
        expected,
        count,
    )


def quadrature(depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on [0, 1], exact for polynomials of degree < 2 n
    with n = ceil(depth / 2) (the integrands have degree depth - 1)."""
    nodes, weights = np.polynomial.legendre.leggauss(max(1, -(-depth // 2)))
    return (nodes + 1.0) / 2.0, weights / 2.0


def tree_contributions(
    ensemble: Ensemble, folded: Ensemble, x: lz.LazyTensor, ctx: Context
) -> tuple[lz.LazyTensor, np.ndarray]:
    """(B, F, K) float64: each row's contribution of every feature the ensemble reads (its
    source features, :attr:`Ensemble.players`; F = the largest one + 1) to each output, and the
    expected value (K,); the two sum to the ensemble's output. ``folded`` and ``x``: the
    ensemble as the compiled model decides it and the matrix it reads
    (:func:`.folding.exact_splits`)."""
    if folded.has_categorical:  # HistGradientBoosting's: as numeric splits on 0/1 columns
        ensemble, folded, x = as_membership_splits(ensemble, folded, x, ctx)
    cols = split_columns(folded, x, ctx)
    tables = path_tables(ensemble, folded, cols, ctx.path)
    n_trees, n_leaves, depth, widest = tables.column.shape
    n_players, k = len(tables.players), ensemble.n_outputs
    t, w = quadrature(depth)
    # Per element and node: the factor z (1 - t) + o t for o = 0 and 1, and their reciprocals
    # (0 where the factor is 0: its element's o - z is 0 then, so the term vanishes).
    z = tables.zero.reshape(n_trees, n_leaves * depth, 1)
    absent = z * (1.0 - t)
    with np.errstate(divide="ignore"):
        inverse_absent = np.where(absent > 0, 1.0 / np.where(absent > 0, absent, 1.0), 0.0)
    flat = (n_trees, -1)
    shared = (
        ctx.param(tables.column.reshape(flat).astype(np.int32), "shap_column", dtype="int32"),
        ctx.param(tables.threshold.reshape(flat), "shap_threshold", dtype=cols.dtype),
        ctx.param(tables.right.reshape(flat), "shap_right", dtype="bool"),
        ctx.param(tables.player.reshape(flat).astype(np.int32), "shap_player", dtype="int32"),
        ctx.param(z.reshape(flat), "shap_zero", dtype="float64"),
        ctx.param(absent.reshape(flat), "shap_absent", dtype="float64"),
        ctx.param(inverse_absent.reshape(flat), "shap_inverse_absent", dtype="float64"),
        ctx.param(1.0 / (absent + t).reshape(flat), "shap_inverse_present", dtype="float64"),
        ctx.param(t, "shap_nodes", dtype="float64"),
        ctx.param(w, "shap_weights", dtype="float64"),
        ctx.param(np.arange(n_players, dtype=np.int32), "shap_players", dtype="int32"),
    )
    elements, q = n_leaves * depth, len(t)

    def unit(tree: lz.LazyTensor, x: lz.LazyTensor, *tables: lz.LazyTensor) -> lz.LazyTensor:
        """(B, L, M): each element's contribution per unit of its leaf's value."""
        column, threshold, right, _, zero, absent, inv_absent, inv_present, nodes, weights, _ = (
            tables
        )
        passed = (
            lz.take(x, lz.take(column, tree, axis=0), axis=1) > lz.take(threshold, tree, axis=0)
        ) == (lz.take(right, tree, axis=0))
        one = lz.reduce_and(lz.reshape(passed, (lz.B, elements, widest)), axis=2)  # (B, L·M)
        o = lz.expand_dims(lz.cast(one, "float64"), 2)
        shape = (lz.B, n_leaves, depth, q)
        factor = lz.reshape(
            lz.reshape(lz.take(absent, tree, axis=0), (elements, q)) + o * nodes, shape
        )
        inverse = lz.reshape(
            lz.where(
                lz.expand_dims(one, 2),
                lz.reshape(lz.take(inv_present, tree, axis=0), (elements, q)),
                lz.reshape(lz.take(inv_absent, tree, axis=0), (elements, q)),
            ),
            shape,
        )
        product = factor[:, :, 0, :]
        for m in range(1, depth):
            product = product * factor[:, :, m, :]
        integral = lz.sum(lz.expand_dims(product * weights, 2) * inverse, axis=3)  # (B, L, M)
        share = lz.reshape(o, (lz.B, n_leaves, depth)) - lz.reshape(
            lz.take(zero, tree, axis=0), (n_leaves, depth)
        )
        return share * integral

    def scatter(
        u: lz.LazyTensor,
        value: lz.LazyTensor,
        tree: lz.LazyTensor,
        player: lz.LazyTensor,
        ids: lz.LazyTensor,
    ) -> lz.LazyTensor:
        """(B, P): ``u`` (B, L, M) weighed by the leaf values (L,) and summed by feature."""
        weighted = lz.reshape(u * lz.reshape(value, (n_leaves, 1)), (lz.B, elements))
        one_hot = lz.cast(lz.expand_dims(lz.take(player, tree, axis=0), 1) == ids, "float64")
        return lz.matmul(weighted, one_hot)

    def body(
        i: lz.LazyTensor,
        acc: lz.LazyTensor,
        x: lz.LazyTensor,
        trees: lz.LazyTensor,
        values: lz.LazyTensor,
        *tables: lz.LazyTensor,
    ) -> lz.LazyTensor:
        """One tree: ``acc`` (B, P · J) plus its contributions to the J outputs of ``values``
        (T, L, J)."""
        tree = lz.take(trees, i)
        u = unit(tree, x, *tables)
        leaf_values = lz.take(values, tree, axis=0)  # (L, J)
        outputs = int(values.shape[2])
        parts = [scatter(u, leaf_values[:, j], tree, tables[3], tables[10]) for j in range(outputs)]
        return acc + (parts[0] if outputs == 1 else lz.concat(parts, axis=1))

    def loop(trees: np.ndarray, values: np.ndarray, name: str) -> lz.LazyTensor:
        """(B, P · J): the trees' contributions to the J outputs of ``values`` (T, L, J)."""
        zeros = constant(np.zeros(n_players * values.shape[2]), cols.x, ctx, "float64")
        if len(trees) == 0:
            return zeros
        return lz.fori_loop(
            len(trees),
            body,
            zeros,
            cols.x,
            ctx.param(trees.astype(np.int32), f"shap_trees{name}", dtype="int32"),
            ctx.param(values, f"shap_leaf_values{name}", dtype="float64"),
            *shared,
        )

    # Boosting adds each tree to one output: a loop per output over its trees. Otherwise (a
    # forest's class fractions) one loop over every tree, for all outputs at once.
    if all(np.count_nonzero(tables.value[i].any(axis=0)) <= 1 for i in range(n_trees)):
        by_output = [
            loop(
                np.flatnonzero(tables.value[:, :, j].any(axis=1)),
                tables.value[:, :, j : j + 1],
                f"_{j}",
            )
            for j in range(k)
        ]
    else:
        summed = loop(np.flatnonzero(tables.value.any(axis=(1, 2))), tables.value, "")
        by_output = [summed[:, j * n_players : (j + 1) * n_players] for j in range(k)]
    device = lz.concat([lz.expand_dims(o, 2) for o in by_output], axis=2)  # (B, P, K)
    by_player = lz.variant(device, _host(tables, cols, ctx))
    # (B, P, K) → (B, F, K) on the features' positions.
    width = int(tables.players.max()) + 1
    placement = np.zeros((n_players, width))
    placement[np.arange(n_players), tables.players] = 1.0
    place = ctx.param(placement, "shap_placement", dtype="float64")
    placed = [lz.expand_dims(lz.matmul(by_player[:, :, j], place), 2) for j in range(k)]
    return lz.concat(placed, axis=2) if len(placed) > 1 else placed[0], tables.expected


def _host(tables: PathTables, cols: SplitColumns, ctx: Context) -> lz.LazyTensor:
    """The host formulation: one FOREST_SHAP (:mod:`lazy.forest_shap`, a native kernel over
    blocks of rows) over the leaves that have elements, each with its own element count and
    the quadrature of its own degree."""
    used = tables.count.ravel() > 0
    count = tables.count.ravel()[used]
    depth = tables.player.shape[2]
    real = (np.arange(depth)[None, None, :] < tables.count[:, :, None]).ravel()  # (T·L·M,)
    widest = tables.column.shape[3]
    q = -(-max(int(count.max(initial=1)), 1) // 2)
    nodes = np.full((len(count), q), 0.5)
    weights = np.zeros((len(count), q))
    for m in np.unique(count):
        t, w = quadrature(int(m))
        nodes[count == m, : len(t)], weights[count == m, : len(t)] = t, w
    offsets = np.concatenate([[0], np.cumsum(count)])
    return lz.forest_shap(
        cols.x,
        ctx.param(
            tables.column.reshape(-1, widest)[real].astype(np.int32),
            "shap_host_column",
            dtype="int32",
        ),
        ctx.param(
            tables.threshold.reshape(-1, widest)[real], "shap_host_threshold", dtype=cols.dtype
        ),
        ctx.param(tables.right.reshape(-1, widest)[real], "shap_host_right", dtype="bool"),
        ctx.param(tables.player.ravel()[real].astype(np.int32), "shap_host_player", dtype="int32"),
        ctx.param(tables.zero.ravel()[real], "shap_host_zero", dtype="float64"),
        ctx.param(offsets.astype(np.int32), "shap_host_offsets", dtype="int32"),
        ctx.param(
            tables.value.reshape(-1, tables.value.shape[2])[used],
            "shap_host_value",
            dtype="float64",
        ),
        ctx.param(nodes, "shap_host_nodes", dtype="float64"),
        ctx.param(weights, "shap_host_weights", dtype="float64"),
        players=len(tables.players),
    )
