"""Leaf values to (B, K) sums: the last step every tree strategy shares."""

from __future__ import annotations

import numpy as np

import lazy as lz

from ..context import Context
from .model import Ensemble


def constant(
    total: np.ndarray, x: lz.LazyTensor, ctx: Context, dtype: str | None = None
) -> lz.LazyTensor:
    """Trees without splits: the same (B, K) sum for every row (in ``dtype``, default the
    graph's)."""
    row = ctx.param(total.reshape(1, -1), "leaf_sum", dtype=dtype)
    # Tied to the input so the head is batched like every other: (B, 1) condition × (1, K).
    return lz.where(lz.isnan(x[:, :1]), row, row)


def no_leaves(x: lz.LazyTensor, count: int, ctx: Context) -> lz.LazyTensor:
    """(B, count) int32 zeros, batched like ``x``: a table of reached leaves, one column per
    tree, before a loop fills it."""
    zeros = ctx.const(np.zeros((1, count)), dtype="int32")
    return lz.where(lz.isnan(x[:, :1]), zeros, zeros)


def stumps(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """An ensemble of single-leaf trees: its root sum for every row."""
    return constant(ensemble.root_sum(), x, ctx, ensemble.sum_dtype(ctx.dtype))


def stack_outputs(columns: list[lz.LazyTensor]) -> lz.LazyTensor:
    """(B,) per output → (B, K)."""
    columns = [lz.reshape(c, (lz.B, 1)) for c in columns]
    return columns[0] if len(columns) == 1 else lz.concat(columns, axis=1)


def node_leaf_sum(
    ensemble: Ensemble, value: np.ndarray, node: lz.LazyTensor, ctx: Context
) -> lz.LazyTensor:
    """(B, K): the sum over trees of ``value[node]`` for (B, T) node ids, one output at a time.

    A (B, T, K) gather and a sum over T leave K as the innermost axis, which XLA:CPU does not
    vectorize; one (B, T) gather and sum per output vectorize over T.
    An ``in_order`` ensemble adds the trees' values one after another (a loop over T).
    """
    dtype = ensemble.sum_dtype(ctx.dtype)
    columns = []
    for k in range(value.shape[1]):
        table = ctx.param(value[:, k], f"leaf_value_{k}", dtype=dtype)
        if not ensemble.in_order:
            columns.append(lz.sum(lz.take(table, node, axis=0), axis=1))
            continue
        columns.append(in_order_sum(table, node, dtype))
    return stack_outputs(columns)


def in_order_sum(table: lz.LazyTensor, node: lz.LazyTensor, dtype: str) -> lz.LazyTensor:
    """(B,): ``table[node[:, 0]] + table[node[:, 1]] + ...``, added one column after another
    from +0 in ``dtype`` (a loop over the columns: the trees' order, which a reduction would
    not keep)."""
    zeros = lz.cast(node[:, 0] * 0, dtype)  # (B,) +0, batched like the rows
    return lz.fori_loop(int(node.shape[1]), _add_tree, zeros, node, table)


def _add_tree(
    i: lz.LazyTensor, acc: lz.LazyTensor, node: lz.LazyTensor, value: lz.LazyTensor
) -> lz.LazyTensor:
    """Loop body of an in-order sum: tree ``i``'s reached leaf value added to (B,) ``acc``."""
    return acc + lz.take(value, lz.take(node, i, axis=1), axis=0)
