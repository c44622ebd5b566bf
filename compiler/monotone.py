"""Decisions on monotone maps of raw columns, moved onto the raw float64 line at compile time.

A source compares the value ``v`` it computed for a column against fitted values ``e``: a tree's
``v <= t``, a bin edge's ``v >= e``, a quantile knot's ``v > q``. Where ``v = g(x)`` for one raw
column ``x`` and a non-decreasing ``g`` (a :class:`~compiler.features.ColumnMap`, replaying the
steps in float64 as the source computes them), the set of raw values passing a down-set test is
``{x <= t'}`` with ``t'`` its largest member, found by bisection over the float64 values in order
(:func:`largest_satisfying`). The graph then compares the raw float64 column with ``t'``: exact
for every float64 input, whatever float32 rounding or the graph's arithmetic would make of
``v``, and the mapped steps cost nothing per row. The tree splits (:mod:`compiler.trees.folding`)
and the binning tests (:class:`compiler.converters.discretization.ExactTests`) share this.

A decision on a column no map describes and whose values are not exact (a projection's output)
needs ``v`` as the source computes it: :func:`computed_as_source` puts the steps computing it in
float64 (:mod:`compiler.precision`), so it decides as the source does up to float64 rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

import lazy as lz

from .context import Context
from .features import ColumnMap, Features
from .float32_inputs import float32_floor

#: A test of computed values ``v`` against fitted values ``e`` (same shapes, float64).
Test = Callable[[np.ndarray, np.ndarray], np.ndarray]

#: ``float64`` values in order as int64 keys: -inf and +inf bound the non-NaN line.
_SIGN = np.int64(0x7FFFFFFFFFFFFFFF)


def _key(v: np.ndarray) -> np.ndarray:
    k = np.asarray(v, np.float64).view(np.int64)
    return np.where(k < 0, k ^ _SIGN, k)


def _value(k: np.ndarray) -> np.ndarray:
    k = np.asarray(k, np.int64)
    return np.where(k < 0, k ^ _SIGN, k).view(np.float64)


def largest_satisfying(
    predicate: Callable[[np.ndarray], np.ndarray], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per element i < n of a vectorized down-set ``predicate`` over the non-NaN float64 line:
    (its largest member, whether it has any member)."""
    lo = np.full(n, _key(np.array(-np.inf)), np.int64)  # invariant: predicate(lo) or none holds
    hi = np.full(n, _key(np.array(np.inf)), np.int64)
    some = predicate(_value(lo))
    top = predicate(_value(hi))
    lo = np.where(top, hi, lo)
    # Largest member in [lo, hi]: 64 halvings of an int64 range cover the whole line.
    open_ = some & ~top
    while np.any(open_ & (hi > lo + 1)):
        mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # floor((lo + hi) / 2), no overflow
        ok = predicate(_value(mid))
        lo = np.where(open_ & ok, mid, lo)
        hi = np.where(open_ & ~ok, mid, hi)
    return _value(lo), some


def fold(
    mapping: ColumnMap | None, values: np.ndarray, holds: Test, dtype: Any = np.float64
) -> tuple[np.ndarray, np.ndarray | None]:
    """For 1-D fitted ``values`` and a test ``holds(v, e)`` true on a down-set of ``v``: per
    value the largest raw ``x`` with ``holds(g(x), e)`` (``g``: ``mapping`` as the source
    computes it on input of ``dtype``, None the identity), -inf where none holds (then only -inf
    itself compares at most it: the source rejects infinite input wherever a step maps a
    column); and the test's answers for a NaN ``x`` where ``g`` gives NaN a value (an imputer's
    fill), None where ``g(NaN)`` is NaN.

    ``dtype`` float32: ``x`` ranges over the float32 values (returned as float64), for raw
    values that arrive as float32 (:mod:`compiler.float32_inputs`)."""
    g = mapping if mapping is not None else ColumnMap(0)
    values = np.asarray(values, np.float64)
    # Over the float64 line, x stands for the float32 at or below it: still a down-set.
    on_line = float32_floor if np.dtype(dtype) == np.float32 else (lambda x: x)
    with np.errstate(all="ignore"):
        largest, some = largest_satisfying(
            lambda x: holds(g(on_line(x), dtype), values), len(values)
        )
        nan_value = g(np.array([np.nan]), dtype)[0]
    t = np.where(some, np.asarray(on_line(largest), np.float64), -np.inf)
    if np.isnan(nan_value):
        return t, None
    with np.errstate(all="ignore"):
        return t, np.asarray(holds(np.full(len(values), nan_value), values), bool)


