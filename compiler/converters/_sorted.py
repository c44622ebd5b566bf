"""Per-column ``np.searchsorted`` against fitted sorted edges, exact in the graph's precision.

An edge ``e`` (float64) is compared with float32 inputs through a float32 stand-in that decides
every float32 value the same way: ``e <= x`` iff ``ceil32(e) <= x`` and ``e < x`` iff
``floor32(e) < x`` (``ceil32``/``floor32``: the nearest float32 at or above / below ``e``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import lazy as lz

from ..context import Context
from ..trees import float32_floor


def padded(edges: Sequence[np.ndarray]) -> np.ndarray:
    """Per-column edge lists → an (F, E) float64 table padded with NaN (never compares true)."""
    width = max([len(e) for e in edges] + [1])
    table = np.full((len(edges), width), np.nan)
    for j, e in enumerate(edges):
        table[j, : len(e)] = e
    return table


def rounded(edges: np.ndarray, ctx: Context, direction: str) -> np.ndarray:
    """``edges`` as the graph's dtype, rounded ``"up"`` or ``"down"`` in float32."""
    edges = np.asarray(edges, np.float64)
    if ctx.dtype != "float32":
        return edges
    return -float32_floor(-edges) if direction == "up" else float32_floor(edges)


def count_at_most(x: lz.LazyTensor, edges: np.ndarray, ctx: Context, name: str) -> lz.LazyTensor:
    """(B, F) int32 ``#{e in edges[f] : e <= x[:, f]}`` — ``searchsorted(..., side='right')``."""
    table = ctx.param(rounded(edges, ctx, "up"), name, dtype=ctx.dtype)
    return lz.sum(lz.cast(lz.expand_dims(x, 2) >= table, "int32"), axis=2)


def count_below(x: lz.LazyTensor, edges: np.ndarray, ctx: Context, name: str) -> lz.LazyTensor:
    """(B, F) int32 ``#{e in edges[f] : e < x[:, f]}`` — ``searchsorted(..., side='left')``."""
    table = ctx.param(rounded(edges, ctx, "down"), name, dtype=ctx.dtype)
    return lz.sum(lz.cast(lz.expand_dims(x, 2) > table, "int32"), axis=2)


def per_column(index: lz.LazyTensor, table: np.ndarray, ctx: Context, name: str) -> lz.LazyTensor:
    """(B, F): ``table[f, index[:, f]]`` for an (F, n) table of fitted values."""
    n = table.shape[1]
    offsets = ctx.const(np.arange(table.shape[0], dtype=np.int32) * n, "int32")
    return lz.take(ctx.param(table.reshape(-1), name), index + offsets, axis=0)
