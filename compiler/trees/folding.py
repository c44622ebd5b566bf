"""Tree splits decided on the raw input columns, exactly as the source decides them.

A split compares the value the source computed for its feature — ``v <= t`` (HistGradientBoosting,
LightGBM: float64 ``v``) or ``float32(v) <= t`` (scikit-learn's ``tree_``, XGBoost) — where ``v``
may be a scaler's or an imputer's output. A float32 graph that recomputes ``v`` rounds it
differently from the source, and a threshold sitting on a data value (they often do) then sends
rows the other way. But where ``v = g(x)`` for one raw column ``x`` and a non-decreasing ``g``
(a :class:`~compiler.features.ColumnMap`: the steps replayed in float64 as the source computes
them), ``{x : P(g(x))}`` is a down-set of the float64 line, so the split is ``x <= t'`` with
``t'`` its largest member, found at compile time by bisection over the float64 values in order.
The split then reads the raw float64 column, and a NaN goes where ``g(NaN)`` (an imputer's fill)
goes, or where the source sends missing values. Exact for every float64 input, and the folded
steps cost nothing per row.

A column no map describes (a projection, a one-hot flag) is compared as computed, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

import lazy as lz

from ..context import Context
from ..features import ColumnMap, Features
from .model import Ensemble, Tree
from .strategies import leaf_sum

#: docs/operators.md's exactness notes of the tree families (``register(..., exactness=...)``).
FLOAT64_SPLITS = (
    "splits compare float64, on the raw float64 columns (float64 input); scalers and imputers "
    "before them are folded into the thresholds"
)
FLOAT32_SPLITS = (
    "splits compare float32(x) as the source does (float32 input on raw columns); behind "
    "scalers they are folded onto the raw float64 columns"
)

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


def _comparison(float32_inputs: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The source's split test ``goes left`` on its computed values ``v``."""
    if float32_inputs:
        return lambda v, t: v.astype(np.float32).astype(np.float64) <= t
    return lambda v, t: v <= t


def _fold_splits(
    mapping: ColumnMap, thresholds: np.ndarray, float32_inputs: bool
) -> tuple[np.ndarray, bool | None]:
    """(raw thresholds ``t'`` with ``P(g(x))`` iff ``x <= t'``; where a NaN goes: True left,
    False right, None as the source's missing direction)."""
    left = _comparison(float32_inputs)
    with np.errstate(all="ignore"):
        folded, some = largest_satisfying(lambda x: left(mapping(x), thresholds), len(thresholds))
        # No raw value goes left: compare against -inf, which only -inf itself is not above; the
        # source rejects infinite input wherever a step folds (scikit-learn's finite check).
        folded = np.where(some, folded, -np.inf)
        nan_value = mapping(np.array([np.nan]))[0]
    if np.isnan(nan_value):
        return folded, None
    return folded, left(np.full(len(thresholds), nan_value), thresholds)


def exact_splits(
    ensemble: Ensemble, features: Features, ctx: Context
) -> tuple[Ensemble, lz.LazyTensor]:
    """``ensemble`` over ``features`` → an equivalent ensemble and the matrix its splits read,
    deciding exactly as the source on float64 inputs where maps allow (see the module doc).

    Unchanged where nothing would gain: a float32-comparing source reading raw columns as they
    are (the host's float32 rounding is the source's own), or no split reading a mapped column.
    """
    maps = features.column_maps()
    # A float32-comparing source reading a raw column, or its imputed copy, decides on the
    # float32 of the raw value or of the fill: the host's rounding gives that already.
    mapped = [m is not None and not (ensemble.float32_inputs and m.fills_only) for m in maps]
    if not any(mapped) or ensemble.has_categorical:
        return ensemble, features.values
    read = set()
    for tree in ensemble.trees:
        read.update(tree.feature[~tree.is_leaf].tolist())
    if not any(mapped[f] for f in read):
        return ensemble, features.values
    # The new matrix: the raw float64 columns the maps read, then the other columns read as
    # computed (in float64, the precision every split now compares in).
    raw = sorted({maps[f].source for f in read if mapped[f]})  # type: ignore[union-attr]
    computed = sorted(f for f in read if not mapped[f])
    column = {f: len(raw) + i for i, f in enumerate(computed)}
    for f in read:
        if mapped[f]:
            column[f] = raw.index(maps[f].source)  # type: ignore[union-attr]
    parts = [ctx.raw_float64(raw)]
    if computed:
        parts.append(lz.cast(features.select(computed).values, "float64"))
    x = parts[0] if len(parts) == 1 else lz.concat(parts, axis=1)
    trees = tuple(
        _fold_tree(t, maps, mapped, column, ensemble.float32_inputs) for t in ensemble.trees
    )
    folded = sum(1 for f in read if mapped[f] and maps[f].steps)  # type: ignore[union-attr]
    ctx.note(
        f"splits exact in float64 on {len(raw)} raw columns"
        + (f" ({folded} computed features folded into thresholds)" if folded else "")
    )
    return Ensemble(trees, int(x.shape[1]), float32_inputs=False), x


def _fold_tree(
    tree: Tree,
    maps: tuple[ColumnMap | None, ...],
    mapped: list[bool],
    column: dict[int, int],
    float32_inputs: bool,
) -> Tree:
    split = ~tree.is_leaf
    feature = tree.feature.copy()
    threshold = tree.threshold.copy()
    missing_left = tree.missing_left.copy()
    for f in np.unique(tree.feature[split]).tolist():
        nodes = np.flatnonzero(split & (tree.feature == f))
        feature[nodes] = column[f]
        t = tree.threshold[nodes]
        # A column compared as computed keeps its threshold: its values are the graph's own,
        # and ``v <= t`` in float64 is the float32 comparison for float32-valued ``v``.
        if mapped[f]:
            t, nan_left = _fold_splits(maps[f], t, float32_inputs)  # type: ignore[arg-type]
            if nan_left is not None:
                missing_left[nodes] = nan_left
        threshold[nodes] = t
    return replace(tree, feature=feature, threshold=threshold, missing_left=missing_left)


def leaf_sum_on(ensemble: Ensemble, features: Features, ctx: Context) -> lz.LazyTensor:
    """(B, K): :func:`~.strategies.leaf_sum` of ``ensemble`` over ``features``, its splits made
    exact by :func:`exact_splits` where they can be."""
    ensemble, x = exact_splits(ensemble, features, ctx)
    return leaf_sum(ensemble, x, ctx)