def answers_differ(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Whether two of :func:`fold`'s answers for a NaN (None: the source's missing direction)
    differ."""
    if a is None or b is None:
        return (a is None) != (b is None)
    return bool((np.asarray(a) != np.asarray(b)).any())


def computed_as_source(features: Features, columns: Iterable[int], ctx: Context) -> None:
    """Ask for the steps computing ``columns`` of ``features`` in float64 where a decision on
    them (made by the current step) could not otherwise see the source's value: columns no map
    folds onto a raw column and whose values are not exact (:meth:`Features.decided_exactly`)."""
    inexact = [j for j in columns if not features.decided_exactly(j)]
    if inexact:
        ctx.promote(
            f"decides on {len(inexact)} computed features that no map folds onto a raw column: "
            "the steps computing them compute in float64, as the source does",
            inputs=True,
        )


def raw_matrix(
    features: Features,
    ctx: Context,
    columns: Sequence[int],
    raw: Sequence[bool],
    *,
    splits: bool = False,
) -> tuple[lz.LazyTensor, dict[int, int]]:
    """(B, k) holding what decisions on ``columns`` of ``features`` read: the raw input column
    of each ``raw`` one (by its map, once per raw column and fill), then the others as
    computed; and where each of ``columns`` is in it. float64; or with ``splits`` (tests ``x <=
    t`` only, whose thresholds the caller gives :meth:`Context.splits_at`), where every part can
    be, float32: raw columns as the host's float32 split codes (:mod:`compiler.float32_splits`,
    where :meth:`Context.splits_in_float32`), computed columns from a float32 graph.

    A raw column whose map starts with an imputer's fill (:attr:`ColumnMap.fill`) is read with
    its NaN filled, as every later step sees it, so no NaN reaches those decisions (trees then
    need no NaN-aware copies of their features)."""
    maps = features.column_maps()
    keys = {(maps[j].source, maps[j].fill) for j, r in zip(columns, raw, strict=True) if r}  # type: ignore[union-attr]
    plain = sorted(s for s, fill in keys if fill is None)
    filled = sorted((s, fill) for s, fill in keys if fill is not None)
    order = [(s, None) for s in plain] + filled
    computed = [j for j, r in zip(columns, raw, strict=True) if not r]
    where = {j: len(order) + i for i, j in enumerate(computed)}
    for j, r in zip(columns, raw, strict=True):
        if r:
            where[j] = order.index((maps[j].source, maps[j].fill))  # type: ignore[union-attr]
    rest = features.select(computed).values if computed else None
    if (
        splits
        and order
        and all(ctx.splits_in_float32(s) for s, _ in order)
        and (rest is None or rest.dtype == "float32")
    ):
        parts = [lz.expand_dims(ctx.split_column(s, fill), 1) for s, fill in order]
        parts += [] if rest is None else [rest]
        return (parts[0] if len(parts) == 1 else lz.concat(parts, axis=1)), where
    parts = [ctx.raw_float64(plain)] if plain else []
    if filled:
        values = ctx.raw_float64([s for s, _ in filled])
        fills = ctx.param(np.asarray([f for _, f in filled]), "raw_fill", dtype="float64")
        parts.append(lz.where(lz.isnan(values), fills, values))
    if rest is not None:
        parts.append(lz.cast(rest, "float64"))
    x = parts[0] if len(parts) == 1 else lz.concat(parts, axis=1)
    return x, where


def raw_in_column_order(features: Features, ctx: Context, raw: Sequence[bool]) -> lz.LazyTensor:
    """(B, F) float64: :func:`raw_matrix` of every column of ``features``, back in their order
    (a raw column read by several features appears once in it)."""
    x, where = raw_matrix(features, ctx, range(features.width), raw)
    order = [where[j] for j in range(features.width)]
    if order != list(range(int(x.shape[1]))):
        x = lz.take(x, lz.const(np.asarray(order, np.int32)), axis=1)
    return x
